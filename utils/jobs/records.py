"""The records a run directory holds, each with one writer and one reader.

`utils.jobs.rundir.RunDir` names the files; this module says what is in them, so that a rank
program (`utils.runtime`), the launcher's watch (`utils.jobs.launch`) and every later reader
(`utils.jobs.runs.Run`, `utils.diagnose`) share one type per record instead of a format each:

- `StatusSlot` / `SlotStatus`: the instruction a rank is executing now (``status-rank{r}``),
  compact JSON in a small memory-mapped file, read back field by field;
- `MemoryRecord`: bytes in use, by one of the `MEMORY_KINDS` (one vocabulary): a step's row
  of ``memory-rank{r}.jsonl`` and the process peak in a rank's result;
- `RankResult`: what a rank that finished writes (``result-rank{r}.json``);
- `RankEnd`, `HungRank`, `Failure`: what the launcher's watch saw when a job failed or hung
  (``status.json``'s ``failure``), the facts `utils.diagnose` reads instead of the launcher's
  prose.

Readers are tolerant: a record that is cut short, garbage, or written by an older version
reads as None (or with defaults), never as an exception somewhere unrelated.
"""

from __future__ import annotations

import json
import mmap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

STATUS_BYTES = 256
"""Size of a status slot: its JSON is cut to fit (`StatusSlot.write` shortens the detail)."""


# --- the status slot ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlotStatus:
    """What a rank's status slot says it is doing (`StatusSlot.read`)."""

    step: int | None
    """The training step (None outside one: a restart's checkpoint check)."""
    doing: str
    """The instruction (``"recv_act"``, ``"backward"`` ...) or phase (``"finished"``,
    ``"repartition"``, ``"restart"``, ``"freezing"``, an untraced instruction's class name)."""
    micro_batch: int | None = None
    chunk: int | None = None
    """The model chunk (virtual stage) of a rank that holds several; None otherwise."""
    detail: str = ""
    """Free words about the phase (``"building the new engine"``); never parsed."""
    untraced: bool = False
    """An instruction the tracer does not time (DeepSpeed's ``CommitP2P``)."""
    time: float | None = None
    """When it started (``time.time()`` of the rank's host)."""

    def describe(self) -> str:
        """The words the messages show: ``step=1 recv_grad mb=0``, ``step=2 repartition:
        building the new engine``, ``step=1 CommitP2P (untraced)``."""
        words = ([f"step={self.step}"] if self.step is not None else []) + [self.doing]
        words += [f"mb={self.micro_batch}"] if self.micro_batch is not None else []
        words += [f"chunk={self.chunk}"] if self.chunk is not None else []
        words += ["(untraced)"] if self.untraced else []
        return " ".join(words) + (f": {self.detail}" if self.detail else "")

    def age(self, now: float) -> float | None:
        """Seconds since it started, None without a time."""
        return None if self.time is None else now - self.time

    def to_dict(self) -> dict[str, Any]:
        data = {"step": self.step, "doing": self.doing, "mb": self.micro_batch, "chunk": self.chunk,
                "detail": self.detail or None, "untraced": self.untraced or None, "t": self.time}
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any) -> SlotStatus | None:
        """None for anything that is not a status (garbage, another version's slot)."""
        if not isinstance(data, dict) or not isinstance(data.get("doing"), str):
            return None
        step, mb, chunk, stamp = data.get("step"), data.get("mb"), data.get("chunk"), data.get("t")
        return cls(step=_int(step), doing=data["doing"], micro_batch=_int(mb), chunk=_int(chunk),
                   detail=str(data.get("detail") or ""), untraced=bool(data.get("untraced")),
                   time=float(stamp) if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else None)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(v for v in value if _int(v) is not None) if isinstance(value, list) else ()


