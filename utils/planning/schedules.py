"""Pipeline schedules as plain data: which compute action every rank runs, in which order.

A schedule is only an *order*. How long anything takes is the simulator's business
(`utils.simulate`); what DeepSpeed's engine executes is the tracer's. Keeping the order as
data lets a learner print it, check it (`Schedule.validate`), count the activations it keeps
alive (`Schedule.in_flight`) and hand it to the simulator, in the style of PyTorch's
``torch/distributed/pipelining/schedules.py``.

Vocabulary (the one thing to get right with interleaved schedules):

* **rank**: a pipeline process / GPU; one row of a timeline. ``Schedule.num_stages`` counts
  ranks, and ``Schedule.actions[rank]`` is that rank's order.
* **virtual stage** (``Action.virtual_stage``): one model chunk, numbered along the model
  ``0 .. num_stages * chunks - 1``. Virtual stage ``k`` is local chunk ``k // num_stages`` of
  rank ``k % num_stages`` (Megatron's and torch's "loop" placement), or, with
  ``placement="v"`` (DualPipeV, two chunks), of rank ``k`` for ``k < p`` and ``2p - 1 - k``
  after (`utils.planning.vshaped`). Without interleaving (``chunks == 1``) virtual stage,
  rank and pipeline stage are the same number.
* **chunk** (``Action.chunk``): the local chunk index on the rank, ``stage // num_stages``.

Action strings follow torch: ``"<virtual stage><letter><micro-batch>"`` with F = forward,
B = full backward, I = backward for inputs, W = backward for weights, e.g. ``"1F0"``,
``"2B3"``, ``"0I1"``, ``"0W1"``. The zero-bubble paper (Qi et al., 2023) writes the
input-gradient pass as *B*; we print it as ``I`` (as torch and `utils.timeline` do) so every
string parses back to exactly one action.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Literal

from utils import validation
from utils.planning import vshaped
from utils.planning.catalogue import SCHEDULE_NAMES, schedule_info

from utils.timeline import COMPUTE_KINDS, KIND_LETTER, ComputeKind

__all__ = ["Action", "SCHEDULE_NAMES", "Schedule", "ScheduleName", "build_schedule", "parse_action"]

ScheduleName = Literal[SCHEDULE_NAMES]  # type: ignore[valid-type]  # the catalogue's names
"""Schedule names `build_schedule` knows: those of `utils.planning.catalogue`."""

_LETTER_KIND = {KIND_LETTER[k]: k for k in COMPUTE_KINDS}  # F, B, I, W
_ACTION_RE = re.compile(r"^\s*(\d+)\s*([FBIW])\s*(\d+)\s*$")


@dataclass(frozen=True, slots=True)
class Action:
    """One compute action: `kind` of micro-batch `micro_batch` on `virtual_stage`.

    Named ``virtual_stage``, not ``stage``, because `utils.timeline.Event.stage` is a
    pipeline stage (a rank's row): the two differ with interleaving. `chunk` is the local
    index on its rank (``virtual_stage // num_stages``), 0 without interleaving. The rank is
    not stored: it is ``virtual_stage % num_stages`` and only a `Schedule` knows
    ``num_stages``.
    """

    virtual_stage: int
    """Model chunk along the model; equal to the rank without interleaving."""
    kind: ComputeKind
    micro_batch: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in COMPUTE_KINDS:
            raise ValueError(f"unknown action kind {self.kind!r}; expected one of {COMPUTE_KINDS}")
        if min(self.virtual_stage, self.micro_batch, self.chunk) < 0:
            raise ValueError(f"negative index in {self!r}")

    def __str__(self) -> str:
        return f"{self.virtual_stage}{KIND_LETTER[self.kind]}{self.micro_batch}"


def parse_action(text: str, *, num_stages: int | None = None) -> Action:
    """``"1F0"`` -> ``Action(1, "forward", 0)``; letters F, B, I, W as in `Action.__str__`.

    Give `num_stages` (ranks) to fill `chunk` for interleaved schedules.
    """
    match = _ACTION_RE.match(text)
    if not match:
        raise ValueError(f"cannot parse action {text!r}; expected e.g. '1F0', '2B3', '0I1', '0W1'")
    stage, letter, mb = int(match[1]), match[2], int(match[3])
    chunk = stage // num_stages if num_stages else 0
    return Action(stage, _LETTER_KIND[letter], mb, chunk)


def rank_of_stage(placement: str, num_stages: int, virtual_stage: int) -> int:
    """The rank holding `virtual_stage` in `placement`: ``k % p`` ("loop"), or the V ("v")."""
    if placement == "v":
        return vshaped.v_rank(virtual_stage, num_stages)
    return virtual_stage % num_stages


def virtual_stage_of(placement: str, num_stages: int, rank: int, chunk: int) -> int:
    """The virtual stage a rank's local `chunk` holds: ``chunk * p + rank`` in the loop
    placement; in the V (`utils.planning.vshaped`) chunk 0 is stage ``rank`` and chunk 1 stage
    ``2p - 1 - rank``. The inverse of `Schedule.rank_of` with the chunk."""
    p = num_stages
    if placement == "v":
        if chunk not in (0, 1):
            raise ValueError(f"the V placement holds two chunks per rank (0, 1), not chunk {chunk}")
        return rank if chunk == 0 else 2 * p - 1 - rank
    return chunk * p + rank


@dataclass(frozen=True)
class _Plan:
    """A validated schedule flattened to indices, for fast repeated timing."""

    actions: tuple[Action, ...]
    rank: tuple[int, ...]
    dep1: tuple[int, ...]  # index of the first input's producer, -1 if none
    dep2: tuple[int, ...]  # index of the second input's producer, -1 if none
    order: tuple[int, ...]  # a topological order consistent with every rank's order

    def times(self, durations: Sequence[float], comm: float = 0.0,
              num_ranks: int | None = None) -> tuple[list[float], list[float]]:
        """Start and end of every action when each starts as soon as its rank is free and
        its inputs have arrived (`comm` seconds after the producer ended, if on another rank)."""
        n = len(self.actions)
        start, end = [0.0] * n, [0.0] * n
        free = [0.0] * (num_ranks or (max(self.rank) + 1))
        rank, dep1, dep2 = self.rank, self.dep1, self.dep2
        for i in self.order:
            r = rank[i]
            s = free[r]
            j = dep1[i]
            if j >= 0:
                t = end[j] + comm if rank[j] != r else end[j]
                if t > s:
                    s = t
                j = dep2[i]
                if j >= 0:
                    t = end[j] + comm if rank[j] != r else end[j]
                    if t > s:
                        s = t
            e = s + durations[i]
            start[i], end[i], free[r] = s, e, e
        return start, end


@dataclass(frozen=True, repr=False)
class Schedule:
    """Per-rank execution order of compute actions for one training step.

    `actions[r]` is what rank ``r`` runs, in order. `num_stages` counts ranks (physical
    pipeline stages); `chunks` is the number of model chunks per rank (virtual stages per
    rank, > 1 for interleaved schedules and DualPipeV), so the model has ``num_stages * chunks``
    virtual stages, placed on ranks by `placement` (``"loop"`` or ``"v"``, see `rank_of`).
    """

    name: str
    num_stages: int
    num_micro_batches: int
    chunks: int
    actions: tuple[tuple[Action, ...], ...]
    placement: str = "loop"

    def rank_of(self, virtual_stage: int) -> int:
        """The rank holding `virtual_stage`: ``k % p`` ("loop"), or the V of DualPipeV ("v")."""
        return rank_of_stage(self.placement, self.num_stages, virtual_stage)

    def virtual_stage(self, rank: int, chunk: int) -> int:
        """The virtual stage of `rank`'s local `chunk` (0, 1, ...; an `Event`'s ``chunk``)."""
        return virtual_stage_of(self.placement, self.num_stages, rank, chunk)

    # --- structure -------------------------------------------------------------------------
    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages * self.chunks

    @cached_property
    def split_backward(self) -> bool:
        """True when the backward is split into input (I) and weight (W) gradient passes."""
        return any(a.kind == "backward_weight" for row in self.actions for a in row)

    @classmethod
    def from_strings(cls, rows: Sequence[Sequence[str] | str], *, name: str = "custom",
                     chunks: int = 1, num_micro_batches: int | None = None,
                     placement: str = "loop") -> Schedule:
        """Build a schedule from per-rank action strings, e.g. ``[["0F0", "0B0"], ...]``
        or ``["0F0 0B0", "1F0 1B0"]``; handy for hand-written schedules in a lab."""
        p = len(rows)
        parsed = tuple(tuple(parse_action(t, num_stages=p)
                             for t in (row.split() if isinstance(row, str) else row))
                       for row in rows)
        if num_micro_batches is None:
            num_micro_batches = 1 + max((a.micro_batch for row in parsed for a in row), default=0)
        return cls(name, p, num_micro_batches, chunks, parsed, placement)

    # --- checking --------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError unless the schedule is complete, well placed and deadlock-free.

        Complete: every virtual stage runs each micro-batch exactly once forward and either
        one full backward (B) or one input-gradient (I) plus one weight-gradient (W) pass.
        Placed: an action sits on rank `rank_of` its virtual stage. Deadlock-free: running every
        rank's list in order with zero costs, every action eventually finds its inputs ready
        (forward needs the previous virtual stage's forward; backward needs its own forward
        and the next virtual stage's backward; W needs its own I).
        """
        self._plan  # noqa: B018 - building the plan is the check (and caches it)

    @cached_property
    def _plan(self) -> _Plan:
        p, m, v = self.num_stages, self.num_micro_batches, self.chunks
        if p < 1 or m < 1 or v < 1:
            raise ValueError(f"schedule {self.name!r}: num_stages, num_micro_batches and chunks "
                             f"must be >= 1, got {p}, {m}, {v}")
        if self.placement not in ("loop", "v") or (self.placement == "v" and v != 2):
            raise ValueError(f"schedule {self.name!r}: placement must be 'loop', or 'v' with "
                             f"chunks=2; got {self.placement!r} with chunks={v}")
        if len(self.actions) != p:
            raise ValueError(f"schedule {self.name!r} lists {len(self.actions)} ranks, "
                             f"num_stages is {p}")
        vs = p * v
        size = vs * m  # actions are looked up in flat tables at (kind code * vs + stage) * m + mb
        F, B, I, W = (c * size for c in range(4))  # noqa: E741 - the letters of the kinds
        code = {"forward": F, "backward": B, "backward_input": I, "backward_weight": W}
        where = [-1] * (4 * size)
        flat: list[Action] = []
        rank: list[int] = []
        problems: list[str] = []
        for r, row in enumerate(self.actions):
            for a in row:
                k, mb = a.virtual_stage, a.micro_batch
                if k >= vs or mb >= m:
                    problems.append(f"rank {r}: {a} is outside {vs} virtual stages x {m} "
                                    "micro-batches")
                    continue
                if self.rank_of(k) != r or a.chunk != k // p:
                    problems.append(f"rank {r}: {a} (chunk {a.chunk}) belongs on rank {self.rank_of(k)} "
                                    f"as chunk {k // p}")
                slot = code[a.kind] + k * m + mb
                if where[slot] >= 0:
                    problems.append(f"rank {r}: {a} appears twice")
                where[slot] = len(flat)
                flat.append(a)
                rank.append(r)
        for slot in range(size):
            has_b, has_i, has_w = where[B + slot] >= 0, where[I + slot] >= 0, where[W + slot] >= 0
            need = [F] + ([B] if has_b or not (has_i or has_w) else [I, W])
            missing = [c for c in need if where[c + slot] < 0]
            if missing or (has_b and (has_i or has_w)):
                k, mb = divmod(slot, m)
                for c in missing:
                    kind = COMPUTE_KINDS[c // size]
                    problems.append(f"virtual stage {k}, micro-batch {mb}: missing {kind} "
                                    f"({k}{KIND_LETTER[kind]}{mb})")
                if has_b and (has_i or has_w):
                    problems.append(f"virtual stage {k}, micro-batch {mb}: has both a full "
                                    "backward (B) and split backward passes (I/W)")
        if problems:
            more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
            raise ValueError(f"schedule {self.name!r} is invalid: " + "; ".join(problems[:8]) + more)

        # dependencies (see `validate`): forward <- previous forward; W <- own I;
        # B/I <- own F and the next virtual stage's B (or I when that one is split).
        # Stored as two flat arrays (-1 = none): first dependency, second dependency.
        n = len(flat)
        dep1, dep2 = [-1] * n, [-1] * n
        for i, a in enumerate(flat):
            kind, slot = a.kind, a.virtual_stage * m + a.micro_batch
            if kind == "forward":
                if a.virtual_stage > 0:
                    dep1[i] = where[F + slot - m]
            elif kind == "backward_weight":
                dep1[i] = where[I + slot]
            else:
                dep1[i] = where[F + slot]
                if a.virtual_stage + 1 < vs:
                    nxt = where[B + slot + m]
                    dep2[i] = nxt if nxt >= 0 else where[I + slot + m]
        order = self._ready_order(flat, rank, dep1, dep2)
        return _Plan(tuple(flat), tuple(rank), tuple(dep1), tuple(dep2), order)

    def _ready_order(self, flat, rank, dep1, dep2) -> tuple[int, ...]:
        """Run every rank's list with zero costs; the completion order, or a deadlock error."""
        bounds, n = [], 0
        for row in self.actions:
            bounds.append((n, n + len(row)))
            n += len(row)
        pos = [lo for lo, _ in bounds]
        done = bytearray(len(flat))
        waiting: dict[int, list[int]] = {}
        blocked_on: dict[int, int] = {}
        order: list[int] = []
        todo = list(range(self.num_stages))
        while todo:
            r = todo.pop()
            i, stop = pos[r], bounds[r][1]
            while i < stop:
                missing = dep1[i]
                if missing < 0 or done[missing]:
                    missing = dep2[i]
                    if missing >= 0 and done[missing]:
                        missing = -1
                if missing >= 0:
                    waiting.setdefault(missing, []).append(r)
                    blocked_on[r] = missing
                    break
                done[i] = 1
                order.append(i)
                if i in waiting:
                    todo.extend(waiting.pop(i))
                i += 1
            pos[r] = i
        if len(order) < len(flat):
            stuck = [f"rank {r} waits at {flat[pos[r]]} for {flat[blocked_on[r]]}"
                     + (" (later on the same rank)" if rank[blocked_on[r]] == r else "")
                     for r in range(self.num_stages) if pos[r] < bounds[r][1]]
            raise ValueError(f"schedule {self.name!r} deadlocks: " + "; ".join(stuck))
        return tuple(order)

    # --- questions a learner asks ---------------------------------------------------------
    def in_flight(self, rank: int, *, release: str = "last") -> int:
        """Peak number of (model chunk, micro-batch) activation sets rank `rank` holds.

        A forward stores activations; they are freed by the micro-batch's full backward (B),
        or, for split schedules, by its weight pass W (``release="last"``, the default: W
        still reads the stored inputs) or already by its input pass I (``release="input"``).
        With interleaving each chunk's activations count separately.
        """
        if release not in ("last", "input"):
            raise ValueError(f"release must be 'last' or 'input', got {release!r}")
        if release == "last":
            return self._peaks_last[rank]
        return self._peak(rank, release)

    @cached_property
    def _peaks_last(self) -> tuple[int, ...]:
        return tuple(self._peak(r, "last") for r in range(self.num_stages))

    def _peak(self, rank: int, release: str) -> int:
        freeing = {"backward", "backward_weight" if release == "last" else "backward_input"}
        held: set[tuple[int, int]] = set()
        peak = 0
        for a in self.actions[rank]:
            if a.kind == "forward":
                held.add((a.virtual_stage, a.micro_batch))
                peak = max(peak, len(held))
            elif a.kind in freeing:
                held.discard((a.virtual_stage, a.micro_batch))
        return peak

    def compute_order(self, rank: int) -> list[str]:
        """Rank `rank`'s compute actions in order as short labels, e.g. ``['F0', 'F1', 'B0']``.

        The same format as `Timeline.compute_order` (kind letter F, B, I or W, then the
        micro-batch), so a schedule can be compared directly with a traced or simulated run.
        The labels do not say which model chunk an action belongs to, so schedules with
        several chunks per rank are refused: use ``str(action)`` (e.g. ``"4F0"``) for those.
        """
        if isinstance(rank, bool) or not hasattr(rank, "__index__"):
            raise TypeError(f"rank must be an integer, got {rank!r}")
        if not 0 <= rank < self.num_stages:
            raise ValueError(f"rank must be in 0..{self.num_stages - 1}, got {rank}")
        if self.chunks > 1:
            raise ValueError(f"schedule {self.name!r} runs {self.chunks} chunks per rank; "
                             "'F0'-style labels cannot tell them apart, use str(action) "
                             "(e.g. '4F0') instead")
        return [f"{KIND_LETTER[a.kind]}{a.micro_batch}" for a in self.actions[rank]]

    def grid(self) -> list[list[str]]:
        """Time-slot x rank table of action strings ("" = idle), from a unit-cost run.

        Every action takes one slot and communication is free, so row ``t`` shows what each
        rank runs in slot ``t`` when it starts as early as its order and inputs allow.
        """
        plan = self._plan
        start, _ = plan.times([1.0] * len(plan.actions), 0.0, self.num_stages)
        slots = int(max(start, default=-1.0)) + 1
        table = [[""] * self.num_stages for _ in range(slots)]
        for i, a in enumerate(plan.actions):
            table[int(start[i])][plan.rank[i]] = str(a)
        return table

    def __repr__(self) -> str:
        return (f"Schedule({self.name!r}, num_stages={self.num_stages}, "
                f"num_micro_batches={self.num_micro_batches}, chunks={self.chunks}"
                + (f", placement={self.placement!r})" if self.placement != "loop" else ")"))

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython/Jupyter: show the grid
        printer.text(repr(self) if cycle else str(self))

    def __str__(self) -> str:
        table = self.grid()
        width = max([len(c) for row in table for c in row] + [6])
        head = (f"{self.name}: {self.num_stages} ranks, {self.num_micro_batches} micro-batches"
                + (f", {self.chunks} chunks per rank" if self.chunks > 1 else "")
                + (" in a V" if self.placement == "v" else "")
                + " (one row per unit-time slot; '.' = idle)")
        lines = [head, "slot  " + " ".join(f"rank {r}".ljust(width) for r in range(self.num_stages))]
        for t, row in enumerate(table):
            lines.append(f"{t:>4}  " + " ".join((c or ".").ljust(width) for c in row))
        return "\n".join(lines)


# --- generators ------------------------------------------------------------------------------
@lru_cache(maxsize=1 << 16)
def _action(stage: int, kind: str, micro_batch: int, chunk: int) -> Action:
    return Action(stage, kind, micro_batch, chunk)  # shared: actions are immutable


def build_schedule(name: ScheduleName, num_stages: int, num_micro_batches: int, *,
                   chunks: int | None = None) -> Schedule:
    """The schedule `name` for `num_stages` ranks and `num_micro_batches` micro-batches.

    The order comes from the schedule's record in `utils.planning.catalogue` (its title and
    source, bubble formula and runtimes are there too):

    * ``"gpipe"``: all forwards, then all backwards in micro-batch order 0..m-1.
    * ``"1f1b"``: rank ``s`` runs ``min(p - s - 1, m)`` warm-up forwards, then alternates
      forward and backward, then drains; the same order as DeepSpeed's ``TrainSchedule``.
    * ``"interleaved-1f1b"``: Megatron's interleaved 1F1B with `chunks` (>= 2) model chunks
      per rank, depth first in rounds of micro-batches; the same order as torch's
      ``ScheduleInterleaved1F1B`` (see `interleaved_group_size` for the allowed m).
    * ``"zb-h1"``: ZB-H1 (Qi et al., 2023): 1F1B's forward/input-backward order with each
      backward split into I and W; rank ``s`` postpones its first ``s`` weight passes, which
      then fill the drain bubble. Peak activations (released at W) are ``p`` micro-batches
      on every rank, the same peak as 1F1B's first rank. Same order as torch's
      ``ScheduleInterleavedZeroBubble`` with one chunk per rank.
    * ``"dualpipev"``: DualPipeV, two chunks per rank in a V (``placement="v"``), at least
      ``2p`` micro-batches; torch's ``ScheduleDualPipeV`` order (`utils.planning.vshaped`).
    * ``"zbv"``: ZB-V, two chunks per rank in a V with every backward split into I and W;
      torch's ``ScheduleZBVZeroBubble`` order (`utils.planning.vshaped.zbv_order`).

    `chunks` defaults to the record's default (2 for interleaved-1f1b, dualpipev and zbv, 1
    otherwise) and must lie in its range.
    """
    info = schedule_info(name)
    # Checked before the cache: True == 1 and 2.0 == 2 hash alike, so a cached build for 1
    # would otherwise answer build_schedule(name, True, ...).
    p = validation.count("num_stages", num_stages)
    m = validation.count("num_micro_batches", num_micro_batches)
    v = validation.count("chunks", chunks if chunks is not None else info.default_chunks)
    info.check_chunks(v)
    return _build(info.name, p, m, v)


@lru_cache(maxsize=1024)
def _build(key: str, p: int, m: int, v: int) -> Schedule:
    info = schedule_info(key)
    rows = tuple(tuple(_action(k, kind, mb, k // p) for k, kind, mb in row) for row in info.order(p, m, v))
    return Schedule(key, p, m, v, rows, placement=info.placement)
