"""Pipeline metrics computed from a `Timeline`: bubble ratio, utilisation, imbalance, throughput.

Everything here works on the one data model, so a measured run and a simulation are judged
by the same definitions. Times are in seconds, like `Event` times; tables show milliseconds.

The central quantity is the **bubble ratio** of one step::

    bubble_ratio = 1 - sum_s compute(s) / (num_stages * makespan)

where ``makespan`` runs from the first compute start to the last compute end of the step
(the pipeline phase; data loading before it and gradient reduction / optimizer step after
it are left out) and ``compute(s)`` is the time stage ``s`` spent in forward/backward work.
Communication and waiting both count as *not compute*: communication that is not hidden
behind computation shows up as bubble. That is deliberate: for the learner, an exposed
send/recv costs exactly as much as an idle slot. `Metrics.stage_comm` separates the two.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from statistics import median

from .timeline import COMM_KINDS, COMPUTE_KINDS, Event, Timeline

__all__ = ["Metrics", "MetricsSummary", "Spread", "compute_metrics", "interval_union",
           "replica_index", "transfer_intervals", "union_length"]

#: A stage whose compute exceeds the mean stage compute by this factor is called the bottleneck.
IMBALANCE_THRESHOLD = 1.10
#: Exposed communication above this share of stage time is worth a diagnosis of its own.
COMM_THRESHOLD = 0.10
#: A data-parallel replica this much slower than the fastest one of its stage is a straggler.
STRAGGLER_THRESHOLD = 1.10

Interval = tuple[float, float]


# --- interval arithmetic ----------------------------------------------------------------------
def interval_union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals, so no moment is counted twice."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def union_length(intervals: Iterable[Interval]) -> float:
    """Total time covered by the intervals (overlaps count once)."""
    return sum(b - a for a, b in interval_union(intervals))


def _clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


# --- one step ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metrics:
    """Metrics of one training step of a pipeline.

    Per-stage values are tuples indexed by stage. With data parallelism (several ranks per
    stage) each per-stage value is the **mean over the ranks of that stage**, so the bubble
    ratio describes a typical replica; `rank_compute` keeps the per-rank values to spot a
    straggler.
    """

    step: int
    """The training step measured."""
    source: str
    """``"measured"`` or ``"simulated"``, copied from the timeline."""
    num_stages: int
    num_micro_batches: int
    start: float
    """Start of the pipeline phase: the first compute start of the step (seconds)."""
    makespan: float
    """Pipeline phase: first compute start to last compute end of the step (seconds)."""
    step_time: float
    """Whole step: its first event start to its last event end, including data loading,
    gradient reduction and the optimizer step (seconds)."""
    bubble_ratio: float
    """``1 - sum_s compute(s) / (num_stages * makespan)``: the share of stage time in the
    pipeline phase not spent computing. Exposed communication counts as bubble."""
    stage_compute: tuple[float, ...]
    """Time each stage spent in forward/backward work (union of its compute intervals)."""
    stage_comm: tuple[float, ...]
    """Exposed communication per stage: time in send/recv while the neighbour was in its
    matching call too (waiting for a late neighbour inside a blocking recv is idle, not
    communication), clipped to the makespan window, not overlapped by that rank's own
    compute (hidden communication costs nothing)."""
    stage_idle: tuple[float, ...]
    """``makespan - compute - comm`` per stage, never negative: waiting, plus any other
    instruction (data loading) that falls inside the window."""
    stage_utilisation: tuple[float, ...]
    """``compute / makespan`` per stage."""
    slowest_stage: int
    """The stage with the most compute: it sets the pipeline's beat."""
    imbalance: float
    """Largest stage compute over mean stage compute (1.0 = perfectly balanced)."""
    comm_share: float
    """Total exposed communication over ``num_stages * makespan``."""
    samples_per_s: float
    """``micro_batch_size * num_micro_batches * data_parallel / step_time``."""
    tokens_per_s: float | None
    """``samples_per_s * seq_len`` when the timeline knows its sequence length, else None."""
    warmup: float
    """Fill: from the makespan start until every stage has started computing (the moment
    the last stage starts its first micro-batch)."""
    steady: float
    """``makespan - warmup - cooldown``: every stage has work started and work left."""
    cooldown: float
    """Drain: from the first moment some stage has finished all of its compute (for 1F1B
    and GPipe, the last stage) to the makespan end."""
    rank_compute: tuple[tuple[int, int, float], ...] = ()
    """``(stage, rank, compute)`` for every rank with events in this step."""

    # --- derived views ------------------------------------------------------------------------
    @property
    def end(self) -> float:
        """End of the pipeline phase (seconds)."""
        return self.start + self.makespan

    @property
    def mean_utilisation(self) -> float:
        """Mean stage utilisation; equals ``1 - bubble_ratio``."""
        return sum(self.stage_utilisation) / self.num_stages

    @property
    def straggler(self) -> tuple[int, int, float] | None:
        """``(stage, rank, slowdown)`` of the worst data-parallel straggler, or None.

        Slowdown is the rank's compute over the fastest rank of the same stage; only ranks
        beyond `STRAGGLER_THRESHOLD` count.
        """
        worst: tuple[int, int, float] | None = None
        for stage in range(self.num_stages):
            ranks = [(r, c) for s, r, c in self.rank_compute if s == stage]
            if len(ranks) < 2 or min(c for _, c in ranks) <= 0:
                continue
            fastest = min(c for _, c in ranks)
            rank, slowest = max(ranks, key=lambda rc: rc[1])
            ratio = slowest / fastest
            if ratio >= STRAGGLER_THRESHOLD and (worst is None or ratio > worst[2]):
                worst = (stage, rank, ratio)
        return worst

    @property
    def diagnosis(self) -> str:
        """One line naming the main cause of the bubble."""
        return _diagnose(bubble=self.bubble_ratio, imbalance=self.imbalance,
                         slowest=self.slowest_stage, comm_share=self.comm_share,
                         straggler=self.straggler)

    def to_dict(self) -> dict:
        """Every field (tuples as lists) plus the diagnosis: JSON-ready."""
        data = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        data["rank_compute"] = [list(x) for x in self.rank_compute]
        data["diagnosis"] = self.diagnosis
        return data

    def table(self) -> list[dict]:
        """Scalar metrics as rows ``{"metric", "value", "meaning"}`` (values formatted)."""
        return _scalar_rows(self)

    def stage_table(self) -> list[dict]:
        """One row per stage: compute, exposed comm and idle in ms, utilisation."""
        return _stage_rows(self)

    def __str__(self) -> str:
        head = f"{self.source} pipeline, step {self.step}"
        return _text(head, self.table(), self.stage_table(), self.diagnosis)

    def _repr_html_(self) -> str:
        head = f"{self.source} pipeline, step {self.step}"
        return _html(head, self.table(), self.stage_table(), self.diagnosis)


