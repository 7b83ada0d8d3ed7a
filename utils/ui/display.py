"""Showing plotly figures inside ipywidgets, safely from any thread.

plotly 7's ``go.FigureWidget`` is built on ``anywidget``, which the workbook does not depend
on. Instead a figure's JSON is written as ``application/vnd.plotly.v1+json`` straight into an
``ipywidgets.Output``'s ``outputs`` (rendered by the ``jupyterlab-plotly`` extension shipped
inside the plotly package). Writing ``outputs`` is safe from a background thread — the
``with out:`` capture is not — and does not depend on ``plotly.io.renderers.default``.

`render_figures_directly` shows every other figure of a kernel the same way.
"""

from __future__ import annotations

import html
import json

import ipywidgets as widgets
import plotly.graph_objects as go

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def figure_bundle(fig: go.Figure) -> dict:
    """The MIME bundle JupyterLab renders as an interactive plotly chart."""
    data = json.loads(fig.to_json())
    data["config"] = {"displaylogo": False, "responsive": True}
    title = fig.layout.title.text or "plotly figure"
    return {PLOTLY_MIME: data, "text/plain": f"<plotly figure: {title}>"}


def render_figures_directly() -> bool:
    """Show every plotly figure this kernel displays as `figure_bundle`, the MIME type
    JupyterLab's plotly extension renders, instead of through ``plotly.io``'s renderers.

    Why: the first figure ``plotly.io`` renders imports its renderers module, which imports
    ``nbformat`` (for a version check), hence ``jsonschema`` and ``rfc3987-syntax``, whose 39
    grammars are built at import: about 2 s in every kernel that shows a figure, against 0.1 s
    this way. The printer is registered for plotly's ``BaseFigure`` with IPython's display
    formatter, which consults registered printers before a figure's own ``_ipython_display_``.
    ``fig.show()`` still goes through ``plotly.io``; an HTML export of the notebook shows no
    chart either way. Returns False (and does nothing) outside IPython."""
    from IPython import get_ipython
    from IPython.display import display
    from plotly.basedatatypes import BaseFigure

    shell = get_ipython()
    if shell is None:
        return False
    shell.display_formatter.ipython_display_formatter.for_type(
        BaseFigure, lambda fig: display(figure_bundle(fig), raw=True))
    return True


def figure_output(fig: go.Figure, out: widgets.Output | None = None) -> widgets.Output:
    """Show `fig` in an Output widget (a new one unless `out` is given), replacing its content.
    Safe to call from any thread."""
    out = out if out is not None else widgets.Output()
    out.outputs = ({"output_type": "display_data", "data": figure_bundle(fig), "metadata": {}},)
    return out


def error_html(text: str, colour: str = "#b00020") -> str:
    return (f"<pre style='white-space:pre-wrap;color:{colour};margin:4px 0;font-size:12px;"
            f"line-height:1.35'>{html.escape(text)}</pre>")


class Displayable:
    """A bare object as the last line of a cell shows its root widget."""

    widget: widgets.Widget

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
