"""The auto-tuner's search, without processes: pipeline depth × data-parallel degree for a
fixed device count, partition × micro-batch count × schedule (× interleaving, simulated only),
ZeRO stage 0/1 and activation checkpointing, for a fixed global batch under a per-rank memory
budget.

Inputs are a `LayerModel` — every layer's forward and backward seconds as a line in the
micro-batch size ``b`` (``fixed + per_sample · b``, fitted to two profiles at different sizes
by `fit_layer_model`), its output bytes per sample and its static bytes (weights, gradients,
optimizer state) — and a `Calibration` from one real run: scale factors for what the profile
misses inside a job, the link latency, the per-step time outside the pipeline phase
(optimizer step) and the α-β figures of a link for the data-parallel collectives. `tune`
simulates every candidate's schedule with those costs (`utils.planning.schedules.Schedule`'s
event-driven timing, the simulator's core) and returns them fastest first; `choose` picks the
one to run (the least memory among those within a tolerance of the fastest).
`utils.jobs.autotune` measures the inputs and confirms the chosen candidates with real runs.

Ranges where the model holds: the per-layer line is fitted between the two profiled sizes
and extrapolated beyond them (fine while a layer stays compute-bound, wrong for tiny ``b`` on a
GPU where kernels are launch-bound); ``zb-h1`` splits each backward into equal input and
weight halves (an assumption: the workbook's jobs do not measure the split); interleaving and
zb-h1 are predictions only, DeepSpeed's engine runs ``1f1b`` and ``gpipe``. The collective,
ZeRO-1 and checkpointing models state their own ranges (`allreduce_seconds`,
`static_bytes_per_param_byte`, `_activations`); all of them assume fp32 training with Adam (the
workbook's jobs), one rank per core or device (contention between ranks sharing cores is not
modelled), and a calibrated ``overhead`` (the optimizer step) that does not change with the
split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from utils.planning.catalogue import SCHEDULE_NAMES, schedule_info, schedules_on
from utils.planning.partitioning import partition_layers
from utils.planning.schedules import Schedule, build_schedule

__all__ = ["LayerModel", "Calibration", "Candidate", "fit_layer_model", "tune", "predict", "choose", "ranked",
           "allreduce_seconds", "allgather_seconds", "static_bytes_per_param_byte", "RUNNABLE_SCHEDULES",
           "DEFAULT_TOLERANCE"]

RUNNABLE_SCHEDULES = schedules_on("deepspeed")
"""Schedules a real job runs on DeepSpeed's engine (`utils.planning.catalogue`)."""
TUNED_SCHEDULES = tuple(name for name in SCHEDULE_NAMES if schedule_info(name).placement == "loop")
"""The loop-placed schedules of the catalogue. The V schedules (DualPipeV, ZB-V) are left out until
their predictions are checked against real runs of the tuned presets: they run on torch's
runtime only, which does not run the presets yet."""
PARTITIONS = ("uniform", "parameters", "balanced")
STATIC_BYTES_PER_PARAM_BYTE = 4
"""fp32 Adam keeps a weight, its gradient and two moments: four times the parameter bytes."""
ZERO_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``zero_optimization.reduce_bucket_size`` (elements): with ZeRO-1 a
pipeline allocates a bucket of this many fp32 elements per step (chapter 14 measures it)."""
DEFAULT_TOLERANCE = 0.05
"""`choose`'s tolerance when no measured prediction error is at hand."""


def static_bytes_per_param_byte(zero_stage: int, data_parallel: int) -> float:
    """Static bytes per parameter byte on one rank, fp32 training with Adam.

    ZeRO 0: weight, gradient, two moments (4). ZeRO-1 (DeepSpeed's ``DeepSpeedZeroOptimizer``):
    the full weights and the full gradients accumulated over the micro-batches stay on every
    rank (2), while the optimizer's fp32 copy of the rank's partition (``weights_partition =
    ... .detach().clone()``, made even when the model is fp32) and its two moments are split
    over the ``d`` replicas (3/d). Range: fp32 + Adam; the reduce bucket is counted apart
    (`tune`'s ``zero_bucket_bytes``); the transient flat gradient partition of the step (1/d)
    is left out."""
    if zero_stage not in (0, 1):
        raise ValueError(f"zero_stage {zero_stage}: pipelines run ZeRO 0 or 1")
    return float(STATIC_BYTES_PER_PARAM_BYTE) if zero_stage == 0 else 2 + 3 / data_parallel


