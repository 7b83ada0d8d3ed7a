"""`Fault`: a failure injected into one rank of a job on purpose, to practise troubleshooting
and to test that the launcher copes; `check_fault` validates one against its job.
`utils.runtime.faults` makes them happen inside the rank."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from utils.jobs.spec_checks import count
from utils.timeline import INSTRUCTION_KINDS, InstructionKind

FaultKind = Literal["raise", "hang", "exit", "killed", "collective", "slow", "mismatch", "memory", "exhausted"]
MismatchKind = Literal["shape", "dtype"]

FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
MISMATCH_KINDS: tuple[str, ...] = get_args(MismatchKind)
SPLIT_BACKWARD_POINTS: tuple[str, ...] = ("backward_input", "backward_weight")
"""The halves of a split backward: where a fault may strike in a torch-runtime job of a schedule
that splits it (`utils.jobs.spec_runtime`); a DeepSpeed job runs neither."""
FAULT_POINTS: tuple[str, ...] = (*INSTRUCTION_KINDS, *SPLIT_BACKWARD_POINTS, "repartition")
"""Where a `Fault` may strike: at the start of an instruction, or inside a live re-partition."""


@dataclass(frozen=True, kw_only=True)
class Fault:
    """A failure injected on purpose, to practise troubleshooting (and to test that the
    launcher copes), on one rank: replica `replica` of `stage` (rank = stage × data_parallel
    + replica). ``Fault(kind="slow", stage=2, factor=3.0)``: a straggler for the whole run;
    ``Fault(kind="mismatch", stage=0, step=1)``: stage 0 sends an activation of the wrong
    shape; ``Fault(kind="memory", stage=0, cap_mb=40)``: stage 0 runs out of memory once it
    needs 40 MB more than it held as step 0 started (`utils.runtime.faults` makes them)."""

    kind: FaultKind = "raise"
    """``"raise"``: an exception; ``"hang"``: sleep forever; ``"exit"``: the process dies
    (exit code 3); ``"killed"``: the process is killed by SIGKILL, as the kernel's
    out-of-memory killer does; ``"collective"``: the rank alone enters an all-reduce over
    every rank (as a metric reduced on rank 0 only would), which the others never join: a
    real deadlock, since they wait for it in their receives. These five strike as
    `instruction` starts in `step`.
    ``"slow"``: a straggler: every forward and backward of the rank takes `factor` times as
    long, from `step` on. ``"mismatch"``: at `step` the rank sends a tensor of the wrong
    `tensor` (shape or dtype) to its neighbour, which fails with DeepSpeed's or torch's own
    error. ``"memory"``: from the start of `step` the rank may allocate at most `cap_mb` MB
    more (on CPU a limit on its address space, on CUDA a memory fraction): a bigger
    allocation fails with the allocator's out-of-memory error, never the machine's.
    ``"exhausted"``: the rank's data loader runs out as `step` starts, as a finite loader
    not wrapped in DeepSpeed's ``RepeatingLoader`` does: DeepSpeed's own ``next()`` in
    ``PipelineEngine._next_batch`` raises ``StopIteration`` out of ``train_batch``. Only the
    first stage (inputs) and the last (labels) load data."""
    stage: int = 0
    """Pipeline stage of the rank that fails."""
    step: int = 0
    """Training step in which it fails (``"slow"``, ``"memory"``: from which it applies)."""
    instruction: InstructionKind | Literal["backward_input", "backward_weight", "repartition"] = "forward"
    """Instruction kind at whose start it fails (see `utils.timeline.INSTRUCTION_KINDS`), or
    ``"repartition"``: in the middle of the live re-partition before `step` (after the new
    engine is built, before the layers' state has moved), which must then be a step of
    `JobSpec.repartition_at`. ``"mismatch"``: ``"forward"`` corrupts the activation the
    stage sends on, ``"backward"`` the gradient it sends back. ``"slow"`` and ``"memory"``
    take no instruction (leave the default)."""
    replica: int = 0
    """Which data-parallel replica of `stage` (0 .. data_parallel - 1): one slow rank among
    the PP × DP ranks."""
    factor: float | None = None
    """``"slow"`` only: how many times as long its forwards and backwards take (> 1; None: 3)."""
    tensor: MismatchKind | None = None
    """``"mismatch"`` only: ``"shape"`` (one sequence position more; None means this) or
    ``"dtype"`` (float64 instead of the model's float type)."""
    cap_mb: float | None = None
    """``"memory"`` only, required: MB the rank may allocate beyond what it holds as `step`
    starts."""

    @property
    def slowdown(self) -> float:
        """The factor a ``"slow"`` fault applies (`factor`, 3.0 when not given)."""
        return 3.0 if self.factor is None else float(self.factor)


def check_fault(spec) -> None:
    """The injected `Fault`: a known kind on a rank, step and instruction of this job, with
    only the options of its kind (`JobSpec.check` calls it)."""
    f = spec.fault
    if not isinstance(f, Fault):
        raise TypeError(f"fault must be a utils.Fault(...) or None, got {f!r}")
    if f.kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {f.kind!r}; choose one of {FAULT_KINDS}")
    count("fault.stage", f.stage, minimum=0)
    count("fault.step", f.step, minimum=0)
    if not 0 <= f.stage < spec.num_stages:
        raise ValueError(f"fault stage {f.stage} is outside 0..{spec.num_stages - 1}")
    if not 0 <= f.step < spec.steps:
        raise ValueError(f"fault step {f.step} is outside 0..{spec.steps - 1}")
    if f.instruction not in FAULT_POINTS:
        raise ValueError(f"unknown fault instruction {f.instruction!r}; choose one of {FAULT_POINTS}")
    if f.instruction == "repartition" and (f.step not in spec.repartition_at or spec.repartition_mode != "live"):
        raise ValueError(f"a fault in 'repartition' at step {f.step} needs a live re-partition at that step: "
                         f"add repartition_at={{{f.step}: [...]}} (steps given: {sorted(spec.repartition_at)})")
    count("fault.replica", f.replica, minimum=0)
    if f.replica >= spec.data_parallel:
        raise ValueError(f"fault replica {f.replica} is outside 0..{spec.data_parallel - 1} "
                         f"(data_parallel={spec.data_parallel})")
    for name, kind in (("factor", "slow"), ("tensor", "mismatch"), ("cap_mb", "memory")):
        if getattr(f, name) is not None and f.kind != kind:
            raise ValueError(f"fault {name} is for kind={kind!r} only; this fault is kind={f.kind!r}")
    if f.kind in ("slow", "memory", "mismatch", "exhausted") and f.instruction not in (
            ("forward", "backward") if f.kind == "mismatch" else ("forward",)):
        raise ValueError(f"a {f.kind!r} fault takes " + ("instruction 'forward' (the activation it sends) or "
                         "'backward' (the gradient it sends back)" if f.kind == "mismatch" else
                         "no instruction (it applies to every one): leave instruction out")
                         + f", got {f.instruction!r}")
    def number(value) -> bool:
        return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)

    if f.kind == "slow" and f.factor is not None and not (number(f.factor) and f.factor > 1):
        raise ValueError(f"a slow fault's factor must be a number > 1 (3.0: three times as long), got {f.factor!r}")
    if f.kind == "mismatch":
        if f.tensor not in (None, *MISMATCH_KINDS):
            raise ValueError(f"a mismatch fault's tensor is one of {MISMATCH_KINDS}, got {f.tensor!r}")
        if spec.num_stages < 2 or f.stage == (spec.num_stages - 1 if f.instruction == "forward" else 0):
            raise ValueError(f"stage {f.stage} sends no {'activation on' if f.instruction == 'forward' else 'gradient back'}"
                             f" ({spec.num_stages} stage(s)): a mismatch fault needs a neighbour to receive it; use "
                             + ("a stage before the last" if f.instruction == "forward" else "a stage after the first"))
    if f.kind == "collective" and spec.world_size < 2:
        raise ValueError("a collective fault needs another rank that does not join it: use 2 or more stages "
                         "(or data_parallel >= 2)")
    if f.kind == "exhausted" and f.stage not in (0, spec.num_stages - 1):
        raise ValueError(f"stage {f.stage} loads no data (the first stage loads the inputs, the last the labels): "
                         f"an exhausted-loader fault needs stage 0 or {spec.num_stages - 1}")
    if f.kind == "memory" and not (number(f.cap_mb) and f.cap_mb > 0):
        raise ValueError(f"a memory fault needs cap_mb, the MB its rank may allocate from step {f.step} on "
                         f"(a positive number such as 40), got {f.cap_mb!r}")
