"""`plan_job(spec) -> JobPlan`: everything decided about a job before any process starts.

A `JobSpec` says what a learner asked for; a `JobPlan` says what that means on this
machine, computed once: the resolved model, the device (``"auto"`` resolved), the layer
profile when one is needed or already cached, the stage boundaries and how they were
chosen, the per-stage cost the profile predicts, and notes worth showing (ranks sharing
cores). The launcher writes it to the run directory as ``plan.json``, and every rank reads
its device and boundaries from there instead of deciding again.

Boundaries are computed here, with DeepSpeed's own algorithms, rather than inside the
ranks, for two reasons: the run record knows its partition before it starts, and DeepSpeed
0.19.8's ``partition_method="parameters"`` with ``seed_layers=True`` crashes on
Python >= 3.11 (its boundaries are numpy integers, which ``random.seed`` rejects).
DeepSpeed's ``partition_method="profile"`` raises NotImplementedError; ``"profile"`` here
means the exact min-max balance of the measured per-layer costs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.jobs.config import deepspeed_config
from utils.jobs.hosts import Node, is_local_host, job_nodes
from utils.jobs.rundir import runs_dir
from utils.jobs.spec import JobSpec
from utils.planning.partitioning import partition_layers, stage_costs
from utils.profiling.profile import LayerProfile, profile_layers
from utils.system.cpu import rank_threads
from utils.system.devices import resolve_device
from utils.system.diskspace import FULL_FIX, CheckpointDiskError, existing_ancestor, free_bytes, human
from utils.workloads.models import Model, get_model
from utils.workloads.presets import is_import_path


@dataclass(frozen=True, kw_only=True)
class JobPlan:
    """What a job will run with on this machine (see the module docstring)."""

    spec: JobSpec
    model: Model
    """The resolved model preset (layer list, parameter counts)."""
    device: str
    """``"cpu"`` or ``"cuda"``: the spec's device with ``"auto"`` resolved for its rank count."""
    boundaries: tuple[int, ...]
    """Stage boundaries ``[0, b1, ..., n_layers]`` every rank imposes from step 0."""
    method: str
    """How they were chosen: ``"uniform"``, ``"parameters"``, ``"profile"`` or ``"explicit"``."""
    profile: LayerProfile | None
    """The layer profile used (``partition="profile"``) or found in the cache; else None."""
    threads: int | None
    """Torch threads per rank on CPU (`utils.system.cpu.rank_threads`); None on GPU."""
    notes: tuple[str, ...] = ()
    """Things the learner should know about this run's timings."""
    nodes: tuple[Node, ...] = ()
    """The machines the ranks run on, numbered as the launcher numbers them (`utils.jobs.hosts`);
    one ``localhost`` node for a job on this machine."""

    @property
    def predicted_stage_costs(self) -> list[float] | None:
        """Forward + backward seconds per micro-batch of each stage, from the profile."""
        return stage_costs(self.profile.total, self.boundaries) if self.profile else None

    @property
    def deepspeed_config(self) -> dict[str, Any]:
        return deepspeed_config(self.spec)

    def partition_record(self) -> dict[str, Any]:
        """The partition part of ``plan.json``: what `utils.jobs.runs.Run` reads back."""
        profile = self.profile
        return {
            "parts": list(self.boundaries),
            "method": self.method,
            "predicted_stage_costs": self.predicted_stage_costs,
            "layer_costs": profile.total if profile else None,
            "profile": None if profile is None else {
                "device": profile.device, "device_name": profile.device_name, "threads": profile.threads,
                "concurrency": profile.concurrency, "micro_batch_size": profile.micro_batch_size,
                "repeats": profile.repeats, "measured_at": profile.measured_at},
        }

    def to_record(self) -> dict[str, Any]:
        """``plan.json``: read by every rank (device, boundaries) and by `Run`."""
        record = {"device": self.device, "threads": self.threads, "notes": list(self.notes),
                  "partition": self.partition_record(), "launcher": self.spec.launcher,
                  "nodes": [{"index": n.index, "host": n.host, "ranks": list(n.ranks)} for n in self.nodes]}
        if is_import_path(self.spec.model):  # a learner's model changes under its name: `find_run` compares this
            from utils.workloads.custom import source_digest

            record["model_source"] = source_digest(self.spec.model)
        return record


