"""`fit_micro_batch_costs` recovers the fixed and per-token cost of micro-batches from a run's
record, and refuses a run whose micro-batches do not vary."""

from types import SimpleNamespace

import pytest

from utils.analysis.microbatch_fit import fit_micro_batch_costs
from utils.planning.microbatching import MicroBatchCost
from utils.timeline import Event, Timeline

COST = MicroBatchCost(overhead=256.0, per_token=1.0, per_token_pair=0.001)
FIXED = {"forward": 0.004, "backward": 0.009}
PER_UNIT = {"forward": 2e-6, "backward": 5e-6}
LOAD_S = 0.001
"""Each micro-batch's load on stage 0: counted with its forward (the rank cannot compute meanwhile)."""


def _run(micro_batches: dict[int, list[tuple[int, int, int]]]):
    """A one-stage record whose every forward/backward lasts exactly fixed + per_unit × units."""
    events, t = [], 0.0
    for step, rows in micro_batches.items():
        for mb, (samples, _real, padded) in enumerate(rows):
            units = COST(samples, padded / samples) - COST.overhead
            for kind in ("load", "forward", "backward"):
                seconds = LOAD_S if kind == "load" else FIXED[kind] + PER_UNIT[kind] * units - (
                    LOAD_S if kind == "forward" else 0.0)
                events.append(Event(stage=0, rank=0, step=step, kind=kind, micro_batch=mb, start=t, end=t + seconds))
                t += seconds
    spec = SimpleNamespace(num_stages=1, model="gpt", model_options={})
    return SimpleNamespace(name="fake", spec=spec, micro_batch_tokens=micro_batches,
                           timeline=Timeline(events=tuple(events), num_stages=1, num_micro_batches=4))


def test_the_fit_recovers_the_fixed_and_per_token_costs():
    plans = {step: [(n, 0, n * length) for n, length in rows] for step, rows in {
        0: [(9, 50), (1, 500)], 1: [(8, 64), (3, 200), (1, 512)], 2: [(12, 40), (4, 128)], 3: [(2, 300), (6, 90)]}.items()}
    fitted = fit_micro_batch_costs(_run(plans), COST)
    assert set(fitted) == {(0, "forward"), (0, "backward")}
    for kind in ("forward", "backward"):
        fit = fitted[0, kind]
        assert fit.points == 7  # steps 1-3: step 0 warms up
        assert fit.fixed_s == pytest.approx(FIXED[kind]) and fit.per_unit_s == pytest.approx(PER_UNIT[kind])
        assert fit.fixed_tokens == pytest.approx(FIXED[kind] / PER_UNIT[kind])


def test_micro_batches_of_one_size_have_nothing_to_fit():
    same = {step: [(4, 0, 4 * 64)] * 3 for step in range(3)}
    with pytest.raises(ValueError, match="all have the same size after step 0"):
        fit_micro_batch_costs(_run(same), COST)
    with pytest.raises(ValueError, match="has fixed micro-batches"):
        fit_micro_batch_costs(_run({}), COST)
