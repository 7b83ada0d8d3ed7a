"""Bounded output inside a grading kernel: loaded as an IPython extension
(``--IPKernelApp.extensions=utils.grading.kernel_output``), it keeps the first
`Budget.stream_kib` KiB (``$GRADING_STREAM_KIB``) that a cell writes to stdout and stderr
together and replaces the rest by one line ``[output cut: X MiB more]``, so a flood never
leaves the kernel. The grader bounds what it keeps again on its side
(`utils.grading.execute.BoundedClient`): kernel code can undo anything done in the kernel.

It runs inside every student's kernel: it imports only the standard library and
`containment` (which imports psutil only inside the functions that need it).
"""

from __future__ import annotations

import os
import sys
import threading

from .containment import MIB, Budget

STREAM_ENV = "GRADING_STREAM_KIB"
"""How a kernel learns `containment.Budget.stream_kib` (read by `load_ipython_extension`)."""


def human(size: float) -> str:
    """``12.3 MiB`` / ``640 KiB`` / ``120 B``."""
    if size >= MIB:
        return f"{size / MIB:.1f} MiB"
    if size >= 1024:
        return f"{size / 1024:.0f} KiB"
    return f"{size:.0f} B"


def cut_note(cut: float) -> str:
    return f"[output cut: {human(cut)} more]\n"


class _StreamLimiter:
    """Keeps the first `limit` characters a cell writes to stdout and stderr together."""

    def __init__(self, limit: int):
        self.limit = limit
        self.kept = 0
        self.cut = 0
        self.lock = threading.Lock()
        self.note = None

    def wrap(self, stream) -> None:
        original = stream.write
        if self.note is None:
            self.note = original

        def write(text):
            if not isinstance(text, str):
                return original(text)  # let the stream raise its own TypeError
            with self.lock:
                room = max(0, self.limit - self.kept)
                part = text[:room]
                self.kept += len(part)
                self.cut += len(text) - len(part)
            if part:
                original(part)
            return len(text)

        stream.write = write  # an instance attribute: print() and the fd-capture thread use it

    def reset(self, *args) -> None:
        with self.lock:
            self.kept = self.cut = 0

    def report(self, *args) -> None:
        with self.lock:
            cut, self.cut = self.cut, 0
        if cut and self.note is not None:
            self.note(cut_note(cut))


def load_ipython_extension(ip) -> None:
    """In a grading kernel: bound what each cell prints (see the module doc)."""
    try:
        limit = int(float(os.environ.get(STREAM_ENV, Budget.stream_kib)) * 1024)
    except ValueError:
        limit = Budget.stream_kib * 1024
    if limit <= 0:
        return
    limiter = _StreamLimiter(limit)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "write"):
            limiter.wrap(stream)
    ip.events.register("pre_execute", limiter.reset)
    ip.events.register("post_execute", limiter.report)