def compute_metrics(timeline: Timeline, step: int | None = None, *,
                    skip_first: bool = True) -> Metrics | MetricsSummary:
    """Metrics of one step, or a summary over all steps.

    * `step` given: `Metrics` of that step.
    * `step` None and the timeline holds one step: `Metrics` of that step.
    * `step` None and several steps: a `MetricsSummary` (median and spread across steps).
      With `skip_first` (the default) step 0 is left out of the statistics: the first
      training step pays one-off costs (allocator growth, JIT builds, NCCL/gloo
      connection setup, cold caches) that say nothing about the steady pipeline. Its
      `Metrics` remain available in `MetricsSummary.per_step`.

    Raises ValueError for an empty timeline, a step that is not in the timeline, or a step
    without compute events.
    """
    steps = timeline.steps
    if not steps:
        raise ValueError("the timeline has no events: nothing to measure")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int or None, got {step!r}")
        if step not in steps:
            raise ValueError(f"step {step} is not in this timeline; steps present: {steps}")
        return _step_metrics(timeline, step)
    if len(steps) == 1:
        return _step_metrics(timeline, steps[0])
    per_step = tuple(_step_metrics(timeline, s) for s in steps)
    used = tuple(s for s in steps if not (skip_first and s == 0))
    return MetricsSummary(per_step=per_step, used_steps=used, skip_first=skip_first)