def plan_job(spec: JobSpec, *, directory: str | Path | None = None) -> JobPlan:
    """Check `spec` and decide device, profile and boundaries, once.

    Raises ValueError, saying what to change, for a spec that cannot run here (a CUDA job
    with more ranks than visible GPUs, say) before any profiling starts. With
    ``partition="profile"`` this measures the layer profile unless it is cached. A
    restart-mode job whose checkpoints cannot fit on the disk of `directory` (the folder its
    run will be created in; `runs_dir()` when None) raises `CheckpointDiskError`
    (`check_checkpoint_space`).
    """
    spec.check()
    model = get_model(spec.model, spec.model_options)
    nodes = job_nodes(spec)
    # The ranks this machine runs: every loopback "node" shares it; a real node runs its slots.
    here = sum(n.slots for n in nodes if is_local_host(n.host)) or max(n.slots for n in nodes)
    device = resolve_device(spec.device, ranks=here)
    notes = []
    if device == "cuda":
        import torch

        available = torch.cuda.device_count()
        if here > available:
            raise ValueError(f"the job needs {here} GPUs on this machine (num_stages × data_parallel "
                             f"over its nodes) but {available} are visible; use fewer stages or device='cpu' "
                             "(every rank needs a GPU of its own: NCCL refuses two ranks on one GPU, "
                             "'Duplicate GPU detected', and DeepSpeed's pipeline sends go through NCCL on CUDA)")
        notes.append(PAGEABLE_LOADS_NOTE)
    elif spec.device == "auto" and _gpu_count() > 0:
        notes.append(f"device='auto' runs on CPU: {here} ranks need as many GPUs, "
                     f"{_gpu_count()} are visible")
    notes += _lint(spec, device)
    cores = len(os.sched_getaffinity(0))
    if device == "cpu" and here > cores:
        notes.append(f"{here} ranks share {cores} CPU cores: timings include contention "
                     "between stages, not only their work")
    if spec.partition == "profile":
        profile = profile_for_job(spec, device=device)
    else:
        profile = profile_for_job(spec, device=device, measure=False)  # a prediction if cached
    boundaries = tuple(plan_boundaries(spec, model, profile))
    check_checkpoint_space(spec, model, boundaries, directory)
    return JobPlan(spec=spec, model=model, device=device, profile=profile, boundaries=boundaries,
                   method=spec.partition if isinstance(spec.partition, str) else "explicit",
                   threads=rank_threads(here) if device == "cpu" else None, notes=tuple(notes), nodes=nodes)


#: Why the first and last stage of a CUDA job show more bubble than compute alone explains.
PAGEABLE_LOADS_NOTE = (
    "on CUDA, DeepSpeed copies each micro-batch to the GPU from pageable host memory "
    "(PipelineEngine._exec_load_micro_batch: x.clone().to(self.device), no pinned memory, no "
    "non_blocking): the copy blocks the host, so on the first stage (inputs) and the last (labels) "
    "it counts as bubble, not compute")


def _lint(spec: JobSpec, device: str) -> list[str]:
    """The linter's findings on the job's DeepSpeed config on `device`, as notes; its errors
    (fp16 on a CPU among them) raise ValueError before launch unless ``spec.strict`` is False.
    A job on torch's runtime has no DeepSpeed config: nothing to lint."""
    if spec.resolved_runtime != "deepspeed":
        return []
    findings = spec.lint(device=device)
    errors = [f for f in findings if f.severity == "error"]
    if errors and spec.strict:
        raise ValueError("the job's DeepSpeed config would not run as written:\n" +
                         "\n".join(f"  {f}" for f in errors) +
                         "\n(strict=False launches anyway, to see DeepSpeed's own error)")
    return [f"config {f}" for f in findings]


