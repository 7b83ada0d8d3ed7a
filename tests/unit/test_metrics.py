"""Metrics and theory formulas on hand-built timelines with known answers.

The timelines come from a tiny list scheduler written here (not `utils.simulate`), so the
metrics are checked against an independent construction of the classic schedules.
"""

from __future__ import annotations

import json

import pytest

from utils.analysis import theory
from utils.analysis.intervals import interval_union, union_length
from utils.analysis.metrics import Metrics, compute_metrics
from utils.analysis.steps import steady_steps
from utils.analysis.summary import MetricsSummary
from utils.analysis.tables import html_table, text_table
from tests.helpers import schedule_events
from utils.timeline import Event, Timeline


def ev(stage: int, kind: str, start: float, end: float, mb: int | None = 0, *, rank=None,
       step: int = 0) -> Event:
    return Event(stage=stage, rank=stage if rank is None else rank, step=step, kind=kind,
                 micro_batch=mb, start=start, end=end)


def timeline(events, p, m, **kw) -> Timeline:
    return Timeline(events=tuple(events), num_stages=p, num_micro_batches=m, **kw)


# --- one step ---------------------------------------------------------------------------------
def test_1f1b_equal_costs_bubble_is_3_over_11():
    tl = timeline(schedule_events(4, 8), 4, 8, source="simulated")
    assert tl.compute_order(3, 0)[:4] == ["F0", "B0", "F1", "B1"]
    assert tl.compute_order(0, 0)[:5] == ["F0", "F1", "F2", "F3", "B0"]
    m = tl.metrics()
    assert isinstance(m, Metrics)
    assert m.makespan == pytest.approx(33.0)
    assert m.bubble_ratio == pytest.approx(3 / 11)
    assert m.bubble_ratio == pytest.approx(theory.bubble_ratio_1f1b(4, 8))
    assert m.stage_compute == pytest.approx((24.0,) * 4)
    assert m.stage_idle == pytest.approx((9.0,) * 4)
    assert m.stage_comm == pytest.approx((0.0,) * 4)
    assert m.stage_utilisation == pytest.approx((24 / 33,) * 4)
    assert m.mean_utilisation == pytest.approx(1 - 3 / 11)
    assert m.imbalance == pytest.approx(1.0)
    # fill = (p-1) forwards, drain = (p-1) backwards, steady = m slots
    assert (m.warmup, m.steady, m.cooldown) == pytest.approx((3.0, 24.0, 6.0))
    assert "balanced" in m.diagnosis and "micro-batch" in m.diagnosis


def test_gpipe_same_bubble_and_exact_makespan_with_unequal_costs():
    gp = timeline(schedule_events(4, 8, schedule="gpipe"), 4, 8).metrics()
    assert gp.bubble_ratio == pytest.approx(3 / 11)
    assert (gp.warmup, gp.steady, gp.cooldown) == pytest.approx((3.0, 24.0, 6.0))
    f, b = [1.0, 2.0, 1.0], [2.0, 4.0, 2.0]
    m = timeline(schedule_events(3, 4, f=f, b=b, schedule="gpipe"), 3, 4).metrics()
    assert m.makespan == pytest.approx(theory.makespan_gpipe(f, b, 4))
    assert m.slowest_stage == 1
    assert m.imbalance == pytest.approx(24 / 16)
    assert m.diagnosis.startswith("stage 1 is the bottleneck: 1.50×")


def test_idle_gap_counts_as_bubble():
    events = [ev(0, "forward", 0, 1), ev(1, "forward", 1, 2),
              ev(1, "backward", 2, 3), ev(0, "backward", 3, 5)]
    m = timeline(events, 2, 1).metrics()
    assert m.makespan == pytest.approx(5.0)
    assert m.stage_compute == pytest.approx((3.0, 2.0))
    assert m.stage_idle == pytest.approx((2.0, 3.0))
    assert m.bubble_ratio == pytest.approx(0.5)
    assert m.slowest_stage == 0