class StatusSlot:
    """A small memory-mapped file holding the instruction a rank is executing now.

    Writing it costs a memory copy, no system call, so it is updated at every instruction;
    the launcher reads it when a job hangs, even while the rank is blocked inside a
    collective where no Python code runs. It holds one `SlotStatus` as compact JSON, padded
    with spaces to `STATUS_BYTES`; `read` returns it, or None for a slot that is empty (the
    rank has not started training), cut short or garbage.
    """

    def __init__(self, path: Path):
        path.write_bytes(b" " * STATUS_BYTES)
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), STATUS_BYTES)

    def write(self, *, step: int | None, doing: str, micro_batch: int | None = None, chunk: int | None = None,
              detail: str = "", untraced: bool = False) -> None:
        """Record what the rank starts now, stamped with the time."""
        status = SlotStatus(step=step, doing=doing, micro_batch=micro_batch, chunk=chunk, detail=detail,
                            untraced=untraced, time=round(time.time(), 3))
        self._map[:] = self.encode(status)

    @staticmethod
    def encode(status: SlotStatus) -> bytes:
        """`status` as the slot's bytes: exactly `STATUS_BYTES`; a detail too long is cut (…)."""
        detail = status.detail
        while True:
            data = json.dumps({**status.to_dict(), **({"detail": detail} if detail else {})},
                              separators=(",", ":")).encode()
            if len(data) <= STATUS_BYTES:
                return data.ljust(STATUS_BYTES)
            if not detail:  # only an absurdly long instruction name gets here
                return json.dumps({"step": status.step, "doing": status.doing[:STATUS_BYTES // 2],
                                   "t": status.time}, separators=(",", ":")).encode().ljust(STATUS_BYTES)
            detail = detail[:max(0, len(detail) - (len(data) - STATUS_BYTES) - 1)].rstrip() + "…" \
                if len(detail) > 1 else ""

    @staticmethod
    def decode(data: bytes) -> SlotStatus | None:
        try:
            return SlotStatus.from_dict(json.loads(data.decode().strip()))
        except (UnicodeDecodeError, ValueError):
            return None

    @staticmethod
    def read(path: Path) -> SlotStatus | None:
        """The slot's status; None when the file is missing, empty, cut short or garbage."""
        for _ in range(3):  # a read that met a write half-way is garbage: the next one is whole
            try:
                data = path.read_bytes()
            except OSError:
                return None
            if not data.strip():
                return None
            status = StatusSlot.decode(data)
            if status is not None:
                return status
        return None


# --- memory ------------------------------------------------------------------------------------------
MemoryKind = Literal["cuda_memory_allocated", "cpu_malloc_in_use", "cuda_max_memory_allocated", "cpu_max_rss",
                     "unavailable"]
MEMORY_KINDS: dict[str, str] = {
    "cuda_memory_allocated": "bytes the CUDA caching allocator handed out (torch.cuda.memory_allocated), sampled "
                             "at every instruction boundary; the peak is torch.cuda.max_memory_allocated since "
                             "the step started",
    "cpu_malloc_in_use": "bytes malloc handed out and did not take back (glibc mallinfo2), sampled at every "
                         "instruction boundary",
    "cuda_max_memory_allocated": "the process's peak of torch.cuda.max_memory_allocated over the whole run",
    "cpu_max_rss": "the process's peak resident memory over the whole run (Python, libraries and freed pages "
                   "included)",
    "unavailable": "nothing measured: no reader on this platform",
}
"""Every kind of memory figure a run records, and what it measures: one vocabulary for the
per-step rows (`utils.runtime.memory.MemoryMeter`) and the ranks' results."""


@dataclass(frozen=True)
class MemoryRecord:
    """Bytes in use, measured by `kind` (one of `MEMORY_KINDS`).

    A step's row (``step`` set; ``memory-rank{r}.jsonl``): ``base`` as the step started,
    ``after`` each traced instruction (in the order of the step's events) and the ``peak``;
    a rank's whole run (``step`` None; its result): the ``peak`` alone."""

    kind: str
    peak: int
    step: int | None = None
    base: int | None = None
    after: tuple[int, ...] = ()

    def __post_init__(self):
        if self.kind not in MEMORY_KINDS:
            raise ValueError(f"unknown memory kind {self.kind!r}; known: {sorted(MEMORY_KINDS)}")

    @property
    def added(self) -> int | None:
        """``peak - base``: what the step added on top of what it started with."""
        return None if self.base is None else self.peak - self.base

    def to_dict(self) -> dict[str, Any]:
        if self.step is None:
            return {"kind": self.kind, "peak": self.peak}
        return {"step": self.step, "kind": self.kind, "base": self.base, "peak": self.peak, "after": list(self.after)}

    @classmethod
    def from_dict(cls, data: Any) -> MemoryRecord | None:
        """None for a row that is not one (damaged, or a kind this version does not know)."""
        if not isinstance(data, dict) or data.get("kind") not in MEMORY_KINDS or _int(data.get("peak")) is None:
            return None
        after = data.get("after") or ()
        return cls(kind=data["kind"], peak=data["peak"], step=_int(data.get("step")), base=_int(data.get("base")),
                   after=tuple(int(x) for x in after) if isinstance(after, (list, tuple)) else ())


# --- a rank's result ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankResult:
    """What a rank that finished training writes (``result-rank{r}.json``; `RunDir.write_result`)."""

    rank: int
    stage: int
    replica: int = 0
    device: str | None = None
    parts: tuple[int, ...] | None = None
    """The stage boundaries its last engine was built with."""
    layers: tuple[int, int] | None = None
    """Its stage's layer range ``(first, end)`` (its first chunk's, on a rank that holds several)."""
    chunk_layers: tuple[tuple[int, int], ...] = ()
    """Each local model chunk's layer range, in chunk order, on a rank that holds several
    (a torch-runtime job of a multi-chunk schedule); empty otherwise."""
    peak_memory: MemoryRecord | None = None
    """The process's peak over the run (``cpu_max_rss`` / ``cuda_max_memory_allocated``)."""
    threads: int | None = None
    layer_fingerprints: dict[str, list[float]] = field(default_factory=dict)
    """Per local layer: (sum, sum of squares) of its final weights."""
    record_lines: dict[str, int] = field(default_factory=dict)
    """Lines it wrote to each of its JSON-lines records (`RunDir.rank_records`)."""
    comms: dict | None = None
    """DeepSpeed's comms-logger record, if the job turned it on."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know (a newer writer's), kept as they were."""

    _KNOWN = ("rank", "stage", "replica", "device", "parts", "layers", "chunk_layers", "peak_memory", "threads",
              "layer_fingerprints", "record_lines", "comms", "peak_memory_bytes", "memory_kind")

    def to_dict(self) -> dict[str, Any]:
        data = {"rank": self.rank, "stage": self.stage, "replica": self.replica, "device": self.device,
                "parts": list(self.parts) if self.parts is not None else None,
                "layers": list(self.layers) if self.layers is not None else None,
                "chunk_layers": [list(r) for r in self.chunk_layers] or None,
                "peak_memory": self.peak_memory.to_dict() if self.peak_memory is not None else None,
                "threads": self.threads, "layer_fingerprints": self.layer_fingerprints,
                "record_lines": self.record_lines, "comms": self.comms, **self.extra}
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any) -> RankResult | None:
        """None for a file that is not a result; an older result's ``peak_memory_bytes`` and
        ``memory_kind`` are read as its `peak_memory`."""
        if not isinstance(data, dict) or _int(data.get("rank")) is None or _int(data.get("stage")) is None:
            return None
        peak = MemoryRecord.from_dict(data.get("peak_memory"))
        if peak is None and _int(data.get("peak_memory_bytes")) is not None:  # written before MemoryRecord
            peak = MemoryRecord.from_dict({"kind": data.get("memory_kind"), "peak": data["peak_memory_bytes"]})
        parts, layers = data.get("parts"), data.get("layers")
        counted = data.get("record_lines")
        return cls(rank=data["rank"], stage=data["stage"], replica=_int(data.get("replica")) or 0,
                   device=data.get("device"), parts=tuple(parts) if isinstance(parts, list) else None,
                   layers=tuple(layers) if isinstance(layers, list) and len(layers) == 2 else None,
                   chunk_layers=tuple(tuple(r) for r in data.get("chunk_layers") or ()
                                      if isinstance(r, list) and len(r) == 2),
                   peak_memory=peak, threads=_int(data.get("threads")),
                   layer_fingerprints=dict(data.get("layer_fingerprints") or {}),
                   record_lines={k: v for k, v in counted.items() if _int(v) is not None}
                   if isinstance(counted, dict) else {},
                   comms=data.get("comms") if isinstance(data.get("comms"), dict) else None,
                   extra={k: v for k, v in data.items() if k not in cls._KNOWN})


