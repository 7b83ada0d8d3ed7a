"""Jupyter's ■ (SIGINT) stops a `RunPanel` job: in a plain process, in an idle Jupyter kernel
and in a kernel busy with another cell. No DeepSpeed: the job is a fake that runs until it is
stopped, so what is tested is the path from the interrupt to `RunningJob.stop`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import utils.ui.widgets as W
from utils.jobs.spec import JobSpec
from utils.ui import interrupt

ROOT = Path(__file__).resolve().parents[2]


class EndlessJob:
    """A `RunningJob` stand-in that runs until stopped and records who stopped it, and why."""

    def __init__(self, spec):
        self.spec, self.path, self.notes = spec, Path("/tmp/endless-job"), []
        self.started, self.state, self.reason, self.stop_thread = time.time(), "running", None, None

    def poll(self):
        return self.state

    def progress(self):
        return []

    def stop(self, reason=""):
        if self.state == "running":
            self.state, self.reason = "stopped", reason
            self.stop_thread = threading.current_thread().name

    def result(self):
        raise W.JobFailed(f"job endless {self.state}: {self.reason}", None)


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt here, as in a terminal or a busy kernel, whatever this
    process inherited: a test suite run as a background job of a script inherits SIGINT
    ignored, and Python then leaves it so."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def endless(monkeypatch):
    jobs: list[EndlessJob] = []
    monkeypatch.setattr(W, "start_job", lambda spec, directory=None: jobs.append(EndlessJob(spec)) or jobs[-1])
    yield jobs
    interrupt.uninstall()


def _wait_until(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        # timing-claim: margin — a guard against waiting forever on an in-process fake job (it reacts in ms); 10 s is over 100x that even 3x slower and oversubscribed
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_sigint_in_a_plain_process_stops_the_job_then_raises(endless):
    panel = W.RunPanel(JobSpec(steps=3), poll_interval=0.01)
    panel.run()
    _wait_until(lambda: bool(endless))
    assert interrupt.installed() and "■" in panel.stop_hint.value and "Stop" in panel.stop_hint.value
    with pytest.raises(KeyboardInterrupt):  # the previous handler still runs: Ctrl-C still works
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert panel.wait(10) == "stopped" and panel.stopped_by == "interrupt"
    job = endless[0]
    assert job.reason == "stopped by the kernel interrupt (■)" and job.stop_thread == "RunPanel-watcher"
    assert "kernel interrupt" in panel.message.value and "all 2 processes ended" in panel.message.value
    assert interrupt.fire() == 0  # the finished panel no longer listens


def test_stop_button_is_named_as_the_stopper(endless):
    panel = W.RunPanel(JobSpec(steps=3), poll_interval=0.01, lang="zh")
    panel.run()
    _wait_until(lambda: bool(endless))
    panel.stop_button.click()
    assert panel.wait(10) == "stopped" and panel.stopped_by == "button"
    assert endless[0].reason == "stopped from the panel"
    assert "在面板上停止" in panel.message.value and "已停止" in panel.status.value


def test_off_the_main_thread_the_panel_says_only_stop_works(endless):
    panel = W.RunPanel(JobSpec(steps=3), poll_interval=0.01)
    starter = threading.Thread(target=panel.run)
    starter.start()
    starter.join()
    assert "Only Stop ends this job" in panel.stop_hint.value
    assert interrupt.fire() == 0  # nothing registered: ■ cannot reach this job
    panel.stop()
    assert panel.state == "stopped"


KERNEL_SETUP = """
import time, threading
from pathlib import Path
import utils.ui.widgets as W
from utils.jobs.spec import JobSpec

class EndlessJob:
    def __init__(self, spec):
        self.spec, self.path, self.notes = spec, Path("/tmp/endless-job"), []
        self.started, self.state, self.reason = time.time(), "running", None
    def poll(self): return self.state
    def progress(self): return []
    def stop(self, reason=""):
        if self.state == "running": self.state, self.reason = "stopped", reason
    def result(self): raise W.JobFailed(f"job endless {self.state}: {self.reason}", None)

W.start_job = lambda spec, directory=None: EndlessJob(spec)
panel = W.RunPanel(JobSpec(steps=3), poll_interval=0.02, lang="zh")
panel.run_button.click()   # as the browser does: the click handler starts the job
print(panel.state)
"""


def _execute(kc, code: str, timeout: float = 60) -> str:
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(msg["content"]["ename"])

    kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return "".join(out)


@pytest.fixture
def kernel():
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT), env=env, startup_timeout=120)
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _state(kc) -> str:
    return _execute(kc, "print(panel.state, panel.stopped_by, panel.job.reason if panel.job else None)").strip()


@pytest.mark.timeout(180)
def test_the_kernel_interrupt_stops_a_panel_job_when_idle_and_when_busy(kernel):
    km, kc = kernel
    assert _execute(kc, KERNEL_SETUP, timeout=120).strip() == "running"
    time.sleep(0.5)  # idle now: ipykernel would ignore SIGINT, the panel's handler must not
    assert _state(kc).startswith("running")
    km.interrupt_kernel()
    deadline = time.monotonic() + 20
    while not (state := _state(kc)).startswith("stopped") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert state == "stopped interrupt stopped by the kernel interrupt (■)", state
    assert "被内核中断 (■) 停止" in _execute(kc, "print(panel.message.value)")
    # Busy: a cell is running when ■ comes; the cell is interrupted and the job stops too.
    assert _execute(kc, "panel.run_button.click(); print(panel.state)").strip() == "running"
    msg_id = kc.execute("time.sleep(60)")
    time.sleep(1.0)
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"
    deadline = time.monotonic() + 20
    while not (state := _state(kc)).startswith("stopped") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert state.startswith("stopped interrupt"), state
    # With no job running, ■ on an idle kernel does nothing at all (as before the panel).
    km.interrupt_kernel()
    time.sleep(0.5)
    assert _execute(kc, "print('alive', panel.state)").strip() == "alive stopped"
