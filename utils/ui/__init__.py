"""What a learner sees: plotly figures (`plots`), ipywidgets panels (`widgets`, `explorer`),
the metrics report (`tables`), a run's standalone page (`report`) and the headless demo
(`demo`). Nothing below the ui imports it.

The language of labels, titles and legends is chosen here (`utils.ui.labels`)::

    from utils.ui import set_language
    set_language("zh")   # Chinese figures, tables and panels in this kernel; English is the default

`metrics_table(m)` shows a `Metrics` or `MetricsSummary` in that language.
`render_figures_directly()` shows the kernel's plotly figures without ``plotly.io``'s
renderers (2 s less per kernel; `utils.ui.display`).
"""

from __future__ import annotations


from utils.ui.labels import get_language, set_language, use_language
from utils.ui.tables import metrics_table


def render_figures_directly() -> bool:
    """`utils.ui.display.render_figures_directly`, imported on call (ipywidgets with it)."""
    from utils.ui.display import render_figures_directly as install

    return install()


__all__ = ["set_language", "get_language", "use_language", "metrics_table", "render_figures_directly"]
