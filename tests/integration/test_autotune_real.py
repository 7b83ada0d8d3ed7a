"""The auto-tuner on real jobs: profiles, a calibration run of DeepSpeed's default
configuration, the search (p × d splits, ZeRO-1, activation checkpointing included), its
chosen candidate confirmed by a real run, prediction and measurement side by side, and a
candidate with replicas, ZeRO-1 and checkpointing run from `candidate_spec`. (How close they are and how the tuned run compares with the
default on a quiet machine is benchmarks/autotune.py's to print.)"""

from __future__ import annotations

import math

import pytest

from utils import JobSpec, autotune, run_job
from utils.jobs.autotune import candidate_spec, measured_step

pytestmark = pytest.mark.integration

SPEC = JobSpec(num_stages=2, model_options={"blocks": 4}, micro_batches=4, micro_batch_size=4, steps=3,
               device="cpu", name="tune")


def test_autotune_searches_and_confirms_with_real_runs(runs_root):
    # 2 devices: 2 stages × 1 replica and 1 stage × 2 replicas; ZeRO 0/1; checkpointing off or every layer
    tuning = autotune(SPEC, devices=2, zero_stages=(0, 1), checkpoint_intervals=(0, 1), confirm=1, steps=3)
    base = tuning.baseline
    assert base.run.ok and base.run.spec.partition == "parameters" and base.run.spec.schedule == "1f1b"
    assert base.candidate.partition == "parameters" and base.candidate.micro_batches == SPEC.micro_batches
    # timing-claim: construction — a count, and the positive duration of a search that ran (no two measurements compared)
    assert len(tuning.candidates) > 20 and tuning.search_seconds > 0
    assert {(c.num_stages, c.data_parallel) for c in tuning.candidates} == {(2, 1), (1, 2)}
    assert {(c.data_parallel, c.zero_stage) for c in tuning.candidates} == {(1, 0), (2, 0), (2, 1)}
    assert {c.checkpoint_interval for c in tuning.candidates} == {0, 1}
    cal = tuning.calibration
    # timing-claim: construction — the α-β fit of a measured link: fit_alpha_beta clamps α at 0 and refuses β <= 0
    assert cal.link_latency >= 0 and 0 < cal.link_bandwidth < math.inf
    best, fastest = tuning.best, tuning.fastest
    assert best.feasible and best.runnable and tuning.tolerance == 0.05
    runnable = [c for c in tuning.candidates if c.feasible and c.runnable]
    # timing-claim: simulated — predictions: fastest is the least predicted step time, best lies within the tolerance of it
    assert all(c.step_time >= fastest.step_time for c in runnable)
    assert best.step_time <= fastest.step_time * (1 + tuning.tolerance)  # timing-claim: simulated — the choice rule
    # timing-claim: simulated — best holds the least memory among the candidates predicted within the tolerance
    assert all(max(c.peak_memory) >= max(best.peak_memory) for c in runnable
               if c.step_time <= fastest.step_time * (1 + tuning.tolerance))
    assert tuning.best_at(0.0) is fastest
    assert len(tuning.confirmed) <= 1
    for confirmed in tuning.confirmed:
        run = confirmed.run
        assert run.ok and list(run.parts) == list(confirmed.candidate.boundaries)
        assert run.spec.micro_batches * run.spec.micro_batch_size * run.spec.data_parallel == SPEC.global_batch
    rows = tuning.comparison()
    assert rows[0]["config"] == "DeepSpeed default" and len(rows) == 1 + len(tuning.confirmed)
    # timing-claim: construction — a finite error and a positive median of real steps, whatever their size
    assert all(math.isfinite(r["error"]) and r["measured_ms"] > 0 for r in rows)
    # timing-claim: construction — ratios of positive durations and an overhead clamped at 0, whatever the machine's speed
    assert cal.forward_scale > 0 and cal.backward_scale > 0 and cal.overhead >= 0 and cal.activation_scale > 0
    # timing-claim: construction — baseline / min(confirmed + baseline) measured: >= 1 by definition, on any machine
    assert tuning.speedup >= 1.0  # the best measured is the baseline or faster, by definition
    assert "candidates" in str(tuning)
    print(tuning)  # measured step times, speed-up and prediction errors of this run: observations
    simulated_only = next(c for c in tuning.candidates if not c.runnable)
    with pytest.raises(ValueError, match="prediction only"):
        candidate_spec(SPEC, simulated_only)
    # The new levers run for real: 1 stage × 2 replicas, ZeRO-1, every layer checkpointed (2 ranks).
    wide = next(c for c in runnable if (c.num_stages, c.data_parallel, c.zero_stage, c.checkpoint_interval) == (1, 2, 1, 1))
    spec = candidate_spec(SPEC, wide, steps=3, name="tune-wide")
    assert (spec.num_stages, spec.data_parallel, spec.zero_stage, spec.activation_checkpoint_interval) == (1, 2, 1, 1)
    run = run_job(spec, progress=False)
    assert run.ok and run.spec.world_size == 2 and run.spec.global_batch == SPEC.global_batch
    print(f"1 × 2, ZeRO-1, checkpointing: predicted {wide.step_time * 1e3:.1f} ms, measured "
          f"{measured_step(run) * 1e3:.1f} ms (an observation)")


def test_a_budget_nothing_fits_says_so(runs_root):
    tuning = autotune(SPEC, memory_budget=1.0, confirm=0, steps=2)
    assert not any(c.feasible for c in tuning.candidates) and not tuning.confirmed
    with pytest.raises(ValueError, match="raise memory_budget"):
        tuning.best
