"""Pipeline metrics computed from a `Timeline`: bubble ratio, utilisation, imbalance, throughput.

Everything here works on the one data model, so a measured run and a simulation are judged
by the same definitions. Times are in seconds, like `Event` times; tables show milliseconds.

The central quantity is the **bubble ratio** of one step::

    bubble_ratio = 1 - sum_s compute(s) / (num_stages * makespan)

where ``makespan`` runs from the first compute start to the last compute end of the step
(the pipeline phase) and ``compute(s)`` is the time stage ``s`` spent in forward/backward
work. Only what lies outside that window is left out: the first stage's first data load
before it, and the per-step instructions of the stages that finish last. Everything else
that is not compute counts as idle, including the data loads DeepSpeed's `TrainSchedule`
issues before every forward on the first and last stage, and the gradient reduction and
optimizer step of stages that finish while others still compute (chapter 4 shows both).
Communication and waiting both count as *not compute*: communication that is not hidden
behind computation shows up as bubble. That is deliberate: for the learner, an exposed
send/recv costs exactly as much as an idle slot. `Metrics.stage_comm` separates the two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from utils.analysis.intervals import clip_intervals, transfer_intervals, union_length
from utils.analysis.report import (SCALARS, diagnose, format_value, partial_notes, report_html, report_text,
                                   stage_rows, with_notes)
from utils.analysis.steps import steady_steps
from utils.analysis.summary import MetricsSummary
from utils.timeline import COMM_KINDS, COMPUTE_KINDS, Event, Timeline

__all__ = ["Metrics", "compute_metrics"]

#: A data-parallel replica this much slower than the fastest one of its stage is a straggler.
STRAGGLER_THRESHOLD = 1.10


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
    padding_waste: float | None = None
    """Variable-length micro-batches (``timeline.meta["micro_batch_tokens"]``): the share of
    the tokens computed that were padding; None when every sample has the full length."""
    notes: tuple[str, ...] = ()
    """What a reader must know about the figures: for a timeline read from a partial record
    (``timeline.meta["record_problems"]``: a rank's file cut short or damaged), that they are
    partial and which files; shown above the tables and before the diagnosis."""

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
        return with_notes(diagnose(bubble=self.bubble_ratio, imbalance=self.imbalance,
                                   slowest=self.slowest_stage, comm_share=self.comm_share,
                                   straggler=self.straggler), self.notes)

    def to_dict(self) -> dict:
        """Every field (tuples as lists) plus the diagnosis: JSON-ready."""
        data = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        data["rank_compute"] = [list(x) for x in self.rank_compute]
        data["diagnosis"] = self.diagnosis
        return data

    def table(self) -> list[dict]:
        """Scalar metrics as rows ``{"metric", "value", "meaning"}`` (values formatted)."""
        rows = [{"metric": name, "value": format_value(name, getattr(self, name)),
                 "meaning": meaning}
                for name, meaning in SCALARS.items() if getattr(self, name) is not None]
        at = next(i for i, r in enumerate(rows) if r["metric"] == "imbalance")
        rows.insert(at, {"metric": "slowest_stage", "value": str(self.slowest_stage),
                         "meaning": "stage with the most compute: it sets the beat"})
        return rows

    def stage_table(self) -> list[dict]:
        """One row per stage: compute, exposed comm and idle in ms, utilisation."""
        return stage_rows(self)

    def __str__(self) -> str:
        head = f"{self.source} pipeline, step {self.step}"
        return report_text(head, self.table(), self.stage_table(), self.diagnosis, self.notes)

    def _repr_html_(self) -> str:
        head = f"{self.source} pipeline, step {self.step}"
        return report_html(head, self.table(), self.stage_table(), self.diagnosis, self.notes)


def compute_metrics(timeline: Timeline, step: int | None = None, *,
                    skip_first: bool = True) -> Metrics | MetricsSummary:
    """Metrics of one step, or a summary over all steps.

    * `step` given: `Metrics` of that step.
    * `step` None and the timeline holds one step: `Metrics` of that step.
    * `step` None and several steps: a `MetricsSummary` (median and spread across steps).
      With `skip_first` (the default) step 0 is left out of the statistics: the first
      training step pays one-off costs that say nothing about the steady pipeline (see
      `utils.analysis.steps.steady_steps`). Its `Metrics` remain available in
      `MetricsSummary.per_step`.

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
    used = tuple(steady_steps(steps, skip_first=skip_first))
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
        comm = clip_intervals([transfer.get(id(e), (e.start, e.end))
                               for e in evs if e.kind in COMM_KINDS], start, end)
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
    padding_waste = None
    planned = micro_batch_tokens(timeline, step)
    if planned:  # variable lengths: count real tokens (one replica's plan, every replica alike)
        samples_per_s = sum(n for n, _, _ in planned) * timeline.data_parallel / step_time
        tokens_per_s = sum(real for _, real, _ in planned) * timeline.data_parallel / step_time
        padding_waste = 1.0 - sum(real for _, real, _ in planned) / sum(padded for _, _, padded in planned)

    return Metrics(
        step=step, source=timeline.source, num_stages=num_stages,
        num_micro_batches=len(planned) if planned else timeline.num_micro_batches, start=start, makespan=makespan,
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
        padding_waste=padding_waste, notes=partial_notes(timeline.meta),
    )


def micro_batch_tokens(timeline: Timeline, step: int) -> list | None:
    """``(samples, real, padded)`` per micro-batch of `step`, when the timeline has them (the
    keys are steps, or their strings after a JSON round trip)."""
    table = timeline.meta.get("micro_batch_tokens") or {}
    return table.get(step) or table.get(str(step))
