"""The one data model of the workbook: a `Timeline` of `Event`s.

A real DeepSpeed run (through the tracer), the simulator and any later source all produce
this model, so every metric and every picture works the same on measured and simulated
pipelines. An event is one executed pipeline instruction on one stage: what kind it was,
which micro-batch it served and when it started and ended, in seconds from an origin
common to all stages of the timeline.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

ComputeKind = Literal["forward", "backward", "backward_input", "backward_weight"]
"""Instruction kinds that do model computation (they count as "busy" in the bubble ratio)."""
CommKind = Literal["send_act", "recv_act", "send_grad", "recv_grad"]
"""Point-to-point communication between neighbouring stages."""
StepKind = Literal["reduce_tied_grads", "reduce_grads", "optimizer_step"]
"""Instructions that run once per step, after the pipeline has drained."""
ControlKind = Literal["repartition"]
"""Work a running job does between two steps on its own: ``"repartition"`` is the live
migration of layers (and their optimizer state) to new stages, or a restart; its event
belongs to the step it precedes and lasts as long as it really took."""
EventKind = Literal[ComputeKind, "load", CommKind, StepKind, ControlKind]
"""Every kind an event may have, in the order plots list them."""

COMPUTE_KINDS: tuple[str, ...] = get_args(ComputeKind)
COMM_KINDS: tuple[str, ...] = get_args(CommKind)
STEP_KINDS: tuple[str, ...] = get_args(StepKind)
CONTROL_KINDS: tuple[str, ...] = get_args(ControlKind)
KINDS: tuple[str, ...] = COMPUTE_KINDS + ("load",) + COMM_KINDS + STEP_KINDS + CONTROL_KINDS

InstructionKind = Literal["load", "forward", "backward", "send_act", "recv_act", "send_grad", "recv_grad",
                          "reduce_tied_grads", "reduce_grads", "optimizer_step"]
"""Event kinds of the instructions DeepSpeed's `PipelineEngine` executes."""
INSTRUCTION_KINDS: tuple[str, ...] = get_args(InstructionKind)

#: DeepSpeed instruction class name -> event kind (`utils.runtime.tracing` records these;
#: an instruction outside this table runs untraced).
KIND_OF_INSTRUCTION = {
    "LoadMicroBatch": "load",
    "ForwardPass": "forward",
    "BackwardPass": "backward",
    "SendActivation": "send_act",
    "RecvActivation": "recv_act",
    "SendGrad": "send_grad",
    "RecvGrad": "recv_grad",
    "ReduceTiedGrads": "reduce_tied_grads",
    "ReduceGrads": "reduce_grads",
    "OptimizerStep": "optimizer_step",
}

#: Short letters for compact printing (PyTorch's schedules print actions as ``1F0``).
KIND_LETTER = {
    "forward": "F",
    "backward": "B",
    "backward_input": "I",
    "backward_weight": "W",
    "load": "L",
    "send_act": "sa",
    "recv_act": "ra",
    "send_grad": "sg",
    "recv_grad": "rg",
    "reduce_tied_grads": "RT",
    "reduce_grads": "R",
    "optimizer_step": "O",
    "repartition": "RP",
}


