"""Tests of utils.planning.rebalance: the re-balancing policy on hand-built per-layer cost
traces, without processes."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest

from utils.planning.partitioning import bottleneck
from utils.planning.rebalance import (Decision, LayerCosts, Rebalance, decide,
                                      estimate_migration_seconds, moved_layers)

MS = 1e-3


def trace(forward, backward, steps, *, first=0):
    """`steps` identical measurements of per-layer costs, one per step from `first`."""
    return [LayerCosts(first + s, tuple(forward), tuple(backward)) for s in range(steps)]


def look(observations, boundaries, *, policy=None, schedule="1f1b", m=8, step_seconds=None,
         remaining=100, migration=0.5, comm=0.0):
    policy = policy or Rebalance()
    step = observations[-1].step + 1 if observations else 1
    if step_seconds is None:
        step_seconds = [1.0] * len(observations)
    return decide(observations, step=step, boundaries=boundaries, policy=policy, schedule=schedule,
                  num_micro_batches=m, step_seconds=step_seconds, remaining_steps=remaining,
                  migration_seconds=migration, comm=comm)


def gpipe_makespan(stage_totals, m):
    """GPipe's makespan when backward is proportional to forward, in closed form."""
    return sum(stage_totals) + (m - 1) * max(stage_totals)


# 8 equal layers, all on the wrong side: stage 0 has 2 layers, stage 1 has 6.
EQUAL_F, EQUAL_B = [1 * MS] * 8, [2 * MS] * 8
SKEWED = [0, 2, 8]


# --- (a) stay when the move does not pay back, (b) move when it does -------------------------

def test_move_pays_back_exactly_at_the_threshold():
    obs = trace(EQUAL_F, EQUAL_B, 3)
    first = look(obs, SKEWED, schedule="gpipe", m=4, remaining=100, migration=0.0)
    assert first.migrate and first.candidate == (0, 4, 8)
    # predicted = measured × simulated(candidate) / simulated(current), checked in closed form
    ratio = gpipe_makespan([12 * MS, 12 * MS], 4) / gpipe_makespan([6 * MS, 18 * MS], 4)
    assert first.predicted_step_seconds == pytest.approx(1.0 * ratio)
    assert first.saving_per_step == pytest.approx(1.0 - ratio)
    assert first.stage_costs == pytest.approx((6 * MS, 18 * MS))
    assert first.candidate_stage_costs == pytest.approx((12 * MS, 12 * MS))
    assert first.num_micro_batches == 4  # the count the simulator compared at, kept with the decision
    assert type(first).from_dict({k: v for k, v in first.to_dict().items() if k != "num_micro_batches"}) \
        .num_micro_batches is None  # a record made before the count was kept still reads

    saving, migration, payback = first.saving_per_step, 3.0, Rebalance().payback
    needed = math.ceil(payback * migration / saving)
    stay = look(obs, SKEWED, schedule="gpipe", m=4, remaining=needed - 1, migration=migration)
    move = look(obs, SKEWED, schedule="gpipe", m=4, remaining=needed, migration=migration)
    assert not stay.migrate and stay.reason.startswith("would not pay back")
    assert f"× {needed - 1} steps" in stay.reason and "< 2.0 × migration 3.00 s" in stay.reason
    assert move.migrate and f"× {needed} steps" in move.reason and "≥ 2.0 × migration" in move.reason
    assert stay.candidate == move.candidate == (0, 4, 8)


def test_large_migration_cost_or_no_steps_left_stays():
    obs = trace(EQUAL_F, EQUAL_B, 3)
    assert look(obs, SKEWED, remaining=1000, migration=1.0).migrate
    assert not look(obs, SKEWED, remaining=1000, migration=1000.0).migrate
    assert not look(obs, SKEWED, remaining=0, migration=0.0).migrate
    assert not look(obs, SKEWED, remaining=1000, migration=1.0, policy=Rebalance(payback=1e6)).migrate


def test_candidate_is_the_exact_min_max_partition():
    rng = random.Random(3)
    for _ in range(30):
        n, p = rng.randint(3, 8), rng.randint(2, 3)
        fwd = [rng.uniform(0.1, 3.0) * MS for _ in range(n)]
        bwd = [rng.uniform(0.1, 5.0) * MS for _ in range(n)]
        total = [f + b for f, b in zip(fwd, bwd)]
        every = [[0, *cuts, n] for cuts in itertools.combinations(range(1, n), p - 1)]
        best = min(bottleneck(total, q) for q in every)
        d = look(trace(fwd, bwd, 3), every[0], remaining=10**6, migration=0.0)
        assert bottleneck(total, list(d.candidate)) == pytest.approx(best, rel=1e-12)
        # timing-claim: construction — the policy's candidate against a brute-force min-max of random given costs
        assert max(d.candidate_stage_costs) == pytest.approx(best, rel=1e-12)


