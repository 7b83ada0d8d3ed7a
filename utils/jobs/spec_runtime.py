"""Which runtime runs a job's ranks, and what each runtime cannot do: the checks of
`JobSpec`'s ``schedule``, ``chunks`` and ``runtime`` fields, next to their types.

Two runtimes run pipeline jobs (`utils.planning.catalogue.RUNTIMES`): DeepSpeed's
`PipelineEngine` (one model chunk per rank, one full backward: ``1f1b``, ``gpipe``) and
``torch.distributed.pipelining`` (every schedule of the catalogue, multi-chunk and split
backward included; `utils.runtime.torchrank`). The torch runtime runs the workbook's plain
training step — the same presets, seeding, data, AdamW and warm-up as a DeepSpeed job — but
none of DeepSpeed's machinery, so a field that asks for that machinery is refused here, before
any process starts, saying what to change.
"""

from __future__ import annotations

from typing import Literal, get_args

from utils.jobs.fault import SPLIT_BACKWARD_POINTS, Fault
from utils.planning.catalogue import schedule_info, schedules_on

RuntimeChoice = Literal["auto", "deepspeed", "torch"]
"""`JobSpec.runtime`: a runtime of the catalogue, or ``"auto"`` (the schedule's first)."""
RUNTIME_CHOICES: tuple[str, ...] = get_args(RuntimeChoice)

TORCH_FAULTS: tuple[str, ...] = ("raise", "hang", "exit", "killed", "collective", "slow", "memory")
"""Fault kinds the torch runtime injects (`utils.runtime.torchrank`); ``mismatch`` corrupts a
DeepSpeed send buffer and ``exhausted`` DeepSpeed's data iterator, which torch's runtime has not."""
TORCH_FAULT_POINTS: tuple[str, ...] = ("forward", "backward", *SPLIT_BACKWARD_POINTS)
"""Instructions a torch-runtime rank traces, and so where a fault may strike."""


def _deepspeed_only(spec) -> list[tuple[str, str]]:
    """(field, why) for every field of `spec` that only DeepSpeed's engine implements."""
    asked = []
    if spec.data_parallel != 1:
        asked.append(("data_parallel", "data parallelism is DeepSpeed's grid; the torch runtime runs one pipeline"))
    if spec.zero_stage:
        asked.append(("zero_stage", "ZeRO is DeepSpeed's optimizer"))
    if spec.precision != "fp32":
        asked.append(("precision", "bf16/fp16 are DeepSpeed's config sections; the torch runtime trains in fp32"))
    if spec.activation_checkpoint_interval:
        asked.append(("activation_checkpoint_interval", "activation checkpointing is PipelineModule's"))
    if spec.deepspeed_config:
        asked.append(("deepspeed_config", "there is no DeepSpeed config on the torch runtime"))
    for name in ("repartition_at", "freeze_at", "seq_len_at", "micro_batches_at"):
        if getattr(spec, name):
            asked.append((name, "the dynamic half rebuilds and rewires DeepSpeed engines"))
    for name in ("rebalance", "micro_batch_policy"):
        if getattr(spec, name) is not None:
            asked.append((name, "the dynamic half rebuilds and rewires DeepSpeed engines"))
    if spec.batching != "fixed":
        asked.append(("batching", "variable-length micro-batches change shape between steps, which torch's "
                                  "stages fix at their first step"))
    return asked


def check_runtime(spec, n_layers: int) -> None:
    """`spec.schedule` is in the catalogue, `spec.chunks` is a count it runs, `spec.runtime`
    runs it, and on the torch runtime nothing DeepSpeed-only is asked for and the schedule fits
    (p, m, chunks). ValueError/TypeError saying what to change."""
    from utils.jobs.spec_checks import count

    if not isinstance(spec.schedule, str):
        raise TypeError(f"schedule must be a schedule name such as '1f1b', got {spec.schedule!r}")
    info = schedule_info(spec.schedule)  # ValueError naming every schedule
    if spec.schedule != info.name:
        raise ValueError(f"schedule {spec.schedule!r}: write it as {info.name!r}")
    if spec.chunks is not None:
        count("chunks", spec.chunks)
        info.check_chunks(spec.chunks)
    if spec.runtime not in RUNTIME_CHOICES:
        raise ValueError(f"unknown runtime {spec.runtime!r}; choose one of {RUNTIME_CHOICES}")
    if spec.runtime != "auto" and not info.runs_on(spec.runtime):
        raise ValueError(f"schedule {info.name!r} does not run on the {spec.runtime} runtime (it runs on "
                         f"{', '.join(info.runtimes)}): DeepSpeed's engine runs one model chunk per rank and one full "
                         "backward; use runtime='torch' or 'auto'")
    fault = spec.fault if isinstance(spec.fault, Fault) else None  # check_fault names any other value
    if spec.resolved_runtime != "torch":
        if fault is not None and fault.instruction in SPLIT_BACKWARD_POINTS:
            raise ValueError(f"fault instruction {fault.instruction!r} is half of a split backward, which "
                             f"DeepSpeed's engine never runs: strike 'backward', or run a schedule that splits it "
                             f"({', '.join(n for n in schedules_on('torch') if schedule_info(n).split_backward != 'never')})")
        return
    asked = _deepspeed_only(spec)
    if asked:
        why = "; ".join(f"{name} ({reason})" for name, reason in asked)
        alternative = ("runtime='deepspeed'" if info.runs_on("deepspeed") else
                       f"a DeepSpeed schedule ({', '.join(schedules_on('deepspeed'))})")
        raise ValueError(f"schedule {info.name!r} runs on torch.distributed.pipelining, which does not do what "
                         f"these fields ask: {why}. Leave them at their defaults, or use {alternative}")
    if fault is not None and (fault.kind not in TORCH_FAULTS or
                              (fault.kind not in ("slow", "memory") and fault.instruction not in TORCH_FAULT_POINTS)):
        raise ValueError(f"the torch runtime injects faults of kind {TORCH_FAULTS} at the start of "
                         f"{TORCH_FAULT_POINTS}; got kind={fault.kind!r}, instruction={fault.instruction!r} "
                         "(mismatch and exhausted need DeepSpeed's engine: runtime='deepspeed' with '1f1b')")
    if n_layers < spec.virtual_stages:
        return  # JobSpec.check says so, naming the layers
    from utils.planning.schedules import build_schedule

    try:
        build_schedule(info.name, spec.num_stages, spec.micro_batches, chunks=spec.model_chunks)
    except ValueError as exc:
        raise ValueError(f"schedule {info.name!r} with num_stages={spec.num_stages}, "
                         f"micro_batches={spec.micro_batches}: {exc}") from None