def allreduce_seconds(nbytes: float, data_parallel: int, latency: float, bandwidth: float) -> float:
    """Ring all-reduce of `nbytes` over `data_parallel` ranks on links of `latency` seconds
    and `bandwidth` bytes/s (the α-β model of `utils.profiling.link`):
    ``2(d − 1)α + 2(d − 1)/d · bytes/β``. Range: one message per ring step (DeepSpeed flattens a
    stage's gradients into buckets of up to 5e8 elements: one bucket for the workbook's
    models), every link alike and idle (one rank per device; ranks sharing cores contend),
    gloo/NCCL picking the ring (they may choose a tree or halving-doubling for small
    messages, faster in latency); 0 for d = 1."""
    d = data_parallel
    return 0.0 if d <= 1 else 2 * (d - 1) * latency + 2 * (d - 1) / d * nbytes / bandwidth


def allgather_seconds(nbytes: float, data_parallel: int, latency: float, bandwidth: float) -> float:
    """Ring all-gather of `nbytes` in `data_parallel` equal partitions:
    ``(d − 1)α + (d − 1)/d · bytes/β`` (half an all-reduce); same range as `allreduce_seconds`."""
    d = data_parallel
    return 0.0 if d <= 1 else (d - 1) * latency + (d - 1) / d * nbytes / bandwidth


@dataclass(frozen=True)
class LayerModel:
    """Per-layer cost and memory as functions of the micro-batch size `b` (samples)."""

    forward_fixed: tuple[float, ...]
    forward_per_sample: tuple[float, ...]
    backward_fixed: tuple[float, ...]
    backward_per_sample: tuple[float, ...]
    activation_per_sample: tuple[float, ...]
    """Bytes of one sample's output of the layer: what a layer keeps until its backward, up
    to the calibrated `Calibration.activation_scale`, and what a checkpointed segment keeps
    of its input."""
    static: tuple[float, ...]
    """Bytes held whatever the schedule without ZeRO: weights, gradients, optimizer state."""
    params: tuple[float, ...]
    """Trainable parameters (DeepSpeed's ``parameters`` method balances these)."""

    @property
    def num_layers(self) -> int:
        return len(self.forward_fixed)

    def forward(self, b: float) -> list[float]:
        return [f + s * b for f, s in zip(self.forward_fixed, self.forward_per_sample)]

    def backward(self, b: float) -> list[float]:
        return [f + s * b for f, s in zip(self.backward_fixed, self.backward_per_sample)]

    @property
    def param_bytes(self) -> tuple[float, ...]:
        """Each layer's parameter bytes (= its gradient bytes)."""
        return tuple(x / STATIC_BYTES_PER_PARAM_BYTE for x in self.static)


