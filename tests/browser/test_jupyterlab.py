"""JupyterLab in headless Chromium: the plotly timeline and the run panel really render, and
chapter 1's run panel works as a learner uses it.

Starts JupyterLab on 127.0.0.1 (free port, random token, throw-away config, settings and
workspace folders) with a small notebook and a copy of chapter 1, opens them with Playwright's
Python API in the system's Chromium (``$CHROMIUM``, else ``chromium`` on PATH) and runs all
cells from the Run menu.

* The small notebook: the plotly charts and the widgets are in the page; the panel's Run button
  trains a tiny real DeepSpeed job and its timeline appears.
* Chapter 1, whole: its run panel (Chinese labels) starts nothing by itself; Run starts a real
  job and Jupyter's ■ (the toolbar's interrupt button) stops it, every process gone, the panel
  saying so; a 2-stage job from the changed controls succeeds; A/B comparison draws both runs
  with a legend that does not scroll and choices whose text is not clipped.
* `utils.run_job` in a scratch notebook (written into the server's root, removed after): its
  one live line names the phase with elapsed seconds, ■ ends the job with one line and no
  traceback or process left, a finished run ends on "完成 (succeeded) · 3/3 steps".
* A dynamic job in a Chinese run panel (scratch notebook): the controls show its freezing and
  re-balancing policy; after Run the title carries the partition history, the decision log is
  a Chinese table, the partition-history plot is drawn and the move is marked on the slider.

Screenshots are saved under ``artifacts/`` (kept by CI as test artifacts).

Without Chromium (or Playwright) the test skips, except under ``CI=true``, where it fails.
The server and its kernels are always stopped, and every wait is bounded.
"""

from __future__ import annotations

import os
import re
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

from tests.helpers import SMALL_GPT
from utils.system.procs import job_processes

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
# $CHROMIUM if set, else chromium on PATH (.ci/run installs it there), else the usual place.
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
NOTEBOOK = "panel.ipynb"
CHAPTER = "01_course_intro.ipynb"   # copied from chapters/ into the server's root
SERVER_START_S = 120
PAGE_S = 120            # JupyterLab's page and the kernel
CELLS_S = 180           # all cells (imports of torch through utils take a while on 2 cores)
JOB_S = 300             # the tiny real job started from the page
CHAPTER_S = 300         # chapter 1 with its 4-stage job (about 30 s on 2 cores when warm)
STOP_S = 30             # ■ to every process of the job gone


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
    shutil.copy(ROOT / "chapters" / CHAPTER, root / CHAPTER)
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
        assert job_processes(jupyterlab["runs"]) == [], "the finished job left processes behind"
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


# --- chapter 1's run panel -----------------------------------------------------------------------
def _wait_until(page, predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        _accept_dialogs(page)
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds:g} s")
        page.wait_for_timeout(250)


def _interrupt_kernel(page) -> None:
    """Press the notebook toolbar's ■ (Interrupt the kernel), as a learner does."""
    toolbar = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar").first
    button = toolbar.locator("[data-jp-item-name='interrupt'] button, "
                             "[data-jp-item-name='interrupt'] jp-button, "
                             "[data-command='notebook:interrupt-kernel']").first
    button.click()


def _element_screenshot(page, element, path: Path, settle_ms: int = 800) -> None:
    """A screenshot of one element, whole: the viewport is made taller than the element first
    (JupyterLab scrolls inside the notebook, so a tall element would be cut or overlapped).
    `settle_ms`: time for plotly to redraw after the resize (longer for several figures)."""
    box = element.bounding_box() or {"height": 1000}
    page.set_viewport_size({"width": 1500, "height": int(min(max(box["height"] + 200, 1000), 6000))})
    element.scroll_into_view_if_needed()
    page.wait_for_timeout(settle_ms)  # plotly redraws on resize
    element.screenshot(path=str(path))
    page.set_viewport_size({"width": 1500, "height": 1000})