# --- how a job ended, as the launcher's watch saw it ----------------------------------------------------
FailureKind = Literal["error", "died", "hang", "too-slow", "node", "launcher", "unwritable", "stopped"]


@dataclass(frozen=True)
class RankEnd:
    """A rank whose process ended without a Python error (no error record, no result) and not
    because the launcher stopped it: its exit code or signal as the launcher reported them."""

    rank: int
    stage: int
    exit_code: int | None = None
    signal: str | None = None
    """``"SIGKILL"`` ... for a negative exit code."""

    @property
    def how(self) -> str:
        """``was killed by SIGKILL (exit code -9)``, ``died with exit code 3``, ``died``."""
        if self.signal:
            return f"was killed by {self.signal}" + (f" (exit code {self.exit_code})" if self.exit_code is not None
                                                     else "")
        return f"died with exit code {self.exit_code}" if self.exit_code is not None else "died"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "stage": self.stage, "exit_code": self.exit_code, "signal": self.signal}

    @classmethod
    def from_dict(cls, data: Any) -> RankEnd | None:
        if not isinstance(data, dict) or _int(data.get("rank")) is None or _int(data.get("stage")) is None:
            return None
        sig = data.get("signal")
        return cls(rank=data["rank"], stage=data["stage"], exit_code=_int(data.get("exit_code")),
                   signal=sig if isinstance(sig, str) else None)