def check_checkpoint_space(spec: JobSpec, model: Model, boundaries: tuple[int, ...],
                           directory: str | Path | None = None) -> None:
    """Refuse before launch a restart-mode job whose checkpoints obviously do not fit on the
    disk of `directory` (`runs_dir()` when None): each move that changes the boundaries writes
    one checkpoint, which holds at least every parameter (4 bytes each in fp32, 2 in bf16/fp16,
    plus DeepSpeed's fp32 master copy) and, for Adam and the like, its two fp32 moments. A
    lower bound (no headers, no margin): the ranks check again, with a margin, before they
    save (`utils.runtime.restart.check_folder`)."""
    if spec.repartition_mode != "restart" or not spec.repartition_at:
        return
    moves, current = 0, tuple(boundaries)
    for step in sorted(spec.repartition_at):
        target = tuple(spec.repartition_at[step])
        if target != current:
            moves, current = moves + 1, target
    if not moves:
        return
    optimizer = str((deepspeed_config(spec).get("optimizer") or {}).get("type", "")).lower()
    per_param = (4 if spec.precision == "fp32" else 2 + 4) + (8 if "adam" in optimizer or "lamb" in optimizer else 0)
    params = sum(model.param_counts())
    needed = moves * params * per_param
    folder = existing_ancestor(directory if directory is not None else runs_dir())
    free = free_bytes(folder)
    if free < needed:
        raise CheckpointDiskError(
            f"磁盘空间不足，放不下重启模式的检查点：{moves} 次重启至少要写 {human(needed)}，{folder} 所在磁盘只剩 "
            f"{human(free)} (not enough disk space for the restart-mode checkpoints: {moves} restart(s) write at "
            f"least {human(needed)} — the model's {params:,} parameters at {per_param} bytes each with their "
            f"optimizer state, per checkpoint — and the disk of {folder} has {human(free)} free; nothing was "
            f"started). {FULL_FIX}", path=folder, reason="full")


def plan_boundaries(spec: JobSpec, model: Model, profile: LayerProfile | None) -> list[int]:
    """The boundaries `spec.partition` asks for: explicit ones as given; ``"uniform"`` and
    ``"parameters"`` with DeepSpeed's algorithms on the model's parameter counts;
    ``"profile"`` with the exact min-max balance of `profile` (required then). A job with
    several model chunks per rank is cut into `JobSpec.virtual_stages` pieces.
    DeepSpeed's ``type:REGEX`` is left out: the presets' layer classes make ``uniform`` and
    ``parameters`` cover what a regex would choose."""
    if not isinstance(spec.partition, str):
        return [int(b) for b in spec.partition]
    if spec.partition == "profile":
        if profile is None:
            raise ValueError("partition='profile' needs the job's layer profile")
        return profile.balanced(spec.virtual_stages)
    params = model.param_counts()
    if spec.partition == "uniform":
        return partition_layers(params, spec.virtual_stages, method="uniform")
    return partition_layers(params, spec.virtual_stages, method="parameters", params=params)


def profile_for_job(spec: JobSpec, *, device: str | None = None, cache: bool = True,
                    measure: bool = True) -> LayerProfile | None:
    """The layer profile that matches job `spec`: its model, micro-batch size, device, seed
    and, on CPU, the thread count each of its ranks gets and as many processes measuring
    at once as it has ranks (see `utils.profiling.profile.profile_layers`).

    ``measure=False`` returns the cached profile or None, and never measures (nor fails for
    a GPU job looked up on a machine without a GPU).
    """
    device = device or resolve_device(spec.device, ranks=spec.world_size)
    if device == "cuda" and not measure and _gpu_count() == 0:
        return None
    cpu = device == "cpu"
    return profile_layers(spec.model, model_options=spec.model_options, cache=cache, measure=measure,
                          micro_batch_size=spec.micro_batch_size, device=device, seed=spec.seed,
                          threads=rank_threads(spec.world_size) if cpu else None,
                          concurrency=spec.world_size if cpu else 1)


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