def fit_layer_model(first, second=None) -> LayerModel:
    """A `LayerModel` from one or two `LayerProfile`s of the same model (anything with
    ``micro_batch_size``, ``forward``, ``backward``, ``activation_bytes``, ``param_bytes``).

    With two micro-batch sizes each layer's cost is the line through both medians (slope
    clipped at 0, intercept at 0); with one, the cost is proportional to ``b``."""
    profiles = [p for p in (first, second) if p is not None]
    if len({len(p.forward) for p in profiles}) != 1:
        raise ValueError("the profiles are of different models (different layer counts)")
    a = max(profiles, key=lambda p: p.micro_batch_size)
    c = min(profiles, key=lambda p: p.micro_batch_size)

    def line(big: Sequence[float], small: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
        if a.micro_batch_size == c.micro_batch_size:
            return tuple(0.0 for _ in big), tuple(t / a.micro_batch_size for t in big)
        slopes = [max(0.0, (x - y) / (a.micro_batch_size - c.micro_batch_size)) for x, y in zip(big, small)]
        return tuple(max(0.0, x - s * a.micro_batch_size) for x, s in zip(big, slopes)), tuple(slopes)

    ff, fs = line(a.forward, c.forward)
    bf, bs = line(a.backward, c.backward)
    return LayerModel(forward_fixed=ff, forward_per_sample=fs, backward_fixed=bf, backward_per_sample=bs,
                      activation_per_sample=tuple(x / a.micro_batch_size for x in a.activation_bytes),
                      static=tuple(STATIC_BYTES_PER_PARAM_BYTE * x for x in a.param_bytes),
                      params=tuple(x / 4 for x in a.param_bytes))


@dataclass(frozen=True)
class Calibration:
    """What one real run adds to the profile (`utils.jobs.autotune.calibrate` measures it)."""

    forward_scale: float = 1.0
    """Measured stage forward time / the model's, over the calibration run's stages."""
    backward_scale: float = 1.0
    comm: float = 0.0
    """Seconds to hand an activation or a gradient to the next rank."""
    overhead: float = 0.0
    """Seconds per step outside the pipeline phase and the modelled collectives (the
    optimizer step, bookkeeping)."""
    activation_scale: float = 1.0
    """Measured activation bytes per stage / the model's (what a profile cannot see: autograd
    buffers, the allocator)."""
    action_overhead: float = 0.0
    """Seconds added to every forward and backward: the per-instruction cost a layer profile
    cannot see (the blocking send/recv around each micro-batch, DeepSpeed's bookkeeping, the
    tracer), solved so that the calibration run's own configuration simulates to its measured
    makespan. Per instruction, so a candidate with more micro-batches pays it more often."""
    link_latency: float = 0.0
    """α (seconds) of the links the data-parallel collectives run on (`allreduce_seconds`)."""
    link_bandwidth: float = math.inf
    """β (bytes/s) of those links. The defaults (α = 0, β = ∞) price every collective at 0:
    fit them (`utils.jobs.autotune.calibrate_link`) before comparing data-parallel degrees."""


@dataclass(frozen=True)
class Candidate:
    """One configuration and its predicted outcome."""

    num_stages: int
    partition: str
    """``"uniform"``, ``"parameters"`` (DeepSpeed's methods) or ``"balanced"`` (exact min-max
    over the model's per-layer times at this micro-batch size)."""
    boundaries: tuple[int, ...]
    """Over ``num_stages × chunks`` virtual stages."""
    schedule: str
    chunks: int
    micro_batches: int
    micro_batch_size: int
    step_time: float
    """Predicted seconds per step: the simulated pipeline phase, each rank's data-parallel
    collectives after its last backward, and the calibrated overhead."""
    bubble: float
    peak_memory: tuple[float, ...]
    """Predicted bytes per rank at peak: static plus activations in flight."""
    feasible: bool
    """Every rank's peak fits the memory budget (True without a budget)."""
    data_parallel: int = 1
    """Replicas of the pipeline: the job runs ``num_stages × data_parallel`` ranks."""
    zero_stage: int = 0
    checkpoint_interval: int = 0
    """``activation_checkpoint_interval`` (0: every activation kept)."""
    collective_time: float = 0.0
    """Predicted seconds of the slowest stage's gradient all-reduce (and, with ZeRO-1, the
    all-gather of the updated partitions), included in `step_time`."""

    @property
    def runnable(self) -> bool:
        """DeepSpeed's engine runs it (no interleaving, schedule ``1f1b`` or ``gpipe``)."""
        return self.schedule in RUNNABLE_SCHEDULES and self.chunks == 1

    @property
    def devices(self) -> int:
        return self.num_stages * self.data_parallel

    def row(self) -> dict:
        return {"stages": self.num_stages, "dp": self.data_parallel, "partition": self.partition,
                "boundaries": list(self.boundaries),
                "schedule": self.schedule + (f" ×{self.chunks}" if self.chunks > 1 else ""),
                "micro_batches": self.micro_batches, "micro_batch_size": self.micro_batch_size,
                "zero": self.zero_stage, "ckpt": self.checkpoint_interval,
                "step_ms": round(self.step_time * 1e3, 2), "collective_ms": round(self.collective_time * 1e3, 2),
                "bubble": round(self.bubble, 3), "peak_MB": round(max(self.peak_memory) / 2**20, 1),
                "feasible": self.feasible, "runnable": self.runnable}


@lru_cache(maxsize=4096)
def _schedule(name: str, p: int, m: int, v: int) -> Schedule | None:
    try:
        return build_schedule(name, p, m, chunks=v if v > 1 else None)
    except ValueError:  # m not allowed for interleaving, or p·v > layers
        return None


def _boundaries(model: LayerModel, method: str, parts: int, b: float) -> tuple[int, ...] | None:
    if parts > model.num_layers:
        return None
    if method == "balanced":
        costs = [f + w for f, w in zip(model.forward(b), model.backward(b))]
        return tuple(partition_layers(costs, parts, method="balanced"))
    params = list(model.params)
    return tuple(partition_layers(params, parts, method=method, **({"params": params} if method == "parameters" else {})))


def _splits(devices: int | None, stages: Sequence[int] | None, data_parallel: int, global_batch: int,
            layers: int) -> list[tuple[int, int]]:
    if devices is None:
        return [(p, data_parallel) for p in (stages or (2,))]
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    return [(p, devices // p) for p in range(1, devices + 1) if devices % p == 0 and p <= layers
            and (stages is None or p in stages) and global_batch % (devices // p) == 0]


def tune(model: LayerModel, *, global_batch: int, data_parallel: int = 1, stages: Sequence[int] | None = None,
         devices: int | None = None, schedules: Sequence[str] = TUNED_SCHEDULES,
         partitions: Sequence[str] = PARTITIONS, chunks: int = 2, micro_batch_counts: Sequence[int] | None = None,
         zero_stages: Sequence[int] = (0,), checkpoint_intervals: Sequence[int] = (0,),
         memory_budget: float | None = None, calibration: Calibration = Calibration(),
         zero_bucket_bytes: float = 4.0 * ZERO_REDUCE_BUCKET_ELEMENTS) -> list[Candidate]:
    """Every candidate, feasible ones first, each group fastest first (then least memory).
    Which one to run is `choose`'s (the least memory within a tolerance of the fastest).

    The splits: with `devices`, every ``p × d = devices`` with ``p`` pipeline stages (at most
    the layer count; only those in `stages` when given) and ``d`` replicas dividing the global
    batch; without, `stages` (default ``(2,)``) × `data_parallel`. For each split, schedule
    (``interleaved-1f1b`` with `chunks` chunks per rank), micro-batch count m dividing the
    per-replica batch (or `micro_batch_counts`), ZeRO stage (`zero_stages`, 0 or 1; 1 only with
    d > 1, where it divides the optimizer state), checkpoint interval (`checkpoint_intervals`,
    0 = none) and partition method: the partition's virtual-stage costs at ``b = batch / (d·m)``
    samples, scaled by the calibration, timed on the schedule's dependency graph with the
    calibrated link latency, plus each stage's collectives (`allreduce_seconds`, with ZeRO-1
    `allgather_seconds`); the peak memory of each rank is its static bytes
    (`static_bytes_per_param_byte`, plus `zero_bucket_bytes` with ZeRO-1: DeepSpeed's reduce
    bucket, 5e8 fp32 elements unless the config sets ``reduce_bucket_size``) plus its
    activations in flight at peak (`Schedule.in_flight`, `_activations`). Partitions that
    coincide are evaluated once. Raises ValueError for a batch that does not split over the
    replicas or an unknown schedule, partition or ZeRO stage.
    """
    if global_batch < 1 or data_parallel < 1 or global_batch % data_parallel:
        raise ValueError(f"global_batch {global_batch} must be a positive multiple of data_parallel {data_parallel}")
    unknown = [s for s in schedules if s not in TUNED_SCHEDULES] + [m for m in partitions if m not in PARTITIONS]
    if unknown:
        raise ValueError(f"unknown schedule or partition {unknown}; schedules: {TUNED_SCHEDULES}, "
                         f"partitions: {PARTITIONS}")
    if any(z not in (0, 1) for z in zero_stages) or any(k < 0 for k in checkpoint_intervals):
        raise ValueError(f"zero_stages must be 0 or 1 (pipelines), checkpoint intervals >= 0; got "
                         f"{list(zero_stages)}, {list(checkpoint_intervals)}")
    cal = calibration
    found: list[Candidate] = []
    for p, d in _splits(devices, stages, data_parallel, global_batch, model.num_layers):
        batch = global_batch // d
        counts = sorted(micro_batch_counts or [c for c in range(1, batch + 1) if batch % c == 0])
        for name in schedules:
            v = schedule_info(name).chunks_for(chunks)
            for m in counts:
                sched = _schedule(name, p, m, v)
                if sched is None or batch % m:
                    continue
                b = batch // m
                fwd = [cal.forward_scale * x for x in model.forward(b)]
                bwd = [cal.backward_scale * x for x in model.backward(b)]
                seen: set[tuple[int, ...]] = set()
                for method in partitions:
                    cuts = _boundaries(model, method, p * v, b)
                    if cuts is None or cuts in seen:
                        continue
                    seen.add(cuts)
                    for zero in zero_stages:
                        if zero and d == 1:  # nothing to divide the optimizer state over
                            continue
                        for k in checkpoint_intervals:
                            found.append(_evaluate(model, sched, method, cuts, fwd, bwd, b, cal, memory_budget,
                                                   d, zero, k, zero_bucket_bytes))
    # Ties (GPipe and 1F1B take equally long) go to the one holding less memory.
    return sorted(found, key=lambda c: (not c.feasible, c.step_time, max(c.peak_memory), c.micro_batches))


def ranked(candidates: Sequence[Candidate], tolerance: float = DEFAULT_TOLERANCE) -> list[Candidate]:
    """The feasible runnable candidates in the order to adopt them: those predicted within
    `tolerance` (relative) of the fastest, least peak memory first (then faster); then the
    rest, fastest first.

    Why: a prediction error of e makes predicted step times that differ by less than e
    indistinguishable, while memory is a prediction of a different kind (static bytes are
    counted; activations scale with a calibrated factor) and the memory left over buys a larger
    batch or a longer sequence. Pass the model's measured out-of-sample error (a `Tuning`'s
    ``median_error``) when there is one; `DEFAULT_TOLERANCE` (5 %) otherwise. 0 ranks purely
    by predicted time."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    ok = sorted((c for c in candidates if c.feasible and c.runnable), key=lambda c: (c.step_time, max(c.peak_memory)))
    if not ok:
        return []
    limit = ok[0].step_time * (1 + tolerance)
    near = sorted((c for c in ok if c.step_time <= limit), key=lambda c: (max(c.peak_memory), c.step_time))
    return near + [c for c in ok if c.step_time > limit]


def choose(candidates: Sequence[Candidate], tolerance: float = DEFAULT_TOLERANCE) -> Candidate:
    """`ranked`'s first: among the feasible runnable candidates predicted within `tolerance` of
    the fastest, the one holding the least peak memory. ValueError when none is feasible."""
    order = ranked(candidates, tolerance)
    if not order:
        raise ValueError("no runnable candidate fits the memory budget; raise memory_budget")
    return order[0]


def predict(model: LayerModel, boundaries: Sequence[int], *, schedule: str, micro_batches: int, global_batch: int,
            data_parallel: int = 1, chunks: int = 1, partition: str = "explicit", zero_stage: int = 0,
            checkpoint_interval: int = 0, memory_budget: float | None = None,
            calibration: Calibration = Calibration(),
            zero_bucket_bytes: float = 4.0 * ZERO_REDUCE_BUCKET_ELEMENTS) -> Candidate:
    """One configuration at given `boundaries` (over ``stages × chunks`` virtual stages),
    predicted as `tune` predicts its candidates: a run's own configuration, say."""
    batch = global_batch // data_parallel
    if batch * data_parallel != global_batch or batch % micro_batches:
        raise ValueError(f"{micro_batches} micro-batches do not split {global_batch} samples over {data_parallel} replica(s)")
    parts = len(boundaries) - 1
    if parts % chunks:
        raise ValueError(f"{parts} virtual stages do not split into {chunks} chunk(s) per rank")
    sched = _schedule(schedule, parts // chunks, micro_batches, chunks)
    if sched is None:
        raise ValueError(f"{schedule} cannot run {micro_batches} micro-batches on {parts // chunks} stages × {chunks}")
    b, cal = batch // micro_batches, calibration
    return _evaluate(model, sched, partition, tuple(boundaries), [cal.forward_scale * x for x in model.forward(b)],
                     [cal.backward_scale * x for x in model.backward(b)], b, cal, memory_budget, data_parallel,
                     zero_stage, checkpoint_interval, zero_bucket_bytes)


def _segments(model: LayerModel, first: int, stop: int, interval: int) -> list[tuple[int, int, bool]]:
    """DeepSpeed's ``PipelineModule.forward``: a stage's layers in runs of `interval` from its
    first layer; a run is checkpointed when one of its layers has parameters
    (``_is_checkpointable``'s default). (start, stop, checkpointed) per run; one unchecked
    run without checkpointing."""
    if interval <= 0:
        return [(first, stop, False)]
    return [(s, min(s + interval, stop), any(model.params[i] > 0 for i in range(s, min(s + interval, stop))))
            for s in range(first, stop, interval)]


def _activations(model: LayerModel, segments: list[tuple[int, int, bool]], b: int,
                 cal: Calibration) -> tuple[float, float]:
    """(bytes one micro-batch in flight holds, bytes of the one recompute at a time).

    An unchecked run holds its layers' activations (output bytes × the calibrated scale); a
    checkpointed run holds only its input (the previous layer's output; 0 for the model's
    first layer, whose input is token ids), and while its backward recomputes it, its
    activations once. Range: transient buffers inside a layer (attention scores) are in the
    calibrated scale only for unchecked runs; the engine's own input/output buffers are not
    modelled."""
    held, recompute = 0.0, 0.0
    for s, t, checked in segments:
        acts = cal.activation_scale * b * sum(model.activation_per_sample[s:t])
        if checked:
            held += b * model.activation_per_sample[s - 1] if s > 0 else 0.0
            recompute = max(recompute, acts)
        else:
            held += acts
    return held, recompute


def _evaluate(model: LayerModel, sched: Schedule, method: str, cuts: tuple[int, ...], fwd: list[float],
              bwd: list[float], b: int, cal: Calibration, budget: float | None, d: int, zero: int, interval: int,
              bucket: float) -> Candidate:
    p, v, m = sched.num_stages, sched.chunks, sched.num_micro_batches
    vs = p * v
    segments = [_segments(model, cuts[k], cuts[k + 1], interval) for k in range(vs)]
    # Checkpointing: the backward of each checkpointed run first repeats its forward.
    again = [sum(sum(fwd[s:t]) for s, t, checked in segs if checked) for segs in segments]
    f = [cal.action_overhead + sum(fwd[cuts[k]:cuts[k + 1]]) for k in range(vs)]
    bw = [cal.action_overhead + again[k] + sum(bwd[cuts[k]:cuts[k + 1]]) for k in range(vs)]
    cost = {"forward": f, "backward": bw, "backward_input": [x / 2 for x in bw],
            "backward_weight": [x / 2 for x in bw]}
    plan = sched._plan
    durations = [cost[a.kind][a.virtual_stage] for a in plan.actions]
    start, end = plan.times(durations, cal.comm, p)
    makespan = max(end) - min(start)
    bubble = 1.0 - sum(durations) / (p * makespan) if makespan > 0 else 0.0
    factor, peaks, finish, slowest = static_bytes_per_param_byte(zero, d), [], [], 0.0
    last = [min(start)] * p
    for i, r in enumerate(plan.rank):
        last[r] = max(last[r], end[i])
    for r in range(p):
        mine = [k for k in range(vs) if sched.rank_of(k) == r]
        grads = sum(sum(model.param_bytes[cuts[k]:cuts[k + 1]]) for k in mine)
        collective = allreduce_seconds(grads, d, cal.link_latency, cal.link_bandwidth)
        if zero:  # ZeRO-1's step ends by all-gathering the updated partitions (all_gather_dp_groups)
            collective += allgather_seconds(grads, d, cal.link_latency, cal.link_bandwidth)
        finish.append(last[r] + collective)
        slowest = max(slowest, collective)
        acts = [_activations(model, segments[k], b, cal) for k in mine]
        held = sum(a for a, _ in acts) / v  # one chunk's activations, on average
        peaks.append(factor * grads + (bucket if zero else 0.0) + sched.in_flight(r) * held
                     + max(x for _, x in acts))
    feasible = budget is None or all(x <= budget for x in peaks)
    return Candidate(num_stages=p, partition=method, boundaries=cuts, schedule=sched.name, chunks=v,
                     micro_batches=m, micro_batch_size=b, step_time=max(finish) - min(start) + cal.overhead,
                     bubble=bubble, peak_memory=tuple(peaks), feasible=feasible, data_parallel=d, zero_stage=zero,
                     checkpoint_interval=interval, collective_time=slowest)
