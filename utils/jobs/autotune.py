"""`autotune(spec, memory_budget=...)`: measure, search, and confirm with real runs.

1. Two layer profiles of the job's model on its device under its conditions, at its
   micro-batch size and at 1 sample (`utils.jobs.plan.profile_for_job`), fitted to a cost
   line per layer (`utils.planning.tuning.fit_layer_model`).
2. One real run of DeepSpeed's default configuration for this model and batch (partition
   ``"parameters"``, 1F1B, the spec's micro-batches) calibrates what the profile misses
   (`calibrate`), and is the baseline the tuned configuration must beat.
3. `utils.planning.tuning.tune` predicts every candidate (partition × micro-batch count ×
   schedule, interleaving in simulation) under the memory budget, fastest first.
4. The best runnable candidates run for real; prediction and measurement side by side.
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
from utils.planning.schedules import build_schedule
from utils.planning.tuning import (PARTITIONS, TUNED_SCHEDULES, Calibration, Candidate, LayerModel, fit_layer_model,
                                   predict, tune)
from utils.planning.whatif import measured_stage_costs


def measured_step(run: Run) -> float:
    """Median seconds per step over the steps after the first (which pays the warm-up)."""
    times = run.step_times[1:] or run.step_times
    return statistics.median(times)


def calibrate(run: Run, model: LayerModel) -> Calibration:
    """What `run` measured beyond what `model` predicts for the run's own configuration:
    compute scales (measured stage compute / the model's, summed over stages), the link
    latency, the per-step time outside the pipeline phase, and the activation-memory scale
    (the memory meter's bytes a step adds per stage / the model's activations in flight)."""
    spec, parts, b = run.spec, run.parts, run.spec.micro_batch_size
    costs = measured_stage_costs(run.timeline)
    fwd, bwd = model.forward(b), model.backward(b)

    def per_stage(values: Sequence[float]) -> list[float]:
        return [sum(values[parts[s]:parts[s + 1]]) for s in range(spec.num_stages)]

    steps = [s for s in run.timeline.steps if s != 0] or run.timeline.steps
    makespans = [run.timeline.metrics(step=s).makespan for s in steps]
    overhead = max(0.0, measured_step(run) - statistics.median(makespans))
    sched = build_schedule(spec.schedule, spec.num_stages, spec.micro_batches)
    predicted_act = [sched.in_flight(s) * a for s, a in
                     enumerate(per_stage([x * b for x in model.activation_per_sample]))]
    measured_act = run.step_memory
    act_scale = (sum(measured_act.values()) / sum(predicted_act)) if measured_act and sum(predicted_act) > 0 else 1.0
    scaled = Calibration(forward_scale=sum(costs.forward) / sum(per_stage(fwd)),
                         backward_scale=sum(costs.backward) / sum(per_stage(bwd)),
                         comm=costs.comm, activation_scale=act_scale)
    target = statistics.median(makespans)

    def simulated(delta: float) -> float:  # the run's own configuration, with `delta` per instruction
        return predict(model, parts, schedule=spec.schedule, micro_batches=spec.micro_batches,
                       global_batch=spec.global_batch, data_parallel=spec.data_parallel,
                       calibration=replace(scaled, action_overhead=delta)).step_time

    # The makespan grows by about one delta per instruction on the critical path: a secant step
    # from 0 and a first guess lands on the measured makespan (it is piecewise linear in delta).
    beats = 2 * (spec.micro_batches + spec.num_stages - 1)
    lowest = -min(min(costs.forward), min(costs.backward)) / 2  # every instruction keeps a positive cost
    d0, s0 = 0.0, simulated(0.0)
    d1 = max(lowest, (target - s0) / beats)
    s1 = simulated(d1)
    delta = d1 if s1 == s0 else max(lowest, d0 + (target - s0) * (d1 - d0) / (s1 - s0))
    return replace(scaled, overhead=overhead, action_overhead=delta)


def layer_model_for(spec: JobSpec) -> LayerModel:
    """The job's per-layer cost lines: profiles at its micro-batch size and at one sample
    (two samples when it already uses one), measured under the job's conditions (cached)."""
    other = 1 if spec.micro_batch_size > 1 else 2
    return fit_layer_model(profile_for_job(spec), profile_for_job(replace(spec, micro_batch_size=other)))


def candidate_spec(spec: JobSpec, candidate: Candidate, **fields) -> JobSpec:
    """`spec` running `candidate`'s stages, boundaries, schedule and micro-batches."""
    if not candidate.runnable:
        raise ValueError(f"{candidate.schedule} with {candidate.chunks} chunk(s) is a prediction only: "
                         "DeepSpeed's engine runs 1f1b and gpipe")
    return replace(spec, num_stages=candidate.num_stages, partition=candidate.boundaries,
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

    @property
    def best(self) -> Candidate:
        """The fastest feasible candidate DeepSpeed's engine can run."""
        runnable = [c for c in self.candidates if c.feasible and c.runnable]
        if not runnable:
            raise ValueError("no runnable candidate fits the memory budget; raise memory_budget")
        return runnable[0]

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
                 **{k: c.candidate.row()[k] for k in ("partition", "boundaries", "schedule", "micro_batches")},
                 "predicted_ms": round(c.candidate.step_time * 1e3, 1), "measured_ms": round(c.measured * 1e3, 1),
                 "error": round(c.error, 3), "run": c.run.name}
                for i, c in enumerate([self.baseline, *self.confirmed])]

    def __str__(self) -> str:
        rows = self.comparison()
        head = (f"{len(self.candidates)} candidates in {self.search_seconds * 1e3:.0f} ms; best measured "
                f"{self.speedup:.2f}× DeepSpeed's default; median prediction error {self.median_error:.1%}")
        return head + "\n" + "\n".join(str(r) for r in rows)


