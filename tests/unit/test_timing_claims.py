"""No assert in the chapters, lab solutions or tests compares measured timing without saying why
it holds on a slow, shared machine (`tests.timing_claims`)."""

from __future__ import annotations

import textwrap

from tests.timing_claims import KINDS, claims_in, inventory


def _claims(source: str) -> list:
    return list(claims_in(textwrap.dedent(source), path="example.py"))


def test_every_timing_assert_in_the_project_is_tagged():
    claims = inventory()
    assert len(claims) > 50, "the scanner found almost nothing: is it still reading the notebooks?"
    bad = [f"{c.where}: {c.problem}\n    {c.source}" for c in claims if c.problem]
    assert not bad, ("asserts that compare measured times, rates or exit orders, without a "
                     "`# timing-claim: <kind> — <why>` tag (kinds: " + ", ".join(KINDS) + "); "
                     "restate them on what holds by construction, print the measured figure, or tag them "
                     "(see tests/timing_claims.py):\n" + "\n".join(bad))


def test_an_untagged_measured_order_is_found():
    (claim,) = _claims("""
        uniform_ms = stage_times(run.timeline)
        assert max(range(4), key=uniform_ms.__getitem__) == 3
    """)
    assert claim.line == 3 and claim.problem and claim.tag is None


def test_comparisons_of_rates_bubbles_and_exit_orders_are_found():
    claims = _claims("""
        assert balanced.step_time < uniform.step_time
        assert run.metrics().bubble_ratio <= 0.5
        assert tokens_per_s["packed"] > 2 * tokens_per_s["padded"]
        assert report.first_failed == (1,)
        assert report.stopped_by_launcher(0)
        assert sorted(wall_s) == wall_s
    """)
    assert [c.line for c in claims] == [2, 3, 4, 5, 6, 7]
    assert all(c.problem for c in claims)


def test_a_tag_above_or_on_the_assert_with_a_known_kind_and_a_reason_passes():
    claims = _claims("""
        # timing-claim: simulated — the simulator's makespan on the costs given above
        assert sim.makespan > base.makespan
        assert sim.bubble < 0.5  # timing-claim: construction — events made by this test
        assert (a_ms
                < b_ms)  # timing-claim: margin — 3 s of sleep against no sleep: 10x headroom
    """)
    assert len(claims) == 3 and not [c.problem for c in claims if c.problem]
    assert [c.kind for c in claims] == ["simulated", "construction", "margin"]


def test_a_tag_with_an_unknown_kind_or_no_reason_fails():
    unknown, bare = _claims("""
        assert x_ms < y_ms  # timing-claim: probably — it was fine on my machine
        assert x_ms < y_ms  # timing-claim: margin
    """)
    assert "not one of" in unknown.problem
    assert "no reason" in bare.problem


def test_equalities_and_non_timing_comparisons_are_not_claims():
    assert _claims("""
        assert losses == reference_losses
        assert len(events) > 10
        assert run.parts == [0, 8, 16]
        assert max(parts) == 32
    """) == []


def test_notebook_magics_do_not_stop_the_scan():
    (claim,) = _claims("""
        %load_ext autoreload
        !echo hi
        assert slowest_ms > fastest_ms
    """)
    assert claim.line == 4