def test_overlapping_comm_counted_once_clipped_and_hidden_behind_compute():
    events = [
        ev(0, "forward", 0, 1), ev(0, "backward", 4, 6),
        ev(0, "send_act", 1.0, 1.5), ev(0, "recv_grad", 1.2, 2.0),  # union 1.0, not 1.3
        ev(0, "recv_grad", 3.5, 4.5),                                 # half hidden by compute
        ev(0, "load", -1.0, 0.0, None),                               # before the window
        ev(1, "recv_act", -0.5, 1.5),  # its send starts at 1.0: waiting before that is idle
        ev(1, "forward", 1.5, 2.5), ev(1, "backward", 2.5, 4.0),
        ev(0, "optimizer_step", 6.0, 7.0, None),                      # after the window
    ]
    m = timeline(events, 2, 1).metrics()
    assert m.makespan == pytest.approx(6.0)
    assert m.step_time == pytest.approx(8.0)
    assert m.stage_compute == pytest.approx((3.0, 2.5))
    assert m.stage_comm == pytest.approx((1.5, 0.5))
    assert m.stage_idle == pytest.approx((1.5, 3.0))
    for s in range(2):
        assert m.stage_compute[s] + m.stage_comm[s] + m.stage_idle[s] == pytest.approx(6.0)
    assert m.comm_share == pytest.approx(2.0 / 12.0)
    assert m.bubble_ratio == pytest.approx(1 - 5.5 / 12)
    assert "communication" in m.diagnosis


def test_waiting_inside_a_blocking_recv_is_idle_not_communication():
    """Stage 1 posts recv_act at 0 but stage 0 only sends at 2 (its forward takes 2 s):
    2 s of waiting (idle) and 0.5 s of transfer (comm); an unmatched recv counts whole."""
    events = [
        ev(0, "forward", 0, 2), ev(0, "send_act", 2.0, 2.5),
        ev(1, "recv_act", 0.0, 2.5), ev(1, "forward", 2.5, 4.5),
        ev(1, "recv_grad", 4.5, 5.0),  # no partner send_grad from a stage 2: counts whole
        ev(1, "backward", 5.0, 6.0), ev(0, "backward", 6.0, 7.0),
    ]
    m = timeline(events, 2, 1).metrics()
    assert m.stage_comm == pytest.approx((0.5, 0.5 + 0.5))
    assert m.stage_idle[1] == pytest.approx(7.0 - 3.0 - 1.0)