# --- (c) no thrashing on noise ----------------------------------------------------------------

@pytest.mark.parametrize("num_stages", [2, 4])
def test_never_thrashes_on_a_noisy_balanced_trace(num_stages):
    # Every stage: a small layer, three big ones, a small one. Balanced at multiples of 5,
    # and noise can make a small layer look better on the other side of a cut.
    block = [0.05, 1.0, 1.0, 1.0, 0.05]
    fwd = [c * MS for c in block * num_stages]
    bwd = [2 * f for f in fwd]
    balanced = list(range(0, 5 * num_stages + 1, 5))
    rng = random.Random(num_stages)

    def noisy(values):
        return tuple(v * rng.uniform(0.9, 1.1) for v in values)

    obs = [LayerCosts(s, noisy(fwd), noisy(bwd)) for s in range(202)]
    times = [0.1 * rng.uniform(0.9, 1.1) for _ in range(202)]
    tempted = thrashes = 0
    for end in range(3, 203):  # 200 looks
        kwargs = dict(step=end, boundaries=balanced, schedule="1f1b", num_micro_batches=8,
                      step_seconds=times[:end], remaining_steps=10**6, migration_seconds=0.0)
        d = decide(obs[:end], policy=Rebalance(), **kwargs)
        assert not d.migrate, d.reason
        if d.candidate != d.boundaries:
            tempted += 1
            assert d.reason.startswith("predicted saving") and "below min_gain 5.0%" in d.reason
        thrashes += decide(obs[:end], policy=Rebalance(min_gain=0.0), **kwargs).migrate
    # the noise does produce other candidates, and without hysteresis the job would move
    assert tempted >= 50
    assert thrashes >= 50


# --- (d) a real cost shift ----------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_progressive_freezing_moves_layers_to_the_first_stage(schedule):
    n, balanced = 12, [0, 6, 12]
    fwd, bwd = [1 * MS] * n, [2 * MS] * n
    before = trace(fwd, bwd, 3)
    assert look(before, balanced, schedule=schedule).reason.startswith("already balanced")
    frozen = [0.0 if layer < 6 else 2 * MS for layer in range(n)]  # first 6 layers frozen
    after = trace(fwd, frozen, 3, first=3)
    d = look(after, balanced, schedule=schedule, step_seconds=[0.3] * 3, remaining=100,
             migration=0.2)
    assert d.migrate, d.reason
    assert d.candidate[1] > 6  # the cheaper first stage takes layers over
    assert d.layer_backward[:6] == (0.0,) * 6
    assert d.measured_step_seconds == pytest.approx(0.3)
    # simulated makespans (m=8, in ms): now 150 in both schedules; after the move 1F1B
    # overlaps to 108, GPipe's separate forward and backward phases give 68 + 68 = 136
    expected = {"1f1b": 108 / 150, "gpipe": 136 / 150}[schedule]
    assert d.predicted_step_seconds == pytest.approx(0.3 * expected)
    # timing-claim: simulated — the policy on a trace of given costs (frozen stage 0)
    assert max(d.candidate_stage_costs) < max(d.stage_costs)
    assert d.saving_per_step == pytest.approx(d.measured_step_seconds - d.predicted_step_seconds)


def test_medians_ignore_one_outlier_step():
    obs = trace(EQUAL_F, EQUAL_B, 3)
    spiked = LayerCosts(1, tuple([50 * MS] + EQUAL_F[1:]), tuple(EQUAL_B))
    d = look([obs[0], spiked, obs[2]], [0, 4, 8], step_seconds=[0.1, 5.0, 0.1])
    assert d.layer_forward == tuple(EQUAL_F) and d.measured_step_seconds == 0.1
    assert d.reason.startswith("already balanced") and not d.migrate


# --- (e) not enough measurements ----------------------------------------------------------------

def test_not_enough_measurements_stays():
    obs = trace(EQUAL_F, EQUAL_B, 2)
    d = look(obs, SKEWED, migration=0.0, remaining=10**6)
    assert not d.migrate and d.candidate == (0, 2, 8)
    assert d.reason.startswith("not enough measurements") and "2 per-layer costs" in d.reason
    d = look(trace(EQUAL_F, EQUAL_B, 5), SKEWED, step_seconds=[1.0, 1.0], migration=0.0)
    assert not d.migrate and "2 step times" in d.reason
    # only the last `window` count: an old skew is forgotten
    old = trace([1 * MS] * 7 + [90 * MS], EQUAL_B, 3)
    d = look(old + trace(EQUAL_F, EQUAL_B, 3, first=3), [0, 4, 8])
    assert d.reason.startswith("already balanced")


# --- input checks -------------------------------------------------------------------------------

