"""Structure of the plotly figures: rows, bars, labels, legends, titles, HTML export."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from tests.helpers import schedule_events
from utils.analysis import theory
from utils.ui.plots import (KIND_COLORS, compare_timelines, default_step, plot_memory,
                         plot_stage_breakdown, plot_sweep, plot_timeline)
from utils.timeline import COMM_KINDS, KINDS, Event, Timeline

MS = 1e-3


def one_f_one_b(p: int, m: int, **kw) -> list[Event]:
    """Classic 1F1B with 1 ms forwards and 2 ms backwards, each action as early as possible."""
    return schedule_events(p, m, f=kw.pop("f", 1 * MS), b=kw.pop("b", 2 * MS), **kw)


def with_comm(events: list[Event], kind: str = "send_act", ms: float = 0.5) -> list[Event]:
    """Add a short `kind` event (`ms` long) after every forward except on the last stage."""
    last = max(e.stage for e in events)
    extra = [Event(stage=e.stage, rank=e.rank, step=e.step, kind=kind,
                   micro_batch=e.micro_batch, start=e.end, end=e.end + ms * MS)
             for e in events if e.kind == "forward" and e.stage < last]
    return events + extra


def tl(events, p=4, m=8, **kw) -> Timeline:
    return Timeline(events=tuple(events), num_stages=p, num_micro_batches=m, **kw)


def bar_traces(fig: go.Figure) -> dict[str, go.Bar]:
    return {t.name: t for t in fig.data if isinstance(t, go.Bar)}


def test_timeline_rows_bars_labels_legend_and_title():
    sim = tl(with_comm(one_f_one_b(4, 8)), source="simulated", label="1F1B")
    fig = plot_timeline(sim)
    bars = bar_traces(fig)
    assert list(fig.layout.yaxis.categoryarray) == [f"stage {s}" for s in range(4)]
    assert fig.layout.yaxis.autorange == "reversed"  # stage 0 on top
    assert {y for t in bars.values() for y in t.y} == {f"stage {s}" for s in range(4)}
    assert set(bars) == {"forward", "backward", "send_act"}
    assert len(bars["forward"].x) == 32 and len(bars["backward"].x) == 32
    assert len(bars["send_act"].x) == 24
    assert set(bars["forward"].text) == {str(i) for i in range(8)}
    assert bars["send_act"].text is None
    assert all(t.showlegend for t in bars.values())  # one legend entry per kind
    assert bars["forward"].marker.color == KIND_COLORS["forward"]
    assert "ms" in bars["forward"].hovertemplate and "micro-batch" in bars["forward"].hovertemplate
    # x in ms from the step start: the last backward of stage 0 ends at 33 ms
    ends = [b + x for b, x in zip(bars["backward"].base, bars["backward"].x)]
    assert max(ends) == pytest.approx(33.0)
    assert "simulated" in fig.layout.title.text and "27.3%" in fig.layout.title.text
    assert fig.layout.title.subtitle.text is None  # every kind drawn is visible: no note
    assert "measured" in plot_timeline(tl(one_f_one_b(4, 8))).layout.title.text
    assert "<html>" in fig.to_html()


def test_timeline_filters_kinds_and_comm():
    sim = tl(with_comm(one_f_one_b(4, 8)))
    assert set(bar_traces(plot_timeline(sim, show_comm=False))) == {"forward", "backward"}
    assert set(bar_traces(plot_timeline(sim, kinds=["forward"]))) == {"forward"}
    with pytest.raises(ValueError, match="unknown kinds"):
        plot_timeline(sim, kinds=["fwd"])


def test_timeline_data_parallel_rows_and_default_step():
    events = []
    for step in range(3):
        events += one_f_one_b(2, 4, step=step, offset=step * 0.1, rank_of=lambda s: 2 * s)
        events += one_f_one_b(2, 4, step=step, offset=step * 0.1, rank_of=lambda s: 2 * s + 1)
    dp = tl(events, p=2, m=4, data_parallel=2)
    fig = plot_timeline(dp)
    assert list(fig.layout.yaxis.categoryarray) == [
        "stage 0 · rank 0", "stage 0 · rank 1", "stage 1 · rank 2", "stage 1 · rank 3"]
    assert default_step(dp) == 1 and "step 1" in fig.layout.title.text
    assert "step 2" in plot_timeline(dp, 2).layout.title.text
    assert default_step(tl(one_f_one_b(2, 2), p=2, m=2)) == 0
    with pytest.raises(ValueError, match="steps present"):
        plot_timeline(dp, 5)


def test_compare_timelines_two_subplots_on_a_shared_axis():
    a = tl(one_f_one_b(4, 8), source="measured")
    b = tl(one_f_one_b(4, 16), m=16, source="simulated")
    fig = compare_timelines(a, b, labels=("measured", "simulated"))
    assert "x2" in (fig.layout.xaxis.matches, fig.layout.xaxis2.matches) or \
        "x" in (fig.layout.xaxis.matches, fig.layout.xaxis2.matches)
    assert {t.yaxis for t in fig.data} == {"y", "y2"}
    assert list(fig.layout.yaxis2.categoryarray) == [f"stage {s}" for s in range(4)]
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert sorted(legend) == ["backward", "forward"]  # each kind once in the legend
    titles = [ann.text for ann in fig.layout.annotations]
    assert any("bubble 27.3%" in t for t in titles)
    assert any(f"bubble {3 / 19:.1%}" in t for t in titles)
    assert "samples/s" in titles[0] and "makespan" in titles[0]
    assert "→" in fig.layout.title.text
    fig.to_html()


def test_stage_breakdown_from_timeline_metrics_and_summary():
    events = []
    for step in range(3):
        events += one_f_one_b(4, 8, step=step, offset=step * 0.1)
    multi = tl(events)
    for source in (multi, multi.metrics(), multi.metrics(step=1), tl(one_f_one_b(4, 8))):
        fig = plot_stage_breakdown(source)
        bars = bar_traces(fig)
        assert list(bars) == ["compute", "comm", "idle"]
        assert list(bars["compute"].x) == [f"stage {s}" for s in range(4)]
        assert bars["compute"].y == pytest.approx((24.0,) * 4)
        assert fig.layout.barmode == "stack"
        fig.to_html()


def test_sweep_markers_and_theory_line():
    ms = [1, 2, 4, 8, 16]
    measured = [theory.bubble_ratio_1f1b(4, m) + 0.01 for m in ms]
    fig = plot_sweep(ms, measured, theory=lambda m: theory.bubble_ratio_1f1b(4, m),
                     x_label="micro-batches", y_label="bubble ratio", percent=True)
    modes = [t.mode for t in fig.data]
    assert modes == ["markers", "lines"]
    assert list(fig.data[1].x) == list(range(1, 17))
    assert fig.layout.yaxis.tickformat == ".0%"
    repeats = plot_sweep([1, 2], [[0.5, 0.6], [0.3]], theory=([1, 2], [0.55, 0.3]),
                         x_label="m", y_label="b")
    assert list(repeats.data[0].x) == [1, 1, 2] and list(repeats.data[1].y) == [0.55, 0.3]
    floats = plot_sweep([0.5, 1.5], [1, 2], theory=lambda x: 2 * x, x_label="x", y_label="y")
    assert len(floats.data[1].x) == 200
    assert len(plot_sweep([1], [1], x_label="x", y_label="y").data) == 1
    with pytest.raises(ValueError, match="same length"):
        plot_sweep([1, 2], [1], x_label="x", y_label="y")
    fig.to_html()


def test_memory_plot(tmp_path):
    fig = plot_memory({0: [(0.0, 0), (0.001, 2**20), (0.003, 0)], "stage 1": [(0.0, 2**21)]},
                      limit_bytes=3 * 2**20)
    assert [t.name for t in fig.data] == ["rank 0", "stage 1"]
    assert fig.data[0].line.shape == "hv" and list(fig.data[0].y) == [0, 1, 0]
    fig.write_html(tmp_path / "memory.html")
    assert (tmp_path / "memory.html").stat().st_size > 0
    assert fig.layout.yaxis.title.text == "memory (MiB)"
    with pytest.raises(ValueError, match="unit"):
        plot_memory({}, unit="MB")


def test_memory_plot_counts_micro_batches():
    held = {"stage 0": [(0.0, 0), (0.001, 1), (0.002, 2.5), (0.004, 0)]}
    fig = plot_memory(held, unit="micro-batches", limit_bytes=4)
    assert list(fig.data[0].y) == [0, 1, 2.5, 0]                   # counts are not scaled
    assert fig.layout.yaxis.title.text == "activations (micro-batches)"
    assert "micro-batches" in fig.data[0].hovertemplate
    assert fig.layout.shapes[0].y0 == 4                           # budget in the same unit
    titled = plot_memory(held, unit="micro-batches", y_title="激活（完整阶段的微批数）")
    assert titled.layout.yaxis.title.text == "激活（完整阶段的微批数）"
    assert plot_memory(held, unit="B", y_title="bytes").layout.yaxis.title.text == "bytes"
    with pytest.raises(ValueError, match="micro-batches"):
        plot_memory(held, unit="microbatches")


def test_every_kind_has_a_colour():
    assert set(KIND_COLORS) == set(KINDS)
    assert all(KIND_COLORS[k] != KIND_COLORS["forward"] for k in COMM_KINDS)


def test_legend_lists_only_kinds_a_reader_can_see():
    # 0.02 ms loads next to 1-2 ms compute in a 33 ms step: drawn (hover finds them) but
    # hairlines, so not in the legend; the subtitle names them instead.
    events = with_comm(with_comm(one_f_one_b(4, 8)), kind="load", ms=0.02)
    fig = plot_timeline(tl(events))
    bars = bar_traces(fig)
    assert len(bars["load"].x) == 24 and bars["load"].showlegend is False
    assert [t.name for t in fig.data if t.showlegend] == ["forward", "backward", "send_act"]
    note = fig.layout.title.subtitle.text
    assert "too short to see" in note and "load" in note and "send_act" not in note
    # compare: a kind visible in either run is in the legend once
    both = compare_timelines(tl(events), tl(with_comm(one_f_one_b(4, 8), kind="load", ms=2.0)))
    entries = sorted((t.legendrank, t.name) for t in both.data if t.showlegend)
    assert [name for _, name in entries] == ["forward", "backward", "load", "send_act"]
    assert both.layout.title.subtitle.text is None


def test_compare_figure_is_tall_enough_for_its_legend():
    # every kind present (12 legend entries): the legend must fit the plot area, not scroll
    kinds = [k for k in KINDS if k not in ("forward", "backward")]
    events = one_f_one_b(2, 2)
    for kind in kinds:
        events = with_comm(events, kind=kind, ms=1.0)
    two = tl(events, p=2, m=2)
    fig = compare_timelines(two, two)
    entries = sum(1 for t in fig.data if t.showlegend)
    assert entries == len(KINDS)
    plot_area = fig.layout.height - 180  # plotly's default margins: 100 px top, 80 px bottom
    assert plot_area >= 30 * entries + 40  # measured in Chromium: ~26 px per entry with CJK labels
    single = plot_timeline(two)
    assert single.layout.height - 180 >= 30 * entries + 40


def test_chinese_labels():
    events = with_comm(with_comm(one_f_one_b(4, 8)), kind="load", ms=0.02)
    fig = plot_timeline(tl(events, source="simulated"), lang="zh")
    assert list(fig.layout.yaxis.categoryarray) == [f"阶段 {s}" for s in range(4)]
    assert "模拟（不是测量）" in fig.layout.title.text and "气泡率" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "步内时间 (ms)" and fig.layout.legend.title.text == "指令类型"
    assert [t.name for t in fig.data if t.showlegend] == ["前向 forward", "反向 backward", "发送激活 send_act"]
    assert "加载微批 load" in fig.layout.title.subtitle.text
    assert "微批" in fig.data[0].hovertemplate and "时长" in fig.data[0].hovertemplate
    from utils.ui.labels import use_language
    with use_language("zh"):  # the kernel-wide setting, here for one block
        cmp = compare_timelines(tl(one_f_one_b(4, 8)), tl(one_f_one_b(4, 8)))
        breakdown = plot_stage_breakdown(tl(one_f_one_b(4, 8)))
        memory = plot_memory({0: [(0.0, 0)]})
        sweep = plot_sweep([1, 2], [0.5, 0.3], x_label="m", y_label="b")
    assert "对比" in cmp.layout.title.text and "气泡率" in cmp.layout.annotations[0].text
    assert [t.name for t in breakdown.data] == ["计算 compute", "通信 comm", "空闲 idle"]
    assert breakdown.layout.title.text.startswith("各阶段时间 · ")
    assert memory.layout.title.text == "激活显存随时间的变化" and memory.layout.yaxis.title.text == "内存 (MiB)"
    assert sweep.data[0].name == "实测" and sweep.layout.title.text == "b 随 m 的变化"
    # back to English outside the block
    assert plot_timeline(tl(one_f_one_b(4, 8))).layout.xaxis.title.text == "time in step (ms)"


def test_partition_history_plot_shows_costs_boundaries_and_moves():
    from utils.ui.rebalance_plots import plot_partition_history, stage_cost_per_step

    events = []
    for step in range(4):  # stage 1 costs 3 ms per micro-batch until the move before step 2
        slow = 3 * MS if step < 2 else 2 * MS
        events += schedule_events(2, 2, f=[1 * MS, slow / 3], b=[1 * MS, 2 * slow / 3], step=step, offset=step)
    events += [Event(stage=s, rank=s, step=2, kind="repartition", micro_batch=None, start=1.9, end=1.95)
               for s in range(2)]
    timeline = Timeline(events=tuple(events), num_stages=2, num_micro_batches=2, source="measured",
                        meta={"partitions": [(0, [0, 4, 8]), (2, [0, 5, 8])]})
    costs = stage_cost_per_step(timeline)
    assert costs[0] == pytest.approx([2 * MS, 3 * MS]) and costs[3] == pytest.approx([2 * MS, 2 * MS])
    fig = plot_partition_history(timeline, lang="en")
    stage_lines = [t for t in fig.data if t.name.startswith("stage ") and t.name != "stage boundary"]
    assert [list(t.y) for t in stage_lines][1] == pytest.approx([3.0, 3.0, 2.0, 2.0])
    boundary = next(t for t in fig.data if t.name == "stage boundary")
    assert list(boundary.y) == [4, 4, 5, 5]
    notes = [a.text for a in fig.layout.annotations]
    assert any("[0, 5, 8]" in n and "50 ms" in n for n in notes), notes
    with pytest.raises(ValueError, match="no partition history"):
        plot_partition_history(Timeline(events=tuple(events), num_stages=2, num_micro_batches=2))
