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
  is ended with it; in a grading worker (`containment.Containment`, see `batch`) that is
  every process below the worker, double-forked daemons included;
* the memory of all the submission's processes together is watched there: over the budget
  they are killed and the cell running ends with status ``"memory"`` (restart and replay as
  after a crash);
* what cells print is bounded twice: inside the kernel (the `containment` extension keeps
  the first KiB of each cell's stdout/stderr) and here (`BoundedClient` keeps at most
  `Budget.stream_kib` of stream text per cell, drops rich outputs over `Budget.output_kib`
  and everything over `Budget.total_mib` per submission, leaving an ``[output cut: …]``
  note), so a flood grows neither the grading process nor the instructor notebook.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import nbformat
import psutil
import zmq
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from utils.system.procs import end_process_tree
from . import containment
from .containment import MEMORY_ENAME, MIB, Budget, Containment
from .isolation import IPYTHON_DIR, isolation_for
from .kernel_manager import LimitedKernelManager
from .kernel_output import OUTPUT_ENV, STREAM_ENV, cut_note, human
from .sandbox import Limits

TIMEOUT_ENAME = "CellTimeout"
PROBE_SECONDS = (5, 30)
"""How long a kernel gets to answer a trivial cell after a timeout interrupt: the cell's
own timeout, clamped to this range (a job being stopped needs a few seconds to clean up)."""
MAX_RESTARTS = 4
"""Restarts per notebook; cells after the last one allowed are reported as not run."""
STARTUP_TIMEOUT = 180
"""Seconds a new kernel gets to start and answer."""
EVALUE_LIMIT = 4096
"""Characters of an exception message kept (feedback shows far fewer)."""
TRACEBACK_LINES = 40
"""Lines of an error output's traceback kept (the last ones: where it failed)."""


@dataclass
class CellOutcome:
    """How one cell ended."""

    status: str
    """``"ok"``, ``"error"``, ``"timeout"``, ``"dead"`` (the kernel died), ``"memory"`` (the
    submission went over its memory budget, all processes together, or its disk budget, and
    its processes were killed; `evalue` says which and how much) or ``"not_run"``."""
    ename: str | None = None
    evalue: str | None = None
    seconds: float = 0.0
    outputs: list = field(default_factory=list)
    student: bool = False
    """For a judged check that failed: the exception was raised by the student's function
    (its message is the student's text), not by the check."""
    tampered: str = ""
    """For a judged check: why the kernel's side of the grader cannot be trusted (its reply
    unsigned or more than one, its entry point altered); the check fails and the submission
    is flagged for review."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Cell:
    """Student code to execute and its timeout in seconds."""

    source: str
    timeout: float

    async def execute(self, session: KernelSession) -> CellOutcome:
        return await session.run(self.source, self.timeout)


class Step(Protocol):
    """What `run_cells` runs: a `Cell`, or a step that uses the kernel its own way (a check
    judged outside the kernel, `judge.JudgedCheck`). Only cells are replayed after a restart."""

    timeout: float

    async def execute(self, session: KernelSession) -> CellOutcome: ...


class OutputBudget:
    """What one submission's cells keep of their outputs, across kernel restarts.

    `cell` counts the characters kept by the cell running now (`stream` the stream part of
    them); `committed` those of the cells whose outcomes were recorded (replayed cells'
    outputs are thrown away, so they do not count).
    """

    def __init__(self, budget: Budget):
        self.stream_limit = budget.stream_kib * 1024 + 1024  # room for the kernel's own cut note
        self.item_limit = budget.output_kib * 1024
        self.total_limit = budget.total_mib * 1024 * 1024
        self.committed = 0
        self.cell = 0
        self.stream = 0
        self.cut = 0
        self.note: nbformat.NotebookNode | None = None

    def new_cell(self) -> None:
        self.cell = self.stream = self.cut = 0
        self.note = None

    def commit(self) -> None:
        """The running cell's outcome is kept: its outputs count from now on."""
        self.committed += self.cell
        self.new_cell()

    @property
    def room(self) -> int:
        return max(0, self.total_limit - self.committed - self.cell)


def _text(value) -> str:
    return "".join(str(v) for v in value) if isinstance(value, list) else str(value)