def test_bad_inputs_are_named():
    obs = trace(EQUAL_F, EQUAL_B, 3)
    with pytest.raises(ValueError, match="layer counts disagree"):
        look(obs[:2] + trace(EQUAL_F[:7], EQUAL_B[:7], 1, first=2), SKEWED)
    with pytest.raises(ValueError, match="must end at 8"):
        look(obs, [0, 2, 7])
    with pytest.raises(ValueError, match="not before step"):
        decide(obs, step=2, boundaries=SKEWED, policy=Rebalance(), schedule="1f1b",
               num_micro_batches=4, step_seconds=[1.0] * 3, remaining_steps=5, migration_seconds=0.0)
    with pytest.raises(ValueError, match="unknown schedule"):
        look(obs, SKEWED, schedule="zb-h1")
    with pytest.raises(ValueError, match="increasing step order"):
        decide(obs[::-1], step=10, boundaries=SKEWED, policy=Rebalance(), schedule="1f1b",
               num_micro_batches=4, step_seconds=[1.0] * 3, remaining_steps=5, migration_seconds=0.0)
    with pytest.raises(ValueError, match="migration_seconds"):
        look(obs, SKEWED, migration=-1.0)
    with pytest.raises(ValueError, match="forward has 2 layers and backward 1"):
        LayerCosts(0, (1.0, 1.0), (1.0,))
    with pytest.raises(ValueError, match="Rebalance.window"):
        look(obs, SKEWED, policy=Rebalance(window=5))


# --- (f) Rebalance.check, (g) round trips --------------------------------------------------------

@pytest.mark.parametrize("fields, error, name", [
    (dict(every=0), ValueError, "every"),
    (dict(every=True), TypeError, "every"),
    (dict(every=2.0), TypeError, "every"),
    (dict(window=0), ValueError, "window"),
    (dict(every=2, window=3), ValueError, "window"),
    (dict(min_gain=1.0), ValueError, "min_gain"),
    (dict(min_gain=-0.1), ValueError, "min_gain"),
    (dict(min_gain=float("nan")), ValueError, "min_gain"),
    (dict(payback=0.0), ValueError, "payback"),
    (dict(payback="2"), TypeError, "payback"),
    (dict(migration_seconds=-1.0), ValueError, "migration_seconds"),
    (dict(migration_seconds=float("inf")), ValueError, "migration_seconds"),
    (dict(migration_seconds=False), TypeError, "migration_seconds"),
])
def test_check_names_the_field(fields, error, name):
    with pytest.raises(error, match=f"Rebalance.{name}"):
        Rebalance(**fields).check()


def test_defaults_check_and_due():
    policy = Rebalance()
    policy.check()
    Rebalance(every=1, window=1, min_gain=0.0, migration_seconds=0.0).check()
    assert [s for s in range(13) if policy.due(s)] == [4, 8, 12]


def test_round_trips_through_json():
    policy = Rebalance(every=6, window=2, min_gain=0.1, payback=3.0, migration_seconds=1.5)
    assert Rebalance.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy
    assert Rebalance.from_dict({}) == Rebalance()
    with pytest.raises(ValueError, match="unknown Rebalance field"):
        Rebalance.from_dict({"evry": 3})
    costs = LayerCosts(7, (1.0, 2.0), (3.0, 0.0))
    assert LayerCosts.from_dict(json.loads(json.dumps(costs.to_dict()))) == costs
    for d in (look(trace(EQUAL_F, EQUAL_B, 3), SKEWED), look(trace(EQUAL_F, EQUAL_B, 1), SKEWED)):
        data = json.loads(json.dumps(d.to_dict()))
        assert isinstance(data["candidate"], list)
        back = Decision.from_dict(data)
        assert back == d and isinstance(back.candidate, tuple)


# --- (h) moved layers, migration estimate -------------------------------------------------------

def test_moved_layers_across_two_stages():
    assert moved_layers([0, 1, 2, 6], [0, 4, 5, 6]) == [(1, 1, 0), (2, 2, 0), (3, 2, 0), (4, 2, 1)]
    assert moved_layers([0, 3, 6, 9], [0, 5, 6, 9]) == [(3, 1, 0), (4, 1, 0)]
    assert moved_layers([0, 4, 8], [0, 4, 8]) == []
    with pytest.raises(ValueError):
        moved_layers([0, 4, 8], [0, 2, 4, 8])


def test_estimate_migration_seconds():
    assert estimate_migration_seconds(moved_bytes=4e9, rebuild_seconds=1.5, bytes_per_second=2e9) == 3.5
    with pytest.raises(ValueError, match="bytes_per_second"):
        estimate_migration_seconds(moved_bytes=1.0, rebuild_seconds=0.0, bytes_per_second=0.0)
