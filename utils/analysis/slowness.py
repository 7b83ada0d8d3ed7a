"""Why a pipeline that ran was slower than it could be, read from its timeline: stragglers,
imbalance, the causes of its bubble, and the memory each stage added per step.

`performance_symptoms` returns `Symptom`s (`utils.analysis.diagnosis`), the worst first,
each with the numbers it rests on. The rules:

- **straggler** — a rank whose forward + backward per micro-batch takes `STRAGGLER_FACTOR`
  times as long as its peers: the other replicas of its stage, and other stages that run the
  same layers (same work, same micro-batch size: only the rank can be slower); or a stage that took that many times its share of the profile's
  prediction (`predicted_stage_costs`), measured against the other stages' ratio to theirs
  (a machine busier than at profiling time slows every stage alike, and says nothing about
  one of them).
- **imbalance** — the slowest stage's compute over the mean stage compute (`Metrics.imbalance`)
  beyond `utils.analysis.report.IMBALANCE_THRESHOLD`: the pipeline beats at its pace.
- **bubble** — the idle share of the pipeline phase split into fill and drain (what balanced
  stages idle: ``(p-1)/(m+p-1)`` for 1F1B and GPipe), imbalance (what the measured stage
  costs add: stages waiting for the slowest at every micro-batch) and the rest (exposed
  communication, data loads, ranks competing for cores), on the median step.
- **communication** — exposed send/recv time (`Metrics.comm_share`) beyond
  `utils.analysis.report.COMM_THRESHOLD`.
- **memory** — per stage, the bytes a step added on top of what the stage held between steps
  (`Run.step_memory`), and why the first stage holds the most in 1F1B.

Times in evidence are milliseconds; memory is MB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from utils.analysis.diagnosis import Symptom, Where
from utils.analysis.metrics import Metrics, compute_metrics
from utils.analysis.report import COMM_THRESHOLD, IMBALANCE_THRESHOLD
from utils.analysis.steps import steady_steps
from utils.analysis.summary import MetricsSummary
from utils.analysis.theory import bubble_ratio_1f1b, bubble_ratio_estimate
from utils.timeline import Timeline

__all__ = ["STRAGGLER_FACTOR", "performance_symptoms", "rank_costs"]

STRAGGLER_FACTOR = 1.5
"""A rank (or stage) this many times as slow as its reference is called a straggler: far
beyond the ±20 % that ranks sharing CPU cores differ by on their own."""


def rank_costs(timeline: Timeline, steps: Sequence[int] | None = None) -> dict[int, dict]:
    """Per rank: its ``stage``, the ``forward`` and ``backward`` seconds per micro-batch
    (median over `steps`, default the steady steps) and ``per_step``: step -> forward +
    backward seconds per micro-batch in that step (every step, step 0 included)."""
    used = set(steady_steps(timeline.steps) if steps is None else steps)
    found: dict[int, dict] = {}
    for rank in sorted({e.rank for e in timeline.events}):
        events = [e for e in timeline.events if e.rank == rank and e.kind in ("forward", "backward")]
        if not events:
            continue
        per_kind: dict[str, dict[int, list[float]]] = {"forward": {}, "backward": {}}
        for e in events:
            per_kind[e.kind].setdefault(e.step, []).append(e.end - e.start)
        mean = {kind: {step: sum(d) / len(d) for step, d in by_step.items()} for kind, by_step in per_kind.items()}
        steps_seen = sorted(set(mean["forward"]) | set(mean["backward"]))
        per_step = {s: mean["forward"].get(s, 0.0) + mean["backward"].get(s, 0.0) for s in steps_seen}
        chosen = [s for s in steps_seen if s in used] or steps_seen
        found[rank] = {"stage": events[0].stage,
                       "forward": median(mean["forward"].get(s, 0.0) for s in chosen),
                       "backward": median(mean["backward"].get(s, 0.0) for s in chosen),
                       "per_step": per_step}
    return found


@dataclass(frozen=True)
class FillAndDrain:
    """What balanced stages would idle under a run's schedule: its bubble formula (text) and
    that formula's value for the run (`utils.planning.catalogue.ScheduleInfo.bubble_ratio`,
    which the caller reads: analysis does not import planning)."""

    formula: str
    ratio: float


def performance_symptoms(timeline: Timeline, *, predicted_stage_costs: Sequence[float] | None = None,
                         step_memory: Mapping[int, int] | None = None,
                         stage_layers: Sequence[Sequence[str]] | None = None,
                         fill_and_drain: FillAndDrain | None = None) -> list[Symptom]:
    """Stragglers, imbalance, bubble causes, exposed communication and memory of a measured
    (or simulated) run, the worst first (see the module docstring).

    `stage_layers` (the layer names each stage runs, if known and fixed for the run) lets
    stages that run the same layers be each other's peers, like replicas: in a 4-stage GPT
    the two middle stages of blocks, so one slow rank is found without replicas or a profile.
    `fill_and_drain`: the run's schedule's own bubble formula; None: 1F1B's and GPipe's
    ``(p-1)/(m+p-1)``."""
    if not timeline.events:
        return []
    costs = rank_costs(timeline)
    summary = compute_metrics(timeline)
    peers = (lambda stage: tuple(stage_layers[stage])) if stage_layers else (lambda stage: stage)
    stragglers = _peer_stragglers(costs, peers) + _predicted_stragglers(costs, predicted_stage_costs, timeline)
    slow_stages = {s.where.stage for s in stragglers}
    found = stragglers + _imbalance(summary, slow_stages)
    found += _bubble(summary, fill_and_drain)
    if summary.comm_share is not None and summary.comm_share >= COMM_THRESHOLD:
        found.append(Symptom(
            code="communication", severity="warning",
            what=f"exposed send/recv takes {summary.comm_share:.0%} of stage time",
            evidence={"comm_share": round(summary.comm_share, 3),
                      "stage_comm_ms": [round(c * 1e3, 2) for c in summary.stage_comm]},
            cause="activations and gradients travel while no stage computes: the link is slow for their size",
            fix="fewer, larger micro-batches; a partition whose boundaries cut where activations are small"))
    if step_memory:
        found.append(_memory(step_memory, timeline))
    order = {"warning": 0, "info": 1, "error": -1}
    return sorted(found, key=lambda s: order[s.severity])


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _peer_stragglers(costs: dict[int, dict], peers) -> list[Symptom]:
    """Ranks this much slower than the others running the same layers (replicas of their
    stage, or stages holding the same layers: `peers` maps a stage to its group)."""
    found = []
    for group in dict.fromkeys(peers(c["stage"]) for c in costs.values()):
        ranks = {r: c for r, c in costs.items() if peers(c["stage"]) == group}
        if len(ranks) < 2:
            continue
        for rank, c in ranks.items():
            others = [r for r in ranks if r != rank]
            reference = median(costs[r]["forward"] + costs[r]["backward"] for r in others)
            ratio = (c["forward"] + c["backward"]) / reference if reference > 0 else 0.0
            if ratio < STRAGGLER_FACTOR:
                continue
            per_step_ref = {s: median(costs[r]["per_step"].get(s, 0.0) for r in others) for s in c["per_step"]}
            since = next((s for s, t in sorted(c["per_step"].items())
                          if per_step_ref[s] > 0 and t / per_step_ref[s] >= STRAGGLER_FACTOR), None)
            slower = max(("forward", "backward"),
                         key=lambda k: c[k] / max(median(costs[r][k] for r in others), 1e-12))
            stage = c["stage"]
            same_stage = all(costs[r]["stage"] == stage for r in others)
            peer_words = (f"the other replicas of stage {stage}" if same_stage else
                          f"the other ranks running the same layers (stages {sorted({costs[r]['stage'] for r in ranks})})")
            peers_short = (f"the other replicas of stage {stage}" if same_stage else
                           f"rank(s) {others} (stage(s) {sorted({costs[r]['stage'] for r in others})})")
            found.append(Symptom(
                code="straggler", severity="warning",
                what=f"rank {rank} is a straggler: its forward + backward take {ratio:.1f}× as long as {peer_words}",
                where=Where(rank=rank, stage=stage, instruction=slower, step=since),
                evidence={"slowdown": round(ratio, 2),
                          "compute_ms_per_micro_batch": {r: _ms(o["forward"] + o["backward"]) for r, o in ranks.items()},
                          "slow_from_step": since},
                cause=f"rank {rank} runs the same layers as {peers_short} on micro-batches of the same size, so only "
                      "the rank itself can be slower: a slower or throttled device, another process on its cores, a "
                      "noisy neighbour (or an injected slow fault)",
                fix=f"find what else runs on rank {rank}'s device or cores and move it away, or replace the device; "
                    "every rank that exchanges with it waits for it"))
    # The worst first: it is the run's primary finding (a rank that merely shares its cores
    # with the others can measure slower too, but less).
    return sorted(found, key=lambda s: -s.evidence["slowdown"])


def _predicted_stragglers(costs: dict[int, dict], predicted: Sequence[float] | None,
                          timeline: Timeline) -> list[Symptom]:
    if not predicted or len(predicted) != timeline.num_stages or min(predicted) <= 0:
        return []
    measured = {}
    for stage in range(timeline.num_stages):  # the fastest replica: one slow replica is not a slow stage
        values = [c["forward"] + c["backward"] for c in costs.values() if c["stage"] == stage]
        if values:
            measured[stage] = min(values)
    if len(measured) < 2:
        return []
    ratios = {s: measured[s] / predicted[s] for s in measured}
    reference = median(ratios.values())
    found = []
    for stage, ratio in ratios.items():
        relative = ratio / reference
        if relative < STRAGGLER_FACTOR:
            continue
        ranks = [r for r, c in costs.items() if c["stage"] == stage]
        found.append(Symptom(
            code="straggler", severity="warning",
            what=f"stage {stage} ran {relative:.1f}× slower than the profile predicted, compared with the other "
                 "stages",
            where=Where(rank=ranks[0] if len(ranks) == 1 else None, stage=stage),
            evidence={"measured_ms": {s: _ms(m) for s, m in measured.items()},
                      "predicted_ms": {s: _ms(p) for s, p in enumerate(predicted)},
                      "measured_over_predicted": {s: round(r, 2) for s, r in ratios.items()}},
            cause=f"the profile measured stage {stage}'s layers at their usual speed; on this run its rank(s) took "
                  f"{relative:.1f}× as long as the other stages did relative to theirs: the rank is slow, not its layers",
            fix=f"look for what slows rank(s) {ranks} (a throttled device, other processes on its cores); a new "
                "partition would only move work onto a slow rank"))
    return found


def _imbalance(summary: Metrics | MetricsSummary, slow_stages: set[int | None]) -> list[Symptom]:
    if summary.imbalance is None or summary.imbalance < IMBALANCE_THRESHOLD:
        return []
    stage = summary.slowest_stage
    rank_slow = stage in slow_stages
    return [Symptom(
        code="imbalance", severity="warning",
        what=f"stage {stage} is the bottleneck: {summary.imbalance:.2f}× the mean stage compute",
        where=Where(stage=stage),
        evidence={"imbalance": round(summary.imbalance, 3),
                  "stage_compute_ms": [_ms(c) for c in summary.stage_compute],
                  "bubble_ratio": round(summary.bubble_ratio, 3)},
        cause=(f"stage {stage}'s rank is slow (see the straggler finding), not its share of the layers" if rank_slow else
               f"stage {stage} holds more work than the others; every stage waits for it once per micro-batch"),
        fix=("fix the slow rank first" if rank_slow else
             f"move layers off stage {stage}: partition='profile' (measured per-layer costs, exact balance) or "
             "explicit boundaries from utils.partition_layers"))]


def _bubble(summary: Metrics | MetricsSummary, baseline: FillAndDrain | None) -> list[Symptom]:
    """The median step's bubble split three ways: fill and drain (what balanced stages would
    idle: ``(p-1)/(m+p-1)`` in 1F1B and GPipe, the schedule's own formula in `baseline`), imbalance (what the measured stage costs add to that, by
    `bubble_ratio_estimate`: every stage waits for the slowest at every micro-batch), and the
    rest (exposed communication, data loads, ranks competing for cores)."""
    per_step = summary.used if isinstance(summary, MetricsSummary) else [summary]
    m = sorted(per_step, key=lambda x: x.bubble_ratio)[len(per_step) // 2]
    p, count = m.num_stages, m.num_micro_batches
    if p < 2 or min(m.stage_compute) <= 0:
        return []
    fill = bubble_ratio_1f1b(p, count) if baseline is None else baseline.ratio
    formula = "(p-1)/(m+p-1)" if baseline is None else baseline.formula
    estimate = bubble_ratio_estimate([c / count for c in m.stage_compute], count)
    imbalance = max(0.0, estimate - fill)
    other = max(0.0, m.bubble_ratio - max(estimate, fill))
    parts = {"fill_and_drain": fill, "imbalance": imbalance, "other": other}
    main = max(parts, key=parts.get)
    evidence = {"bubble_ratio": round(m.bubble_ratio, 3), **{k: round(v, 3) for k, v in parts.items()},
                "micro_batches": count, "stages": p, "step": m.step}
    head = f"bubble {m.bubble_ratio:.0%} of stage time"
    if main == "fill_and_drain":
        return [Symptom(
            code="bubble", severity="info" if m.bubble_ratio < 0.5 else "warning",
            what=f"{head}, mostly fill and drain: balanced {p} stages × {count} micro-batches idle {fill:.0%}",
            where=Where(step=m.step), evidence=evidence,
            cause=f"with p = {p} stages and m = {count} micro-batches every stage idles {formula} of the step "
                  "while the pipeline fills and drains",
            fix=f"more micro-batches per step (m ≥ 4p = {4 * p}) at a smaller micro-batch size, or fewer stages")]
    if main == "imbalance":
        return [Symptom(
            code="bubble", severity="warning",
            what=f"{head}, mostly stages waiting for the slowest one (stage {m.slowest_stage}): {imbalance:.0%} "
                 f"on top of fill and drain ({fill:.0%})",
            where=Where(stage=m.slowest_stage, step=m.step), evidence=evidence,
            cause=f"every other stage waits for stage {m.slowest_stage} once per micro-batch in the steady state",
            fix="balance the stages (or fix the straggler); more micro-batches do not shrink this part")]
    return [Symptom(
        code="bubble", severity="warning",
        what=f"{head}, mostly time the stage costs do not explain: {other:.0%} beyond fill and drain ({fill:.0%}) "
             f"and imbalance ({imbalance:.0%})",
        where=Where(step=m.step), evidence=evidence,
        cause="exposed send/recv, data loading and ranks competing for the same cores keep stages idle between "
              "their computations",
        fix="see the communication finding; on CPU give each rank its own core (fewer stages, or fewer ranks)")]


def _memory(step_memory: Mapping[int, int], timeline: Timeline) -> Symptom:
    stages = sorted(step_memory)
    top = max(stages, key=lambda s: step_memory[s])
    schedule = timeline.meta.get("schedule", "1f1b")
    p = timeline.num_stages
    if schedule == "gpipe":
        why = (f"GPipe runs all {timeline.num_micro_batches} forwards before any backward, so every stage holds "
               "the activations of every micro-batch at once")
        fix = "1F1B (schedule='1f1b') caps what is in flight at p - stage micro-batches; or activation checkpointing"
    elif schedule == "1f1b":
        why = ("in 1F1B stage s keeps the activations of up to p - s micro-batches until their backward: the first "
               f"stage holds the most (p = {p})" + ("" if top == 0 else f"; stage {top} still adds the most here, "
                                                    "so its layers' activations are larger"))
        fix = ("activation_checkpointing (activation_checkpoint_interval=1 keeps only layer inputs), a smaller "
               "micro_batch_size, or fewer layers on that stage")
    else:
        why = (f"{schedule} keeps some micro-batches' activations until their backward on every rank; stage "
               f"{top} adds the most here (the simulator's activation_memory shows the schedule's own peak per rank)")
        fix = "a smaller micro_batch_size, fewer layers on that stage, or a schedule with fewer micro-batches in flight"
    return Symptom(
        code="memory", severity="info",
        what=f"stage {top} adds the most memory per step: {step_memory[top] / 2**20:.1f} MB",
        where=Where(stage=top),
        evidence={"step_memory_mb": {s: round(step_memory[s] / 2**20, 2) for s in stages}},
        cause=why, fix=fix)