def _size(content: dict) -> int:
    """Characters an output's content holds (rich data, text, an error's message)."""
    size = 0
    for value in (content.get("data") or {}).values():
        size += len(value) if isinstance(value, str) else len(_text(value)) if isinstance(value, list) \
            else len(json.dumps(value, default=str))
    size += len(str(content.get("text") or "")) + len(str(content.get("evalue") or ""))
    size += sum(len(str(line)) for line in content.get("traceback") or [])
    return size


class BoundedClient(NotebookClient):
    """A `NotebookClient` that keeps a bounded part of what cells output (see
    `OutputBudget`); what it leaves out is announced by an ``[output cut: …]`` line."""

    output_budget: OutputBudget = OutputBudget(Budget())

    def output(self, outs, msg, display_id, cell_index):
        if self.clear_before_next_output:  # the outputs kept so far are about to be cleared
            self._cleared()
        msg, cut = self._bounded(msg)
        out = super().output(outs, msg, display_id, cell_index) if msg is not None else None
        if cut:
            self._announce(outs, cut)
        return out

    def clear_output(self, outs, msg, cell_index) -> None:
        super().clear_output(outs, msg, cell_index)
        if not outs:
            self._cleared()

    def _update_display_id(self, display_id: str, msg: dict) -> None:
        content = msg.get("content") or {}
        if _size(content) > self.output_budget.item_limit:
            msg = {**msg, "content": self._shrunk(content, msg.get("msg_type", "display_data"))}
        super()._update_display_id(display_id, msg)

    def _cleared(self) -> None:
        budget = self.output_budget
        budget.cell = budget.stream = 0
        budget.note = None

    def _bounded(self, msg: dict) -> tuple[dict | None, int]:
        """The message with what fits in the budget, and how many characters were cut."""
        budget = self.output_budget
        kind = msg.get("msg_type")
        content = msg.get("content") or {}
        if kind == "stream":
            text = content.get("text")
            if not isinstance(text, str):
                return msg, 0
            room = min(budget.stream_limit - budget.stream, budget.room)
            keep = text[:max(0, room)]
            budget.stream += len(keep)
            budget.cell += len(keep)
            if len(keep) == len(text):
                return msg, 0
            return ({**msg, "content": {**content, "text": keep}} if keep else None), len(text) - len(keep)
        if kind == "error":
            content = {**content, "evalue": str(content.get("evalue") or "")[:EVALUE_LIMIT],
                       "traceback": [str(line)[:EVALUE_LIMIT]
                                     for line in (content.get("traceback") or [])[-TRACEBACK_LINES:]]}
            budget.cell += _size(content)  # always kept: it says why the cell failed
            return {**msg, "content": content}, 0
        if kind in ("display_data", "execute_result"):
            size = _size(content)
            if size > min(budget.item_limit, budget.room):
                content = self._shrunk(content, kind)
                size = _size(content)
            budget.cell += size
            return {**msg, "content": content}, 0
        return msg, 0

    def _shrunk(self, content: dict, kind: str) -> dict:
        """A rich output too large to keep: the start of its plain text and a note."""
        size = _size(content)
        plain = _text((content.get("data") or {}).get("text/plain") or "")
        keep = plain[:max(0, min(self.output_budget.stream_limit, self.output_budget.room - 200))]
        note = f"[output cut: {kind} of {human(size)} not kept]"
        return {**content, "data": {"text/plain": keep + ("\n" if keep else "") + note}, "metadata": {}}

    def _announce(self, outs: list, cut: int) -> None:
        """Add (or update) the cell's note on what was left out."""
        budget = self.output_budget
        budget.cut += cut
        if budget.note is None or not any(o is budget.note for o in outs):
            budget.note = nbformat.v4.new_output("stream", name="stderr", text="")
            outs.append(budget.note)
        budget.note["text"] = cut_note(budget.cut)