def _step_metrics(timeline: Timeline, step: int) -> Metrics:
    events = timeline.select(step=step)
    compute = [e for e in events if e.kind in COMPUTE_KINDS]
    if not compute:
        raise ValueError(f"step {step} has no compute events ({', '.join(COMPUTE_KINDS)}): "
                         "there is no pipeline phase to measure")
    start = min(e.start for e in compute)
    end = max(e.end for e in compute)
    makespan = end - start
    if makespan <= 0:
        raise ValueError(f"step {step}: every compute event has zero duration; "
                         "the bubble ratio is undefined")
    step_time = max(e.end for e in events) - min(e.start for e in events)
    num_stages = timeline.num_stages

    transfer = transfer_intervals(events)
    # Per rank: compute union, exposed comm, first/last compute.
    by_rank: dict[tuple[int, int], list[Event]] = {}
    for e in events:
        by_rank.setdefault((e.stage, e.rank), []).append(e)
    per_rank: dict[tuple[int, int], tuple[float, float, float]] = {}
    first_starts: list[float] = []
    last_ends: list[float] = []
    for key, evs in by_rank.items():
        comp = [(e.start, e.end) for e in evs if e.kind in COMPUTE_KINDS]
        comm = _clip([transfer.get(id(e), (e.start, e.end)) for e in evs if e.kind in COMM_KINDS],
                     start, end)
        c = union_length(comp)
        busy = union_length(comp + comm)
        per_rank[key] = (c, busy - c, max(0.0, makespan - busy))
        if comp:
            first_starts.append(min(a for a, _ in comp))
            last_ends.append(max(b for _, b in comp))

    stage_compute, stage_comm, stage_idle = [], [], []
    for s in range(num_stages):
        vals = [v for (stage, _), v in per_rank.items() if stage == s]
        if not vals:  # a stage that did nothing in this step is idle throughout
            vals = [(0.0, 0.0, makespan)]
        stage_compute.append(sum(v[0] for v in vals) / len(vals))
        stage_comm.append(sum(v[1] for v in vals) / len(vals))
        stage_idle.append(sum(v[2] for v in vals) / len(vals))

    total_compute = sum(stage_compute)
    mean_compute = total_compute / num_stages
    slowest = max(range(num_stages), key=lambda s: stage_compute[s])

    # Phases: fill ends when the last rank starts computing; drain starts when the first
    # rank has finished its compute. Clamp so the steady state is never negative.
    warm_end = max(first_starts)
    cool_start = max(min(last_ends), warm_end)

    samples = timeline.micro_batch_size * timeline.num_micro_batches * timeline.data_parallel
    samples_per_s = samples / step_time
    tokens_per_s = samples_per_s * timeline.seq_len if timeline.seq_len else None

    return Metrics(
        step=step, source=timeline.source, num_stages=num_stages,
        num_micro_batches=timeline.num_micro_batches, start=start, makespan=makespan,
        step_time=step_time,
        bubble_ratio=1.0 - total_compute / (num_stages * makespan),
        stage_compute=tuple(stage_compute), stage_comm=tuple(stage_comm),
        stage_idle=tuple(stage_idle),
        stage_utilisation=tuple(c / makespan for c in stage_compute),
        slowest_stage=slowest, imbalance=stage_compute[slowest] / mean_compute,
        comm_share=sum(stage_comm) / (num_stages * makespan),
        samples_per_s=samples_per_s, tokens_per_s=tokens_per_s,
        warmup=warm_end - start, steady=cool_start - warm_end, cooldown=end - cool_start,
        rank_compute=tuple(sorted((s, r, v[0]) for (s, r), v in per_rank.items())),
    )


#: A send on one stage and the receive it feeds: (send kind, recv kind, stage offset).
_P2P_PAIRS = (("send_act", "recv_act", +1), ("send_grad", "recv_grad", -1))


