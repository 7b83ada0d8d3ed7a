"""Plotly figures of pipeline timelines and metrics.

Every figure is a plain `plotly.graph_objects.Figure`: it renders in JupyterLab and can be
saved as a standalone page with ``fig.write_html("run.html")``. Times on the x axis are in
milliseconds, measured from the first event of the step shown, so two runs drawn on one
axis start together. Colours per instruction kind come from one dict, `KIND_COLORS`, so
every figure of the workbook reads the same way.

Titles, axes, legends and hover text are English unless Chinese is chosen
(`utils.ui.labels`: ``set_language("zh")`` or ``lang="zh"`` on any function here). A timeline's
legend lists the kinds a reader can see: a kind whose every bar is shorter than
`VISIBLE_SHARE` of the step is still drawn (hover finds it) but named in the subtitle as
too short to see instead of in the legend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from utils.analysis.metrics import Metrics, compute_metrics, micro_batch_tokens
from utils.analysis.steps import steady_steps
from utils.analysis.summary import MetricsSummary
from utils.timeline import COMM_KINDS, COMPUTE_KINDS, KINDS, Event, Timeline
from utils.ui.labels import kind_label, resolve, text
from utils.ui.tables import diagnosis_text

__all__ = ["KIND_COLORS", "PART_COLORS", "VISIBLE_SHARE", "plot_timeline", "compare_timelines",
           "plot_stage_breakdown", "plot_sweep", "plot_memory", "default_step"]

#: One colour per instruction kind: forward blue, backward orange/red, weight-gradient
#: green, communication grey, per-step work purple, data loading light.
KIND_COLORS: dict[str, str] = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "backward_input": "#E45756",
    "backward_weight": "#54A24B",
    "load": "#E6D7A3",
    "send_act": "#8C8C8C",
    "recv_act": "#B5B5B5",
    "send_grad": "#6E6E6E",
    "recv_grad": "#CFCFCF",
    "reduce_tied_grads": "#C39BD3",
    "reduce_grads": "#A26BBF",
    "optimizer_step": "#6C3483",
    "repartition": "#2E2E2E",  # the job moving layers between stages: dark, it stops every stage
}
_FALLBACK_COLOR = "#999999"  # a kind added to KINDS later still draws

#: Colours of the per-stage breakdown (compute / exposed communication / idle).
PART_COLORS: dict[str, str] = {"compute": "#4C78A8", "comm": "#9E9E9E", "idle": "#E9E9E9"}

_BAR_WIDTH = 0.8          # compute and per-step bars fill most of a row
_THIN_BAR_WIDTH = 0.35    # communication bars are thinner: they often overlap compute
_TEMPLATE = "plotly_white"
#: A bar shorter than this share of the step's time span is a hairline (under ~4 px on a
#: notebook-wide figure, and its white outline covers it): its kind is not listed in the legend.
VISIBLE_SHARE = 0.005


# --- helpers ----------------------------------------------------------------------------------
def default_step(timeline: Timeline) -> int:
    """The step plots show by default: the first step after step 0, else the only one.

    Step 0 carries one-off warm-up costs (see `utils.analysis.steps.steady_steps`), so the
    next step is the representative one.
    """
    steps = timeline.steps
    if not steps:
        raise ValueError("the timeline has no events: nothing to plot")
    return steady_steps(steps)[0]


def _resolve_step(timeline: Timeline, step: int | None) -> int:
    if step is None:
        return default_step(timeline)
    if step not in timeline.steps:
        raise ValueError(f"step {step} is not in this timeline; steps present: {timeline.steps}")
    return step


def _row_labels(timeline: Timeline, lang: str) -> tuple[list[str], Callable[[Event], str]]:
    """Row labels, stage 0 first; with data parallelism one row per rank. A run over several
    nodes (``timeline.meta["nodes"]``: rank -> node) names each row's node, so the boundary
    between two nodes shows in the timeline."""
    ranks: dict[int, set[int]] = {s: set() for s in range(timeline.num_stages)}
    for e in timeline.events:
        ranks[e.stage].add(e.rank)
    per_rank = any(len(r) > 1 for r in ranks.values())
    nodes = {int(r): n for r, n in timeline.meta.get("nodes", {}).items()}

    def on(rank: int | None) -> str:
        return text("row.node", lang, node=nodes[rank]) if rank in nodes else ""

    def stage(s: int) -> str:
        only = next(iter(ranks[s]), None) if len(ranks[s]) == 1 else None
        return text("row.stage", lang, stage=s) + on(only)

    def stage_rank(s: int, r: int) -> str:
        return text("row.stage_rank", lang, stage=s, rank=r) + on(r)

    if not per_rank:
        return [stage(s) for s in range(timeline.num_stages)], lambda e: stage(e.stage)
    labels = []
    for s in range(timeline.num_stages):
        labels += [stage_rank(s, r) for r in sorted(ranks[s])] or [stage(s)]
    return labels, lambda e: stage_rank(e.stage, e.rank)


def _source_phrase(timeline: Timeline, lang: str) -> str:
    if timeline.source in ("simulated", "measured"):
        return text(f"source.{timeline.source}", lang)
    return timeline.source


def _safe_metrics(timeline: Timeline, step: int) -> Metrics | None:
    try:
        return compute_metrics(timeline, step)  # type: ignore[return-value]
    except ValueError:
        return None  # e.g. a step with no compute: still draw what is there


def _add_timeline_traces(fig: go.Figure, timeline: Timeline, step: int, *,
                         kinds: Iterable[str] | None, show_comm: bool,
                         legend_seen: set[str], drawn: dict[str, float], lang: str,
                         row: int | None = None, col: int | None = None) -> list[str]:
    """Add one horizontal-bar trace per kind for `step`; return the row labels (top first).

    A kind gets a legend entry (once: `legend_seen` collects them) only where one of its bars
    is visible (`VISIBLE_SHARE`); `drawn` collects every kind drawn with its longest bar (s).
    """
    wanted = list(KINDS if kinds is None else kinds)
    unknown = set(wanted) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kinds {sorted(unknown)}; expected some of {KINDS}")
    if not show_comm:
        wanted = [k for k in wanted if k not in COMM_KINDS]
    events = timeline.select(step=step)
    origin = min(e.start for e in events)
    shown = [e for e in events if e.kind in wanted]
    span = max((e.end for e in shown), default=origin) - min((e.start for e in shown), default=origin)
    labels, row_of = _row_labels(timeline, lang)
    where = {} if row is None else {"row": row, "col": col}
    planned = micro_batch_tokens(timeline, step) or []  # variable-length micro-batches

    def tokens_note(e: Event) -> str:
        if e.micro_batch is None or e.micro_batch >= len(planned):
            return ""
        samples, real, padded = planned[e.micro_batch]
        return text("hover.tokens", lang, samples=samples, real=real, padded=padded)

    def thickness(e: Event, full: float) -> float:
        """With variable micro-batches a compute bar is as thick as its share of the step's
        largest micro-batch (computed tokens), so a glance shows which ones were big."""
        if not planned or e.micro_batch is None or e.micro_batch >= len(planned):
            return full
        largest = max(p for _, _, p in planned)
        return full * max(0.25, planned[e.micro_batch][2] / largest)
    for kind in [k for k in KINDS if k in wanted]:
        evs = [e for e in events if e.kind == kind]
        if not evs:
            continue
        longest = max(e.duration for e in evs)
        drawn[kind] = max(drawn.get(kind, 0.0), longest)
        visible = span <= 0 or longest >= VISIBLE_SHARE * span
        is_compute = kind in COMPUTE_KINDS
        fig.add_trace(go.Bar(
            name=kind_label(kind, lang), legendgroup=kind, meta=kind,
            legendrank=KINDS.index(kind),  # one order in every figure, whichever run drew it first
            showlegend=visible and kind not in legend_seen,
            orientation="h",
            y=[row_of(e) for e in evs],
            x=[e.duration * 1e3 for e in evs],
            base=[(e.start - origin) * 1e3 for e in evs],
            width=_THIN_BAR_WIDTH if kind in COMM_KINDS else
            [thickness(e, _BAR_WIDTH) if is_compute else _BAR_WIDTH for e in evs],
            marker={"color": KIND_COLORS.get(kind, _FALLBACK_COLOR),
                    # second model chunk of interleaved schedules drawn lighter
                    "opacity": [1.0 if e.chunk % 2 == 0 else 0.6 for e in evs],
                    "line": {"color": "white", "width": 0.5}},
            text=[str(e.micro_batch) for e in evs] if is_compute else None,
            textposition="inside" if is_compute else "none",
            insidetextanchor="middle", textangle=0,
            customdata=[[kind_label(kind, lang), "–" if e.micro_batch is None else e.micro_batch,
                         (e.start - origin) * 1e3, (e.end - origin) * 1e3, e.duration * 1e3,
                         e.stage, e.rank, e.chunk, tokens_note(e)] for e in evs],
            hovertemplate=text("hover.bar", lang),
        ), **where)
        if visible:
            legend_seen.add(kind)
    # Rows without any drawn event still get their place on the axis.
    rows_drawn = {row_of(e) for e in shown}
    missing = [lab for lab in labels if lab not in rows_drawn]
    if missing:
        fig.add_trace(go.Scatter(x=[0.0] * len(missing), y=missing, mode="markers",
                                 marker={"opacity": 0}, showlegend=False, hoverinfo="skip"),
                      **where)
    return labels


def _rows_axis(labels: list[str]) -> dict:
    return {"categoryorder": "array", "categoryarray": labels, "autorange": "reversed",
            "type": "category"}


def _legend_room(entries: int) -> int:
    """Figure height (px) that fits a vertical legend of `entries` without scrolling: the plot
    area (the height less plotly's 100 + 80 px margins) must hold the legend's title and
    about 30 px per entry (CJK fonts draw taller lines than Latin ones)."""
    return 180 + 50 + 30 * entries


def _tiny_note(drawn: dict[str, float], legend_seen: set[str], lang: str) -> str | None:
    """The subtitle naming kinds drawn but too short to see (None when there are none)."""
    tiny = [k for k in KINDS if k in drawn and k not in legend_seen]
    if not tiny:
        return None
    kinds = ", ".join(f"{kind_label(k, lang)} (≤ {drawn[k] * 1e3:.2g} ms)" for k in tiny)
    return text("tiny", lang, kinds=kinds)


def _title(main: str, note: str | None) -> dict:
    title: dict = {"text": main}
    if note:
        title["subtitle"] = {"text": note, "font": {"size": 11, "color": "#666"}}
    return title


# --- timelines --------------------------------------------------------------------------------
def plot_timeline(timeline: Timeline, step: int | None = None, *,
                  kinds: Iterable[str] | None = None, title: str | None = None,
                  show_comm: bool = True, lang: str | None = None) -> go.Figure:
    """Per-stage timeline of one step: what every stage did, micro-batch by micro-batch.

    One row per stage (stage 0 on top), or one row per rank (``stage s · rank r``) when
    the timeline has data-parallel replicas. Each instruction is a bar coloured by kind,
    compute bars carry their micro-batch number, and empty space is idle time: the bubble.
    Hover shows kind, micro-batch, start, end and duration in ms. `step` defaults to
    `default_step` (the first step after 0). `kinds` restricts the kinds drawn;
    ``show_comm=False`` hides send/recv bars. The title says whether the timeline is
    measured or simulated and gives the bubble ratio of the step; its subtitle names kinds
    too short to see. `lang` chooses the language (default: `utils.ui.labels.get_language`).
    """
    lang = resolve(lang)
    step = _resolve_step(timeline, step)
    fig = go.Figure()
    legend_kinds: set[str] = set()
    drawn: dict[str, float] = {}
    labels = _add_timeline_traces(fig, timeline, step, kinds=kinds, show_comm=show_comm,
                                  legend_seen=legend_kinds, drawn=drawn, lang=lang)
    m = _safe_metrics(timeline, step)
    if title is None:
        title = text("timeline.title", lang, name=timeline.label or text("pipeline", lang),
                     source=_source_phrase(timeline, lang), step=step)
        if m is not None:
            title += text("timeline.bubble", lang, bubble=f"{m.bubble_ratio:.1%}")
    note = _tiny_note(drawn, legend_kinds, lang)
    fig.update_layout(title=_title(title, note), barmode="overlay", template=_TEMPLATE,
                      # tall enough for the rows and for the legend (one entry per kind)
                      height=max(240, 110 + 42 * len(labels), _legend_room(len(legend_kinds))),
                      legend={"title": {"text": text("legend.kind", lang)}, "traceorder": "normal"},
                      xaxis={"title": {"text": text("axis.time_in_step", lang)}},
                      yaxis=_rows_axis(labels), hoverlabel={"namelength": -1})
    return fig


def _summary_line(label: str, timeline: Timeline, step: int, lang: str) -> str:
    m = _safe_metrics(timeline, step)
    head = text("summary.head", lang, label=label, source=_source_phrase(timeline, lang), step=step)
    if m is None:
        return head
    return text("summary.line", lang, head=head, bubble=f"{m.bubble_ratio:.1%}",
                makespan=f"{m.makespan * 1e3:.1f}", samples=f"{m.samples_per_s:,.1f}")


def compare_timelines(a: Timeline, b: Timeline, *, labels: tuple[str, str] = ("A", "B"),
                      step: int | None = None, kinds: Iterable[str] | None = None,
                      show_comm: bool = True, title: str | None = None,
                      lang: str | None = None) -> go.Figure:
    """Two timelines stacked on one shared time axis (ms), e.g. simulated over measured.

    Each subplot title carries that run's bubble ratio, makespan and throughput; the figure
    title gives B's makespan relative to A's. `step` applies to both (each defaults to its
    own `default_step`). The figure is tall enough for its legend (no scrolling legend).
    """
    lang = resolve(lang)
    steps = (_resolve_step(a, step), _resolve_step(b, step))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.14,
                        row_heights=[max(a.num_stages, 1), max(b.num_stages, 1)],
                        subplot_titles=[_summary_line(labels[0], a, steps[0], lang),
                                        _summary_line(labels[1], b, steps[1], lang)])
    seen: set[str] = set()
    drawn: dict[str, float] = {}
    total_rows = 0
    for i, (tl, st) in enumerate(zip((a, b), steps), start=1):
        rows = _add_timeline_traces(fig, tl, st, kinds=kinds, show_comm=show_comm,
                                    legend_seen=seen, drawn=drawn, lang=lang, row=i, col=1)
        fig.update_yaxes(_rows_axis(rows), row=i, col=1)
        total_rows += len(rows)
    if title is None:
        ma, mb = _safe_metrics(a, steps[0]), _safe_metrics(b, steps[1])
        title = text("compare.title", lang, a=labels[0], b=labels[1])
        if ma is not None and mb is not None:
            title += text("compare.delta", lang, ratio=f"{mb.makespan / ma.makespan:.2f}",
                          bubble_a=f"{ma.bubble_ratio:.1%}", bubble_b=f"{mb.bubble_ratio:.1%}")
    note = _tiny_note(drawn, seen, lang)
    # The legend spans the whole plot area (both subplots): it must fit there, or plotly
    # scrolls it.
    fig.update_layout(title=_title(title, note), barmode="overlay", template=_TEMPLATE,
                      height=max(420, 200 + 42 * total_rows, _legend_room(len(seen))),
                      legend={"title": {"text": text("legend.kind", lang)}},
                      hoverlabel={"namelength": -1})
    fig.update_xaxes(title={"text": text("axis.time_in_step", lang)}, row=2, col=1)
    fig.update_xaxes(showticklabels=True, row=1, col=1)
    fig.update_annotations(font={"size": 12})
    return fig


# --- metrics figures --------------------------------------------------------------------------
def plot_stage_breakdown(source: Timeline | Metrics | MetricsSummary, *,
                         step: int | None = None, title: str | None = None,
                         lang: str | None = None) -> go.Figure:
    """Per-stage stacked bars: compute, exposed communication and idle time (ms).

    Accepts a `Timeline` (metrics of `step`, or the summary over steps when `step` is None
    and there are several), a `Metrics` or a `MetricsSummary` (medians; their parts need
    not add up exactly to the median makespan). The dashed line is the makespan; the
    slowest stage is marked. The title is the diagnosis.
    """
    lang = resolve(lang)
    m = compute_metrics(source, step) if isinstance(source, Timeline) else source
    stages = [text("row.stage", lang, stage=s) for s in range(m.num_stages)]
    fig = go.Figure()
    for part, values in (("compute", m.stage_compute), ("comm", m.stage_comm),
                         ("idle", m.stage_idle)):
        name = text(f"part.{part}", lang)
        fig.add_trace(go.Bar(
            name=name, x=stages, y=[v * 1e3 for v in values], meta=part,
            marker={"color": PART_COLORS[part], "line": {"color": "#BDBDBD", "width": 0.5}},
            hovertemplate=f"%{{x}}<br>{name} %{{y:.3f}} ms<extra></extra>"))
    fig.add_hline(y=m.makespan * 1e3, line_dash="dash", line_color="#444",
                  annotation_text=text("breakdown.makespan", lang, ms=f"{m.makespan * 1e3:.1f}"),
                  annotation_position="top left")
    fig.add_annotation(x=stages[m.slowest_stage], y=m.makespan * 1e3,
                       text=text("breakdown.slowest", lang),
                       showarrow=True, arrowhead=2, ay=-30, yshift=4)
    fig.update_layout(title=title or text("breakdown.title", lang, diagnosis=diagnosis_text(m, lang)),
                      barmode="stack", template=_TEMPLATE,
                      yaxis={"title": {"text": text("axis.time", lang)}},
                      legend={"title": {"text": text("legend.part", lang)}}, height=420)
    return fig


def plot_sweep(x: Sequence[float], y: Sequence[float] | Sequence[Sequence[float]], *,
               theory: Callable[[float], float] | tuple[Sequence[float], Sequence[float]]
               | None = None,
               x_label: str, y_label: str, title: str | None = None,
               name: str | None = None, theory_name: str | None = None,
               y_err: Sequence[float] | None = None, percent: bool = False,
               log_x: bool = False, lang: str | None = None) -> go.Figure:
    """Measured points against a parameter, with an optional theory curve as a line.

    `y` holds one value per `x`, or a list of repeated measurements per `x` (every repeat
    is drawn). `theory` is a callable of x, or ``(xs, ys)`` arrays. When every `x` is an
    integer the callable is evaluated on the integers between min and max (the formulas in
    `utils.analysis.theory` accept integers only); otherwise on 200 points. `percent` formats the
    y axis as percentages (for bubble ratios). `name` and `theory_name` default to
    "measured" and "theory" in the chosen language.
    """
    lang = resolve(lang)
    name = text("sweep.measured", lang) if name is None else name
    theory_name = text("sweep.theory", lang) if theory_name is None else theory_name
    if len(x) != len(y):
        raise ValueError(f"x and y need the same length: {len(x)} vs {len(y)}")
    px: list[float] = []
    py: list[float] = []
    for xi, yi in zip(x, y):
        repeats = list(yi) if hasattr(yi, "__len__") and not isinstance(yi, str) else [yi]
        px += [xi] * len(repeats)
        py += list(repeats)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=px, y=py, mode="markers", name=name, marker={"size": 9, "color": "#4C78A8"},
        error_y=None if y_err is None else {"type": "data", "array": list(y_err)}))
    if theory is not None:
        if callable(theory):
            lo, hi = min(x), max(x)
            if all(float(v).is_integer() for v in x) and hi - lo <= 2000:
                xs = list(range(int(lo), int(hi) + 1))
            else:
                xs = [lo + (hi - lo) * i / 199 for i in range(200)]
            ys = [theory(v) for v in xs]
        else:
            xs, ys = list(theory[0]), list(theory[1])
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=theory_name,
                                 line={"color": "#E45756", "dash": "dash"}))
    fig.update_layout(title=title or text("sweep.title", lang, y=y_label, x=x_label), template=_TEMPLATE,
                      xaxis={"title": {"text": x_label}, "type": "log" if log_x else "linear"},
                      yaxis={"title": {"text": y_label},
                             **({"tickformat": ".0%"} if percent else {})},
                      height=420)
    return fig


#: Units `plot_memory` accepts: byte units (values are bytes, scaled) and count units
#: (values are plain numbers, e.g. the micro-batches of activations a simulation holds).
BYTE_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
COUNT_UNITS = ("micro-batches",)


def plot_memory(series: Mapping[int | str, Sequence[tuple[float, float]]], *,
                title: str | None = None, unit: str = "MiB",
                limit_bytes: float | None = None, y_title: str | None = None,
                lang: str | None = None) -> go.Figure:
    """Memory over time, one step line per rank (or stage).

    `series` maps a rank (int, shown as ``rank r``) or any label to ``(time_s, value)``
    samples; memory is held constant between samples. `unit` is a byte unit (``"B"``,
    ``"KiB"``, ``"MiB"``, ``"GiB"``: values are bytes, shown scaled) or ``"micro-batches"``
    (values are counts, e.g. ``utils.simulate(...)`` without ``activation_bytes``, shown as
    they are). `limit_bytes` draws a budget line, in the same units as the values (bytes, or
    micro-batches). `y_title` replaces the y-axis title (default ``memory (MiB)`` or
    ``activations (micro-batches)``), e.g. to say what one counted unit is. `title` defaults
    to "Activation memory over time" in the chosen language.
    """
    lang = resolve(lang)
    if unit in BYTE_UNITS:
        scale, axis = BYTE_UNITS[unit], text("memory.axis", lang, unit=unit)
    elif unit in COUNT_UNITS:
        scale, axis = 1, text("memory.count_axis", lang, unit=unit)
    else:
        raise ValueError(f"unit must be one of {list(BYTE_UNITS) + list(COUNT_UNITS)}, "
                         f"got {unit!r}")
    fig = go.Figure()
    for key, samples in series.items():
        pts = sorted(samples)
        fig.add_trace(go.Scatter(
            x=[t * 1e3 for t, _ in pts], y=[v / scale for _, v in pts],
            mode="lines", line_shape="hv", name=f"rank {key}" if isinstance(key, int) else key,
            hovertemplate=f"%{{x:.3f}} ms<br>%{{y:.2f}} {unit}<extra>%{{fullData.name}}</extra>"))
    if limit_bytes is not None:
        fig.add_hline(y=limit_bytes / scale, line_dash="dot", line_color="#E45756",
                      annotation_text=text("memory.budget", lang), annotation_position="top left")
    fig.update_layout(title=text("memory.title", lang) if title is None else title,
                      template=_TEMPLATE, height=400,
                      xaxis={"title": {"text": text("axis.time", lang)}},
                      yaxis={"title": {"text": axis if y_title is None else y_title}})
    return fig