class KernelSession:
    """One kernel: start it, run cells with timeouts, stop it with everything it started.

    Under a `Containment` (a grading worker) the kernel is registered with it, a cell that
    finds its kernel killed by the memory watchdog ends with status ``"memory"``, and
    stopping ends every process below the worker.
    """

    def __init__(self, workdir: Path, env: dict[str, str], limits: Limits, *, budget: Budget | None = None,
                 outputs: OutputBudget | None = None, contained: Containment | None = None):
        self.workdir, self.env, self.limits = workdir, env, limits
        self.contained = contained
        self.budget = budget or (contained.budget if contained is not None else Budget())
        self.outputs = outputs or OutputBudget(self.budget)
        self.client: NotebookClient | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._reply: dict | None = None
        self._pid: int | None = None
        self.token = ""
        """The token the entry point of this kernel signs its replies with (set by `start`)."""
        self._iopub_events = None  # the output socket's monitor (set by `start`)

    async def start(self) -> None:
        isolation = isolation_for(self.limits.isolation, self.workdir, self.limits.hide)
        km = LimitedKernelManager(kernel_name="python3",
                                  **(isolation.kernel_manager_settings() if isolation else {}))
        km.limits, km.isolation = self.limits, isolation
        km.max_message = self.budget.message_mib * MIB
        scratch = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
        self.client = BoundedClient(
            scratch, km=km, timeout=60, allow_errors=True, interrupt_on_timeout=True,
            error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": "cell timed out", "traceback": []},
            startup_timeout=STARTUP_TIMEOUT, shutdown_kernel="immediate",
            record_timing=False, resources={"metadata": {"path": str(self.workdir)}},
            store_widget_state=False, on_cell_executed=self._remember_reply)
        self.client.output_budget = self.outputs
        env = {**self.env, STREAM_ENV: str(self.budget.stream_kib), OUTPUT_ENV: str(self.budget.output_kib)}
        self._stack = contextlib.AsyncExitStack()
        # The kernel's descriptors 1 and 2 lead nowhere: inherited, they would be the grading
        # worker's, i.e. the instructor's log, and a submission could write into it. What the
        # kernel prints reaches the grader through its messages (and the output budget) only.
        await self._stack.enter_async_context(
            self.client.async_setup_kernel(env=env, cleanup_kc=True, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
        self._pid = getattr(km.provisioner, "pid", None)
        if self.contained is not None:
            self.contained.own(self._pid)
        # The output socket drops a message over Budget.message_mib unread, and the connection with it:
        # watched, so that the cell is told why and the kernel is replaced (see `run`).
        self._iopub_events = self.client.kc.iopub_channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        # Before any student cell: arm the grader's entry point with a token only this
        # session knows (`student_side`); every reply it sends for a check carries it.
        self.token = secrets.token_hex(16)
        armed = await self.run(f"__import__('utils.grading.student_side', fromlist=['_']).Entry.arm({self.token!r})",
                               STARTUP_TIMEOUT, store_history=False)
        self.outputs.commit()
        if not armed.ok:
            raise RuntimeError(f"the grading kernel could not load the grader's entry point: {armed.evalue}")

    def _remember_reply(self, cell=None, cell_index=None, execute_reply=None) -> None:
        self._reply = execute_reply

    async def run(self, source: str, timeout: float, *, store_history: bool = True) -> CellOutcome:
        """Execute one cell; never raises for what the cell does. With `store_history` False
        the kernel keeps no trace of it in its input history (``In``, ``_ih``)."""
        assert self.client is not None, "start() first"
        cell = nbformat.v4.new_code_cell(source)
        self.client.nb.cells[0] = cell
        self.client.timeout = max(1, int(round(timeout)))
        self._reply = None
        self.outputs.new_cell()
        started = time.monotonic()
        try:
            cell = await self.client.async_execute_cell(cell, 0, store_history=store_history)
        except DeadKernelError:
            outputs = list(cell.get("outputs", []))
            trip = self.contained.claim_trip() if self.contained is not None else None
            if trip is not None:  # the memory watchdog killed the kernel and everything else
                return CellOutcome("memory", MEMORY_ENAME, trip.message(), time.monotonic() - started, outputs)
            return CellOutcome("dead", "DeadKernelError", "the kernel died", time.monotonic() - started, outputs)
        seconds = time.monotonic() - started
        if await self._output_refused():
            return CellOutcome("memory", MEMORY_ENAME,
                               f"这个格子发出的一个输出超过了每条消息 {self.budget.message_mib} MiB 的上限，评分器没有接收它，"
                               "内核已重启（a single output over the grader's message limit was refused）", seconds,
                               list(cell.outputs))
        content = (self._reply or {}).get("content", {})
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        if content.get("ename") == TIMEOUT_ENAME:
            return CellOutcome("timeout", TIMEOUT_ENAME, f"no result after {timeout:g} s", seconds,
                               list(cell.outputs))
        if content.get("status") == "error" or errors:
            ename = content.get("ename") or (errors[0].get("ename") if errors else "Error")
            evalue = content.get("evalue") if content.get("ename") else (errors[0].get("evalue") if errors else "")
            return CellOutcome("error", ename, str(evalue or "")[:EVALUE_LIMIT], seconds, list(cell.outputs))
        if self._reply is None:
            return CellOutcome("error", "NoReply", "the kernel sent no reply", seconds, list(cell.outputs))
        return CellOutcome("ok", seconds=seconds, outputs=list(cell.outputs))

    async def _output_refused(self) -> bool:
        """Whether the grader's output socket dropped its connection since the last look: it
        does so for a message over `Budget.message_mib` (ZMQ_MAXMSGSIZE), and does not get
        the kernel's output back, so the kernel must be replaced."""
        events = self._iopub_events
        refused = False
        while events is not None and await events.poll(0):
            await events.recv_multipart()
            refused = True
        return refused

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
        if self.contained is not None:  # and whatever escaped the kernel's tree (re-parented to us)
            self.contained.end_all(grace=1.0)
        if self._iopub_events is not None:
            self._iopub_events.close(linger=0)
        self._stack, self.client, self._pid, self._iopub_events = None, None, None, None


async def run_cells(cells: list[Step], workdir: Path, env: dict[str, str], limits: Limits, *,
                    log: Callable[[str], None] = lambda text: None, budget: Budget | None = None,
                    contained: Containment | None = None,
                    on_step: Callable[[int], None] = lambda index: None) -> list[CellOutcome]:
    """Run `cells` in order in a fresh kernel; one outcome per cell, in the same order.

    A failing cell never stops the rest. After a timeout the kernel is interrupted; if it
    does not recover, or after the kernel died (or was killed for memory), a new kernel
    replays the cells that had succeeded (silently) and execution continues after the failed
    cell. After more than `MAX_RESTARTS` restarts no kernel is started and the remaining
    cells are not run.

    `on_step(i)` is called before step `i` starts (progress for the instructor).
    `contained` defaults to the process's active `Containment` (a grading worker); `budget`
    to its budget, else `Budget()` (only the output bounds apply without a containment).
    """
    contained = contained if contained is not None else containment.active()
    budget = budget or (contained.budget if contained is not None else Budget())
    outputs = OutputBudget(budget)

    def new_session() -> KernelSession:
        return KernelSession(workdir, env, limits, budget=budget, outputs=outputs, contained=contained)

    session: KernelSession | None = new_session()
    outcomes: list[CellOutcome] = []
    succeeded: list[Cell] = []
    restarts = 0
    await session.start()
    try:
        for index, cell in enumerate(cells):
            on_step(index)
            if session is None:
                outcomes.append(CellOutcome("not_run", "NotRun", "too many kernel restarts"))
                continue
            outcome = await cell.execute(session)
            outputs.commit()  # before any probe or replay: their outputs are not kept
            if outcome.status in ("dead", "memory") or (outcome.status == "timeout"
                                                        and not await session.responsive(cell.timeout)):
                what = {"dead": "kernel died", "memory": "a budget (memory or disk) exceeded"}.get(
                    outcome.status, "kernel did not recover from a timeout")
                restarts += 1
                await session.stop()
                session = None
                if restarts > MAX_RESTARTS:
                    log(f"{what}; too many restarts, the remaining cells are not run")
                else:
                    log(f"{what}; restarting ({restarts})")
                    session = await _replayed(new_session, succeeded, log)
            elif outcome.ok and isinstance(cell, Cell):
                succeeded.append(cell)
            outcomes.append(outcome)
    finally:
        if session is not None:
            await session.stop()
    return outcomes


async def _replayed(new_session: Callable[[], KernelSession], succeeded: list[Cell],
                    log: Callable[[str], None]) -> KernelSession:
    """A new kernel in which the cells that had succeeded are replayed in order. A cell that
    fails in replay is dropped from `succeeded`; if it also left the kernel unusable (timeout,
    death), the replay starts over in another new kernel, so the cells before it run again."""
    while True:
        session = new_session()
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
            if outcome.status in ("timeout", "dead", "memory"):
                break
        else:
            return session
        await session.stop()  # replay again, from the first cell, in a new kernel


def kernel_env(workdir: Path, project_root: Path) -> dict[str, str]:
    """Environment of a grading kernel: the project importable, runs and a fresh IPython
    directory (the grader creates it; never the submission's) inside the submission's own
    working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project_root), env.get("PYTHONPATH")]))
    env["WORKBOOK_RUNS"] = str(workdir / "runs")
    env["IPYTHONDIR"] = str(workdir / IPYTHON_DIR)
    env["MPLBACKEND"] = "Agg"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
