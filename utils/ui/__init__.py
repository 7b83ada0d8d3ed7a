"""What a learner sees: plotly figures (`plots`), ipywidgets panels (`widgets`) and the
headless demo (`demo`). Nothing below the ui imports it."""
