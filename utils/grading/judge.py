"""The grader's side of judging: start the judge, relay its calls to the student's kernel.

`Judge` owns one `judge_process` (trusted: it reads the lab source, hidden checks and
solutions included) and speaks its line protocol. `JudgedCheck` is the step that
`execute.run_cells` runs where a check belongs: it asks the kernel which task names exist
(`student_side.describe`), lets the judge run the check, and carries each call the judge
makes into the kernel as a cell of its own (`student_side.call`, not kept in the kernel's
history), within the check's timeout. A call that times out, kills the kernel or trips the
memory budget ends the check with that status, so the runner restarts the kernel as it
does after a cell.

The judge is started lazily and again after it was ended (a kernel restart ends every
process of the submission; a judge that runs past a check's timeout is killed); a new one
rebuilds its reference from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from utils.system.procs import end_process_tree
from .containment import MEMORY_ENAME
from .execute import CellOutcome, KernelSession
from .notebook_source import Check, LabSource
from .student_side import ENTRY_EXPRESSION, MESSAGE_CHARS, REPLY_MIME

LINE_LIMIT = 256 * 1024 * 1024
"""Longest protocol line (a call carrying a large timeline)."""
START_TIMEOUT = 60.0


class JudgeError(RuntimeError):
    """The judge could not run the lab source (an instructor's problem, not the student's)."""


def _snippet(function: str, *arguments) -> str:
    """One kernel cell calling ``student_side.Entry.<function>``. It binds no name in the
    kernel and looks none up there: the entry is found through `ENTRY_EXPRESSION`."""
    args = ", ".join(repr(a) for a in arguments)
    return f"{ENTRY_EXPRESSION}.{function}({args})"


def _reply(outcome: CellOutcome, token: str) -> tuple[dict | None, str]:
    """The reply the cell published and, if the kernel's side of the grader cannot be
    trusted, why: a reply without this session's token, more than one, or one saying the
    entry point was altered. An honest kernel sends exactly one signed reply per call."""
    replies = [o["data"][REPLY_MIME] for o in outcome.outputs
               if isinstance(o.get("data"), dict) and REPLY_MIME in o["data"]]
    if not replies:
        return None, ""
    if any(not isinstance(r, dict) or r.get("token") != token for r in replies):
        return None, "a grader reply in the kernel's output does not carry the grader's token (forged)"
    if len(replies) > 1:
        return None, f"the kernel sent {len(replies)} grader replies for one call (one is sent)"
    tampered = replies[0].get("tampered")
    if tampered:
        return None, str(tampered)[:MESSAGE_CHARS]
    return replies[0], ""


def _bindings(described: dict, names: list[str]) -> dict[str, dict]:
    """What the kernel said of each task name asked about, reduced to the forms the judge
    binds (callable, missing, a value as codec text, unsendable). Names not asked about are
    dropped, so a reply can never rebind the check's own helpers or builtins."""
    found = described.get("names") if isinstance(described.get("names"), dict) else {}
    bindings = {}
    for name in names:
        entry = found.get(name)
        kind = entry.get("kind") if isinstance(entry, dict) else "missing"
        if kind == "value" and isinstance(entry.get("value"), str):
            bindings[name] = {"kind": "value", "value": entry["value"]}
        elif kind == "unsendable":
            bindings[name] = {"kind": "unsendable", "why": str(entry.get("why", ""))[:MESSAGE_CHARS]}
        elif kind == "callable":
            bindings[name] = {"kind": "callable"}
        else:
            bindings[name] = {"kind": "missing"}
    return bindings


def _sanitised(reply: dict | None, outcome: CellOutcome) -> dict:
    """The kernel's reply to a call, reduced to the fields and types the judge reads (the
    kernel is the student's: its reply may be anything)."""
    if reply is None:
        why = f"{outcome.ename}: {outcome.evalue}" if not outcome.ok else "the call returned no result"
        return {"raised": ["RuntimeError"], "type": "RuntimeError", "message": why[:MESSAGE_CHARS]}
    if reply.get("missing") is True:
        return {"missing": True}
    if "raised" in reply:
        raised = reply["raised"] if isinstance(reply["raised"], list) else []
        return {"raised": [str(n)[:100] for n in raised[:20]], "type": str(reply.get("type", ""))[:200],
                "message": str(reply.get("message", ""))[:MESSAGE_CHARS]}
    if isinstance(reply.get("value"), str):
        return {"value": reply["value"]}
    return {"unsendable": str(reply.get("unsendable", "a reply the grader cannot read"))[:MESSAGE_CHARS]}


