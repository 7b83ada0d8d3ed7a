"""What a learner sees: plotly figures (`plots`), ipywidgets panels (`widgets`, `explorer`),
the metrics report (`tables`), a run's standalone page (`report`) and the headless demo
(`demo`). Nothing below the ui imports it.

The language of labels, titles and legends is chosen here (`utils.ui.labels`)::

    from utils.ui import set_language
    set_language("zh")   # Chinese figures, tables and panels in this kernel; English is the default

`metrics_table(m)` shows a `Metrics` or `MetricsSummary` in that language.
"""

from utils.ui.labels import get_language, set_language, use_language
from utils.ui.tables import metrics_table

__all__ = ["set_language", "get_language", "use_language", "metrics_table"]
