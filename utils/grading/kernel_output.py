"""Bounded output inside a grading kernel: loaded as an IPython extension
(``--IPKernelApp.extensions=utils.grading.kernel_output``), it keeps the first
`Budget.stream_kib` KiB (``$GRADING_STREAM_KIB``) that a cell writes to stdout and stderr
together and replaces the rest by one line ``[output cut: X MiB more]``, and replaces a
display or cell result over `Budget.output_kib` (``$GRADING_OUTPUT_KIB``) by the start of
its text and a note, so a flood never leaves the kernel. Kernel code can undo this; the
grader's socket refuses any message over `Budget.message_mib` before reading it. The grader bounds what it keeps again on its side
(`utils.grading.execute.BoundedClient`): kernel code can undo anything done in the kernel.

It runs inside every student's kernel: it imports only the standard library and
`containment` (which imports psutil only inside the functions that need it).
"""

from __future__ import annotations

import json
import os
import sys
import threading

from .containment import MIB, Budget

STREAM_ENV = "GRADING_STREAM_KIB"
"""How a kernel learns `containment.Budget.stream_kib` (read by `load_ipython_extension`)."""
OUTPUT_ENV = "GRADING_OUTPUT_KIB"
"""How a kernel learns `containment.Budget.output_kib`: the largest rich output it sends."""
REPLY_MIME = "application/vnd.workbook.grading-reply+json"
"""The MIME type of the grader's replies from the kernel (`student_side`), never cut here."""


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


def bounded_bundle(data: dict, limit: int) -> dict:
    """A MIME bundle of at most about `limit` characters: itself, or the start of its plain
    text and a note ``[output cut: display of X not kept]``."""
    if not isinstance(data, dict) or REPLY_MIME in data:
        return data
    size = 0
    for value in data.values():
        size += len(value) if isinstance(value, str) else len(json.dumps(value, default=str))
        if size > limit:
            break
    if size <= limit:
        return data
    plain = data.get("text/plain")
    keep = plain[:min(limit, 2000)] if isinstance(plain, str) else ""
    return {"text/plain": keep + ("\n" if keep else "") + f"[output cut: display of more than {human(limit)} not kept]"}


def _bound_rich_output(ip, limit: int) -> None:
    """Cut every display and every cell result over `limit` characters before it is sent."""
    publish = ip.display_pub.publish

    def bounded_publish(data, metadata=None, *args, **kwargs):
        bounded = bounded_bundle(data, limit)
        return publish(bounded, {} if bounded is not data else metadata, *args, **kwargs)

    ip.display_pub.publish = bounded_publish
    write = ip.displayhook.write_format_data

    def bounded_write(format_dict, md_dict=None):
        bounded = bounded_bundle(format_dict, limit)
        return write(bounded, {} if bounded is not format_dict else md_dict)

    ip.displayhook.write_format_data = bounded_write


def _kib(name: str, default: int) -> int:
    try:
        return int(float(os.environ.get(name, default)) * 1024)
    except ValueError:
        return default * 1024


def load_ipython_extension(ip) -> None:
    """In a grading kernel: bound what each cell prints and displays (see the module doc)."""
    output = _kib(OUTPUT_ENV, Budget.output_kib)
    if output > 0:
        _bound_rich_output(ip, output)
    limit = _kib(STREAM_ENV, Budget.stream_kib)
    if limit <= 0:
        return
    limiter = _StreamLimiter(limit)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "write"):
            limiter.wrap(stream)
    ip.events.register("pre_execute", limiter.reset)
    ip.events.register("post_execute", limiter.report)
