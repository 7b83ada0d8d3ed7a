"""Every rank's Python stacks when a job hangs: asked for by signal, read back and summarised.

Each rank registers ``faulthandler`` for `STACK_SIGNAL` as it starts
(`utils.runtime.lifecycle.dump_stacks_on_signal`); `request_stacks` sends the signal to every
rank that has its handler in place and waits briefly for the dumps, before the launcher ends
the job. A dump is plain ``faulthandler`` text, one block per thread, most recent call first::

    Current thread 0x00007f... (most recent call first):
      File ".../deepspeed/runtime/pipe/p2p.py", line 88 in recv
      File ".../deepspeed/runtime/pipe/engine.py", line 1198 in _exec_recv_grads
      ...

`parse_stacks` reads it, `main_stack` picks the thread that trains (the one started by
``runpy``) and `stack_summary` names its innermost frames and the DeepSpeed instruction
it is in. No py-spy needed: a rank stopped by SIGSTOP (or a debugger) cannot answer, and
says so by an empty dump.

All of this is the *host's* view, and it is where a rank waits only where the host blocks in
its sends and receives: gloo (CPU). On NCCL they return once enqueued and the host runs on to
its next synchronisation; the device-side record is torch's NCCL flight recorder, whose dumps an
NCCL job's launcher sends to `FLIGHT_RECORDER_DIR` (`flight_recorder_dumps`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from utils.analysis.diagnosis import Symptom
from utils.jobs.rundir import STACK_SIGNAL, RunDir

#: DeepSpeed's engine method -> the instruction kind it executes (`utils.timeline` kinds).
ENGINE_METHODS = {
    "_exec_load_micro_batch": "load", "_exec_forward_pass": "forward", "_exec_backward_pass": "backward",
    "_exec_send_activations": "send_act", "_exec_recv_activations": "recv_act", "_exec_send_grads": "send_grad",
    "_exec_recv_grads": "recv_grad", "_exec_reduce_tied_grads": "reduce_tied_grads",
    "_exec_reduce_grads": "reduce_grads", "_exec_optimizer_step": "optimizer_step",
}
FLIGHT_RECORDER_DIR = "flight-recorder"
"""The run-directory folder of an NCCL job's flight-recorder dumps, one file per rank
(`utils.jobs.launchers.nccl_debug_environment` points torch there)."""
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"
"""Their file names before the rank (torch's writer appends the rank to the prefix it is given)."""
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def short(self) -> str:
        """``deepspeed/runtime/pipe/p2p.py:88 recv``: the path from the package on."""
        return f"{short_path(self.file)}:{self.line} {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    thread: str
    current: bool
    """The thread that handled the signal."""
    frames: tuple[Frame, ...]
    """Innermost first, as ``faulthandler`` writes them."""


def short_path(path: str) -> str:
    """A source path from its package on (``deepspeed/...``, ``torch/...``, ``utils/...``)."""
    for marker in ("site-packages/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    match = re.search(r"(?:^|/)((?:utils|deepspeed|torch)/.*)$", path)
    return match.group(1) if match else path.rsplit("/", 1)[-1]


def parse_stacks(text: str) -> list[ThreadStack]:
    """Every thread of the *last* dump in `text` (a rank asked twice appends a second dump:
    a thread seen again starts it)."""
    dumps: list[list[ThreadStack]] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            if not dumps or any(t.thread == head.group(2) for t in dumps[-1]):
                dumps.append([])
            dumps[-1].append(ThreadStack(head.group(2), head.group(1) == "Current thread", ()))
            continue
        frame = _FRAME.match(line)
        if frame and dumps:
            last = dumps[-1][-1]
            dumps[-1][-1] = ThreadStack(last.thread, last.current, last.frames + (
                Frame(frame["file"], int(frame["line"]), frame["function"]),))
    return dumps[-1] if dumps else []


def main_stack(threads: list[ThreadStack]) -> ThreadStack | None:
    """The thread that trains: the one ``runpy`` started (``-m utils.runtime.rank``), else the
    one with the deepest stack."""
    for thread in threads:
        if thread.frames and thread.frames[-1].function in ("_run_module_as_main", "<module>"):
            return thread
    return max(threads, key=lambda t: len(t.frames), default=None)


def engine_instruction(frames: tuple[Frame, ...]) -> str | None:
    """The pipeline instruction the frames are in (innermost DeepSpeed ``_exec_*``), or None."""
    return next((ENGINE_METHODS[f.function] for f in frames if f.function in ENGINE_METHODS), None)


_PLUMBING = ("wrapper", "log_wrapper", "wrapped_fn", "_call_impl", "_wrapped_call_impl")
"""Decorator frames (torch's and DeepSpeed's logging wrappers) a summary skips."""


def stack_summary(frames: tuple[Frame, ...], *, most: int = 3) -> str:
    """The innermost `most` frames (decorator plumbing left out), innermost first, and the
    instruction they are in."""
    if not frames:
        return "no Python stack"
    shown = " ← ".join(f.short for f in [f for f in frames if f.function not in _PLUMBING][:most])
    kind = engine_instruction(frames)
    return shown + (f" (in DeepSpeed's {kind})" if kind else "")


def request_stacks(run_dir: RunDir, workers: dict[int, psutil.Process], *, wait: float = 2.0) -> dict[int, str]:
    """Ask every rank in `workers` for its stacks and wait up to `wait` seconds for the dumps;
    rank -> the newest dump ("" for a rank that did not answer: stopped, or not yet set up)."""
    asked: dict[int, int] = {}
    for rank, process in workers.items():
        path = run_dir.stacks_file(rank)
        try:
            before = path.stat().st_size  # no file: no handler yet, and the signal would end it
            process.send_signal(STACK_SIGNAL)
        except (OSError, psutil.Error):  # no file yet (no handler), or the process is gone
            continue
        asked[rank] = before
    deadline, sizes, steady_since = time.time() + wait, {}, time.time()
    while asked and time.time() < deadline:
        now = {rank: _size(run_dir.stacks_file(rank)) for rank in asked}
        if now != sizes:
            sizes, steady_since = now, time.time()
        elif all(now[r] > asked[r] for r in asked) and time.time() - steady_since > 0.15:
            break  # every rank answered and finished writing
        time.sleep(0.05)
    found = {}
    for rank, before in asked.items():
        try:
            found[rank] = run_dir.stacks_file(rank).read_bytes()[before:].decode(errors="replace")
        except OSError:
            found[rank] = ""
    return found


def _size(path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def flight_recorder_dumps(run_dir: RunDir) -> list[Path]:
    """The NCCL flight-recorder dumps in the run directory (none unless NCCL timed out and dumped)."""
    folder = run_dir.file(FLIGHT_RECORDER_DIR)
    return sorted(folder.glob(f"{FLIGHT_RECORDER_PREFIX}*")) if folder.is_dir() else []


HOST_VIEW = ("NCCL: its status slot and stack are the host's view, an upper bound of where it waits on the GPU: "
             "it may wait in an earlier instruction (see nccl-host-view)")
"""What every hang finding of an NCCL job adds to its cause."""


def on_nccl(findings: list[Symptom], run_dir: RunDir, *, hung: bool) -> list[Symptom]:
    """An NCCL job's findings: a hang's rest on the host's view, which can run ahead of the GPU (each
    ``hang``/``waiting``/``deadlock`` says so, and an ``nccl-host-view`` finding after the first says
    why and what sees the device side); a failure's first finding names the flight-recorder dumps."""
    dumps = [str(p) for p in flight_recorder_dumps(run_dir)]
    if not hung:
        return [replace(findings[0], evidence={**findings[0].evidence, "flight_recorder": dumps}),
                *findings[1:]] if dumps and findings else findings
    marked = [replace(f, cause=f"{f.cause} [{HOST_VIEW}]") if f.code in ("hang", "waiting", "deadlock") else f
              for f in findings]
    caveat = Symptom(
        code="nccl-host-view", severity="warning",
        what="an NCCL job: each rank's status slot is an upper bound of where it waits, and the wait-for chain "
             "above may name the wrong rank",
        evidence={"backend": "nccl", "flight_recorder": dumps or f"no dump in {FLIGHT_RECORDER_DIR}/ (the job's "
                  "own timeout ended it before NCCL's timeout fired, or NCCL could not write one)"},
        cause="on NCCL a send, receive or collective returns once it is enqueued on the GPU; the host thread runs on "
              "to its next synchronisation (the end-of-step synchronize, a loss .item()) and only the watchdog sees "
              "the timeout (unless TORCH_NCCL_BLOCKING_WAIT=1). A rank that waits on the GPU can show a later "
              "instruction in its slot, or a computing one in its stack, so it looks like the one everybody waits for",
        fix=f"read the GPU side: the flight-recorder dumps (torchfrtrace {run_dir.file(FLIGHT_RECORDER_DIR)} -p "
            f"{FLIGHT_RECORDER_PREFIX}: each rank's last operations and which never completed), NCCL_DEBUG=INFO in "
            "the ranks' logs, TORCH_DISTRIBUTED_DEBUG=DETAIL (checks that the ranks' collectives agree), py-spy "
            "dump --native --pid PID for a rank stuck in C++; or run again with TORCH_NCCL_BLOCKING_WAIT=1, so "
            "that the host waits where the GPU does")
    return [*marked[:1], caveat, *marked[1:]]