def replica_index(events: list[Event]) -> dict[tuple[int, int], int]:
    """``(stage, rank) -> i``: the data-parallel replica a rank is within its stage, counting
    the stage's ranks in order, so events of neighbouring stages pair up replica by replica."""
    ranks_of: dict[int, set[int]] = {}
    for e in events:
        ranks_of.setdefault(e.stage, set()).add(e.rank)
    return {(s, r): i for s, ranks in ranks_of.items() for i, r in enumerate(sorted(ranks))}


def transfer_intervals(events: list[Event]) -> dict[int, Interval]:
    """For each send/recv whose partner is in `events`, the part of it that is transfer.

    DeepSpeed's point-to-point calls block: a recv posted before its neighbour reaches the
    matching send waits inside the call. That wait is a bubble (the neighbour is late), not
    communication, so a call counts as communication only from the moment both ends are
    inside their calls. Keys are ``id(event)``; unmatched events (e.g. a simulated timeline
    or a neighbour's missing events) are left out and count whole.
    """
    replica = replica_index(events)
    index = {(e.kind, e.stage, replica[e.stage, e.rank], e.micro_batch, e.chunk): e
             for e in events if e.kind in COMM_KINDS}
    intervals: dict[int, Interval] = {}
    for send_kind, recv_kind, offset in _P2P_PAIRS:
        for (kind, stage, rep, mb, chunk), send in index.items():
            if kind != send_kind:
                continue
            recv = index.get((recv_kind, stage + offset, rep, mb, chunk))
            if recv is None:
                continue
            both_in = max(send.start, recv.start)
            intervals[id(send)] = (min(both_in, send.end), send.end)
            intervals[id(recv)] = (min(both_in, recv.end), recv.end)
    return intervals


def _diagnose(*, bubble: float, imbalance: float, slowest: int, comm_share: float,
              straggler: tuple[int, int, float] | None) -> str:
    if imbalance >= IMBALANCE_THRESHOLD:
        return (f"stage {slowest} is the bottleneck: {imbalance:.2f}× the mean stage compute; "
                f"move layers off it (bubble {bubble:.0%})")
    if straggler is not None:
        stage, rank, ratio = straggler
        return (f"rank {rank} of stage {stage} is a straggler: {ratio:.2f}× the fastest "
                f"replica of its stage (bubble {bubble:.0%})")
    if comm_share >= COMM_THRESHOLD:
        return (f"communication is not overlapped: {comm_share:.0%} of stage time goes to "
                f"send/recv (bubble {bubble:.0%})")
    if bubble < 0.05:
        return (f"the pipeline is well filled: bubble {bubble:.1%}, stages balanced "
                f"(max/mean {imbalance:.2f})")
    return (f"stages are balanced (max/mean {imbalance:.2f}); the bubble ({bubble:.0%}) comes "
            "from fill and drain: raise the micro-batch count")


# --- several steps ----------------------------------------------------------------------------
#: Scalar metrics summarised across steps, with the meaning shown in tables.
SCALARS: dict[str, str] = {
    "bubble_ratio": "share of stage time in the pipeline phase not spent computing",
    "makespan": "first compute start to last compute end",
    "step_time": "whole step, including load, reduce and optimizer step",
    "samples_per_s": "samples per second over the whole step, all replicas",
    "tokens_per_s": "tokens per second (samples/s × sequence length)",
    "imbalance": "largest stage compute / mean stage compute",
    "comm_share": "exposed send/recv time / (stages × makespan)",
    "warmup": "fill: until every stage has started computing",
    "steady": "every stage has work started and work left",
    "cooldown": "drain: after the first stage has finished all its compute",
}
_TIME_SCALARS = {"makespan", "step_time", "warmup", "steady", "cooldown"}
_SHARE_SCALARS = {"bubble_ratio", "comm_share"}


@dataclass(frozen=True)
class Spread:
    """Median and spread of one metric across steps."""

    median: float
    min: float
    max: float
    q1: float
    """First quartile (linear interpolation)."""
    q3: float
    """Third quartile (linear interpolation)."""
    n: int
    """Number of steps summarised."""

    @property
    def iqr(self) -> float:
        """Interquartile range ``q3 - q1``: the spread of the middle half of the steps."""
        return self.q3 - self.q1

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        xs = sorted(values)
        return cls(median=median(xs), min=xs[0], max=xs[-1], q1=_quantile(xs, 0.25),
                   q3=_quantile(xs, 0.75), n=len(xs))


