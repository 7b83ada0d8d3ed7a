"""The trusted side of grading: ``python -m utils.grading.judge_process LAB_SOURCE``.

One judge process serves one submission. It keeps a **reference**: the lab source's code
cells (set-up, given code, the *solution* answers and every check, public and hidden)
executed in order, as plain Python, in a namespace of its own — so everything a check
computes (expected values, helpers of earlier checks, ``utils.compute_metrics`` results)
comes from trusted code in a process the student's code never reaches.

To judge a check, the check's full source runs in a copy of the reference namespace in
which the task's names are replaced by what the student's kernel holds: a callable becomes
a proxy whose calls travel to the kernel as `codec` text (the grader relays them, see
`judge.Judge`), a plain value arrives decoded, a name the student never defined is absent.
The check decides pass or fail here; the kernel only ever sees the arguments of the calls.

Protocol: one JSON object per line. The grader sends ``prepare`` (run the reference up to
a check) and ``check``; during a check the judge sends ``call`` lines and reads one
``reply`` for each; every command ends with one ``prepared``/``done``/``failed`` line. The
protocol uses the process's original stdout; `print` in cells and checks is captured.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from . import codec
from .check_api import active_forbidden
from .notebook_source import LabSource

OUTPUT_CHARS = 64 * 1024
"""What a check prints that is kept (the instructor notebook shows it)."""
TRACEBACK_CHARS = 8000


class StudentAborted(BaseException):
    """The student's kernel timed out, died or ran out of memory during a call: the check
    ends here (a BaseException, so a check's ``except Exception`` cannot swallow it)."""


class Channel:
    """JSON lines to and from the grader."""

    def __init__(self, inp, out):
        self.inp, self.out = inp, out

    def send(self, message: dict) -> None:
        self.out.write(json.dumps(message, ensure_ascii=False) + "\n")
        self.out.flush()

    def receive(self) -> dict | None:
        line = self.inp.readline()
        return json.loads(line) if line else None


class Capture(io.StringIO):
    """`sys.stdout` of the judge: keeps the first `OUTPUT_CHARS` of what is printed."""

    def write(self, text: str) -> int:
        room = OUTPUT_CHARS - self.tell()
        if room > 0:
            super().write(text[:room])
        return len(text)

    def take(self) -> str:
        text = self.getvalue()
        self.seek(0)
        self.truncate()
        return text


def _raise_like(reply: dict) -> None:
    """Raise what the student's function raised: the most specific builtin class that can
    carry a message (``except ValueError`` in a check catches a student's ValueError
    subclass), marked as the student's."""
    for name in reply.get("raised") or []:
        cls = getattr(builtins, str(name), None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            continue
        try:
            error = cls(str(reply.get("message", "")))
        except Exception:  # a class whose constructor wants more (UnicodeDecodeError)
            continue
        error.from_student = True
        raise error
    error = RuntimeError(f"{reply.get('type', 'an exception')}: {reply.get('message', '')}")
    error.from_student = True
    raise error


class StudentProxy:
    """Stands for one of the student's functions inside a check."""

    def __init__(self, name: str, judge: Judge):
        self.__name__ = self.name = name
        self.judge = judge

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.judge.call(self.name, args, kwargs)

    def __repr__(self) -> str:
        return f"<student function {self.name}>"


class Judge:
    def __init__(self, lab: LabSource, channel: Channel, capture: Capture):
        self.lab, self.channel, self.capture = lab, channel, capture
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.cells = [(i, c) for i, c in enumerate(lab.nb.cells) if c.cell_type == "code"
                      and (c.get("metadata", {}).get("grading") or {}).get("kind") != "instructor"]
        self.done = 0  # reference cells executed so far (a prefix of self.cells)
        self.check_cell = {c.metadata["grading"]["id"]: i for i, c in self.cells
                           if (c.metadata.get("grading") or {}).get("kind") == "test"}
        self.proxies: dict[str, StudentProxy] = {}

    # --- the reference --------------------------------------------------------------------
    def prepare(self, check_id: str) -> None:
        """Run the reference up to (not including) the cell of `check_id`. A set-up, answer or
        test cell that fails stops the judge (``failed``); a plain cell that fails is logged."""
        stop = self.check_cell[check_id]
        while self.done < len(self.cells) and self.cells[self.done][0] < stop:
            index, cell = self.cells[self.done]
            try:
                exec(compile(cell.source, f"<{self.lab.name} cell {index}>", "exec"), self.namespace)
            except Exception as error:
                self.capture.take()
                if (cell.metadata.get("grading") or {}).get("kind") is None:
                    # A demonstration cell (a plot, a claim about measured runs that noise can
                    # break): no check depends on it being right; note it and go on.
                    print(f"judge: cell {index} of the lab source failed, continuing:\n{_traceback(error)}",
                          file=sys.stderr, flush=True)
                else:  # set-up, a solution or a check: the checks after it would be wrong
                    self.channel.send({"op": "failed", "cell": index, "error": _traceback(error)})
                    return
            self.done += 1
            self.capture.take()
        self.channel.send({"op": "prepared"})

    # --- one check --------------------------------------------------------------------------
    def check(self, check_id: str, bindings: dict[str, dict]) -> None:
        index = self.check_cell[check_id]
        namespace = dict(self.namespace)
        self.proxies = {}
        # Only the lab's task names are bound (whatever the kernel's reply held), never over
        # the check's own helpers or builtins.
        task_names = {n for t in self.lab.tasks.values() for n in t.names}
        for name, found in bindings.items():
            if name not in task_names or not isinstance(found, dict):
                continue
            kind = found.get("kind")
            if kind == "callable":
                namespace[name] = self.proxies[name] = StudentProxy(name, self)
            elif kind == "value":
                try:
                    namespace[name] = self.decode(found.get("value"))
                except ValueError as error:
                    namespace[name] = codec.StudentObject("value", f"unreadable: {error}")
            elif kind == "unsendable":
                namespace[name] = codec.StudentObject("value", str(found.get("why", "")))
            else:
                namespace.pop(name, None)
        source = self.lab.nb.cells[index].source
        result: dict[str, Any] = {"op": "done", "status": "ok"}
        try:
            exec(compile(source, f"<check {check_id}>", "exec"), namespace)
        except StudentAborted as aborted:
            result = {"op": "done", "status": "abort", "reason": str(aborted)}
        except Exception as error:
            result = {"op": "done", "status": "error", "ename": type(error).__name__,
                      "evalue": str(error), "student": bool(getattr(error, "from_student", False)),
                      "traceback": _traceback(error)}
        result["stdout"] = self.capture.take()
        self.channel.send(result)

    def decode(self, text: str) -> Any:
        return codec.decode(text, resolve=lambda name: self.proxies.get(name) or codec.StudentFunction(name))

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        targets, message = active_forbidden()
        refs = {id(p): p.name for p in self.proxies.values()}
        try:
            arguments = codec.encode([list(args), kwargs], refs=refs)
        except codec.EncodeError as error:
            raise ValueError(f"the check's arguments to {name} cannot be sent: {error}") from None
        self.channel.send({"op": "call", "name": name, "arguments": arguments,
                           "forbid": targets, "message": message})
        reply = self.channel.receive()
        if reply is None or reply.get("op") != "reply":
            raise StudentAborted("the grader went away")
        if "abort" in reply:
            raise StudentAborted(str(reply["abort"]))
        if reply.get("missing"):
            raise NameError(f"name '{name}' is not defined")
        if "raised" in reply:
            _raise_like(reply)
        if "unsendable" in reply:
            return codec.StudentObject("result", str(reply["unsendable"]))
        try:
            return self.decode(reply.get("value"))
        except ValueError as error:  # what the kernel sent is not what `codec.encode` writes
            return codec.StudentObject("result", f"unreadable: {error}")


def _traceback(error: BaseException) -> str:
    text = "".join(traceback.format_exception(error))
    return text[-TRACEBACK_CHARS:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    lab = LabSource.load(Path(args[0]))
    # The protocol keeps the original stdout; anything written to fd 1 later (a C library,
    # a subprocess) goes to stderr (the judge's log), and `print` to the capture.
    channel = Channel(sys.stdin, os.fdopen(os.dup(1), "w", encoding="utf-8"))
    os.dup2(2, 1)
    capture = Capture()
    sys.stdout = capture
    judge = Judge(lab, channel, capture)
    channel.send({"op": "ready"})
    while (message := channel.receive()) is not None:
        op = message.get("op")
        if op == "prepare":
            judge.prepare(message["check"])
        elif op == "check":
            judge.check(message["check"], message.get("bindings") or {})
        elif op == "quit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
