"""The DeepSpeed config a job runs with, built from its `JobSpec`.

Stages, partition and schedule are *not* DeepSpeed config keys: DeepSpeed 0.19.8 silently
ignores unknown top-level keys such as ``pipe_parallel_size`` or ``schedule``. They are
`PipelineModule` arguments and engine settings, which the rank program sets from the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from utils.jobs.spec import JobSpec


def deepspeed_config(spec: JobSpec) -> dict[str, Any]:
    """The config dict passed to ``deepspeed.initialize`` for `spec`."""
    config: dict[str, Any] = {
        "train_batch_size": spec.global_batch,
        "train_micro_batch_size_per_gpu": spec.micro_batch_size,
        "gradient_accumulation_steps": spec.micro_batches,
        # torch's AdamW: runs on CPU and GPU alike, so both give the same numbers.
        "optimizer": {"type": "Adam", "params": {"lr": spec.lr, "torch_adam": True}},
        "steps_per_print": 10**9,  # the workbook reports progress itself
        "wall_clock_breakdown": False,  # True crashes non-last stages in 0.19.8 (DESIGN.md)
    }
    if spec.lr_warmup_steps:
        config["scheduler"] = {"type": "WarmupLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": spec.lr, "warmup_num_steps": spec.lr_warmup_steps,
            "warmup_type": "linear"}}
    if spec.precision != "fp32":
        config[spec.precision] = {"enabled": True}
    if spec.zero_stage:
        config["zero_optimization"] = {"stage": spec.zero_stage}
    return merged(config, spec.deepspeed_config)


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `extra`'s keys set over it, sections merged key by key (so
    ``{"optimizer": {"params": {"lr": 1e-4}}}`` changes the learning rate and keeps the rest)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