class Judge:
    """One judge process for one submission (see the module doc)."""

    def __init__(self, lab: LabSource, workdir: Path, env: dict[str, str], *, prepare_timeout: float):
        self.lab, self.workdir, self.env = lab, workdir, env
        self.prepare_timeout = prepare_timeout
        self.proc: asyncio.subprocess.Process | None = None
        self.log = workdir / "judge.log"
        self._early: asyncio.Task | None = None

    async def _start(self) -> None:
        await self.stop()
        with open(self.log, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "utils.grading.judge_process", str(self.lab.path.resolve()),
                cwd=self.workdir, env=self.env, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=log, limit=LINE_LIMIT, start_new_session=True)
        ready = await self._receive(START_TIMEOUT)
        if ready.get("op") != "ready":
            raise JudgeError(f"the judge did not start: {self._log_tail()}")

    async def _send(self, message: dict) -> None:
        """Raises JudgeError if the judge is gone (a kernel restart or the memory watchdog
        ends every process of the submission, the judge included)."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(message, ensure_ascii=False) + "\n").encode())
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as error:
            raise JudgeError(f"the judge ended: {error!r}") from None

    async def _receive(self, timeout: float) -> dict:
        """The judge's next message; raises TimeoutError, or JudgeError if it ended."""
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), max(0.1, timeout))
        if not line:
            raise JudgeError(f"the judge ended: {self._log_tail()}")
        return json.loads(line)

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(encoding="utf-8", errors="replace")[-2000:]
        return ""

    def prepare_early(self, check: Check) -> None:
        """Start the judge and run the reference up to `check` (the first check) in the
        background now, while the kernel starts and runs the cells before it: a judge's start
        and reference take seconds (``import torch`` among them), which then overlap the
        kernel's instead of following them. `prepare` waits for it; should it fail, `prepare`
        tries again and reports what fails. Call it from the running event loop."""
        self._early = asyncio.ensure_future(self._prepare(check))

    async def prepare(self, check: Check) -> None:
        """Run the reference up to `check` (starting a judge first if none is alive)."""
        early, self._early = self._early, None
        if early is not None:
            with contextlib.suppress(Exception):  # JudgeError: tried again below, where it counts
                await early
        await self._prepare(check)

    async def _prepare(self, check: Check) -> None:
        for attempt in (1, 2):
            if self.proc is None or self.proc.returncode is not None:
                await self._start()
            try:
                await self._send({"op": "prepare", "check": check.id})
                reply = await self._receive(self.prepare_timeout)
                break
            except JudgeError:  # ended since its last check (its returncode may not be known yet)
                await self.stop()
                if attempt == 2:
                    raise
            except TimeoutError:
                await self.stop()
                raise JudgeError(f"the lab source did not run within {self.prepare_timeout:g} s "
                                 "in the judge") from None
        if reply.get("op") != "prepared":
            raise JudgeError(f"the lab source fails in the judge at cell {reply.get('cell')}:\n{reply.get('error')}")

    async def check(self, check: Check, session: KernelSession, timeout: float) -> CellOutcome:
        """Judge `check` against the kernel of `session`; see the module doc."""
        started = time.monotonic()
        deadline = started + timeout
        outputs: list = []

        async def in_kernel(source: str) -> tuple[CellOutcome, dict | None, str]:
            outcome = await session.run(source, max(1.0, deadline - time.monotonic()), store_history=False)
            session.outputs.commit()
            outputs.extend(o for o in outcome.outputs if REPLY_MIME not in (o.get("data") or {}))
            return (outcome, *_reply(outcome, session.token))

        names = sorted({n for t in self.lab.tasks.values() for n in t.names})
        outcome, described, tampered = await in_kernel(_snippet("describe", names))
        if tampered:
            return self._tampered(tampered, outputs, started)
        if not outcome.ok or described is None:
            return self._ended(outcome, outputs, started, "the kernel did not answer")
        try:
            return await self._relay(check, _bindings(described, names), in_kernel, deadline, started, outputs)
        except JudgeError:
            await self.stop()
            trip = session.contained.claim_trip() if session.contained is not None else None
            if trip is None:
                raise  # the judge failed on its own: the grader's problem, not the student's
            # The memory watchdog ended every process of the submission, the judge with them.
            return CellOutcome("memory", MEMORY_ENAME, trip.message(), time.monotonic() - started, outputs)

    async def _relay(self, check: Check, bindings: dict, in_kernel, deadline: float, started: float,
                     outputs: list) -> CellOutcome:
        """Run `check` in the judge, carrying each of its calls into the kernel."""
        timeout = deadline - started
        await self._send({"op": "check", "check": check.id, "bindings": bindings})
        while True:
            try:
                message = await self._receive(deadline - time.monotonic())
            except TimeoutError:
                await self.stop()  # the judge is busy with the check: a new one takes over
                return CellOutcome("timeout", "CellTimeout", f"no result after {timeout:g} s",
                                   time.monotonic() - started, outputs)
            if message.get("op") == "done":
                return self._done(message, outputs, started)
            outcome, reply, tampered = await in_kernel(_snippet("call", message["name"], message["arguments"],
                                                                message.get("forbid") or [],
                                                                message.get("message") or ""))
            if tampered:
                with contextlib.suppress(TimeoutError, JudgeError):
                    await self._send({"op": "reply", "abort": "tampered"})
                    await self._receive(10.0)
                return self._tampered(tampered, outputs, started)
            if outcome.status in ("timeout", "dead", "memory"):
                with contextlib.suppress(TimeoutError, JudgeError):
                    await self._send({"op": "reply", "abort": outcome.status})
                    await self._receive(10.0)  # the judge's "done" for the aborted check
                return self._ended(outcome, outputs, started, outcome.evalue or outcome.status)
            await self._send({**_sanitised(reply, outcome), "op": "reply"})

    @staticmethod
    def _tampered(why: str, outputs: list, started: float) -> CellOutcome:
        return CellOutcome("error", "GraderTampered", "the kernel's side of the grader cannot be trusted",
                           time.monotonic() - started, outputs, tampered=why)

    @staticmethod
    def _ended(outcome: CellOutcome, outputs: list, started: float, why: str) -> CellOutcome:
        status = outcome.status if outcome.status != "ok" else "error"
        return CellOutcome(status, outcome.ename or "KernelError", why, time.monotonic() - started, outputs)

    @staticmethod
    def _done(message: dict, outputs: list, started: float) -> CellOutcome:
        kept = []
        if message.get("stdout"):
            kept.append(nbformat.v4.new_output("stream", name="stdout", text=message["stdout"]))
        kept += outputs
        seconds = time.monotonic() - started
        if message.get("status") == "ok":
            return CellOutcome("ok", seconds=seconds, outputs=kept)
        if message.get("status") == "abort":
            return CellOutcome("error", "KernelError", str(message.get("reason")), seconds, kept)
        kept.append(nbformat.v4.new_output("error", ename=message.get("ename", "Error"),
                                           evalue=message.get("evalue", ""),
                                           traceback=str(message.get("traceback", "")).splitlines()))
        return CellOutcome("error", message.get("ename"), message.get("evalue"), seconds, kept,
                           student=bool(message.get("student")))

    async def stop(self) -> None:
        early = self._early
        if early is not None and early is not asyncio.current_task():  # (`_start` stops from inside it)
            self._early = None
            early.cancel()
            with contextlib.suppress(BaseException):
                await early
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                await self._send_quit(proc)
                await asyncio.wait_for(proc.wait(), 2.0)
        if proc.returncode is None:
            import psutil

            with contextlib.suppress(psutil.Error):
                end_process_tree([psutil.Process(proc.pid)], grace=1.0)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5.0)

    @staticmethod
    async def _send_quit(proc) -> None:
        proc.stdin.write(b'{"op": "quit"}\n')
        await proc.stdin.drain()
        proc.stdin.close()


@dataclass
class JudgedCheck:
    """A step of `execute.run_cells`: one instructor check, judged outside the kernel."""

    check: Check
    timeout: float
    judge: Judge

    async def execute(self, session: KernelSession) -> CellOutcome:
        await self.judge.prepare(self.check)
        return await self.judge.check(self.check, session, self.timeout)


def judge_env(workdir: Path, project_root: Path, runs: Path | None = None) -> dict[str, str]:
    """Environment of a judge: the project importable, its runs folder (`runs`, default
    ``workdir/runs``), no display."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project_root), env.get("PYTHONPATH")]))
    env["WORKBOOK_RUNS"] = str(Path(runs).resolve() if runs is not None else workdir / "runs")
    env["MPLBACKEND"] = "Agg"
    env["PLOTLY_RENDERER"] = "json"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
