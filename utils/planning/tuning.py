"""The auto-tuner's search, without processes: partition × micro-batch count × schedule
(× interleaving, simulated only) for a fixed global batch under a per-rank memory budget.

Inputs are a `LayerModel` — every layer's forward and backward seconds as a line in the
micro-batch size ``b`` (``fixed + per_sample · b``, fitted to two profiles at different sizes
by `fit_layer_model`), its activation bytes per sample and its static bytes (weights, gradients,
optimizer state) — and a `Calibration` from one real run: scale factors for what the profile
misses inside a job, the link latency, and the per-step time outside the pipeline phase
(optimizer step, gradient reduction). `tune` simulates every candidate's schedule with those
costs (`utils.planning.schedules.Schedule`'s event-driven timing, the simulator's core) and
returns them fastest first. `utils.jobs.autotune` measures the inputs and confirms the best
candidates with real runs.

Ranges where the model holds: the per-layer line is fitted between the two profiled sizes
and extrapolated beyond them (fine while a layer stays compute-bound, wrong for tiny ``b`` on a
GPU where kernels are launch-bound); ``zb-h1`` splits each backward into equal input and
weight halves (an assumption: the workbook's jobs do not measure the split); interleaving and
zb-h1 are predictions only, DeepSpeed's engine runs ``1f1b`` and ``gpipe``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from utils.planning.partitioning import partition_layers
from utils.planning.schedules import Schedule, build_schedule

__all__ = ["LayerModel", "Calibration", "Candidate", "fit_layer_model", "tune", "predict", "RUNNABLE_SCHEDULES"]

RUNNABLE_SCHEDULES = ("1f1b", "gpipe")
"""Schedules a real job runs on DeepSpeed's engine (`utils.jobs.spec.JOB_SCHEDULES`)."""
TUNED_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1")
PARTITIONS = ("uniform", "parameters", "balanced")
STATIC_BYTES_PER_PARAM_BYTE = 4
"""fp32 Adam keeps a weight, its gradient and two moments: four times the parameter bytes."""


@dataclass(frozen=True)
class LayerModel:
    """Per-layer cost and memory as functions of the micro-batch size `b` (samples)."""

    forward_fixed: tuple[float, ...]
    forward_per_sample: tuple[float, ...]
    backward_fixed: tuple[float, ...]
    backward_per_sample: tuple[float, ...]
    activation_per_sample: tuple[float, ...]
    """Bytes one sample's activations occupy in the layer until its backward."""
    static: tuple[float, ...]
    """Bytes held whatever the schedule: weights, gradients, optimizer state."""
    params: tuple[float, ...]
    """Trainable parameters (DeepSpeed's ``parameters`` method balances these)."""

    @property
    def num_layers(self) -> int:
        return len(self.forward_fixed)

    def forward(self, b: float) -> list[float]:
        return [f + s * b for f, s in zip(self.forward_fixed, self.forward_per_sample)]

    def backward(self, b: float) -> list[float]:
        return [f + s * b for f, s in zip(self.backward_fixed, self.backward_per_sample)]


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
    """Seconds per step outside the pipeline phase (optimizer step, gradient reduction)."""
    activation_scale: float = 1.0
    """Measured activation bytes per stage / the model's (what a profile cannot see: autograd
    buffers, the allocator)."""
    action_overhead: float = 0.0
    """Seconds added to every forward and backward: the per-instruction cost a layer profile
    cannot see (the blocking send/recv around each micro-batch, DeepSpeed's bookkeeping, the
    tracer), solved so that the calibration run's own configuration simulates to its measured
    makespan. Per instruction, so a candidate with more micro-batches pays it more often."""


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
    """Predicted seconds per step: the simulated pipeline phase plus the calibrated overhead."""
    bubble: float
    peak_memory: tuple[float, ...]
    """Predicted bytes per rank at peak: static plus activations in flight."""
    feasible: bool
    """Every rank's peak fits the memory budget (True without a budget)."""

    @property
    def runnable(self) -> bool:
        """DeepSpeed's engine runs it (no interleaving, schedule ``1f1b`` or ``gpipe``)."""
        return self.schedule in RUNNABLE_SCHEDULES and self.chunks == 1

    def row(self) -> dict:
        return {"stages": self.num_stages, "partition": self.partition, "boundaries": list(self.boundaries),
                "schedule": self.schedule + (f" ×{self.chunks}" if self.chunks > 1 else ""),
                "micro_batches": self.micro_batches, "micro_batch_size": self.micro_batch_size,
                "step_ms": round(self.step_time * 1e3, 2), "bubble": round(self.bubble, 3),
                "peak_MB": round(max(self.peak_memory) / 2**20, 1), "feasible": self.feasible,
                "runnable": self.runnable}


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