def _quantile(xs: list[float], q: float) -> float:
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class MetricsSummary:
    """Metrics over several steps: the median and spread of each scalar, per-step details.

    Attribute names match `Metrics` (``summary.bubble_ratio`` is the median bubble ratio,
    ``summary.stage_compute`` the per-stage medians), so code and plots accept either.
    """

    per_step: tuple[Metrics, ...]
    """`Metrics` of every step in the timeline, including a skipped step 0."""
    used_steps: tuple[int, ...]
    """Steps that enter the statistics."""
    skip_first: bool = True
    """Whether step 0 was left out (it carries one-off warm-up costs)."""

    def __post_init__(self) -> None:
        if not self.used_steps:
            raise ValueError("a summary needs at least one step")

    @property
    def used(self) -> list[Metrics]:
        return [m for m in self.per_step if m.step in self.used_steps]

    def for_step(self, step: int) -> Metrics:
        """`Metrics` of one step (also a skipped one)."""
        for m in self.per_step:
            if m.step == step:
                return m
        raise ValueError(f"step {step} is not in this summary; steps present: "
                         f"{[m.step for m in self.per_step]}")

    def spread(self, name: str) -> Spread | None:
        """Median, min, max and quartiles of scalar `name` over the used steps."""
        if name not in SCALARS:
            raise ValueError(f"unknown metric {name!r}; summarised metrics: {list(SCALARS)}")
        values = [getattr(m, name) for m in self.used]
        if any(v is None for v in values):
            return None
        return Spread.of(values)

    @property
    def stats(self) -> dict[str, Spread | None]:
        return {name: self.spread(name) for name in SCALARS}

    def _median(self, name: str) -> float | None:
        s = self.spread(name)
        return None if s is None else s.median

    def _stage_median(self, name: str) -> tuple[float, ...]:
        rows = [getattr(m, name) for m in self.used]
        return tuple(median(r[s] for r in rows) for s in range(self.num_stages))

    # Medians under the names `Metrics` uses.
    bubble_ratio = property(lambda self: self._median("bubble_ratio"))
    makespan = property(lambda self: self._median("makespan"))
    step_time = property(lambda self: self._median("step_time"))
    samples_per_s = property(lambda self: self._median("samples_per_s"))
    tokens_per_s = property(lambda self: self._median("tokens_per_s"))
    imbalance = property(lambda self: self._median("imbalance"))
    comm_share = property(lambda self: self._median("comm_share"))
    warmup = property(lambda self: self._median("warmup"))
    steady = property(lambda self: self._median("steady"))
    cooldown = property(lambda self: self._median("cooldown"))
    stage_compute = property(lambda self: self._stage_median("stage_compute"))
    stage_comm = property(lambda self: self._stage_median("stage_comm"))
    stage_idle = property(lambda self: self._stage_median("stage_idle"))
    stage_utilisation = property(lambda self: self._stage_median("stage_utilisation"))

    @property
    def num_stages(self) -> int:
        return self.per_step[0].num_stages

    @property
    def source(self) -> str:
        return self.per_step[0].source

    @property
    def slowest_stage(self) -> int:
        """Stage with the largest median compute."""
        comp = self.stage_compute
        return max(range(len(comp)), key=lambda s: comp[s])

    @property
    def diagnosis(self) -> str:
        """The diagnosis of the median values (see `Metrics.diagnosis`)."""
        stragglers = [m.straggler for m in self.used if m.straggler is not None]
        # A straggler counts only when it shows up in most steps, not in one noisy step.
        straggler = (max(stragglers, key=lambda x: x[2])
                     if len(stragglers) * 2 > len(self.used) else None)
        return _diagnose(bubble=self.bubble_ratio, imbalance=self.imbalance,
                         slowest=self.slowest_stage, comm_share=self.comm_share,
                         straggler=straggler)

    def table(self) -> list[dict]:
        """Rows ``{"metric", "median", "min", "max", "iqr", "meaning"}`` (values formatted)."""
        rows = []
        for name, meaning in SCALARS.items():
            s = self.spread(name)
            if s is None:
                continue
            rows.append({"metric": name, "median": _fmt(name, s.median),
                         "min": _fmt(name, s.min), "max": _fmt(name, s.max),
                         "iqr": _fmt(name, s.iqr), "meaning": meaning})
        return rows

    def stage_table(self) -> list[dict]:
        """One row per stage with median compute, comm and idle (ms) and utilisation."""
        return _stage_rows(self)

    def to_dict(self) -> dict:
        return {"used_steps": list(self.used_steps), "skip_first": self.skip_first,
                "stats": {k: (None if v is None else {**asdict(v), "iqr": v.iqr})
                          for k, v in self.stats.items()},
                "diagnosis": self.diagnosis,
                "per_step": [m.to_dict() for m in self.per_step]}

    def _head(self) -> str:
        skipped = [m.step for m in self.per_step if m.step not in self.used_steps]
        note = f", step {skipped[0]} left out (warm-up costs)" if skipped else ""
        return (f"{self.source} pipeline, median over {len(self.used_steps)} step(s) "
                f"{list(self.used_steps)}{note}")

    def __str__(self) -> str:
        return _text(self._head(), self.table(), self.stage_table(), self.diagnosis)

    def _repr_html_(self) -> str:
        return _html(self._head(), self.table(), self.stage_table(), self.diagnosis)


