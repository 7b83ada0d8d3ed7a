"""torch's own per-rank order of a multi-chunk schedule, read without any process.

`torch_schedule_order` builds a ``torch.distributed.pipelining`` schedule from stand-in stage
objects and returns its ``pipeline_order``, to compare with the workbook's
`utils.planning.schedules.build_schedule` (chapters 7 and 8, the schedule tests). Real runs of
those schedules are jobs: ``run_job(JobSpec(schedule="interleaved-1f1b", ...))`` runs on torch's
runtime (`utils.runtime.torchrank`).
"""

from __future__ import annotations

from types import SimpleNamespace

from utils.planning.catalogue import schedule_info, schedules_on
from utils.planning.schedules import build_schedule

__all__ = ["torch_schedule_order"]


def torch_schedule_order(name: str, num_stages: int, num_micro_batches: int,
                         chunks: int | None = None) -> dict[int, list[str]]:
    """torch's per-rank compute order (``pipeline_order``) of a multi-stage schedule, e.g.
    ``{0: ['0F0', '0F1', ...], 1: [...]}``, built from stand-in stage objects, no process group.

    Overlapped forward+backward pairs (DualPipeV's ``OVERLAP_F_B``) are listed as their two
    actions, forward first, which is the order torch's runtime runs them in. Only schedules
    run by torch's ``_PipelineScheduleRuntime`` (the catalogue's ``torch_multi_stage``
    ones): the ``pipeline_order`` of its single-stage ``Schedule1F1B`` lists the last rank
    wrongly (its runtime is right), so compare those against a traced run instead.
    """
    multi = [n for n in schedules_on("torch") if schedule_info(n).torch_multi_stage]
    if name not in multi:
        raise ValueError(f"torch_schedule_order covers {', '.join(multi)}, not {name!r}")
    import torch
    from torch.distributed.pipelining import schedules as torch_schedules

    ours = build_schedule(name, num_stages, num_micro_batches, chunks=chunks)  # checks the input
    p, v = num_stages, ours.chunks
    local = [k for k in range(p * v) if ours.rank_of(k) == 0]
    stages = [SimpleNamespace(num_stages=p * v, group_size=p, group_rank=0, stage_index=k,
                              is_first=k == 0, is_last=k == p * v - 1, submod=torch.nn.Identity())
              for k in local]
    schedule = getattr(torch_schedules, schedule_info(name).torch_class)(stages, num_micro_batches)
    order = {}
    for rank, ops in schedule.pipeline_order.items():
        flat = []
        for action in ops:
            if action is None:
                continue
            flat.extend(str(a) for a in (action.sub_actions or (action,)))
        order[rank] = flat
    return order