@dataclass(frozen=True, slots=True)
class Event:
    """One executed pipeline instruction."""

    stage: int
    """Pipeline stage (one timeline row per stage)."""
    rank: int
    """Global process rank that executed it (differs from `stage` with data parallelism)."""
    step: int
    """Training step (one `train_batch` call), counted from 0."""
    kind: EventKind
    """One of `KINDS`."""
    micro_batch: int | None
    """Micro-batch served, counted from 0 within the step; None for per-step instructions."""
    start: float
    """Start time in seconds from the timeline's origin."""
    end: float
    """End time in seconds from the timeline's origin."""
    chunk: int = 0
    """Model chunk on this stage (virtual stage of interleaved schedules); 0 otherwise."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}; expected one of {KINDS}")
        if self.end < self.start:
            raise ValueError(f"event ends before it starts: {self}")

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def label(self) -> str:
        """Compact form such as ``1F0`` (stage 1, forward, micro-batch 0)."""
        mb = "" if self.micro_batch is None else str(self.micro_batch)
        return f"{self.stage}{KIND_LETTER[self.kind]}{mb}"


@dataclass(frozen=True)
class Timeline:
    """What every stage of a pipeline executed, over one or more training steps.

    `source` says where the events come from: ``"measured"`` for a real run, ``"simulated"``
    for the simulator. Metrics and plots do not care, but labels must never pass a
    simulation off as a measurement.
    """

    events: tuple[Event, ...]
    num_stages: int
    num_micro_batches: int
    source: str = "measured"
    micro_batch_size: int = 1
    """Samples per micro-batch per data-parallel replica (for throughput)."""
    data_parallel: int = 1
    """Number of data-parallel replicas; throughput counts all of them."""
    seq_len: int | None = None
    """Tokens per sample when the model is a language model (for tokens/s), else None."""
    label: str = ""
    meta: dict = field(default_factory=dict, compare=False)
    """Free-form facts about the source (schedule name, partition, device ...)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(sorted(self.events, key=_event_order)))
        bad = {e.stage for e in self.events if not 0 <= e.stage < self.num_stages}
        if bad:
            raise ValueError(f"events on stages {sorted(bad)} outside 0..{self.num_stages - 1}")

    # --- selection -------------------------------------------------------------------------
    @property
    def steps(self) -> list[int]:
        """The training steps present, in order."""
        return sorted({e.step for e in self.events})

    def select(self, *, step: int | None = None, stage: int | None = None,
               kinds: Iterable[str] | None = None, rank: int | None = None) -> list[Event]:
        """Events matching every given filter, in time order."""
        wanted = None if kinds is None else set(kinds)
        return [e for e in self.events
                if (step is None or e.step == step)
                and (stage is None or e.stage == stage)
                and (rank is None or e.rank == rank)
                and (wanted is None or e.kind in wanted)]

    def for_step(self, step: int) -> Timeline:
        """The same timeline restricted to one step."""
        return replace(self, events=tuple(self.select(step=step)))

    def compute_order(self, stage: int, step: int, *, rank: int | None = None) -> list[str]:
        """Compute actions of one stage in execution order, e.g. ``['F0', 'F1', 'B0', ...]``."""
        return [f"{KIND_LETTER[e.kind]}{e.micro_batch}"
                for e in self.select(step=step, stage=stage, kinds=COMPUTE_KINDS, rank=rank)]

    def metrics(self, step: int | None = None, **options):
        """Bubble ratio, utilisation and the rest: see `utils.analysis.metrics.compute_metrics`."""
        from utils.analysis.metrics import compute_metrics  # metrics build on the model, not the reverse

        return compute_metrics(self, step=step, **options)

    # --- persistence and export -------------------------------------------------------------
    def to_dict(self) -> dict:
        header = {k: v for k, v in asdict(self).items() if k != "events"}
        return {**header, "events": [asdict(e) for e in self.events]}

    @classmethod
    def from_dict(cls, data: dict) -> Timeline:
        data = dict(data)
        events = tuple(Event(**e) for e in data.pop("events"))
        return cls(events=events, **data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict()), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Timeline:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write a Chrome trace (Perfetto, chrome://tracing): one row per stage, times in µs.

        Each stage is a "process" named ``stage N`` and each global rank a thread inside it,
        so data-parallel replicas of a stage sit next to each other.
        """
        trace: list[dict] = []
        for stage in range(self.num_stages):
            trace.append({"ph": "M", "name": "process_name", "pid": stage, "tid": 0,
                          "args": {"name": f"stage {stage}"}})
            trace.append({"ph": "M", "name": "process_sort_index", "pid": stage, "tid": 0,
                          "args": {"sort_index": stage}})
        for stage, rank in sorted({(e.stage, e.rank) for e in self.events}):
            trace.append({"ph": "M", "name": "thread_name", "pid": stage, "tid": rank,
                          "args": {"name": f"rank {rank}"}})
        for e in self.events:
            trace.append({
                "ph": "X", "name": e.label, "cat": e.kind, "pid": e.stage, "tid": e.rank,
                "ts": e.start * 1e6, "dur": e.duration * 1e6,
                "args": {"step": e.step, "micro_batch": e.micro_batch, "kind": e.kind,
                         "chunk": e.chunk},
            })
        path = Path(path)
        payload = {"traceEvents": trace, "displayTimeUnit": "ms",
                   "otherData": {"source": self.source, "label": self.label}}
        path.write_text(json.dumps(payload), encoding="utf-8")
        return path


def _event_order(e: Event) -> tuple:
    return (e.step, e.start, e.stage, e.rank, e.end)
