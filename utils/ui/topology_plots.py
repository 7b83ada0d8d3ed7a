"""`plot_rank_grid`: the processes of a PP × DP job as a grid, with who talks to whom.

Columns are pipeline stages, rows data-parallel replicas (`utils.planning.topology.RankGrid`).
Arrows along a row are the point-to-point activation and gradient transfers of one pipeline;
a bracket down a column is one stage's gradient all-reduce group.
"""

from __future__ import annotations

import plotly.graph_objects as go

from utils.planning.topology import RankGrid
from utils.ui.labels import resolve, text
from utils.ui.rebalance_plots import STAGE_COLORS

__all__ = ["plot_rank_grid"]


def plot_rank_grid(grid: RankGrid, *, title: str | None = None, lang: str | None = None) -> go.Figure:
    """The grid of `grid`'s ranks: one box per process, coloured by stage."""
    lang = resolve(lang)
    fig = go.Figure()
    for rank, (stage, replica) in sorted(grid.coords.items()):
        fig.add_shape(type="rect", x0=stage - 0.35, x1=stage + 0.35, y0=replica - 0.3, y1=replica + 0.3,
                      fillcolor=STAGE_COLORS[stage % len(STAGE_COLORS)], opacity=0.85, line={"color": "#333"},
                      layer="below")
    ranks = sorted(grid.coords)
    fig.add_trace(go.Scatter(x=[grid.coords[r][0] for r in ranks], y=[grid.coords[r][1] for r in ranks],
                             mode="text", text=[text("grid.rank", lang, rank=r) for r in ranks],
                             textfont={"color": "white", "size": 14}, hoverinfo="skip", showlegend=False))
    for sender, receiver in grid.p2p_pairs():
        (s0, r0), (s1, _) = grid.coords[sender], grid.coords[receiver]
        fig.add_annotation(x=s1 - 0.36, y=r0, ax=s0 + 0.36, ay=r0, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=3, arrowside="end+start", arrowwidth=2, arrowcolor="#555", text="")
    if grid.data_parallel > 1:
        for stage, group in enumerate(grid.data_groups):
            ys = [grid.coords[r][1] for r in group]
            x = stage + 0.42
            fig.add_shape(type="line", x0=x, x1=x, y0=min(ys) - 0.25, y1=max(ys) + 0.25,
                          line={"color": "#E45756", "width": 3, "dash": "dot"})
            fig.add_annotation(x=x, y=max(ys) + 0.42, text=text("grid.allreduce", lang, stage=stage),
                               showarrow=False, font={"color": "#E45756", "size": 11})
    fig.add_annotation(x=(grid.num_stages - 1) / 2, y=-0.62, showarrow=False, text=text("grid.p2p", lang),
                       font={"color": "#555"})
    n = grid.num_stages * grid.data_parallel
    fig.update_xaxes(title_text=text("grid.stage_axis", lang), tickvals=list(range(grid.num_stages)),
                     range=[-0.6, grid.num_stages - 0.4], showgrid=False, zeroline=False)
    fig.update_yaxes(title_text=text("grid.replica_axis", lang), tickvals=list(range(grid.data_parallel)),
                     range=[-0.8, grid.data_parallel - 0.2 + 0.3], autorange="reversed", showgrid=False, zeroline=False)
    fig.update_layout(title=title or text("grid.title", lang, p=grid.num_stages, d=grid.data_parallel, n=n),
                      template="plotly_white", height=200 + 110 * grid.data_parallel, width=260 + 200 * grid.num_stages)
    return fig
