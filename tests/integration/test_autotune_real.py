"""The auto-tuner on real jobs: profiles, a calibration run of DeepSpeed's default
configuration, the search, and its best candidate confirmed by a real run, prediction and
measurement side by side. (How close they are and how the tuned run compares with the
default on a quiet machine is benchmarks/autotune.py's to print.)"""

from __future__ import annotations

import math

import pytest

from utils import JobSpec, autotune
from utils.jobs.autotune import candidate_spec

pytestmark = pytest.mark.integration

SPEC = JobSpec(num_stages=2, model_options={"blocks": 4}, micro_batches=4, micro_batch_size=4, steps=3,
               device="cpu", name="tune")


def test_autotune_searches_and_confirms_with_real_runs(runs_root):
    tuning = autotune(SPEC, confirm=1, steps=3)
    base = tuning.baseline
    assert base.run.ok and base.run.spec.partition == "parameters" and base.run.spec.schedule == "1f1b"
    assert base.candidate.partition == "parameters" and base.candidate.micro_batches == SPEC.micro_batches
    # timing-claim: construction — a count, and the positive duration of a search that ran (no two measurements compared)
    assert len(tuning.candidates) > 20 and tuning.search_seconds > 0
    best = tuning.best
    assert best.feasible and best.runnable
    # timing-claim: simulated — the candidates' step times are predictions, and best is the first of them sorted fastest first
    assert all(c.step_time >= best.step_time for c in tuning.candidates if c.feasible and c.runnable)
    assert len(tuning.confirmed) <= 1
    for confirmed in tuning.confirmed:
        run = confirmed.run
        assert run.ok and list(run.parts) == list(confirmed.candidate.boundaries)
        assert run.spec.micro_batches * run.spec.micro_batch_size == SPEC.micro_batches * SPEC.micro_batch_size
    rows = tuning.comparison()
    assert rows[0]["config"] == "DeepSpeed default" and len(rows) == 1 + len(tuning.confirmed)
    # timing-claim: construction — a finite error and a positive median of real steps, whatever their size
    assert all(math.isfinite(r["error"]) and r["measured_ms"] > 0 for r in rows)
    cal = tuning.calibration
    # timing-claim: construction — ratios of positive durations and an overhead clamped at 0, whatever the machine's speed
    assert cal.forward_scale > 0 and cal.backward_scale > 0 and cal.overhead >= 0 and cal.activation_scale > 0
    # timing-claim: construction — baseline / min(confirmed + baseline) measured: >= 1 by definition, on any machine
    assert tuning.speedup >= 1.0  # the best measured is the baseline or faster, by definition
    assert "candidates" in str(tuning)
    print(tuning)  # measured step times, speed-up and prediction errors of this run: observations
    simulated_only = next(c for c in tuning.candidates if not c.runnable)
    with pytest.raises(ValueError, match="prediction only"):
        candidate_spec(SPEC, simulated_only)


def test_a_budget_nothing_fits_says_so(runs_root):
    tuning = autotune(SPEC, memory_budget=1.0, confirm=0, steps=2)
    assert not any(c.feasible for c in tuning.candidates) and not tuning.confirmed
    with pytest.raises(ValueError, match="raise memory_budget"):
        tuning.best
