"""The results part of a `RunPanel`: the run shown, the panel's history and the comparison.

`RunResults` shows a `Run` (title, diagnosis, a `TimelineExplorer`, the metrics table; for a
dynamic job also its partition history, a diagnosis per phase, the decision logs and the
partition-history plot, `utils.ui.dynamic_view`),
keeps the panel's successful runs, and draws two of them on one time axis. The history
label of a run gives its **median** bubble over the steps after step 0 and says so, since
the explorer next to it shows the bubble of one step.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import plotly.graph_objects as go

from utils.jobs.runs import Run
from utils.ui.controls import STYLE
from utils.ui.display import error_html, figure_output
from utils.ui.dynamic_controls import is_dynamic
from utils.ui.dynamic_view import decisions_html, history_text, move_steps, phase_diagnoses_html
from utils.ui.explorer import TimelineExplorer
from utils.ui.labels import text
from utils.ui.plots import compare_timelines
from utils.ui.rebalance_plots import plot_partition_history
from utils.ui.tables import diagnosis_text, metrics_html

__all__ = ["RunResults"]

#: Room for a history label (``#12 gpt-large 16st×128mb gpipe 0,3,8,… · median bubble …``).
_CHOICE_LAYOUT = {"width": "min(100%, 760px)"}


class RunResults:
    """Mixin of `RunPanel`: ``result_title``, ``diagnosis``, ``result_box``, ``metrics``,
    ``history`` and its widgets, `show`, `compare`. Needs ``self.lang`` and ``self.message``."""

    lang: str
    message: widgets.HTML
    history: list[Run]
    explorer: TimelineExplorer | None

    def _build_results(self) -> None:
        t = lambda key: text(key, self.lang)  # noqa: E731
        self.result_title = widgets.HTML()
        self.result_box = widgets.VBox()
        self.metrics = widgets.HTML()
        self.diagnosis = widgets.HTML()
        self.decisions = widgets.HTML()  # a dynamic job's decision logs
        self.partition_plot = widgets.Output()  # a dynamic job's stage costs and boundaries
        self.partition_figure: go.Figure | None = None
        self.history_select = widgets.Dropdown(options=[], description=t("runs"), style=STYLE,
                                               layout=_CHOICE_LAYOUT)
        self.show_button = widgets.Button(description=t("btn.show"), icon="eye", tooltip=t("tip.show"))
        self.compare_a = widgets.Dropdown(options=[], description="A", style=STYLE, layout=_CHOICE_LAYOUT)
        self.compare_b = widgets.Dropdown(options=[], description="B", style=STYLE, layout=_CHOICE_LAYOUT)
        self.compare_button = widgets.Button(description=t("btn.compare"), icon="columns",
                                             tooltip=t("tip.compare"))
        self.compare_output = widgets.Output()
        self.show_button.on_click(lambda _b: self._on_show())
        self.compare_button.on_click(lambda _b: self._on_compare())
        row = {"align_items": "center", "flex_flow": "row wrap", "width": "100%"}
        self.history_box = widgets.VBox([
            widgets.HTML(f"<h4 style='margin:8px 0 2px'>{html.escape(t('panel.history'))}</h4>"),
            widgets.HBox([self.history_select, self.show_button], layout=row),
            # A and B one under the other, each as wide as its label needs
            self.compare_a, widgets.HBox([self.compare_b, self.compare_button], layout=row),
            self.compare_output,
        ])

    @property
    def figure(self) -> go.Figure | None:
        """The timeline figure shown in the result view (None before any result)."""
        return self.explorer.figure if self.explorer is not None else None

    def show(self, run: Run | int) -> None:
        """Show a run (or the history entry with that index): timeline, metrics, diagnosis."""
        run = self.history[run] if isinstance(run, int) else run
        timeline = run.timeline
        losses = run.losses
        loss = text("result.loss", self.lang, first=f"{losses[0]:.3f}", last=f"{losses[-1]:.3f}") \
            if losses else ""
        dynamic = is_dynamic(run.spec)
        moved = dynamic and len(run.partition_history) > 1
        title = text("result.title", self.lang, name=html.escape(run.name), stages=run.spec.num_stages,
                     mbs=run.spec.micro_batches, schedule=html.escape(schedule_label(run.spec)), parts=run.parts,
                     loss=loss)
        if moved:
            title += html.escape(text("result.history", self.lang, history=history_text(run)))
        self.result_title.value = title
        # the run's diagnosis is shown above the explorer, not once more beside its slider
        self.explorer = TimelineExplorer(timeline, diagnosis=False, marks=move_steps(run) if moved else (),
                                         lang=self.lang)
        self.result_box.children = (self.explorer.widget,)
        m = timeline.metrics()
        self.metrics.value = metrics_html(m, self.lang, diagnosis=False)  # shown above the timeline
        if moved:  # one median across a move mixes two pipelines: diagnose each phase
            self.diagnosis.value = phase_diagnoses_html(run, self.lang)
        else:
            self.diagnosis.value = (f"<b>{html.escape(text('diagnosis', self.lang))}</b> "
                                    f"{html.escape(diagnosis_text(m, self.lang))}")
        self.decisions.value = decisions_html(run, self.lang) if dynamic else ""
        self.partition_figure = None
        if moved or (dynamic and run.spec.rebalance is not None):
            self.partition_figure = plot_partition_history(timeline, lang=self.lang)
            figure_output(self.partition_figure, self.partition_plot)
        else:
            self.partition_plot.outputs = ()

    def history_label(self, index: int) -> str:
        """What the history and A/B lists call run `index`: its settings and median bubble."""
        run = self.history[index]
        s = run.spec
        part = s.partition if isinstance(s.partition, str) else ",".join(map(str, s.partition))
        label = text("history.label", self.lang, i=index + 1, model=s.model, stages=s.num_stages,
                     mbs=s.micro_batches, schedule=schedule_label(s), part=part)
        try:
            m = run.timeline.metrics()
        except ValueError:
            return label
        steps = len(getattr(m, "used_steps", (m,)))
        return label + text("history.bubble", self.lang, bubble=f"{m.bubble_ratio:.0%}", n=steps)

    def _refresh_history(self, select: int | None = None) -> None:
        options = [(self.history_label(i), i) for i in range(len(self.history))]
        for dropdown in (self.history_select, self.compare_a, self.compare_b):
            dropdown.options = options
        if options:
            last = len(options) - 1
            self.history_select.value = last if select is None else select
            self.compare_b.value = last
            self.compare_a.value = max(0, last - 1)

    def _on_show(self) -> None:
        if self.history_select.value is not None:
            self.show(self.history_select.value)

    def _on_compare(self) -> None:
        try:
            self.compare(self.compare_a.value, self.compare_b.value)
        except (ValueError, IndexError, TypeError) as exc:
            self.compare_output.outputs = ()
            self.message.value = error_html(text("error.compare", self.lang, why=exc))

    def compare(self, a: int | Run, b: int | Run) -> go.Figure:
        """Both runs' timelines on one time axis (`utils.compare_timelines`), shown below."""
        if a is None or b is None:
            raise ValueError(text("error.empty", self.lang))
        runs = [self.history[x] if isinstance(x, int) else x for x in (a, b)]
        labels = tuple(f"#{self.history.index(r) + 1}" if r in self.history else r.name for r in runs)
        fig = compare_timelines(runs[0].timeline, runs[1].timeline, labels=labels, lang=self.lang)
        figure_output(fig, self.compare_output)
        return fig


def schedule_label(spec) -> str:
    """A spec's schedule as the panel shows it: the name, with ``@torch`` when torch's
    pipelining runs it (so a DeepSpeed and a torch 1F1B are told apart in the history)."""
    return spec.schedule if spec.resolved_runtime == "deepspeed" else f"{spec.schedule}@torch"