def autotune(spec: JobSpec, *, memory_budget: float | None = None, stages: Sequence[int] | None = None,
             schedules: Sequence[str] = TUNED_SCHEDULES, partitions: Sequence[str] = PARTITIONS,
             chunks: int = 2, confirm: int = 2, steps: int = 4) -> Tuning:
    """Tune `spec`'s model for its global batch under `memory_budget` (bytes per rank, None:
    no limit): profile, calibrate on DeepSpeed's default configuration, search every
    candidate, and run the `confirm` fastest runnable ones for real (`steps` steps each).
    `stages`: the stage counts to search (default: the spec's). See the module docstring."""
    spec.check()
    model = layer_model_for(spec)
    default = replace(spec, partition="parameters", schedule="1f1b", steps=steps, name=f"{spec.name or 'tune'}-default")
    base_run = run_job(default, progress=False)
    calibration = calibrate(base_run, model)
    t0 = time.perf_counter()
    candidates = tune(model, global_batch=spec.global_batch, data_parallel=spec.data_parallel,
                      stages=tuple(stages or (spec.num_stages,)), schedules=schedules, partitions=partitions,
                      chunks=chunks, memory_budget=memory_budget, calibration=calibration)
    searched = time.perf_counter() - t0
    as_default = predict(model, base_run.parts, schedule="1f1b", micro_batches=spec.micro_batches,
                         global_batch=spec.global_batch, data_parallel=spec.data_parallel, partition="parameters",
                         memory_budget=memory_budget, calibration=calibration)
    tuning = Tuning(spec=spec, candidates=candidates, calibration=calibration,
                    baseline=Confirmed(as_default, base_run, measured_step(base_run)), search_seconds=searched)
    ran = {(tuple(as_default.boundaries), as_default.schedule, as_default.micro_batches)}
    for i, candidate in enumerate(c for c in candidates if c.feasible and c.runnable):
        if len(tuning.confirmed) >= confirm:
            break
        key = (candidate.boundaries, candidate.schedule, candidate.micro_batches)
        if key in ran:  # the default itself: its run is the baseline
            continue
        ran.add(key)
        run = run_job(candidate_spec(spec, candidate, steps=steps, name=f"{spec.name or 'tune'}-top{i}"),
                      progress=False)
        tuning.confirmed.append(Confirmed(candidate, run, measured_step(run)))
    return tuning
