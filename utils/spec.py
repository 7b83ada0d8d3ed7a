"""`JobSpec`: everything that defines one pipeline training job, checked before launch.

A spec is plain data (it is saved as ``spec.json`` in the run directory and read back by
every rank), so a job can be reproduced from its record alone. `JobSpec.check()` turns
every mistake DeepSpeed would only report from inside N processes — or silently ignore —
into one clear error in the notebook, before any process starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .models import get_model
from .tracing import KIND_OF_INSTRUCTION

if TYPE_CHECKING:
    from .profiling import LayerProfile

SCHEDULES = ("1f1b", "gpipe")
PARTITION_METHODS = ("uniform", "parameters", "profile")
"""Partition methods by name: DeepSpeed's ``uniform`` and ``parameters``, and ``profile``
(measured per-layer cost, exact balance), which DeepSpeed names but does not implement.
DeepSpeed's ``type:REGEX`` is left out on purpose (see `JobSpec.boundaries`)."""
DEVICES = ("auto", "cpu", "cuda")
FAULT_KINDS = ("raise", "hang", "exit", "killed")
INSTRUCTIONS = tuple(KIND_OF_INSTRUCTION.values())
"""Event kinds of the instructions DeepSpeed's engine executes (where a fault can be injected)."""


@dataclass(frozen=True, kw_only=True)
class Fault:
    """A failure injected on purpose, to practise troubleshooting (and to test that the
    launcher copes): the first rank of `stage` fails when it starts `instruction` in `step`."""

    kind: str = "raise"
    """``"raise"``: an exception; ``"hang"``: sleep forever; ``"exit"``: the process dies
    (exit code 3); ``"killed"``: the process is killed by SIGKILL, as the kernel's
    out-of-memory killer does."""
    stage: int = 0
    """Pipeline stage whose first rank fails."""
    step: int = 0
    """Training step in which it fails."""
    instruction: str = "forward"
    """Instruction kind at whose start it fails (see `INSTRUCTIONS`)."""


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One real DeepSpeed pipeline job: model, parallelism, batch, schedule and limits."""

    model: str = "gpt"
    """Model preset (see `utils.models.PRESETS`): ``"gpt"``, ``"gpt-large"``, ``"mlp"``."""
    model_options: Mapping[str, int] = field(default_factory=dict)
    """Overrides of the preset's sizes, e.g. ``{"blocks": 10, "vocab": 16384}``."""
    num_stages: int = 2
    """Pipeline stages (PipelineModule ``num_stages``)."""
    data_parallel: int = 1
    """Data-parallel replicas of the whole pipeline; processes = num_stages × data_parallel."""
    micro_batches: int = 4
    """Micro-batches per step (DeepSpeed's ``gradient_accumulation_steps``)."""
    micro_batch_size: int = 4
    """Samples per micro-batch (``train_micro_batch_size_per_gpu``)."""
    train_batch_size: int | None = None
    """Optional: the global batch you intend. If given it must equal micro_batch_size ×
    micro_batches × data_parallel, which DeepSpeed asserts; None derives it."""
    partition: str | Sequence[int] = "parameters"
    """``"uniform"`` (layer count), ``"parameters"`` (DeepSpeed's default), ``"profile"``
    (measure every layer's forward + backward time on the job's device, then the exact
    min-max balance; see `utils.profiling`), or explicit boundaries ``[0, b1, ..., n_layers]``
    (stage s runs layers b_s .. b_{s+1}-1)."""
    schedule: str = "1f1b"
    """``"1f1b"``: DeepSpeed's TrainSchedule; ``"gpipe"``: all forwards, then all backwards."""
    steps: int = 3
    """Training steps (``train_batch`` calls)."""
    seed: int = 1234
    """Seeds the layers (``seed_layers=True``, ``base_seed``) and the data."""
    lr: float = 3e-3
    """Adam(W) learning rate."""
    device: str = "auto"
    """``"auto"``: CUDA + NCCL when a GPU is present, else CPU + gloo; or ``"cpu"`` / ``"cuda"``."""
    timeout: float = 300.0
    """Seconds the whole job may take; a hung job is stopped and reported after this."""
    name: str = ""
    """A short label for the run directory and plots."""
    fault: Fault | None = None
    """Inject a failure (teaching and tests); None for a normal run."""

    # --- derived -------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.num_stages * self.data_parallel

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.micro_batches * self.data_parallel

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @classmethod
    def for_this_machine(cls, **fields) -> JobSpec:
        """A spec sized for where it runs, from one code path: with at least
        num_stages × data_parallel GPUs the GPU-sized ``gpt-large`` on CUDA, else the
        CPU-sized ``gpt`` on CPU. Fields given explicitly always win, and an explicit
        ``device`` also picks the model that fits it."""
        import torch

        device = fields.get("device", "auto")
        if device == "auto":
            device = "cuda" if torch.cuda.device_count() >= cls(**fields).world_size else "cpu"
        defaults = {"model": "gpt-large" if device == "cuda" else "gpt", "device": device}
        return cls(**{**defaults, **fields})

    # --- checking ------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ValueError, saying what to change, for anything DeepSpeed would reject,
        silently ignore or hang on."""
        for name in ("num_stages", "data_parallel", "micro_batches", "micro_batch_size", "steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        model = get_model(self.model, self.model_options)
        n = model.num_layers
        if self.num_stages > n:
            raise ValueError(f"num_stages={self.num_stages} but model {self.model!r} has only {n} layers: "
                             f"every stage needs at least one layer; use num_stages <= {n} or more blocks "
                             f"(model_options={{'blocks': ...}})")
        if self.train_batch_size is not None and self.train_batch_size != self.global_batch:
            raise ValueError(
                f"train_batch_size={self.train_batch_size} but micro_batch_size × micro_batches × "
                f"data_parallel = {self.micro_batch_size} × {self.micro_batches} × {self.data_parallel} = "
                f"{self.global_batch}; DeepSpeed asserts they are equal. Change micro_batches to "
                f"{self.train_batch_size / (self.micro_batch_size * self.data_parallel):g} or drop train_batch_size")
        self._check_partition(n)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose one of {SCHEDULES} "
                             "(DeepSpeed has no config key for the schedule: it is set on the engine)")
        if self.device not in DEVICES:
            raise ValueError(f"unknown device {self.device!r}; choose one of {DEVICES}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be positive seconds, got {self.timeout!r}")
        if self.fault is not None:
            self._check_fault()

    def _check_partition(self, n_layers: int) -> None:
        if isinstance(self.partition, str):
            if self.partition not in PARTITION_METHODS:
                raise ValueError(f"unknown partition {self.partition!r}; use one of {PARTITION_METHODS} "
                                 "or explicit boundaries [0, b1, ..., n_layers]")
            return
        parts = list(self.partition)
        expected = f"[0, b1, ..., {n_layers}] with {self.num_stages + 1} strictly increasing integers"
        if len(parts) != self.num_stages + 1:
            raise ValueError(f"partition {parts} has {len(parts)} boundaries; {self.num_stages} stages need "
                             f"{expected}")
        if parts[0] != 0 or parts[-1] != n_layers:
            raise ValueError(f"partition {parts} must start at 0 and end at {n_layers} (the layer count)")
        if any(b <= a for a, b in zip(parts, parts[1:])):
            raise ValueError(f"partition {parts} must be strictly increasing: every stage needs a layer")

    def _check_fault(self) -> None:
        f = self.fault
        if f.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {f.kind!r}; choose one of {FAULT_KINDS}")
        if not 0 <= f.stage < self.num_stages:
            raise ValueError(f"fault stage {f.stage} is outside 0..{self.num_stages - 1}")
        if not 0 <= f.step < self.steps:
            raise ValueError(f"fault step {f.step} is outside 0..{self.steps - 1}")
        if f.instruction not in INSTRUCTIONS:
            raise ValueError(f"unknown fault instruction {f.instruction!r}; choose one of {INSTRUCTIONS}")

    def boundaries(self, *, profile: LayerProfile | None = None) -> list[int]:
        """The stage boundaries ``[0, b1, ..., n_layers]`` this job will use.

        They are computed here, before launch, with DeepSpeed's own algorithms, and every rank
        imposes them. Two reasons: the run record knows its partition before it starts, and
        DeepSpeed 0.19.8's ``partition_method="parameters"`` with ``seed_layers=True`` crashes
        on Python >= 3.11 (its boundaries are numpy integers, which ``random.seed`` rejects).

        ``"profile"`` partitions the job's layer profile with ``method="balanced"``
        (`LayerProfile.balanced`): the boundaries whose slowest stage is as fast as the
        measured costs allow. `profile` is that profile if the caller already has it (the
        launcher does); by default `utils.profiling.profile_for_job` measures it or reuses
        the cached one. DeepSpeed's own ``partition_method="profile"`` raises
        NotImplementedError.
        """
        from .partition import partition

        self.check()
        if not isinstance(self.partition, str):
            return [int(b) for b in self.partition]
        if self.partition == "profile":
            if profile is None:
                from .profiling import profile_for_job

                profile = profile_for_job(self)
            return profile.balanced(self.num_stages)
        params = get_model(self.model, self.model_options).param_counts()
        if self.partition == "uniform":
            return partition(params, self.num_stages, method="uniform")
        return partition(params, self.num_stages, method="parameters", params=params)

    # --- DeepSpeed config and persistence --------------------------------------------------------
    def deepspeed_config(self) -> dict[str, Any]:
        """The DeepSpeed config this job runs with. Stages, partition and schedule are *not*
        config keys (DeepSpeed silently ignores e.g. ``pipe_parallel_size``): they are
        PipelineModule arguments and engine settings."""
        return {
            "train_batch_size": self.global_batch,
            "train_micro_batch_size_per_gpu": self.micro_batch_size,
            "gradient_accumulation_steps": self.micro_batches,
            # torch's AdamW: runs on CPU and GPU alike, so both give the same numbers.
            "optimizer": {"type": "Adam", "params": {"lr": self.lr, "torch_adam": True}},
            "steps_per_print": 10**9,  # the workbook reports progress itself
            "wall_clock_breakdown": False,  # True crashes non-last stages in 0.19.8 (DESIGN.md)
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["model_options"] = dict(self.model_options)
        if not isinstance(self.partition, str):
            data["partition"] = list(self.partition)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown JobSpec field(s) {sorted(unknown)}")
        data = dict(data)
        if data.get("fault") is not None:
            data["fault"] = Fault(**data["fault"])
        return cls(**data)