# --- formatting -------------------------------------------------------------------------------
def _fmt(name: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if name in _TIME_SCALARS:
        return f"{value * 1e3:.2f} ms"
    if name in _SHARE_SCALARS:
        return f"{value:.1%}"
    if name == "imbalance":
        return f"{value:.2f}×"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _stage_rows(m: Metrics | MetricsSummary) -> list[dict]:
    return [{"stage": s,
             "compute_ms": round(m.stage_compute[s] * 1e3, 3),
             "comm_ms": round(m.stage_comm[s] * 1e3, 3),
             "idle_ms": round(m.stage_idle[s] * 1e3, 3),
             "utilisation": round(m.stage_utilisation[s], 4)}
            for s in range(m.num_stages)]


def _scalar_rows(m: Metrics) -> list[dict]:
    rows = [{"metric": name, "value": _fmt(name, getattr(m, name)), "meaning": meaning}
            for name, meaning in SCALARS.items() if getattr(m, name) is not None]
    at = next(i for i, r in enumerate(rows) if r["metric"] == "imbalance")
    rows.insert(at, {"metric": "slowest_stage", "value": str(m.slowest_stage),
                     "meaning": "stage with the most compute: it sets the beat"})
    return rows


def _text(head: str, rows: list[dict], stage_rows: list[dict], diagnosis: str) -> str:
    cols = [k for k in rows[0] if k != "meaning"] if rows else []
    lines = [head]
    if cols:
        lines.append("  " + "  ".join(f"{c:>14}" if c != "metric" else f"{c:<14}"
                                      for c in cols))
    for r in rows:
        lines.append("  " + "  ".join(f"{r[c]:>14}" if c != "metric" else f"{r[c]:<14}"
                                      for c in cols))
    lines.append("  stage  compute_ms     comm_ms     idle_ms  utilisation")
    for r in stage_rows:
        lines.append(f"  {r['stage']:>5}  {r['compute_ms']:>10.3f}  {r['comm_ms']:>10.3f}  "
                     f"{r['idle_ms']:>10.3f}  {r['utilisation']:>11.1%}")
    lines.append(f"  diagnosis: {diagnosis}")
    return "\n".join(lines)


def _html_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th style='text-align:left'>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(v))}</td>"
                                    for v in r.values()) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _html(head: str, rows: list[dict], stage_rows: list[dict], diagnosis: str) -> str:
    stage_rows = [{**r, "utilisation": f"{r['utilisation']:.1%}"} for r in stage_rows]
    return (f"<div><b>{html.escape(head)}</b>{_html_table(rows)}{_html_table(stage_rows)}"
            f"<p><b>diagnosis:</b> {html.escape(diagnosis)}</p></div>")
