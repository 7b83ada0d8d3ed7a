"""JupyterLab in headless Chromium: the plotly timeline and the run panel really render.

Starts JupyterLab on 127.0.0.1 (free port, random token, throw-away config, settings and
workspace folders) with a small notebook, opens it with Playwright's Python API in the
system's Chromium (``$CHROMIUM``, else ``chromium`` on PATH), runs all cells from the Run
menu, checks that the plotly charts and the widgets are in the page, presses the panel's Run
button to train a tiny real DeepSpeed job, waits for its timeline to appear, and saves
screenshots under ``artifacts/``.

Without Chromium (or Playwright) the test skips, except under ``CI=true``, where it fails.
The server and its kernels are always stopped, and every wait is bounded.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import psutil
import pytest

from tests.helpers import SMALL_GPT, processes_of

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
# $CHROMIUM if set, else chromium on PATH (.ci/run installs it there), else the usual place.
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
NOTEBOOK = "panel.ipynb"
SERVER_START_S = 120
PAGE_S = 120            # JupyterLab's page and the kernel
CELLS_S = 180           # all cells (imports of torch through utils take a while on 2 cores)
JOB_S = 300             # the tiny real job started from the page


def _missing_browser() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (set $CHROMIUM)"
    return None


@pytest.fixture(scope="module")
def browser_available() -> None:
    why = _missing_browser()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but the browser test cannot run: {why}")
        pytest.skip(f"browser test skipped: {why}")


def _notebook() -> nbformat.NotebookNode:
    """Built here, not stored as a .ipynb under tests/: nbval would collect that file."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    spec = dict(SMALL_GPT, num_stages=2, micro_batches=2, steps=2, device="cpu", timeout=240)
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Browser check: a timeline figure and the run panel"),
        nbformat.v4.new_code_cell(
            "import utils\n"
            "from utils import RunPanel, TimelineExplorer\n\n"
            "simulated = utils.simulate(utils.build_schedule('1f1b', 4, 8), forward=1e-3, backward=2e-3)\n"
            "utils.plot_timeline(simulated)"),
        nbformat.v4.new_code_cell(
            "TimelineExplorer(utils.simulate(utils.build_schedule('gpipe', 4, 8), forward=1e-3, backward=2e-3))"),
        nbformat.v4.new_code_cell(
            "# A tiny real job: the test presses this panel's Run button in the page.\n"
            f"panel = RunPanel(utils.JobSpec(**{spec!r}))\n"
            "panel"),
    ]
    return nb


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(proc: subprocess.Popen) -> None:
    """The server, its kernels and anything they started (DeepSpeed jobs run in sessions of
    their own, but are children of the kernel)."""
    try:
        parent = psutil.Process(proc.pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


@pytest.fixture(scope="module")
def jupyterlab(browser_available, tmp_path_factory) -> Iterator[dict]:
    """A JupyterLab server with the test notebook; yields its URL parts."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root, home = base / "root", base / "jupyter"
    root.mkdir()
    nbformat.write(_notebook(), root / NOTEBOOK)
    settings = home / "settings"
    # No news or update checks (no internet here; they would only add toasts to the page).
    notification = settings / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}', encoding="utf-8")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               WORKBOOK_RUNS=str(base / "runs"), JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"), JUPYTER_PLATFORM_DIRS="1")
    env.pop("PLOTLY_RENDERER", None)
    log = open(base / "server.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={settings}",
         f"--LabApp.workspaces_dir={home / 'workspaces'}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly",
         *(["--allow-root"] if os.geteuid() == 0 else [])],  # containers and CI often run as root
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n{_tail(base / 'server.log')}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer within {SERVER_START_S} s:\n{_tail(base / 'server.log')}")
            time.sleep(0.5)
        yield {"url": url, "token": token, "root": root, "log": base / "server.log",
               "runs": base / "runs"}
    finally:
        _kill_tree(server)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="module")
def page(jupyterlab) -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                                    timeout=60_000)
        try:
            context = browser.new_context(viewport={"width": 1500, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(60_000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{jupyterlab['url']}/lab/tree/{NOTEBOOK}?token={jupyterlab['token']}",
                      timeout=PAGE_S * 1000, wait_until="domcontentloaded")
            page.page_errors = errors
            yield page
        finally:
            browser.close()


def _accept_dialogs(page) -> None:
    """Accept a dialog if one is open (JupyterLab may ask which kernel to use: the
    notebook's own, preselected, is the right one)."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and dialog.first.is_visible():
        dialog.first.locator(".jp-mod-accept").first.click()
        page.wait_for_timeout(300)


def _run_all_cells(page) -> None:
    """Run ▸ Run All Cells, from the menu bar, as a learner would, once the kernel is idle."""
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=PAGE_S * 1000)
    idle = page.locator(".jp-StatusBar-TextItem", has_text="Idle")
    deadline = time.monotonic() + PAGE_S
    while not idle.count():
        _accept_dialogs(page)
        if time.monotonic() > deadline:
            raise AssertionError(f"the kernel was not idle within {PAGE_S} s")
        page.wait_for_timeout(250)
    _accept_dialogs(page)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def test_timeline_and_panel_render_in_jupyterlab(jupyterlab, page):
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        page.locator(".jp-Notebook").first.wait_for(timeout=PAGE_S * 1000)
        _run_all_cells(page)
        # Two plotly charts without any job: the bare figure and the explorer's (in an
        # Output widget, written from Python as plotly's MIME bundle).
        plots = page.locator(".jp-NotebookPanel .js-plotly-plot")
        _wait_for_count(page, plots, 2, CELLS_S)
        panel_run = page.locator(".widget-button", has_text="Run").first
        panel_run.wait_for(timeout=CELLS_S * 1000)
        assert page.locator(".jupyter-widgets").count() > 10
        assert page.locator(".widget-slider, .widget-hslider").count() >= 1
        assert page.locator(".js-plotly-plot .barlayer .point").count() >= 2 * 64
        assert "simulated" in page.locator(".js-plotly-plot .gtitle").first.text_content()
        legend = page.locator(".js-plotly-plot").first.locator(".legend .traces").all_text_contents()
        assert any("forward" in t for t in legend) and any("backward" in t for t in legend)
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-before-run.png"))

        # Press Run in the page: the kernel starts the job and a thread fills the panel in.
        panel_run.scroll_into_view_if_needed()
        panel_run.click()
        page.get_by_text("succeeded in", exact=False).first.wait_for(timeout=JOB_S * 1000)
        _wait_for_count(page, plots, 3, 60)
        page.get_by_text("diagnosis:", exact=False).first.wait_for(timeout=30_000)
        measured = plots.nth(2)
        measured.scroll_into_view_if_needed()
        assert "measured" in measured.locator(".gtitle").text_content()
        assert page.locator(".jp-NotebookPanel").get_by_text("bubble_ratio").count() >= 1
        assert processes_of(jupyterlab["runs"]) == [], "the finished job left processes behind"
        _screenshots(page, ARTIFACTS)
        assert (ARTIFACTS / "jupyterlab.png").stat().st_size > 50_000
        assert not [e for e in page.page_errors if "plotly" in e.lower() or "widget" in e.lower()], \
            page.page_errors
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-failure.png"))
        print(_tail(jupyterlab["log"], 60))
        raise


def _wait_for_count(page, locator, n: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while locator.count() < n:
        _accept_dialogs(page)
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {n} of {locator} within {seconds:g} s, found {locator.count()}")
        page.wait_for_timeout(250)


def _screenshots(page, folder: Path) -> None:
    """``jupyterlab.png``: the whole notebook — simulated figure, explorer, run panel with its
    measured timeline — with the file browser folded away; JupyterLab scrolls inside the
    notebook, so the page is first made as tall as the notebook's content.
    ``jupyterlab-panel.png``: the run panel alone, at full resolution."""
    sidebar_tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
    if sidebar_tab.count():
        sidebar_tab.first.click()
    scroller = ("document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer')"
                " || document.querySelector('.jp-NotebookPanel .jp-Notebook')")
    height = page.evaluate(f"() => {{ const n = {scroller}; return n ? n.scrollHeight : 1000; }}")
    page.set_viewport_size({"width": 1500, "height": int(min(max(height + 150, 1000), 6000))})
    page.evaluate(f"() => {{ const n = {scroller}; if (n) n.scrollTop = 0; }}")
    page.wait_for_timeout(1000)  # plotly redraws on resize
    page.screenshot(path=str(folder / "jupyterlab.png"))
    panel = page.locator(".widget-vbox", has_text="Pipeline run").filter(has_text="History and comparison")
    panel.last.screenshot(path=str(folder / "jupyterlab-panel.png"))