#: Width the text of each shown <select> of the panel needs and has (px), measured by the browser.
_SELECT_TEXT = """(root) => Array.from(root.querySelectorAll('.widget-dropdown select'))
  .filter(sel => sel.offsetParent !== null)  /* shown: not inside the folded dynamic controls */
  .map(sel => {
  const text = sel.selectedIndex >= 0 ? sel.options[sel.selectedIndex].text : '';
  const cs = getComputedStyle(sel);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
  const room = sel.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  return {text, need: ctx.measureText(text).width, room};
})"""


def test_chapter_one_panel_stop_by_interrupt_and_compare(jupyterlab, page):
    ARTIFACTS.mkdir(exist_ok=True)
    runs = jupyterlab["runs"]
    try:
        page.goto(f"{jupyterlab['url']}/lab/workspaces/chapter1/tree/{CHAPTER}?reset&token={jupyterlab['token']}",
                  timeout=PAGE_S * 1000, wait_until="domcontentloaded")
        page.locator(".jp-Notebook").first.wait_for(timeout=PAGE_S * 1000)
        _run_all_cells(page)
        notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
        # the whole chapter ran: the last code cell (exercise 2) printed its answer
        notebook.get_by_text("这段时间里执行的指令", exact=False).first.wait_for(timeout=CHAPTER_S * 1000)
        panel = notebook.locator(".widget-vbox", has_text="流水线任务").filter(has_text="历史与对比").last
        panel.scroll_into_view_if_needed()
        assert job_processes(runs) == [], "executing the chapter left a job running"
        # the chapter's figures and the panel are Chinese
        titles = " ".join(notebook.locator(".js-plotly-plot .gtitle").all_text_contents())
        assert "模拟（不是测量）" in titles and "实测时间线" in titles
        run_button = panel.locator(".widget-button", has_text="运行").first
        stop_hint = "按「停止」或 Jupyter 的 ■（中断内核）都会结束这个任务的全部进程"
        assert panel.get_by_text(stop_hint, exact=False).count() == 1
        history = panel.locator(".widget-dropdown", has=page.locator("label", has_text="历史")).locator("select")
        assert "气泡率中位数" in history.first.locator("option").first.text_content()  # the run of 1.9, a median

        # Run, then ■: the job stops, all its processes end, the panel says who stopped it.
        run_button.click()
        _wait_until(page, lambda: len(job_processes(runs)) > 0, 120, "the job's processes starting")
        _interrupt_kernel(page)
        pressed = time.monotonic()
        panel.get_by_text("被内核中断 (■) 停止", exact=False).first.wait_for(timeout=STOP_S * 1000)
        print(f"■ to the panel saying the job stopped: {time.monotonic() - pressed:.1f} s")
        _wait_until(page, lambda: job_processes(runs) == [], STOP_S, "every process of the stopped job ending")
        assert panel.get_by_text("个进程全部结束", exact=False).count() >= 1
        assert "已停止" in panel.locator(".widget-html", has_text="已停止").first.text_content()
        _element_screenshot(page, panel, ARTIFACTS / "chapter01-panel-stopped.png")

        # Change the controls (2 stages) and run again: it succeeds and joins the history.
        stages = panel.locator(".widget-text", has_text="阶段数").locator("input").first
        stages.fill("2")
        stages.press("Enter")
        panel.get_by_text("2 个进程", exact=False).first.wait_for(timeout=30_000)
        run_button.click()
        panel.get_by_text("完成，用时", exact=False).first.wait_for(timeout=JOB_S * 1000)
        assert job_processes(runs) == [], "the finished job left processes behind"
        plots = panel.locator(".js-plotly-plot")
        _wait_for_count(page, plots, 1, 60)
        assert "实测时间线" in plots.first.locator(".gtitle").text_content()
        _element_screenshot(page, panel, ARTIFACTS / "chapter01-panel.png")

        # A = #1 (chapter 1's 4-stage run), B = #2 (the 2-stage run): both on one time axis.
        panel.locator(".widget-button", has_text="对比").first.click()
        _wait_for_count(page, plots, 2, 60)
        compare = plots.nth(1)
        compare.scroll_into_view_if_needed()
        page.wait_for_timeout(1000)
        assert compare.locator(".gtitle").text_content().startswith("#1 对比 #2")
        legend = compare.locator(".legend .traces").all_text_contents()
        assert any("前向 forward" in t for t in legend) and any("接收梯度 recv_grad" in t for t in legend)
        scrollbars = compare.evaluate("(el) => Array.from(el.querySelectorAll('.legend .scrollbar'))"
                                      ".map(r => r.getBBox().height)")
        assert all(h == 0 for h in scrollbars), f"the comparison's legend scrolls: {scrollbars}"
        choices = panel.evaluate(_SELECT_TEXT)
        assert len(choices) >= 3 and all(c["text"] for c in choices), choices
        clipped = [c for c in choices if c["need"] > c["room"]]
        assert not clipped, f"dropdown text is clipped: {clipped}"
        _element_screenshot(page, compare, ARTIFACTS / "chapter01-compare.png")
        assert (ARTIFACTS / "chapter01-panel.png").stat().st_size > 50_000
        assert not [e for e in page.page_errors if "plotly" in e.lower() or "widget" in e.lower()], \
            page.page_errors
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "chapter01-failure.png"))
        print(_tail(jupyterlab["log"], 60))
        raise