def test_overlapping_compute_on_one_stage_not_double_counted():
    events = [ev(0, "backward_input", 0, 2), ev(0, "backward_weight", 1, 3)]
    m = timeline(events, 1, 1).metrics()
    assert m.stage_compute == pytest.approx((3.0,))
    assert m.bubble_ratio == pytest.approx(0.0)
    assert union_length([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)
    assert interval_union([(2, 3), (0, 1), (1, 1.5)]) == [(0, 1.5), (2, 3)]


def test_data_parallel_averages_over_the_ranks_of_a_stage():
    # DeepSpeed-like layout: rank = stage * dp + replica. Replica 1's stage 1 is 1.5× slower.
    r0 = schedule_events(2, 2, rank_of=lambda s: 2 * s)
    r1 = schedule_events(2, 2, f=[1.0, 1.5], b=[2.0, 3.0], rank_of=lambda s: 2 * s + 1)
    tl = timeline(r0 + r1, 2, 2, data_parallel=2, micro_batch_size=3)
    m = tl.metrics()
    assert m.makespan == pytest.approx(12.0)           # the slower replica sets the window
    assert m.stage_compute == pytest.approx((6.0, 7.5))
    assert m.bubble_ratio == pytest.approx(1 - 13.5 / 24)
    assert m.samples_per_s == pytest.approx(3 * 2 * 2 / 12.0)
    assert m.rank_compute == ((0, 0, 6.0), (0, 1, 6.0), (1, 2, 6.0), (1, 3, 9.0))
    assert m.straggler == (1, 3, pytest.approx(1.5))


def test_throughput_counts_the_whole_step_and_tokens():
    events = schedule_events(2, 4) + [ev(0, "load", -1.0, 0.0, 0),
                                      ev(0, "reduce_grads", 15.0, 16.0, None),
                                      ev(1, "optimizer_step", 16.0, 17.0, None)]
    m = timeline(events, 2, 4, micro_batch_size=4, seq_len=128).metrics()
    assert m.makespan == pytest.approx(15.0)
    assert m.step_time == pytest.approx(18.0)
    assert m.samples_per_s == pytest.approx(16 / 18)
    assert m.tokens_per_s == pytest.approx(16 / 18 * 128)
    assert timeline(schedule_events(2, 4), 2, 4).metrics().tokens_per_s is None


def test_views_render_and_serialise():
    m = timeline(schedule_events(4, 8), 4, 8, source="simulated").metrics()
    json.dumps(m.to_dict())
    names = [r["metric"] for r in m.table()]
    assert names[0] == "bubble_ratio" and "slowest_stage" in names and "tokens_per_s" not in names
    assert m.table()[0]["value"] == "27.3%"
    assert len(m.stage_table()) == 4
    text = str(m)
    assert "bubble_ratio" in text and "diagnosis" in text and "simulated" in text
    page = m._repr_html_()
    assert page.count("<table>") == 2 and "27.3%" in page


# --- several steps ----------------------------------------------------------------------------
def multi_step_timeline(scales=(3.0, 1.0, 1.1, 1.2)) -> Timeline:
    events = []
    for step, k in enumerate(scales):
        events += schedule_events(4, 8, f=1.0 * k, b=2.0 * k, step=step, offset=200.0 * step)
    return timeline(events, 4, 8)


def test_summary_skips_step_0_by_default():
    tl = multi_step_timeline()
    s = tl.metrics()
    assert isinstance(s, MetricsSummary)
    assert s.used_steps == (1, 2, 3)
    assert s.bubble_ratio == pytest.approx(3 / 11)
    assert s.makespan == pytest.approx(33 * 1.1)
    spread = s.spread("makespan")
    assert (spread.min, spread.max, spread.n) == pytest.approx((33.0, 33 * 1.2, 3))
    assert spread.iqr == pytest.approx(33 * 0.1)
    assert s.for_step(0).makespan == pytest.approx(99.0)
    assert s.stage_compute == pytest.approx((24 * 1.1,) * 4)
    assert s.slowest_stage in range(4) and "balanced" in s.diagnosis
    assert s.spread("tokens_per_s") is None
    assert {r["metric"] for r in s.table()} >= {"bubble_ratio", "makespan", "samples_per_s"}
    assert "step 0 left out" in str(s) and "<table>" in s._repr_html_()
    json.dumps(s.to_dict())

    everything = compute_metrics(tl, skip_first=False)
    assert everything.used_steps == (0, 1, 2, 3)
    assert everything.spread("makespan").max == pytest.approx(99.0)
    assert isinstance(tl.metrics(step=2), Metrics)


def test_single_step_and_two_steps():
    assert isinstance(multi_step_timeline((2.0,)).metrics(), Metrics)
    two = multi_step_timeline((2.0, 1.0)).metrics()
    assert isinstance(two, MetricsSummary) and two.used_steps == (1,)
    assert two.makespan == pytest.approx(33.0)


def test_clear_errors():
    tl = multi_step_timeline((1.0, 1.0))
    with pytest.raises(ValueError, match=r"step 7 is not in this timeline; steps present: \[0, 1"):
        tl.metrics(step=7)
    with pytest.raises(ValueError, match="no events"):
        timeline([], 2, 1).metrics()
    with pytest.raises(ValueError, match="no compute events"):
        timeline([ev(0, "load", 0, 1)], 1, 1).metrics()
    with pytest.raises(ValueError, match="zero duration"):
        timeline([ev(0, "forward", 1, 1)], 1, 1).metrics()
    with pytest.raises(TypeError):
        tl.metrics(step="1")
    summary = tl.metrics()
    with pytest.raises(ValueError, match="not in this summary"):
        summary.for_step(9)
    with pytest.raises(ValueError, match="unknown metric"):
        summary.spread("speed")


# --- step selection and tables ---------------------------------------------------------------
def test_steady_steps_leaves_out_step_0_unless_it_is_alone():
    assert steady_steps([0]) == [0]
    assert steady_steps([0, 1, 2]) == [1, 2]
    assert steady_steps([3, 4]) == [3, 4]          # only step 0 is warm-up, not the first one
    assert steady_steps([0, 1, 2], skip_first=False) == [0, 1, 2]
    assert steady_steps([0], skip_first=False) == [0]
    assert steady_steps([]) == []
    assert steady_steps(iter([0, 5])) == [5]


def test_text_table_aligns_columns():
    rows = [{"name": "a", "ms": 1.5}, {"name": "long<name>", "ms": 12.25}]
    assert text_table(rows).splitlines() == ["      name     ms",
                                             "         a    1.5",
                                             "long<name>  12.25"]
    left = text_table(rows, columns=["name"], align={"name": "left"}, min_width=6, indent="> ")
    assert left.splitlines() == ["> name      ", "> a         ", "> long<name>"]
    assert text_table([]) == ""
    assert text_table([], columns=["x"]) == "x"


def test_html_table_escapes_cells_and_headers():
    rows = [{"a<b": "x & y", "n": 3}, {"a<b": "<script>", "n": None}]
    page = html_table(rows, align={"a<b": "left"})
    assert page.startswith("<table><thead><tr><th style='text-align:left'>a&lt;b</th>"
                           "<th style='text-align:right'>n</th></tr></thead><tbody>")
    assert "<td style='text-align:left'>x &amp; y</td><td style='text-align:right'>3</td>" in page
    assert "&lt;script&gt;" in page and "<script>" not in page and ">None<" in page
    assert page.count("<tr>") == 3 and page.endswith("</tbody></table>")
    assert html_table([]) == ""
    assert html_table(rows, columns=["n"]).count("</th>") == 1


# --- theory -----------------------------------------------------------------------------------
def test_theory_hand_values():
    assert theory.bubble_ratio_1f1b(4, 8) == pytest.approx(3 / 11)
    assert theory.bubble_ratio_gpipe(4, 8) == theory.bubble_ratio_1f1b(4, 8)
    assert theory.bubble_ratio_1f1b(1, 5) == 0.0
    assert theory.bubble_overhead(4, 8) == pytest.approx(3 / 8)
    assert theory.bubble_overhead_interleaved(4, 8, 2) == pytest.approx(3 / 16)
    assert theory.bubble_ratio_interleaved(4, 8, 2) == pytest.approx(3 / 19)
    assert theory.bubble_ratio_interleaved(4, 8, 1) == pytest.approx(3 / 11)
    assert theory.overhead_to_ratio(theory.bubble_overhead(4, 8)) == pytest.approx(3 / 11)
    assert theory.overhead_to_ratio(theory.bubble_overhead_interleaved(4, 8, 2)) == \
        pytest.approx(theory.bubble_ratio_interleaved(4, 8, 2))
    assert theory.makespan_uniform(4, 8, 3.0) == pytest.approx(33.0)
    assert theory.makespan_estimate([3, 3, 3, 3], 8) == pytest.approx(33.0)
    assert theory.makespan_estimate([1, 2], 3) == pytest.approx(7.0)
    assert theory.makespan_gpipe([1, 1], [2, 2], 4) == pytest.approx(15.0)
    assert theory.bubble_ratio_estimate([3, 3, 3, 3], 8) == pytest.approx(3 / 11)
    # seed case: 95/78/76/112 ms, imbalance raises the bubble above the balanced value
    # timing-claim: simulated — formulas on given stage costs
    assert theory.bubble_ratio_estimate([95, 78, 76, 112], 8) > theory.bubble_ratio_1f1b(4, 8)
    assert theory.bubble_ratio_1f1b(4.0, 8) == pytest.approx(3 / 11)  # integral floats pass


def test_theory_estimate_bounds_simulated_1f1b():
    costs_f, costs_b = [1.0, 1.5, 0.8], [2.0, 3.0, 1.6]
    m = timeline(schedule_events(3, 6, f=costs_f, b=costs_b), 3, 6).metrics()
    t = [a + b for a, b in zip(costs_f, costs_b)]
    # timing-claim: simulated — crafted events (schedule_events) against the formula on the same given costs
    assert m.makespan <= theory.makespan_estimate(t, 6) + 1e-9
    # timing-claim: simulated — crafted events of given costs: the slowest stage must do all its work
    assert m.makespan >= 6 * max(t)


@pytest.mark.parametrize("call, error, text", [
    (lambda: theory.bubble_ratio_1f1b(0, 8), ValueError, "number of pipeline stages"),
    (lambda: theory.bubble_ratio_1f1b(4, 0), ValueError, "number of micro-batches"),
    (lambda: theory.bubble_ratio_interleaved(4, 8, 0), ValueError, "model chunks"),
    (lambda: theory.bubble_overhead_interleaved(4, 8, -1), ValueError, "at least 1"),
    (lambda: theory.bubble_ratio_1f1b(4, 2.5), TypeError, "must be an integer"),
    (lambda: theory.bubble_ratio_1f1b(True, 8), TypeError, "must be an integer"),
    (lambda: theory.makespan_estimate([], 4), ValueError, "one cost per stage"),
    (lambda: theory.makespan_estimate([1, -1], 4), ValueError, "non-negative"),
    (lambda: theory.makespan_gpipe([1, 2], [1], 4), ValueError, "one cost per stage"),
    (lambda: theory.makespan_uniform(4, 8, -1.0), ValueError, ">= 0"),
    (lambda: theory.bubble_ratio_estimate([0, 0], 4), ValueError, "undefined"),
    (lambda: theory.overhead_to_ratio(-0.1), ValueError, "non-negative"),
])
def test_theory_validation(call, error, text):
    with pytest.raises(error, match=text):
        call()
