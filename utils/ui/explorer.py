"""`TimelineExplorer`: a timeline figure with a step slider and a filter of instruction kinds."""

from __future__ import annotations

import html
from collections.abc import Iterable

import ipywidgets as widgets
import plotly.graph_objects as go

from utils.timeline import KINDS, Timeline
from utils.ui.display import Displayable, figure_output
from utils.ui.labels import kind_label, resolve, text
from utils.ui.plots import default_step, plot_timeline
from utils.ui.tables import diagnosis_text

_STYLE = {"description_width": "initial"}


class TimelineExplorer(Displayable):
    """A timeline figure with a step slider and a kind filter.

    ``TimelineExplorer(run.timeline)`` or ``TimelineExplorer(utils.simulate(...))``. Moving
    the slider or ticking a kind redraws the figure (`figure` is the one shown). Step 0 is
    available but not the default: it carries one-off warm-up costs (see `default_step`).
    Next to the slider: the step's bubble ratio, makespan and (``diagnosis=True``) diagnosis.
    `marks` are steps to mark on the slider (a dynamic job's re-partitions: ``6 ⇄``), named
    once more in a line under it.
    ``lang="zh"`` labels it in Chinese (default: `utils.ui.labels.get_language`).
    """

    def __init__(self, timeline: Timeline, *, step: int | None = None,
                 kinds: Iterable[str] | None = None, title: str | None = None,
                 diagnosis: bool = True, marks: Iterable[int] = (), lang: str | None = None):
        self.lang = resolve(lang)
        self.timeline = timeline
        self.title = title
        self.show_diagnosis = diagnosis
        steps = timeline.steps
        if not steps:
            raise ValueError("the timeline has no events: nothing to explore")
        present = [k for k in KINDS if any(e.kind == k for e in timeline.events)]
        chosen = set(present if kinds is None else kinds)
        self.marks = sorted(set(marks) & set(steps))
        self.step_slider = widgets.SelectionSlider(
            options=[(text("explorer.mark", self.lang, step=s) if s in self.marks else str(s), s) for s in steps], value=default_step(timeline) if step is None else step,
            description=text("explorer.step", self.lang), disabled=len(steps) == 1, continuous_update=False, style=_STYLE,
            layout={"width": "420px"})
        self.kind_boxes: dict[str, widgets.Checkbox] = {
            k: widgets.Checkbox(value=k in chosen, description=kind_label(k, self.lang), indent=False,
                                layout={"width": "auto", "margin": "0 12px 0 0"})
            for k in present}
        self.summary = widgets.HTML()
        self.output = widgets.Output(layout={"min_height": "260px"})
        self.figure: go.Figure | None = None
        self.step_slider.observe(self._on_change, names="value")
        for box in self.kind_boxes.values():
            box.observe(self._on_change, names="value")
        self.kinds_row = kinds_row = widgets.HBox([widgets.HTML(f"<b>{html.escape(text('explorer.kinds', self.lang))}</b>&nbsp;"), *self.kind_boxes.values()],
                                 layout={"flex_flow": "row wrap", "align_items": "center"})
        # the marked steps once more, as buttons that move the slider there
        self.mark_buttons = [widgets.Button(description=text("explorer.mark", self.lang, step=s),
                                            layout={"width": "auto"}) for s in self.marks]
        for step, button in zip(self.marks, self.mark_buttons):
            button.on_click(lambda _b, step=step: setattr(self, "step", step))
        marked = text("explorer.marks", self.lang, steps=self.marks) if self.marks else ""
        self.marks_line = widgets.HBox(
            [widgets.HTML(f"<small>{html.escape(marked)}</small>"), *self.mark_buttons] if marked else [],
            layout={"align_items": "center", "flex_flow": "row wrap"})
        self.widget = widgets.VBox([widgets.HBox([self.step_slider, self.summary],
                                                 layout={"align_items": "center"}),
                                    self.marks_line, kinds_row, self.output])
        self.redraw()

    @property
    def step(self) -> int:
        return self.step_slider.value

    @step.setter
    def step(self, value: int) -> None:
        self.step_slider.value = value  # redraws through the observer

    @property
    def kinds(self) -> list[str]:
        """The kinds ticked, in the order plots list them."""
        return [k for k, box in self.kind_boxes.items() if box.value]

    @kinds.setter
    def kinds(self, wanted: Iterable[str]) -> None:
        wanted = set(wanted)
        unknown = wanted - set(self.kind_boxes)
        if unknown:
            raise ValueError(f"kinds {sorted(unknown)} are not in this timeline; it has {list(self.kind_boxes)}")
        self._hold = True  # one redraw for all boxes, not one per box
        try:
            for k, box in self.kind_boxes.items():
                box.value = k in wanted
        finally:
            self._hold = False
        self.redraw()

    _hold = False

    def _on_change(self, _change=None) -> None:
        if not self._hold:
            self.redraw()

    def redraw(self) -> go.Figure:
        """Draw the selected step with the ticked kinds; returns the figure."""
        step = self.step
        self.figure = plot_timeline(self.timeline, step, kinds=self.kinds, title=self.title,
                                    lang=self.lang)
        figure_output(self.figure, self.output)
        try:
            m = self.timeline.metrics(step)
            why = f" · <i>{html.escape(diagnosis_text(m, self.lang))}</i>" if self.show_diagnosis else ""
            line = text("explorer.summary", self.lang, step=step, bubble=f"{m.bubble_ratio:.1%}",
                        makespan=f"{m.makespan * 1e3:.1f}")
            self.summary.value = f"&nbsp;&nbsp;{line}{why}"
        except ValueError as exc:  # e.g. a step without compute
            self.summary.value = f"&nbsp;&nbsp;<i>{html.escape(str(exc))}</i>"
        return self.figure

    def bar_count(self) -> int:
        """Bars (events) drawn in the current figure: handy in tests and exercises."""
        return sum(len(t.x) for t in (self.figure.data if self.figure else ()) if t.type == "bar")