# --- run_job's progress line, ■, and the final line ------------------------------------------------
RUN_JOB_NOTEBOOK = "run_job_progress.ipynb"   # written by the test into the server's root, removed after
LONG_STEPS = 2000                              # the job that ■ stops: far more steps than it gets to


def _run_job_notebook() -> nbformat.NotebookNode:
    """Cell 1 runs a 3-step job to the end (its final line), cell 2 a long one for ■."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    spec = dict(SMALL_GPT, num_stages=2, micro_batches=2, steps=3, device="cpu", timeout=240)
    long_spec = dict(spec, steps=LONG_STEPS, timeout=600)
    nb.cells = [
        nbformat.v4.new_code_cell(f"import utils\nrun = utils.run_job(utils.JobSpec(**{spec!r}))"),
        nbformat.v4.new_code_cell(f"utils.run_job(utils.JobSpec(**{long_spec!r}))"),
    ]
    return nb


def test_run_job_progress_stop_and_final_line(jupyterlab, page):
    """`utils.run_job` in a notebook cell, as issue 16 points 5 and 6 ask: one live line with
    the phase and the seconds since launch; ■ ends the job with one line, no traceback and no
    process left; a finished run's last line. Screenshots: run-job-done.png,
    run-job-progress.png, run-job-stopped.png."""
    ARTIFACTS.mkdir(exist_ok=True)
    runs, path = jupyterlab["runs"], jupyterlab["root"] / RUN_JOB_NOTEBOOK
    nbformat.write(_run_job_notebook(), path)
    try:
        page.goto(f"{jupyterlab['url']}/lab/workspaces/runjob/tree/{RUN_JOB_NOTEBOOK}?reset"
                  f"&token={jupyterlab['token']}", timeout=PAGE_S * 1000, wait_until="domcontentloaded")
        page.locator(".jp-Notebook").first.wait_for(timeout=PAGE_S * 1000)
        _run_all_cells(page)
        notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
        done_out = notebook.locator(".jp-CodeCell").nth(0).locator(".jp-OutputArea")
        long_out = notebook.locator(".jp-CodeCell").nth(1).locator(".jp-OutputArea")

        # (c) the 3-step job: its line ends as "完成 (succeeded) · 3/3 steps · 共 N s (total)"
        done_out.get_by_text("完成 (succeeded) · 3/3 steps", exact=False).first.wait_for(
            timeout=JOB_S * 1000)
        done_text = done_out.inner_text()
        assert re.search(r"完成 \(succeeded\) · 3/3 steps · 共 \d+ s \(total\)", done_text), done_text
        assert "Traceback" not in done_text and "'" not in done_text.split("\n")[-1], done_text
        done_out.scroll_into_view_if_needed()
        done_out.screenshot(path=str(ARTIFACTS / "run-job-done.png"))

        # (a) the long job, while it runs: one line with the phase and the elapsed seconds
        line = re.compile(r"(正在启动 \d+ 个进程|正在编译|第 \d+/\d+ 步).* · \d+ s$", re.M)
        _wait_until(page, lambda: "s/step" in long_out.inner_text(), 120, "run_job's step line")
        progress_text = long_out.inner_text()
        assert line.search(progress_text), progress_text
        assert re.search(rf"第 \d+/{LONG_STEPS} 步 \(step \d+/{LONG_STEPS}\) · loss [\d.]+ · [\d.]+ s/step",
                         progress_text), progress_text
        assert len(long_out.locator(".jp-OutputArea-output", has_text="stages ×").all()) == 1, \
            "the progress line is not one display updated in place"
        long_out.scroll_into_view_if_needed()
        long_out.screenshot(path=str(ARTIFACTS / "run-job-progress.png"))
        assert job_processes(runs), "the long job's processes are not running"

        # (b) ■: one line saying the job stopped and all its processes ended, no traceback
        _interrupt_kernel(page)
        pressed = time.monotonic()
        long_out.get_by_text("已按你的要求停止", exact=False).first.wait_for(timeout=STOP_S * 1000)
        print(f"■ to run_job's one line: {time.monotonic() - pressed:.1f} s")
        _wait_until(page, lambda: job_processes(runs) == [], STOP_S, "every process of the stopped job ending")
        page.wait_for_timeout(500)  # the progress line's last update (its end state)
        stopped_text = long_out.inner_text()
        assert stopped_text.count("已按你的要求停止") == 1, stopped_text
        assert "已按你的要求停止：2 个进程全部结束 (stopped by you; all 2 processes ended)" in stopped_text, \
            stopped_text
        for alarm in ("Traceback", "KeyboardInterrupt", "launch.py", "File \""):
            assert alarm not in stopped_text, f"{alarm!r} in the stopped cell:\n{stopped_text}"
        assert "已停止 (stopped)" in stopped_text, stopped_text
        long_out.scroll_into_view_if_needed()
        long_out.screenshot(path=str(ARTIFACTS / "run-job-stopped.png"))
        assert (ARTIFACTS / "run-job-stopped.png").stat().st_size > 5_000
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "run-job-failure.png"))
        print(_tail(jupyterlab["log"], 60))
        raise
    finally:
        page.goto("about:blank")  # no autosave brings the scratch notebook back
        path.unlink(missing_ok=True)


# --- a dynamic job in the run panel ----------------------------------------------------------------
DYNAMIC_NOTEBOOK = "dynamic_panel.ipynb"   # written by the test into the server's root, removed after


def _dynamic_notebook() -> nbformat.NotebookNode:
    """A Chinese RunPanel set up for a job that freezes its first half at step 2 and lets the
    policy move the boundary (tests/integration/test_rebalance_real.py's policy job, shorter):
    a frozen stage 0 only runs forwards, about a third of stage 1, so the min-max boundary
    moves right; payback is lowered because a model this small saves milliseconds per step."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    model = {**SMALL_GPT, "model_options": {**SMALL_GPT["model_options"], "blocks": 10, "hidden": 96}}
    spec = dict(model, num_stages=2, micro_batches=4, steps=8, partition=[0, 6, 12], freeze_at={2: 6},
                device="cpu", timeout=300, name="dynamic-panel")
    nb.cells = [nbformat.v4.new_code_cell(
        "import utils\n"
        "utils.set_language('zh')\n"
        f"spec = utils.JobSpec(**{spec!r}, rebalance=utils.Rebalance(every=2, window=2, min_gain=0.05, payback=0.02))\n"
        "panel = utils.RunPanel(spec)\n"
        "panel")]
    return nb


def test_a_dynamic_job_in_the_panel_shows_its_moves(jupyterlab, page):
    """Issue 42: the panel's dynamic controls show the job's freezing and policy; Run trains it
    for real; the title carries the partition history, the decision log is a Chinese table, the
    partition-history plot is drawn and the slider marks the move. Screenshots:
    dynamic-panel-controls.png, dynamic-panel.png (title, per-phase diagnosis, decision log),
    dynamic-panel-partition-plot.png, dynamic-panel-move-step.png (the slider at the move)."""
    ARTIFACTS.mkdir(exist_ok=True)
    runs, path = jupyterlab["runs"], jupyterlab["root"] / DYNAMIC_NOTEBOOK
    nbformat.write(_dynamic_notebook(), path)
    try:
        page.goto(f"{jupyterlab['url']}/lab/workspaces/dynamic/tree/{DYNAMIC_NOTEBOOK}?reset"
                  f"&token={jupyterlab['token']}", timeout=PAGE_S * 1000, wait_until="domcontentloaded")
        page.locator(".jp-Notebook").first.wait_for(timeout=PAGE_S * 1000)
        _run_all_cells(page)
        notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
        panel = notebook.locator(".widget-vbox", has_text="流水线任务").filter(has_text="历史与对比").last
        panel.wait_for(timeout=CELLS_S * 1000)
        # the controls of the dynamic half, open because the spec is dynamic, and the plan line
        panel.get_by_text("动态调度：冻结、重新均衡", exact=False).first.wait_for(timeout=30_000)
        freeze = panel.locator(".widget-text", has_text="冻结 freeze_at").locator("input").first
        assert freeze.input_value() == "2:6"
        assert panel.locator(".widget-checkbox", has_text="重新均衡").locator("input").first.is_checked()
        plan = panel.get_by_text("冻结：第 2 步起前 6 层", exact=False).first
        assert "重新均衡：每 2 步看最近 2 步" in plan.text_content()
        _element_screenshot(page, panel, ARTIFACTS / "dynamic-panel-controls.png")

        panel.locator(".widget-button", has_text="运行").first.click()
        panel.get_by_text("完成，用时", exact=False).first.wait_for(timeout=JOB_S * 1000)
        assert job_processes(runs) == [], "the finished job left processes behind"
        title = panel.locator(".widget-html", has_text="切分历史").first
        title.wait_for(timeout=30_000)
        assert re.search(r"切分历史 \[0, 6, 12\] → \[0, \d+, 12\] @ \d+", title.text_content()), \
            title.text_content()
        assert panel.get_by_text("分阶段诊断", exact=False).count() >= 1
        table = panel.locator("table", has_text="迁移代价 (ms)").first
        logged = table.text_content()
        assert "迁移" in logged and "回本：预计每步省" in logged and "实测步时 (ms)" in logged, logged
        plots = panel.locator(".js-plotly-plot")
        _wait_for_count(page, plots, 2, 60)  # the timeline and the partition history
        titles = " ".join(plots.locator(".gtitle").all_text_contents())
        assert "各阶段开销与边界随训练步的变化" in titles, titles
        _element_screenshot(page, panel, ARTIFACTS / "dynamic-panel.png", settle_ms=4000)
        history_plot = plots.filter(has=page.locator(".gtitle", has_text="各阶段开销与边界")).first
        _element_screenshot(page, history_plot, ARTIFACTS / "dynamic-panel-partition-plot.png", settle_ms=2000)
        assert history_plot.locator(".shapelayer path").count() >= 2  # the move's dashed marks (both rows)

        # the move is marked: its button moves the slider to that step, the readout says so
        mark = panel.locator(".widget-button", has_text="⇄ 重切分").first
        mark.click()
        readout = panel.locator(".widget-readout", has_text="⇄ 重切分").first
        readout.wait_for(timeout=30_000)
        explorer = panel.locator(".widget-vbox", has=page.locator(".widget-readout", has_text="⇄ 重切分")).last
        _element_screenshot(page, explorer, ARTIFACTS / "dynamic-panel-move-step.png", settle_ms=3000)
        assert not [e for e in page.page_errors if "plotly" in e.lower() or "widget" in e.lower()], \
            page.page_errors
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "dynamic-panel-failure.png"))
        print(_tail(jupyterlab["log"], 60))
        raise
    finally:
        page.goto("about:blank")
        path.unlink(missing_ok=True)
