"""One rank of a real ``torch.distributed.pipelining`` run, traced into the workbook's events.

DeepSpeed's engine runs one model chunk per rank and one full backward, so interleaved,
zero-bubble and DualPipeV schedules cannot run on it (`utils.runtime.lowering` refuses
them). torch's pipelining runs them on CPU/gloo; this module is the program each rank runs
for `utils.jobs.torchpipe.run_torch_pipeline` (which starts, watches and ends the ranks):

    python -m utils.runtime.torchpipe CONFIG.json OUT_DIR      # env RANK, WORLD_SIZE, MASTER_*

For every schedule in the config, in turn and in the same processes, a rank builds the same
small model (``layers`` blocks of Linear(hidden, hidden) + Tanh, seeded, so every schedule
starts from the same weights and sees the same data), cuts it into ``ranks * chunks``
virtual stages placed as `utils.planning.schedules.Schedule.rank_of` says, wraps its
``PipelineStage`` objects so that every ``forward_one_chunk`` / ``backward_one_chunk`` /
``backward_weight_one_chunk`` is timed (host monotonic clock, shared by all processes of the
machine), and runs ``steps`` training steps (SGD). Receives are waited for *before* those
calls, so the recorded intervals are compute only; time spent waiting shows as idle.

It writes ``OUT_DIR/events-rank{r}.json`` at the end, or ``OUT_DIR/error-rank{r}.txt`` and
exits 1. It exits as soon as its parent (the notebook) is gone.

`torch_schedule_order` gives torch's own per-rank order of a multi-chunk schedule without
any process, to compare with `utils.planning.schedules.build_schedule`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

from utils.planning.catalogue import schedule_info, schedules_on
from utils.planning.schedules import build_schedule
from utils.system.cpu import prepare_cpu_rank

__all__ = ["torch_schedule_order", "main"]


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


# --- the rank program -------------------------------------------------------------------------
def _exit_with_parent() -> None:
    """End this process when its parent (the notebook that started it) is gone."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.25)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _model(config: dict, num_virtual: int):
    """The seeded model, cut into `num_virtual` equal chunks (same weights for every schedule)."""
    import torch

    torch.manual_seed(config["seed"])
    hidden, layers = config["hidden"], config["layers"]
    blocks = [torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.Tanh()) for _ in range(layers)]
    per = layers // num_virtual
    return [torch.nn.Sequential(*blocks[k * per:(k + 1) * per]) for k in range(num_virtual)]


def _traced(stage, virtual_stage: int, chunk: int, record: list) -> None:
    """Time the stage's compute calls; each record is [kind, micro-batch, virtual stage,
    chunk, start, end] (host monotonic seconds)."""
    clock = time.perf_counter
    forward, backward, weight = (stage.forward_one_chunk, stage.backward_one_chunk,
                                 stage.backward_weight_one_chunk)

    def forward_one_chunk(fwd_chunk_id, *args, **kwargs):
        start = clock()
        out = forward(fwd_chunk_id, *args, **kwargs)
        record.append(["forward", fwd_chunk_id, virtual_stage, chunk, start, clock()])
        return out

    def backward_one_chunk(bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        start = clock()
        out = backward(bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward)
        kind = "backward" if full_backward else "backward_input"
        record.append([kind, bwd_chunk_id, virtual_stage, chunk, start, clock()])
        return out

    def backward_weight_one_chunk(bwd_chunk_id, last_backward=False):
        start = clock()
        out = weight(bwd_chunk_id, last_backward=last_backward)
        record.append(["backward_weight", bwd_chunk_id, virtual_stage, chunk, start, clock()])
        return out

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def _run_schedule(name: str, config: dict, rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining

    m = config["micro_batches"]
    info = schedule_info(name)
    plan = build_schedule(name, world, m, chunks=info.chunks_for(config["chunks"]))
    vs = plan.num_virtual_stages
    chunks = _model(config, vs)
    mine = [k for k in range(vs) if plan.rank_of(k) == rank]  # local chunk order: 0, 1, ...
    record: list = []
    stages = []
    for k in mine:
        stage = pipelining.PipelineStage(chunks[k], k, vs, torch.device("cpu"))
        _traced(stage, k, k // world, record)
        stages.append(stage)
    params = [q for k in mine for q in chunks[k].parameters()]
    optimizer = torch.optim.SGD(params, lr=config["lr"])
    cls = getattr(pipelining, info.torch_class)

    def loss_fn(output, target):
        return torch.nn.functional.mse_loss(output, target)

    schedule = cls(stages if info.torch_multi_stage else stages[0], m, loss_fn=loss_fn)
    generator = torch.Generator().manual_seed(config["seed"] + 1)
    batch = m * config["micro_batch_size"]
    x = torch.randn(batch, config["hidden"], generator=generator)
    y = torch.randn(batch, config["hidden"], generator=generator)
    first, last = 0 in mine, vs - 1 in mine
    events, losses = [], []
    for step in range(config["steps"]):
        if rank == config.get("fault_rank"):
            raise RuntimeError(f"injected fault on rank {rank} before step {step} of {name}")
        optimizer.zero_grad()
        record.clear()
        dist.barrier()
        step_losses: list = []
        kwargs = {"target": y, "losses": step_losses} if last else {}
        schedule.step(*((x,) if first else ()), **kwargs)
        optimizer.step()
        events.extend([step, *r] for r in record)
        if last:
            losses.append(float(torch.stack(step_losses).mean()))
    return {"events": events, "losses": losses if last else None, "virtual_stages": mine,
            "torch_class": info.torch_class, "placement": plan.placement, "chunks": plan.chunks}


def main() -> None:
    _exit_with_parent()
    config_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        prepare_cpu_rank()  # OMP_NUM_THREADS torch threads, the profiler's allocator settings
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=config["pg_timeout"]))
        result = {"rank": rank, "threads": torch.get_num_threads(), "schedules": {}}
        for name in config["schedules"]:
            result["schedules"][name] = _run_schedule(name, config, rank, world)
        dist.barrier()
        dist.destroy_process_group()
        tmp = out / f".events-rank{rank}.json.tmp"
        tmp.write_text(json.dumps(result), encoding="utf-8")
        tmp.replace(out / f"events-rank{rank}.json")
    except BaseException:  # noqa: BLE001 - report everything, then fail fast so peers are ended
        (out / f"error-rank{rank}.txt").write_text(traceback.format_exc(), encoding="utf-8")
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
