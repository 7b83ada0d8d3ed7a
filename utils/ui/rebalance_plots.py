"""Pictures of the dynamic half: how stage costs and boundaries change while a job runs.

`plot_partition_history` reads a measured `Timeline` (a `Run.timeline`): per step, what each
stage computed per micro-batch (its forward and backward events), and the partition history
the job recorded (``timeline.meta["partitions"]``). A re-partition shows as a change of the
boundary lines and a dashed mark at its step, labelled with how long it took (its
"repartition" events).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from utils.timeline import COMPUTE_KINDS, Timeline
from utils.ui.labels import resolve, text
from utils.ui.plots import KIND_COLORS

__all__ = ["stage_cost_per_step", "plot_partition_history"]

STAGE_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#9D755D", "#FF9DA6")


def stage_cost_per_step(timeline: Timeline) -> dict[int, list[float]]:
    """``{step: [seconds per micro-batch of each stage]}``: the stage's compute (forward and
    backward events, replicas averaged) in the step, divided by the micro-batch count."""
    costs: dict[int, list[float]] = {}
    replicas = max(timeline.data_parallel, 1)
    for step in timeline.steps:
        busy = [0.0] * timeline.num_stages
        for e in timeline.select(step=step, kinds=COMPUTE_KINDS):
            busy[e.stage] += e.duration
        costs[step] = [b / replicas / timeline.num_micro_batches for b in busy]
    return costs


def plot_partition_history(timeline: Timeline, *, title: str | None = None, lang: str | None = None) -> go.Figure:
    """Per-stage compute per micro-batch over the steps (top) and the stage boundaries in
    force at each step (bottom), with every re-partition marked at its step."""
    lang = resolve(lang)
    history = [(int(step), list(b)) for step, b in timeline.meta.get("partitions") or []]
    if not history:
        raise ValueError("the timeline has no partition history (meta['partitions']): plot a Run.timeline")
    costs = stage_cost_per_step(timeline)
    steps = sorted(costs)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.6, 0.4])
    for s in range(timeline.num_stages):
        color = STAGE_COLORS[s % len(STAGE_COLORS)]
        fig.add_trace(go.Scatter(x=steps, y=[costs[t][s] * 1e3 for t in steps], mode="lines+markers",
                                 name=text("rebalance.stage", lang, stage=s), legendgroup=f"s{s}",
                                 line={"color": color}), row=1, col=1)

    def boundaries_at(step: int) -> list[int]:
        return [b for start, b in history if start <= step][-1]

    for cut in range(1, timeline.num_stages):
        fig.add_trace(go.Scatter(x=steps, y=[boundaries_at(t)[cut] for t in steps], mode="lines",
                                 line={"shape": "hv", "color": "#555555"}, showlegend=cut == 1,
                                 name=text("rebalance.cut", lang), legendgroup="cut",
                                 hovertemplate=text("rebalance.cut_hover", lang, cut=cut)), row=2, col=1)
    moves = {e.step: max(e.duration for e in timeline.select(step=e.step, kinds=("repartition",)))
             for e in timeline.select(kinds=("repartition",))}
    for step, boundaries in history[1:]:
        label = text("rebalance.move", lang, boundaries=boundaries,
                     ms=f"{moves[step] * 1e3:.0f}" if step in moves else "?")
        fig.add_vline(x=step - 0.5, line={"dash": "dash", "color": KIND_COLORS["repartition"]}, annotation_text=label,
                      annotation_position="top left", row=1, col=1)
        fig.add_vline(x=step - 0.5, line={"dash": "dash", "color": KIND_COLORS["repartition"]}, row=2, col=1)
    n_layers = history[0][1][-1]
    fig.update_yaxes(title_text=text("rebalance.cost_axis", lang), row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text=text("rebalance.cut_axis", lang), row=2, col=1, range=[0, n_layers])
    fig.update_xaxes(title_text=text("rebalance.step_axis", lang), row=2, col=1)
    fig.update_layout(title=title or text("rebalance.title", lang, name=timeline.label or text("pipeline", lang)),
                      template="plotly_white", height=560)
    return fig
