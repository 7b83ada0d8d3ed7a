"""Closed-form bubbles of interleaved 1F1B and ZB-H1 against the simulator, both sides of
their conditions (m >= p for interleaving; W <= min(F, I) for the short ZB-H1 form)."""

from __future__ import annotations

import itertools

import pytest

from utils.analysis import theory
from utils.planning.schedules import build_schedule
from utils.planning.simulator import simulate


def _interleaved_bubble(p: int, m: int, v: int, t_f: float, t_b: float) -> float:
    """Simulated idle time per rank: makespan minus the ideal m * (t_f + t_b)."""
    sim = simulate(build_schedule("interleaved-1f1b", p, m, chunks=v), t_f / v, t_b / v)
    return sim.metrics().makespan - m * (t_f + t_b)


def test_interleaved_formula_holds_from_m_equal_p_and_megatron_form_fails_below():
    checked_below = checked_above = 0
    for p in range(2, 7):
        for v in (2, 3, 4):
            for m in range(1, 17):
                try:
                    bubble = _interleaved_bubble(p, m, v, 1.0, 2.0)
                except ValueError:  # m that torch cannot split into equal rounds
                    continue
                ideal = m * 3.0
                assert bubble / ideal == pytest.approx(theory.bubble_overhead_interleaved(p, m, v), abs=1e-9)
                assert bubble / (bubble + ideal) == pytest.approx(
                    theory.bubble_ratio_interleaved(p, m, v), abs=1e-9)
                megatron = (p - 1) * 3.0 / v
                if m >= p:
                    assert bubble == pytest.approx(megatron, abs=1e-9)
                    checked_above += 1
                else:  # one round of m < p: every return to rank 0 waits p - m slots
                    # timing-claim: simulated — the simulator against the formula, on given costs
                    assert bubble > megatron + 1e-6
                    assert bubble == pytest.approx(((p - 1) + (v - 1) * (p - m)) * 3.0 / v, abs=1e-9)
                    checked_below += 1
    assert checked_above > 100 and checked_below > 30


def test_interleaved_issue_example_and_single_micro_batch():
    # p = 4, m = 3, v = 2, t_f + t_b = 3: bubble 6.0 time units, not 4.5
    assert _interleaved_bubble(4, 3, 2, 1.0, 2.0) == pytest.approx(6.0)
    assert theory.bubble_overhead_interleaved(4, 3, 2) * 3 * 3.0 == pytest.approx(6.0)
    # one micro-batch alone needs p * (t_f + t_b), whatever v
    for v in (1, 2, 4):
        assert theory.bubble_overhead_interleaved(4, 1, v) * 3.0 + 3.0 == pytest.approx(4 * 3.0)
    # m >= p keeps Megatron's value; v = 1 is plain 1F1B
    assert theory.bubble_overhead_interleaved(4, 8, 2) == pytest.approx(3 / 16)
    assert theory.bubble_overhead_interleaved(4, 4, 2) == pytest.approx(3 / 8)
    assert theory.bubble_overhead_interleaved(4, 2, 1) == pytest.approx(3 / 2)
    assert theory.bubble_ratio_interleaved(4, 3, 2) == pytest.approx(6 / 15)


COSTS = (1.0, 2.0, 3.0, 5.0)


def _zb_bubble(p: int, m: int, f: float, i: float, w: float) -> float:
    sim = simulate(build_schedule("zb-h1", p, m), f, i, weight=w)
    return sim.metrics().makespan - m * (f + i + w)


def test_zb_h1_general_formula_matches_the_simulator_for_m_at_least_p():
    short_form_right = short_form_wrong = 0
    for p in range(1, 7):
        for m in range(p, 13, 3):
            for f, i, w in itertools.product(COSTS, repeat=3):
                bubble = _zb_bubble(p, m, f, i, w)
                assert bubble == pytest.approx(theory.bubble_time_zb_h1(p, m, f, i, w), abs=1e-9)
                short = (p - 1) * (f + i - w)
                if p > 1 and w <= min(f, i):
                    assert bubble == pytest.approx(short, abs=1e-9)
                    short_form_right += 1
                elif p > 1:
                    # timing-claim: simulated — the simulator against the short formula, on given costs
                    assert bubble > short + 1e-9  # W > min(F, I): the short form is too optimistic
                    short_form_wrong += 1
    assert short_form_right > 50 and short_form_wrong > 200


def test_zb_h1_issue_example_w_not_longer_than_i_is_not_enough():
    # W <= I holds, yet W > F: the bubble is (p-1) * I = 2.0, not (p-1)(F+I-W) = 1.0
    assert _zb_bubble(2, 2, 1.0, 2.0, 2.0) == pytest.approx(2.0)
    assert theory.bubble_time_zb_h1(2, 2, 1.0, 2.0, 2.0) == pytest.approx(2.0)
    assert theory.bubble_time_zb_h1(4, 8, 1.0, 1.0, 1.0) == pytest.approx(3.0)  # F = I = W: 1/3 of 1F1B


def test_zb_h1_formula_refuses_fewer_micro_batches_than_stages():
    with pytest.raises(ValueError, match="m >= p"):
        theory.bubble_time_zb_h1(4, 3, 1.0, 1.0, 1.0)
    # and rightly: below m = p the simulated bubble exceeds the formula's value
    for p in range(2, 7):
        for m in range(1, p):
            # timing-claim: simulated — the simulator on given unit costs against the formula
            assert _zb_bubble(p, m, 1.0, 1.0, 1.0) > (p - 1) * 1.0 + 1e-9
    with pytest.raises(ValueError, match="non-negative"):
        theory.bubble_time_zb_h1(2, 2, 1.0, -1.0, 1.0)
