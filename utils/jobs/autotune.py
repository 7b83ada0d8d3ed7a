"""`autotune(spec, memory_budget=...)`: measure, search, and confirm with real runs.

1. Two layer profiles of the job's model on its device under its conditions, at its
   micro-batch size and at 1 sample (`utils.jobs.plan.profile_for_job`), fitted to a cost
   line per layer (`utils.planning.tuning.fit_layer_model`).
2. One real run of DeepSpeed's default configuration for this model and batch (partition
   ``"parameters"``, 1F1B, the spec's micro-batches) calibrates what the profile misses
   (`calibrate`), and is the baseline the tuned configuration must beat.
   With data-parallel candidates (``devices`` split into p × d), a ping-pong between two
   processes fits the link's α-β line (`calibrate_link`, `utils.profiling.link`) that prices
   the gradient all-reduce and ZeRO-1's all-gather.
3. `utils.planning.tuning.tune` predicts every candidate (p × d split, partition ×
   micro-batch count × schedule, ZeRO stage, activation checkpointing; interleaving in
   simulation) under the memory budget.
4. The candidates `utils.planning.tuning.ranked` puts first (the least memory among those
   predicted within `tolerance` of the fastest) run for real; prediction and measurement side
   by side.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from utils.jobs.launch import run_job
from utils.jobs.plan import profile_for_job
from utils.jobs.runs import Run
from utils.jobs.spec import JobSpec
from utils.profiling.link import LinkFit, measure_link
from utils.system.devices import resolve_device
from utils.planning.tuning import (DEFAULT_TOLERANCE, PARTITIONS, TUNED_SCHEDULES, ZERO_REDUCE_BUCKET_ELEMENTS,
                                   Calibration, Candidate, LayerModel, choose, fit_layer_model, predict, ranked,
                                   static_bytes_per_param_byte, tune)
from utils.planning.whatif import measured_stage_costs


def measured_step(run: Run) -> float:
    """Median seconds per step over the steps after the first (which pays the warm-up)."""
    times = run.step_times[1:] or run.step_times
    return statistics.median(times)


def calibrate(run: Run, model: LayerModel, link: LinkFit | None = None) -> Calibration:
    """What `run` measured beyond what `model` predicts for the run's own configuration:
    compute scales (measured stage compute / the model's, summed over stages), the link
    latency, the per-step time outside the pipeline phase (less the collectives the model
    prices with `link`'s α-β line when the run has replicas), and the activation-memory scale
    (the memory meter's bytes a step adds per stage / the model's activations in flight).
    `link` is stored in the calibration for the data-parallel collectives (None: free)."""
    spec, parts, b = run.spec, run.parts, run.spec.micro_batch_size
    costs = measured_stage_costs(run.timeline)
    fwd, bwd = model.forward(b), model.backward(b)

    def per_stage(values: Sequence[float]) -> list[float]:
        return [sum(values[parts[s]:parts[s + 1]]) for s in range(spec.num_stages)]

    own = {"schedule": spec.schedule, "micro_batches": spec.micro_batches, "global_batch": spec.global_batch,
           "data_parallel": spec.data_parallel, "zero_stage": spec.zero_stage,
           "checkpoint_interval": spec.activation_checkpoint_interval}
    steps = [s for s in run.timeline.steps if s != 0] or run.timeline.steps
    makespans = [run.timeline.metrics(step=s).makespan for s in steps]
    # The model's activations in flight per stage: its peak less its static bytes, unscaled.
    bare = predict(model, parts, **own, zero_bucket_bytes=0.0)
    factor = static_bytes_per_param_byte(spec.zero_stage, spec.data_parallel)
    predicted_act = [peak - factor * sum(model.param_bytes[parts[s]:parts[s + 1]])
                     for s, peak in enumerate(bare.peak_memory)]
    measured_act = run.step_memory
    act_scale = (sum(measured_act.values()) / sum(predicted_act)) if measured_act and sum(predicted_act) > 0 else 1.0
    linked = {} if link is None else {"link_latency": link.latency_s, "link_bandwidth": link.bandwidth}
    scaled = Calibration(forward_scale=sum(costs.forward) / sum(per_stage(fwd)),
                         backward_scale=sum(costs.backward) / sum(per_stage(bwd)),
                         comm=costs.comm, activation_scale=act_scale, **linked)
    target = statistics.median(makespans)

    def simulated(delta: float) -> float:  # the run's own pipeline phase, with `delta` per instruction
        c = predict(model, parts, **own, calibration=replace(scaled, action_overhead=delta))
        return c.step_time - c.collective_time

    # The makespan grows by about one delta per instruction on the critical path: a secant step
    # from 0 and a first guess lands on the measured makespan (it is piecewise linear in delta).
    beats = 2 * (spec.micro_batches + spec.num_stages - 1)
    lowest = -min(min(costs.forward), min(costs.backward)) / 2  # every instruction keeps a positive cost
    d0, s0 = 0.0, simulated(0.0)
    d1 = max(lowest, (target - s0) / beats)
    s1 = simulated(d1)
    delta = d1 if s1 == s0 else max(lowest, d0 + (target - s0) * (d1 - d0) / (s1 - s0))
    collectives = predict(model, parts, **own, calibration=replace(scaled, action_overhead=delta)).collective_time
    overhead = max(0.0, measured_step(run) - target - collectives)
    return replace(scaled, overhead=overhead, action_overhead=delta)


def calibrate_link(model: LayerModel, *, device: str = "cpu", timeout: float = 60.0) -> LinkFit:
    """The α-β line of the link the data-parallel collectives run on: chapter 13's
    `measure_link` (blocking send/recv between two fresh processes, fitted on the fastest
    sample per size by `fit_alpha_beta`) at 64 KiB, 1 MiB and the model's whole gradient (a ring
    step sends a 1/d share of a stage's), 3 samples each: a few seconds on the 2-core VM. Range: two
    processes on this machine (loopback); ranks on other nodes need their own measurement."""
    top = max(2**16, int(sum(model.param_bytes)))
    sizes = sorted({2**16, min(top, 2**20), top})
    return measure_link(sizes, repeats=3, warmup=1, device=device, timeout=timeout).fit


def zero_bucket_bytes(spec: JobSpec) -> float:
    """Bytes of the reduce bucket a ZeRO-1 pipeline rank allocates per step: the spec's
    ``zero_optimization.reduce_bucket_size`` (DeepSpeed's default 5e8 elements) × 4 (fp32)."""
    zero = spec.deepspeed_config.get("zero_optimization", {}) if spec.deepspeed_config else {}
    return 4.0 * zero.get("reduce_bucket_size", ZERO_REDUCE_BUCKET_ELEMENTS)


def layer_model_for(spec: JobSpec) -> LayerModel:
    """The job's per-layer cost lines: profiles at its micro-batch size and at one sample
    (two samples when it already uses one), measured under the job's conditions (cached)."""
    other = 1 if spec.micro_batch_size > 1 else 2
    return fit_layer_model(profile_for_job(spec), profile_for_job(replace(spec, micro_batch_size=other)))


def candidate_spec(spec: JobSpec, candidate: Candidate, **fields) -> JobSpec:
    """`spec` running `candidate`'s stages × replicas, boundaries, schedule, micro-batches, ZeRO
    stage and activation-checkpoint interval."""
    if not candidate.runnable:
        raise ValueError(f"{candidate.schedule} with {candidate.chunks} chunk(s) is a prediction only: "
                         "DeepSpeed's engine runs 1f1b and gpipe")
    return replace(spec, num_stages=candidate.num_stages, data_parallel=candidate.data_parallel,
                   zero_stage=candidate.zero_stage, activation_checkpoint_interval=candidate.checkpoint_interval,
                   partition=candidate.boundaries,
                   schedule=candidate.schedule, micro_batches=candidate.micro_batches,
                   micro_batch_size=candidate.micro_batch_size, train_batch_size=None, **fields)


@dataclass(frozen=True)
class Confirmed:
    """A candidate next to the real job that ran it."""

    candidate: Candidate
    run: Run
    measured: float
    """Median seconds per step of the run (steps after the first)."""

    @property
    def error(self) -> float:
        """(predicted − measured) / measured step time."""
        return (self.candidate.step_time - self.measured) / self.measured


@dataclass
class Tuning:
    """An auto-tuning session: every candidate, the calibration, and what ran for real."""

    spec: JobSpec
    candidates: list[Candidate]
    calibration: Calibration
    baseline: Confirmed
    """DeepSpeed's default configuration (the calibration run), predicted and measured."""
    confirmed: list[Confirmed] = field(default_factory=list)
    search_seconds: float = 0.0
    """Wall time of the search alone (every candidate predicted)."""

    tolerance: float = DEFAULT_TOLERANCE
    """`best`'s tolerance: candidates predicted within it of the fastest count as equally fast."""

    @property
    def best(self) -> Candidate:
        """The candidate to adopt: among the feasible ones DeepSpeed's engine can run and
        predicted within `tolerance` of the fastest, the one holding the least peak memory
        (`utils.planning.tuning.choose`); autotune confirms it first."""
        return choose(self.candidates, self.tolerance)

    @property
    def fastest(self) -> Candidate:
        """The feasible runnable candidate predicted fastest (no tolerance)."""
        return choose(self.candidates, 0.0)

    def best_at(self, tolerance: float) -> Candidate:
        """`best` under another tolerance: the measured `median_error`, say, once confirmation
        runs have measured how far the model is off."""
        return choose(self.candidates, tolerance)

    @property
    def best_measured(self) -> Confirmed:
        """The confirmed run (or the baseline) that measured fastest."""
        return min([*self.confirmed, self.baseline], key=lambda c: c.measured)

    @property
    def speedup(self) -> float:
        """Baseline step time / the fastest confirmed run's step time (measured, ≥ 1 when
        the tuner found nothing better than the default)."""
        return self.baseline.measured / self.best_measured.measured

    @property
    def median_error(self) -> float:
        """Median |predicted − measured| / measured over the confirmed runs: out of sample
        (the baseline is the calibration run itself, predicted by construction; it counts
        only when nothing else ran)."""
        return statistics.median(abs(c.error) for c in (self.confirmed or [self.baseline]))

    def table(self, top: int = 10) -> list[dict]:
        """The `top` candidates as rows (feasible and fastest first)."""
        return [c.row() for c in self.candidates[:top]]

    def comparison(self) -> list[dict]:
        """Predicted against measured for the baseline and every confirmed candidate."""
        return [{"config": "DeepSpeed default" if c is self.baseline else f"tuned #{i}",
                 **{k: c.candidate.row()[k] for k in ("stages", "dp", "partition", "boundaries", "schedule",
                                                             "micro_batches", "zero", "ckpt")},
                 "predicted_ms": round(c.candidate.step_time * 1e3, 1), "measured_ms": round(c.measured * 1e3, 1),
                 "error": round(c.error, 3), "run": c.run.name}
                for i, c in enumerate([self.baseline, *self.confirmed])]

    def __str__(self) -> str:
        rows = self.comparison()
        head = (f"{len(self.candidates)} candidates in {self.search_seconds * 1e3:.0f} ms; best measured "
                f"{self.speedup:.2f}× DeepSpeed's default; median prediction error {self.median_error:.1%}")
        return head + "\n" + "\n".join(str(r) for r in rows)


def autotune(spec: JobSpec, *, memory_budget: float | None = None, stages: Sequence[int] | None = None,
             devices: int | None = None, schedules: Sequence[str] = TUNED_SCHEDULES,
             partitions: Sequence[str] = PARTITIONS, zero_stages: Sequence[int] | None = None,
             checkpoint_intervals: Sequence[int] | None = None, chunks: int = 2, confirm: int = 2, steps: int = 4,
             tolerance: float = DEFAULT_TOLERANCE, link: LinkFit | None = None) -> Tuning:
    """Tune `spec`'s model for its global batch under `memory_budget` (bytes per rank, None:
    no limit): profile, calibrate on DeepSpeed's default configuration, search every
    candidate, and run the first `confirm` of `ranked(candidates, tolerance)` for real
    (`steps` steps each). `stages`: the stage counts to search (default: the spec's);
    `devices`: search every p × d split of that many ranks instead of the spec's
    `data_parallel` (with `stages`, only those p); `zero_stages`, `checkpoint_intervals`:
    the ZeRO stages (0, 1) and ``activation_checkpoint_interval`` values to search (default:
    the spec's own). `tolerance`: relative; default 5 % (`DEFAULT_TOLERANCE`) — pass a
    previous tuning's measured ``median_error`` when there is one. `link`: the α-β fit of the
    data-parallel links (`utils.profiling.link.LinkFit`); None measures it (`calibrate_link`)
    when a candidate or the spec has replicas. See the module docstring."""
    spec.check()
    model = layer_model_for(spec)
    replicated = spec.data_parallel > 1 or devices is not None and any(
        devices % p == 0 and devices // p > 1 and (stages is None or p in stages) for p in range(1, devices + 1))
    if link is None and replicated:
        link = calibrate_link(model, device=resolve_device(spec.device, ranks=2))
    default = replace(spec, partition="parameters", schedule="1f1b", steps=steps, name=f"{spec.name or 'tune'}-default")
    base_run = run_job(default, progress=False)
    calibration = calibrate(base_run, model, link)
    bucket = zero_bucket_bytes(spec)
    t0 = time.perf_counter()
    candidates = tune(model, global_batch=spec.global_batch, data_parallel=spec.data_parallel,
                      stages=tuple(stages or (spec.num_stages,)) if devices is None else stages, devices=devices,
                      schedules=schedules, partitions=partitions, chunks=chunks,
                      zero_stages=tuple(zero_stages if zero_stages is not None else (spec.zero_stage,)),
                      checkpoint_intervals=tuple(checkpoint_intervals if checkpoint_intervals is not None
                                                 else (spec.activation_checkpoint_interval,)),
                      memory_budget=memory_budget, calibration=calibration, zero_bucket_bytes=bucket)
    searched = time.perf_counter() - t0
    as_default = predict(model, base_run.parts, schedule="1f1b", micro_batches=spec.micro_batches,
                         global_batch=spec.global_batch, data_parallel=spec.data_parallel, partition="parameters",
                         zero_stage=spec.zero_stage, checkpoint_interval=spec.activation_checkpoint_interval,
                         memory_budget=memory_budget, calibration=calibration, zero_bucket_bytes=bucket)
    tuning = Tuning(spec=spec, candidates=candidates, calibration=calibration,
                    baseline=Confirmed(as_default, base_run, measured_step(base_run)), search_seconds=searched,
                    tolerance=tolerance)
    ran = {_config(as_default)}
    for i, candidate in enumerate(ranked(candidates, tolerance)):
        if len(tuning.confirmed) >= confirm:
            break
        if _config(candidate) in ran:  # the default itself: its run is the baseline
            continue
        ran.add(_config(candidate))
        run = run_job(candidate_spec(spec, candidate, steps=steps, name=f"{spec.name or 'tune'}-top{i}"),
                      progress=False)
        tuning.confirmed.append(Confirmed(candidate, run, measured_step(run)))
    return tuning


def _config(c: Candidate) -> tuple:
    """What a real run of `c` is: boundaries (and so stages), schedule, m, replicas, ZeRO, checkpointing."""
    return tuple(c.boundaries), c.schedule, c.micro_batches, c.data_parallel, c.zero_stage, c.checkpoint_interval
