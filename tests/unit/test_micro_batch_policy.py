"""`choose_micro_batches`: the micro-batch count a running job picks under a memory budget,
on hand-built per-micro-batch costs (no processes)."""

import pytest

from utils import build_schedule, simulate
from utils.planning.microbatching import (MicroBatchDecision, MicroBatchPolicy, choose_micro_batches,
                                          in_flight_samples)

S, P, O = 16, 2, 2.0  # O: the cost model's fixed part of a micro-batch, in samples


def _costs(a: float, b: float, m: int):
    """Per-stage costs of one micro-batch of S/m samples: forward a + b n, backward twice."""
    n = S // m
    return ([a + b * n] * P, [2 * (a + b * n)] * P)


def _makespan(m: int, a: float, b: float) -> float:
    f, bw = _costs(a, b, m)
    timeline = simulate(build_schedule("1f1b", P, m), f, bw)
    return max(e.end for e in timeline.events)


def _choose(observed, current, *, memory=S, min_gain=0.0, measured=None, a=1.0, b=0.5):
    return choose_micro_batches(step=4, samples=S, num_stages=P, schedule="1f1b", current=current,
                                observed=observed, measured_step_seconds=measured or _makespan(current, a, b),
                                policy=MicroBatchPolicy(memory_samples=memory, min_gain=min_gain),
                                overhead_samples=O)


@pytest.mark.parametrize("k", [0.5, 1.0, 3.0])
def test_when_costs_follow_the_model_it_picks_the_fastest_count(k):
    a, b = k * O, k  # t(n) = k (O + n)
    observed = {4: _costs(a, b, 4), 8: _costs(a, b, 8)}
    decision = _choose(observed, 4, a=a, b=b)
    best = min((m for m in (1, 2, 4, 8, 16)), key=lambda m: (_makespan(m, a, b), m))
    assert decision.chosen == best
    assert decision.predicted[best] == pytest.approx(_makespan(best, a, b))


def test_an_imbalance_between_stages_carries_over():
    """A cheap stage 0 (frozen) next to a costly stage 1: overlap matters more than the
    fill, so the stage costs measured per stage change the best count."""
    observed = {8: ([0.1 * (O + 2), 1.0 * (O + 2)], [0.0, 2.0 * (O + 2)])}
    decision = _choose(observed, 8, measured=1.0)
    f, b = [0.1, 1.0], [0.0, 2.0]

    def makespan(m):
        n = S // m
        timeline = simulate(build_schedule("1f1b", P, m), [x * (O + n) for x in f], [x * (O + n) for x in b])
        return max(e.end for e in timeline.events)

    # timing-claim: simulated — the policy's choice against the simulator on the costs the test gave it
    assert decision.chosen == min((1, 2, 4, 8, 16), key=lambda m: (makespan(m), m))


def test_the_memory_budget_bounds_the_choice():
    observed = {4: _costs(O, 1.0, 4), 8: _costs(O, 1.0, 8)}
    free = _choose(observed, 8, a=O, b=1.0)
    assert free.chosen == 2
    capped = _choose(observed, 8, memory=8, a=O, b=1.0)  # 1F1B holds min(2, m) x 16/m samples
    assert in_flight_samples(capped.chosen, S, P, "1f1b") <= 8 and capped.chosen == 4
    assert set(capped.predicted) == {4, 8, 16}
    with pytest.raises(ValueError, match="no micro-batch count fits memory_samples=1"):
        _choose(observed, 8, memory=1)


def test_a_small_gain_does_not_change_the_count():
    observed = {4: _costs(O, 1.0, 4), 8: _costs(O, 1.0, 8)}
    best = _choose(observed, 8, a=O, b=1.0).chosen
    assert best != 8
    gain = 1 - _makespan(best, O, 1.0) / _makespan(8, O, 1.0)
    stay = _choose(observed, 8, min_gain=gain + 0.01, a=O, b=1.0)
    assert not stay.change and "under min_gain" in stay.reason


def test_one_size_seen_scales_through_the_fixed_part():
    """Only the current count measured: costs scale as (overhead + n) / (overhead + n_now)."""
    decision = _choose({8: _costs(1.0, 0.5, 8)}, 8)
    n_now = S // 8
    per_sample = (1.0 + 0.5 * n_now) / (O + n_now)
    f = [per_sample * (O + S // 2)] * P
    expected = simulate(build_schedule("1f1b", P, 2), f, [2 * x for x in f])
    assert decision.predicted[2] == pytest.approx(max(e.end for e in expected.events))


def test_decisions_round_trip_and_policies_check():
    decision = _choose({8: _costs(1.0, 0.5, 8)}, 8)
    assert MicroBatchDecision.from_dict(decision.to_dict()) == decision
    with pytest.raises(ValueError, match="memory_samples"):
        MicroBatchPolicy(memory_samples=0).check()
    with pytest.raises(ValueError, match="min_gain"):
        MicroBatchPolicy(memory_samples=4, min_gain=1.5).check()
