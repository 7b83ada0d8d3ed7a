"""Execute a list of cells in a fresh, resource-limited kernel, one cell at a time.

Built on nbclient's per-cell API (`NotebookClient.async_execute_cell`) with
``allow_errors=True`` (an error in one cell is recorded and the next cell runs),
``interrupt_on_timeout=True`` and ``error_on_timeout`` (a cell that runs past its timeout
is interrupted and reported as ``CellTimeout``). What nbclient leaves open is handled here:

* after a timeout the kernel is probed; if the interrupt did not stop the cell (code that
  swallows KeyboardInterrupt, a blocking C call), the kernel is **restarted** and every
  cell that had succeeded is replayed, so later cells still see the state they expect;
* a kernel that dies (``os._exit``, the CPU limit, a segfault) is restarted the same way;
* every process the kernel started (torchrun and its ranks run in sessions of their own)
  is ended with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import psutil
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from utils.system.procs import end_process_tree
from .sandbox import Limits

TIMEOUT_ENAME = "CellTimeout"
PROBE_SECONDS = (5, 30)
"""How long a kernel gets to answer a trivial cell after a timeout interrupt: the cell's
own timeout, clamped to this range (a job being stopped needs a few seconds to clean up)."""
MAX_RESTARTS = 4
"""Restarts per notebook; cells after the last one allowed are reported as not run."""
STARTUP_TIMEOUT = 180
"""Seconds a new kernel gets to start and answer."""


class LimitedKernelManager(AsyncKernelManager):
    """Starts the kernel through `utils/grading/sandbox.py`, which applies `Limits`."""

    limits: Limits = Limits()

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return self.limits.wrapper_args() + super().format_kernel_cmd(extra_arguments)


@dataclass
class CellOutcome:
    """How one cell ended."""

    status: str
    """``"ok"``, ``"error"``, ``"timeout"``, ``"dead"`` (the kernel died) or ``"not_run"``."""
    ename: str | None = None
    evalue: str | None = None
    seconds: float = 0.0
    outputs: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Cell:
    """A cell to execute and its timeout in seconds."""

    source: str
    timeout: float


class KernelSession:
    """One kernel: start it, run cells with timeouts, stop it with everything it started."""

    def __init__(self, workdir: Path, env: dict[str, str], limits: Limits):
        self.workdir, self.env, self.limits = workdir, env, limits
        self.client: NotebookClient | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._reply: dict | None = None
        self._pid: int | None = None

    async def start(self) -> None:
        km = LimitedKernelManager(kernel_name="python3")
        km.limits = self.limits
        scratch = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
        self.client = NotebookClient(
            scratch, km=km, timeout=60, allow_errors=True, interrupt_on_timeout=True,
            error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": "cell timed out", "traceback": []},
            startup_timeout=STARTUP_TIMEOUT, shutdown_kernel="immediate",
            record_timing=False, resources={"metadata": {"path": str(self.workdir)}},
            on_cell_executed=self._remember_reply)
        self._stack = contextlib.AsyncExitStack()
        await self._stack.enter_async_context(
            self.client.async_setup_kernel(env=self.env, cleanup_kc=True))
        self._pid = getattr(km.provisioner, "pid", None)

    def _remember_reply(self, cell=None, cell_index=None, execute_reply=None) -> None:
        self._reply = execute_reply

    async def run(self, source: str, timeout: float) -> CellOutcome:
        """Execute one cell; never raises for what the cell does."""
        assert self.client is not None, "start() first"
        cell = nbformat.v4.new_code_cell(source)
        self.client.nb.cells[0] = cell
        self.client.timeout = max(1, int(round(timeout)))
        self._reply = None
        started = time.monotonic()
        try:
            cell = await self.client.async_execute_cell(cell, 0)
        except DeadKernelError:
            return CellOutcome("dead", "DeadKernelError", "the kernel died",
                               time.monotonic() - started, list(cell.get("outputs", [])))
        seconds = time.monotonic() - started
        content = (self._reply or {}).get("content", {})
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        if content.get("ename") == TIMEOUT_ENAME:
            return CellOutcome("timeout", TIMEOUT_ENAME, f"no result after {timeout:g} s", seconds,
                               list(cell.outputs))
        if content.get("status") == "error" or errors:
            ename = content.get("ename") or (errors[0].get("ename") if errors else "Error")
            evalue = content.get("evalue") if content.get("ename") else (errors[0].get("evalue") if errors else "")
            return CellOutcome("error", ename, evalue, seconds, list(cell.outputs))
        if self._reply is None:
            return CellOutcome("error", "NoReply", "the kernel sent no reply", seconds, list(cell.outputs))
        return CellOutcome("ok", seconds=seconds, outputs=list(cell.outputs))

    async def responsive(self, timeout: float) -> bool:
        """After a timeout interrupt: does the kernel run a trivial cell again?"""
        low, high = PROBE_SECONDS
        probe = await self.run("pass", min(high, max(low, timeout)))
        return probe.ok

    async def stop(self) -> None:
        """Shut the kernel down and end every process it started."""
        children: list[psutil.Process] = []
        if self._pid:
            with contextlib.suppress(psutil.Error):
                children = psutil.Process(self._pid).children(recursive=True)
        if self._stack is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._stack.aclose(), timeout=30)
        end_process_tree(children, grace=3.0)  # listed before the shutdown, while still its children
        self._stack, self.client, self._pid = None, None, None


async def run_cells(cells: list[Cell], workdir: Path, env: dict[str, str], limits: Limits, *,
                    log: Callable[[str], None] = lambda text: None) -> list[CellOutcome]:
    """Run `cells` in order in a fresh kernel; one outcome per cell, in the same order.

    A failing cell never stops the rest. After a timeout the kernel is interrupted; if it
    does not recover, or after the kernel died, a new kernel replays the cells that had
    succeeded (silently) and execution continues after the failed cell. After more than
    `MAX_RESTARTS` restarts no kernel is started and the remaining cells are not run.
    """
    session: KernelSession | None = KernelSession(workdir, env, limits)
    outcomes: list[CellOutcome] = []
    succeeded: list[Cell] = []
    restarts = 0
    await session.start()
    try:
        for cell in cells:
            if session is None:
                outcomes.append(CellOutcome("not_run", "NotRun", "too many kernel restarts"))
                continue
            outcome = await session.run(cell.source, cell.timeout)
            if outcome.status == "dead" or (outcome.status == "timeout"
                                            and not await session.responsive(cell.timeout)):
                what = "kernel died" if outcome.status == "dead" else "kernel did not recover from a timeout"
                restarts += 1
                await session.stop()
                session = None
                if restarts > MAX_RESTARTS:
                    log(f"{what}; too many restarts, the remaining cells are not run")
                else:
                    log(f"{what}; restarting ({restarts})")
                    session = await _replayed(workdir, env, limits, succeeded, log)
            elif outcome.ok:
                succeeded.append(cell)
            outcomes.append(outcome)
    finally:
        if session is not None:
            await session.stop()
    return outcomes


async def _replayed(workdir: Path, env: dict[str, str], limits: Limits, succeeded: list[Cell],
                    log: Callable[[str], None]) -> KernelSession:
    """A new kernel in which the cells that had succeeded are replayed in order. A cell that
    fails in replay is dropped from `succeeded`; if it also left the kernel unusable (timeout,
    death), the replay starts over in another new kernel, so the cells before it run again."""
    while True:
        session = KernelSession(workdir, env, limits)
        await session.start()
        index = 0
        while index < len(succeeded):
            cell = succeeded[index]
            outcome = await session.run(cell.source, cell.timeout)
            if outcome.ok:
                index += 1
                continue
            log(f"replay: a cell that had succeeded now ended with {outcome.status}; dropped")
            del succeeded[index]
            if outcome.status in ("timeout", "dead"):
                break
        else:
            return session
        await session.stop()  # replay again, from the first cell, in a new kernel


def kernel_env(workdir: Path, project_root: Path) -> dict[str, str]:
    """Environment of a grading kernel: the project importable, runs and IPython profile
    inside the submission's own working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project_root), env.get("PYTHONPATH")]))
    env["WORKBOOK_RUNS"] = str(workdir / "runs")
    env["IPYTHONDIR"] = str(workdir / ".ipython")
    env["MPLBACKEND"] = "Agg"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