def tune(model: LayerModel, *, global_batch: int, data_parallel: int = 1, stages: Sequence[int] = (2,),
         schedules: Sequence[str] = TUNED_SCHEDULES, partitions: Sequence[str] = PARTITIONS,
         chunks: int = 2, micro_batch_counts: Sequence[int] | None = None,
         memory_budget: float | None = None, calibration: Calibration = Calibration()) -> list[Candidate]:
    """Every candidate, feasible ones first, each group fastest first (then least memory).

    For each stage count, schedule (``interleaved-1f1b`` with `chunks` chunks per rank),
    micro-batch count m dividing the per-replica batch (or `micro_batch_counts`) and partition
    method: the partition's virtual-stage costs at ``b = batch / m`` samples, scaled by the
    calibration, timed on the schedule's dependency graph with the calibrated link latency; the
    peak memory of each rank is its static bytes plus its activations in flight at peak
    (`Schedule.in_flight`). Partitions that coincide are evaluated once. Raises ValueError for
    a batch that does not split over the replicas or an unknown schedule or partition.
    """
    if global_batch < 1 or data_parallel < 1 or global_batch % data_parallel:
        raise ValueError(f"global_batch {global_batch} must be a positive multiple of data_parallel {data_parallel}")
    unknown = [s for s in schedules if s not in TUNED_SCHEDULES] + [m for m in partitions if m not in PARTITIONS]
    if unknown:
        raise ValueError(f"unknown schedule or partition {unknown}; schedules: {TUNED_SCHEDULES}, "
                         f"partitions: {PARTITIONS}")
    batch = global_batch // data_parallel
    counts = sorted(micro_batch_counts or [d for d in range(1, batch + 1) if batch % d == 0])
    cal = calibration
    found: list[Candidate] = []
    for p in stages:
        for name in schedules:
            v = chunks if name == "interleaved-1f1b" else 1
            for m in counts:
                sched = _schedule(name, p, m, v)
                if sched is None or batch % m:
                    continue
                b = batch // m
                fwd = [cal.forward_scale * x for x in model.forward(b)]
                bwd = [cal.backward_scale * x for x in model.backward(b)]
                act = [cal.activation_scale * x * b for x in model.activation_per_sample]
                seen: set[tuple[int, ...]] = set()
                for method in partitions:
                    cuts = _boundaries(model, method, p * v, b)
                    if cuts is None or cuts in seen:
                        continue
                    seen.add(cuts)
                    found.append(_evaluate(sched, method, cuts, fwd, bwd, act, model.static, b, cal, memory_budget))
    # Ties (GPipe and 1F1B take equally long) go to the one holding less memory.
    return sorted(found, key=lambda c: (not c.feasible, c.step_time, max(c.peak_memory), c.micro_batches))


def predict(model: LayerModel, boundaries: Sequence[int], *, schedule: str, micro_batches: int, global_batch: int,
            data_parallel: int = 1, chunks: int = 1, partition: str = "explicit",
            memory_budget: float | None = None, calibration: Calibration = Calibration()) -> Candidate:
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
    return _evaluate(sched, partition, tuple(boundaries), [cal.forward_scale * x for x in model.forward(b)],
                     [cal.backward_scale * x for x in model.backward(b)],
                     [cal.activation_scale * x * b for x in model.activation_per_sample], model.static, b, cal,
                     memory_budget)


def _evaluate(sched: Schedule, method: str, cuts: tuple[int, ...], fwd: list[float], bwd: list[float],
              act: list[float], static: Sequence[float], b: int, cal: Calibration,
              budget: float | None) -> Candidate:
    p, v, m = sched.num_stages, sched.chunks, sched.num_micro_batches
    vs = p * v
    f = [cal.action_overhead + sum(fwd[cuts[k]:cuts[k + 1]]) for k in range(vs)]
    bw = [cal.action_overhead + sum(bwd[cuts[k]:cuts[k + 1]]) for k in range(vs)]
    cost = {"forward": f, "backward": bw, "backward_input": [x / 2 for x in bw],
            "backward_weight": [x / 2 for x in bw]}
    plan = sched._plan
    durations = [cost[a.kind][a.virtual_stage] for a in plan.actions]
    start, end = plan.times(durations, cal.comm, p)
    makespan = max(end) - min(start)
    bubble = 1.0 - sum(durations) / (p * makespan) if makespan > 0 else 0.0
    peaks = []
    for r in range(p):
        mine = [k for k in range(vs) if sched.rank_of(k) == r]
        held = sum(sum(static[cuts[k]:cuts[k + 1]]) for k in mine)
        per_set = sum(sum(act[cuts[k]:cuts[k + 1]]) for k in mine) / v  # one chunk's activations, on average
        peaks.append(held + sched.in_flight(r) * per_set)
    feasible = budget is None or all(x <= budget for x in peaks)
    return Candidate(num_stages=p, partition=method, boundaries=cuts, schedule=sched.name, chunks=v,
                     micro_batches=m, micro_batch_size=b, step_time=makespan + cal.overhead, bubble=bubble,
                     peak_memory=tuple(peaks), feasible=feasible)