@dataclass(frozen=True)
class HungRank:
    """One rank of a job that stopped making progress, as the watch saw it before stopping it."""

    rank: int
    stage: int
    status: SlotStatus | None
    """Its status slot (None: it never started training)."""
    steps_done: int = 0
    process_state: str | None = None
    """psutil's state of its process (``"stopped"``: SIGSTOP, a debugger, ^Z); None when gone."""
    stacks: str | None = None
    """The name of the file its Python stacks were saved in, None when it did not answer."""

    @property
    def stopped(self) -> bool:
        return self.process_state == "stopped"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "stage": self.stage,
                "status": self.status.to_dict() if self.status is not None else None,
                "steps_done": self.steps_done, "process_state": self.process_state, "stacks": self.stacks}

    @classmethod
    def from_dict(cls, data: Any) -> HungRank | None:
        if not isinstance(data, dict) or _int(data.get("rank")) is None or _int(data.get("stage")) is None:
            return None
        state, stacks = data.get("process_state"), data.get("stacks")
        return cls(rank=data["rank"], stage=data["stage"], status=SlotStatus.from_dict(data.get("status")),
                   steps_done=_int(data.get("steps_done")) or 0,
                   process_state=state if isinstance(state, str) else None,
                   stacks=stacks if isinstance(stacks, str) else None)


@dataclass(frozen=True)
class Failure:
    """Why the launcher's watch ended a job that did not succeed, as facts (``status.json``'s
    ``failure``; `RunDir.failure`). The job's ``error`` is the same told in words, for people.

    ``kind``: ``"error"`` (a rank raised: `rank` is the first), ``"died"`` (a rank ended
    without a Python error: `died`), ``"hang"`` (no progress within the timeout, or a rank's
    process stayed stopped: `ranks`), ``"too-slow"`` (the timeout ended a job still making
    progress), ``"node"`` (a node lost or never joined), ``"launcher"`` (the launcher was
    killed, or exited without a rank to blame), ``"unwritable"`` (the run directory),
    ``"stopped"`` (by the user or the process that started it)."""

    kind: str
    rank: int | None = None
    """The rank that failed first (``"error"``, ``"died"``)."""
    stage: int | None = None
    died: RankEnd | None = None
    also: tuple[int, ...] = ()
    """Ranks that failed after it (their errors, usually consequences)."""
    ranks: tuple[HungRank, ...] = ()
    """``"hang"``: every rank, as the watch saw it."""
    frozen: tuple[int, ...] = ()
    """``"hang"``: ranks whose process stayed stopped, which ended the job before its timeout."""
    exit_code: int | None = None
    """``"launcher"``: the launcher's own exit code."""
    time: float | None = None
    """When the watch decided."""

    @property
    def stopped_ranks(self) -> list[int]:
        """``"hang"``: the ranks whose process was stopped (SIGSTOP) when the watch looked."""
        return sorted({*self.frozen, *(h.rank for h in self.ranks if h.stopped)})

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "stage": self.stage,
                "died": self.died.to_dict() if self.died is not None else None, "also": list(self.also),
                "ranks": [h.to_dict() for h in self.ranks], "frozen": list(self.frozen),
                "exit_code": self.exit_code, "time": self.time}

    @classmethod
    def from_dict(cls, data: Any) -> Failure | None:
        """None when there is none (a run recorded before this field, or a damaged one)."""
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            return None
        raw = data.get("ranks")
        ranks = [HungRank.from_dict(h) for h in raw] if isinstance(raw, list) else []
        stamp = data.get("time")
        return cls(kind=data["kind"], rank=_int(data.get("rank")), stage=_int(data.get("stage")),
                   died=RankEnd.from_dict(data.get("died")), also=_ints(data.get("also")),
                   ranks=tuple(h for h in ranks if h is not None), frozen=_ints(data.get("frozen")),
                   exit_code=_int(data.get("exit_code")),
                   time=float(stamp) if isinstance(stamp, (int, float)) else None)
