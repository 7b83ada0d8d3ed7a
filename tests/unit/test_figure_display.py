"""`utils.ui.render_figures_directly`: a kernel shows plotly figures as the plotly MIME bundle
without importing plotly.io's renderers (and nbformat with them, ~2 s per kernel)."""

from __future__ import annotations

import json
import subprocess
import sys

from utils.system.paths import PROJECT_ROOT

KERNEL_LIKE = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display
from IPython.utils.capture import capture_output
import plotly.graph_objects as go
from utils.ui import render_figures_directly

shell = InteractiveShell.instance()
installed = render_figures_directly() if sys.argv[1] == "direct" else None
with capture_output() as cap:
    display(go.Figure(go.Bar(y=[1, 2]), layout={"title": "t"}))
print(json.dumps({"installed": installed, "mimes": [sorted(o.data) for o in cap.outputs],
                  "data": [o.data.get("application/vnd.plotly.v1+json", {}).get("data") for o in cap.outputs],
                  "imported": [m for m in ("nbformat", "plotly.io._renderers") if m in sys.modules]}))
"""


def _show(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", KERNEL_LIKE, mode], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_figure_is_shown_as_the_plotly_bundle_without_plotly_io_renderers():
    shown = _show("direct")
    assert shown["installed"] is True
    assert shown["mimes"] == [["application/vnd.plotly.v1+json", "text/plain"]]
    assert shown["data"][0][0]["y"] == [1, 2] and shown["data"][0][0]["type"] == "bar"
    assert shown["imported"] == []


def test_without_it_plotly_io_imports_nbformat():
    """The control: the cost the function avoids is real in this environment."""
    assert _show("plotly")["imported"] == ["nbformat", "plotly.io._renderers"]


def test_outside_ipython_it_does_nothing():
    from utils.ui import render_figures_directly

    assert render_figures_directly() is False
