"""What-if questions answered with the simulator: calibrate, predict, search.

* `measured_stage_costs`: per-stage compute costs and link latency of a (measured) run.
* `predict_from_timeline`: simulate a changed configuration (micro-batch count, schedule, stage costs)
  with the costs calibrated on a measured run, to put prediction and measurement side by side.
* `search_micro_batches`: for a fixed global batch, which micro-batch count and schedule is
  fastest under an activation-memory budget (`fastest_within_memory` picks it).

`utils.jobs.confirm.confirm_top` runs the best rows as real jobs.

What the predictions ignore: the optimizer step, gradient reduction and tied-weight
reduction after the drain, data loading, time a rank spends *inside* send/recv calls (a
DeepSpeed rank blocks in them; the calibrated latency absorbs part of it), contention
between ranks sharing cores, and memory other than activations (weights, optimizer state,
buffers). They model the pipeline phase of one step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from numbers import Real
from statistics import median

from utils.planning.catalogue import SCHEDULE_NAMES, schedule_info
from utils.planning.schedules import build_schedule, rank_of_stage, virtual_stage_of
from utils.planning.simulator import Costs, simulate
from utils.analysis.intervals import replica_index, transfer_intervals
from utils.analysis.steps import steady_steps
from utils.timeline import COMM_KINDS, Timeline

PerStage = float | Sequence[float]
"""A number for every stage alike, or one value per stage."""

__all__ = ["StageCosts", "measured_stage_costs", "predict_from_timeline", "SearchRow", "search_micro_batches",
           "fastest_within_memory"]


@dataclass(frozen=True)
class StageCosts:
    """Median compute cost per virtual stage (seconds) and the link latency of one run.

    Index ``k = chunk * num_stages + stage``: for runs without interleaving, simply the stage.
    `backward` is the full backward (B), or the input-gradient pass (I) when the run split
    its backward; `weight` holds the weight-gradient pass (W) then, and is None otherwise.
    `forward` and `backward` include what the rank does around each computation that keeps
    it from computing: loading the micro-batch and the transfer part of its blocking send
    (waiting for a late receiver is left out). `comm` is the median delay between a
    producer's send ending on one rank and its consumer starting on the next while that
    consumer was idle, waiting (0.0 with a single stage).
    `p2p` is the median duration of send/recv events per stage (None where none recorded);
    it is informational and not used by `predict`.
    """

    num_stages: int
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...] | None
    comm: float
    p2p: tuple[float | None, ...]

    @property
    def chunks(self) -> int:
        return len(self.forward) // self.num_stages


def _pick_steps(timeline: Timeline, step: int | None) -> list[int]:
    if step is not None:
        if step not in timeline.steps:
            raise ValueError(f"step {step} not in the timeline (steps {timeline.steps})")
        return [step]
    return steady_steps(timeline.steps)  # step 0 is warm-up; used only when it is all there is


def measured_stage_costs(timeline: Timeline, step: int | None = None) -> StageCosts:
    """Calibrate per-stage costs from `timeline`, by default over all steps but step 0.

    With data parallelism the durations of all replicas of a stage pool together; for the
    latency, the i-th rank (in rank order) of one stage talks to the i-th rank of the next.
    An event's chunk is placed on its virtual stage by the timeline's ``meta["placement"]``
    (`utils.planning.schedules.virtual_stage_of`: the loop, or the V of DualPipeV and ZB-V;
    the loop when the timeline does not say).
    """
    placement = timeline.meta.get("placement", "loop")
    steps = _pick_steps(timeline, step)
    if not steps:
        raise ValueError("the timeline has no events to calibrate from")
    events = [e for e in timeline.events if e.step in steps]
    p = timeline.num_stages
    chunks = 1 + max((e.chunk for e in events), default=0)
    vs = p * chunks
    split = any(e.kind == "backward_weight" for e in events)
    bwd_kind = "backward_input" if split else "backward"
    transfer = {key: interval for st in steps
                for key, interval in transfer_intervals([e for e in events if e.step == st]).items()}
    durations: dict[tuple[str, int], list[float]] = {}
    for e in events:
        start, end = transfer.get(id(e), (e.start, e.end))
        durations.setdefault((e.kind, virtual_stage_of(placement, p, e.stage, e.chunk)), []).append(end - start)

    def medians(kind: str, *, busy_with: tuple[str, ...] = ()) -> tuple[float, ...]:
        """Median duration of `kind` per virtual stage, plus the median of each instruction
        in `busy_with` that the same rank runs once per micro-batch around it (a DeepSpeed
        rank cannot compute while it loads a micro-batch or is inside a blocking send)."""
        missing = [k for k in range(vs) if (kind, k) not in durations]
        if missing:
            raise ValueError(f"no {kind} events for virtual stage(s) {missing} in steps {steps}")
        return tuple(median(durations[(kind, k)])
                     + sum(median(durations[(extra, k)]) for extra in busy_with if (extra, k) in durations)
                     for k in range(vs))

    p2p = tuple(median(d) if (d := [e.duration for e in events
                                    if e.stage == s and e.kind in COMM_KINDS]) else None
                for s in range(p))
    return StageCosts(p, medians("forward", busy_with=("load", "send_act")),
                      medians(bwd_kind, busy_with=("send_grad",)),
                      medians("backward_weight") if split else None,
                      _latency(events, p, vs, bwd_kind, placement), p2p)


def _latency(events, p: int, vs: int, bwd_kind: str, placement: str) -> float:
    """Median gap producer end -> consumer start across ranks, preferring waiting consumers."""
    replica = replica_index(events)
    compute, previous_end = {}, {}
    by_rank: dict[tuple[int, int], list] = {}
    for e in events:
        if e.kind in ("forward", bwd_kind, "backward_weight"):
            by_rank.setdefault((e.step, e.rank), []).append(e)
    sent = {(e.step, e.rank, e.micro_batch, e.chunk, e.kind): e.end for e in events
            if e.kind in ("send_act", "send_grad")}
    for row in by_rank.values():
        last = None
        for e in sorted(row, key=lambda e: e.start):
            key = (e.step, replica[(e.stage, e.rank)], e.kind, virtual_stage_of(placement, p, e.stage, e.chunk),
                   e.micro_batch)
            # A producer's output leaves when its send ends: calibrated costs include the send.
            send_kind = "send_act" if e.kind == "forward" else "send_grad"
            compute[key] = (e.start, sent.get((e.step, e.rank, e.micro_batch, e.chunk, send_kind), e.end))
            previous_end[key] = last
            last = e.end
    waiting, all_gaps = [], []
    for (step, rep, kind, k, mb), consumer in compute.items():
        source = k - 1 if kind == "forward" else k + 1
        if kind == "backward_weight" or not 0 <= source < vs or rank_of_stage(placement, p, source) == rank_of_stage(placement, p, k):
            continue
        producer = compute.get((step, rep, kind, source, mb))
        if producer is None:
            continue
        gap = max(0.0, consumer[0] - producer[1])
        all_gaps.append(gap)
        before = previous_end[(step, rep, kind, k, mb)]
        if before is None or before <= producer[1]:
            waiting.append(gap)
    gaps = waiting or all_gaps
    return median(gaps) if gaps else 0.0


def predict_from_timeline(timeline: Timeline, *, micro_batches: int | None = None,
            schedule: str | None = None, forward: Costs | None = None,
            backward: Costs | None = None, weight: Costs | None = None,
            comm: float | None = None, step: int | None = None) -> Timeline:
    """Predict the timeline of a changed configuration from a measured one.

    Costs are calibrated with `measured_stage_costs` (medians over steps but step 0),
    then `schedule` (default: ``timeline.meta["schedule"]`` or ``"1f1b"``, DeepSpeed's) runs
    with `micro_batches` (default: the measured count) micro-batches. Micro-batches keep
    their measured size, so more micro-batches means a larger global batch. `forward`,
    `backward`, `weight` (any shape `simulate` accepts) override the calibrated costs, e.g.
    to try other stage boundaries; `comm` overrides the calibrated latency. Switching to an
    interleaved schedule needs per-virtual-stage `forward` and `backward`. See the module
    docstring for what the prediction ignores.
    """
    costs = measured_stage_costs(timeline, step)
    name = schedule or timeline.meta.get("schedule") or "1f1b"
    if name not in SCHEDULE_NAMES:
        raise ValueError(f"cannot simulate schedule {name!r} (from the timeline's meta); pass "
                         f"schedule= one of {', '.join(SCHEDULE_NAMES)}")
    info = schedule_info(name)
    chunks = info.chunks_for(costs.chunks if costs.chunks >= info.min_chunks else None)
    m = timeline.num_micro_batches if micro_batches is None else micro_batches
    target = build_schedule(name, timeline.num_stages, m, chunks=chunks)
    if (forward is None or backward is None) and costs.chunks != chunks:
        raise ValueError(f"the run was calibrated with {costs.chunks} chunk(s) per rank but "
                         f"{name} runs {chunks}: give forward= and backward= per virtual stage")
    if weight is None:
        weight = costs.weight
    if target.split_backward and weight is None:
        raise ValueError(f"{name} splits the backward but the run did not: give weight= (and "
                         "backward= for the input-gradient part)")
    result = simulate(target, costs.forward if forward is None else forward,
                      costs.backward if backward is None else backward, weight=weight,
                      comm=costs.comm if comm is None else comm)
    meta = {**result.meta, "predicted_from": timeline.label, "calibration": asdict(costs)}
    return replace(result, label=f"{name}, m={m} (predicted from {timeline.label or 'a run'})",
                   micro_batch_size=timeline.micro_batch_size,
                   data_parallel=timeline.data_parallel, seq_len=timeline.seq_len, meta=meta)


# --- micro-batch search ----------------------------------------------------------------------
@dataclass(frozen=True)
class SearchRow:
    """One configuration of `search_micro_batches` and its predicted outcome."""

    schedule: str
    micro_batches: int
    micro_batch_size: int
    step_time: float
    """Predicted makespan of the pipeline phase (seconds)."""
    bubble: float
    """1 - busy / (ranks x makespan)."""
    peak_activation: tuple[float, ...]
    """Peak activation bytes per rank."""
    feasible: bool
    """Every rank's peak fits the memory budget."""
    samples_per_second: float

    @property
    def max_peak_activation(self) -> float:
        return max(self.peak_activation)


def _per_stage(value: PerStage, p: int, name: str) -> list[float]:
    if isinstance(value, Real):
        return [float(value)] * p
    values = [float(x) for x in value]
    if len(values) != p:
        raise ValueError(f"{name} needs a number or {p} values (one per stage); got {len(values)}")
    return values


def search_micro_batches(global_batch: int, *, num_stages: int, forward_per_sample: PerStage,
                         backward_per_sample: PerStage, activation_bytes_per_sample: PerStage,
                         memory_budget: PerStage, schedules: Sequence[str] = ("1f1b", "gpipe"),
                         fixed_overhead: PerStage = 0.0, weight_per_sample: PerStage | None = None,
                         comm: float = 0.0, chunks: int = 2,
                         data_parallel: int = 1) -> list[SearchRow]:
    """Evaluate every micro-batch count m dividing the per-replica batch, for each schedule.

    The per-replica batch ``global_batch / data_parallel`` splits into m micro-batches of
    ``b`` samples. Per stage (a number or one value per stage): forward costs
    ``fixed_overhead + forward_per_sample * b``, backward ``fixed_overhead +
    backward_per_sample * b`` (plus ``weight_per_sample * b`` for unsplit schedules when
    given; a split schedule (zb-h1, zbv, dualpipev) needs it as its W pass), activations ``activation_bytes_per_sample * b``
    per micro-batch held, and `memory_budget` caps each rank's activation peak. A schedule
    with several chunks per rank (``"interleaved-1f1b"`` with `chunks`, the V schedules with
    two) splits each rank's per-sample costs and bytes evenly over its chunks while every chunk
    pays the full `fixed_overhead` (more, smaller kernels); counts m a schedule cannot run
    (interleaving rounds, the V schedules' minimum) are skipped.
    """
    p, global_batch, data_parallel = int(num_stages), int(global_batch), int(data_parallel)
    if global_batch < 1 or data_parallel < 1 or global_batch % data_parallel:
        raise ValueError(f"global_batch {global_batch} must be a positive multiple of "
                         f"data_parallel {data_parallel}")
    batch = global_batch // data_parallel
    infos = [schedule_info(name) for name in schedules]
    for info in infos:
        info.check_chunks(info.chunks_for(chunks))
    fps = _per_stage(forward_per_sample, p, "forward_per_sample")
    bps = _per_stage(backward_per_sample, p, "backward_per_sample")
    wps = None if weight_per_sample is None else _per_stage(weight_per_sample, p, "weight_per_sample")
    aps = _per_stage(activation_bytes_per_sample, p, "activation_bytes_per_sample")
    over = _per_stage(fixed_overhead, p, "fixed_overhead")
    budget = _per_stage(memory_budget, p, "memory_budget")
    rows: list[SearchRow] = []
    for info in infos:
        name, v = info.name, info.chunks_for(chunks)
        for m in (d for d in range(1, batch + 1) if batch % d == 0):
            try:
                sched = build_schedule(name, p, m, chunks=v)
            except ValueError:
                continue  # an m this schedule cannot run (interleaving rounds, DualPipeV's 2p)
            if sched.split_backward and wps is None:
                raise ValueError(f"{name} splits the backward: give weight_per_sample (the W pass)")
            b = batch // m
            rank = [sched.rank_of(k) for k in range(p * v)]
            f = [over[r] + fps[r] * b / v for r in rank]
            bw = [over[r] + bps[r] * b / v for r in rank]
            w = None if wps is None else [wps[r] * b / v for r in rank]
            full = bw if w is None else [x + y for x, y in zip(bw, w)]  # B = I + W
            plan = sched._plan
            cost = {"forward": f, "backward": full, "backward_input": bw, "backward_weight": w}
            durations = [cost[a.kind][a.virtual_stage] for a in plan.actions]
            start, end = plan.times(durations, comm, p)
            makespan = max(end) - min(start)
            bubble = 1.0 - sum(durations) / (p * makespan) if makespan > 0 else 0.0
            peaks = tuple(sched.in_flight(r) * b * aps[r] / v for r in range(p))
            rows.append(SearchRow(name, m, b, makespan, bubble, peaks,
                                  all(x <= cap for x, cap in zip(peaks, budget)),
                                  global_batch / makespan if makespan > 0 else float("inf")))
    return rows


def fastest_within_memory(rows: Sequence[SearchRow]) -> SearchRow:
    """The feasible row with the shortest step (ties: fewer micro-batches, then less memory)."""
    ok = [r for r in rows if r.feasible]
    if not ok:
        smallest = min((r.max_peak_activation for r in rows), default=None)
        raise ValueError("no configuration fits the memory budget"
                         + (f" (smallest peak is {smallest:.4g})" if smallest is not None else ""))
    return min(ok, key=lambda r: (r.step_time, r.micro_batches, r.max_peak_activation))


def _time_search(repeat_batches: Sequence[int] = (96, 120, 240, 360, 480, 720),
                 stages: Sequence[int] = (2, 4, 8)) -> tuple[int, float]:
    """How many configurations a sweep evaluates and how long it takes (for the workbook)."""
    t0, n = time.perf_counter(), 0
    for g in repeat_batches:
        for p in stages:
            n += len(search_micro_batches(
                g, num_stages=p, forward_per_sample=1e-3, backward_per_sample=2e-3,
                weight_per_sample=1e-3, activation_bytes_per_sample=1e6, memory_budget=1e9,
                schedules=("1f1b", "gpipe", "zb-h1", "interleaved-1f1b"), fixed_overhead=1e-3))
    return n, time.perf_counter() - t0
