"""JSON files that several processes read while others write them.

A launcher polls files its ranks are writing; a reader must never see half a file. JSON
documents are therefore written to a private temporary file and renamed into place, and
JSON-lines readers skip a last line that is still being written.

A JSON-lines file is appended to one whole line at a time, so only its end can be half
written, and only while its writer runs. `scan_jsonl` says what a reader found besides the
rows (the complete lines, a piece of line after the last newline, lines that are not JSON),
so that the reader of a finished record can tell a complete file from one that was cut
short or damaged afterwards (`utils.jobs.rundir.RunDir.record_problems`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


def read_json(path: Path, default=None):
    """The document at `path`, or `default` when it is missing or not valid JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def write_json(path: Path, data, *, indent: int | None = None) -> None:
    """Write JSON so that readers (the launcher polling, another process) never see half a
    file: write a private temporary file, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent), encoding="utf-8")
    tmp.replace(path)


@dataclass(frozen=True)
class JsonLines:
    """What one JSON-lines file holds: its rows, and what a reader had to leave out."""

    rows: list[dict]
    """Every line that is a JSON object, in file order."""
    lines: int
    """Complete lines: those ended by a newline, damaged ones included, and a last JSON object
    whose newline is missing (a writer writes one line at a time, so this is how many lines
    its writers finished)."""
    damaged: tuple[int, ...] = ()
    """1-based numbers of complete lines that are not a JSON object (not UTF-8, not JSON, or
    JSON but not an object): skipped."""
    tail: int = 0
    """Bytes after the last newline that are not a JSON object: a line still being written
    while its writer runs, a line cut mid-write once it ended. 0 when the file ends cleanly."""
    exists: bool = True


def scan_jsonl(path: Path) -> JsonLines:
    """The rows of the JSON-lines file at `path`, and what was left out (`JsonLines`).

    Never raises for the content: a damaged line is skipped and its number reported, so the
    rest of the record stays readable. A last line without its newline counts as a row when
    it is a whole JSON object (no proper prefix of a JSON object is one), else as `tail`.
    A missing or unreadable file reads as empty, with ``exists=False``.
    """
    try:
        data = Path(path).read_bytes()
    except OSError:
        return JsonLines(rows=[], lines=0, exists=False)
    end = data.rfind(b"\n") + 1
    body, rest = data[:end], data[end:]
    lines = body.count(b"\n")
    rows = _fast_rows(body, lines)
    damaged: list[int] = []
    if rows is None:  # some line is not a JSON object: read them one by one to find it
        rows = []
        for number, raw in enumerate(body.split(b"\n")[:lines], start=1):
            row = _row(raw)
            if row is not None:
                rows.append(row)
            elif raw.strip():
                damaged.append(number)
    tail = 0
    if rest.strip():
        row = _row(rest)
        if row is not None:  # a whole object whose newline is missing (written by hand)
            rows.append(row)
            lines += 1
        else:
            tail = len(rest)
    return JsonLines(rows=rows, lines=lines, damaged=tuple(damaged), tail=tail)


def read_jsonl(path: Path) -> list[dict]:
    """The file's JSON objects, one per line: a line still being written is skipped, not
    misread, and so is a damaged line (`scan_jsonl` says which)."""
    return scan_jsonl(path).rows


def count_lines(path: Path) -> int:
    """Newline-ended lines in the file at `path` (0 when it is missing): what a writer that
    appends to it finds already there."""
    try:
        return Path(path).read_bytes().count(b"\n")
    except OSError:
        return 0


class LineAppender:
    """A JSON-lines file opened for appending whole lines, one write (and flush) per batch,
    that counts the lines it holds: those already there when it was opened (a restarted job
    continues its earlier launch's file) and those written since. A writer records `lines`
    at its end, so that a reader can tell a complete file from one cut short later."""

    def __init__(self, path: Path):
        self.lines = count_lines(path)
        self._file = open(path, "a", encoding="utf-8")

    def write(self, lines) -> None:
        """Append `lines` (strings without their newline: serialized JSON objects)."""
        lines = list(lines)
        self._file.write("".join(line + "\n" for line in lines))
        self._file.flush()
        self.lines += len(lines)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> LineAppender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _fast_rows(body: bytes, lines: int) -> list[dict] | None:
    """Every line of `body` parsed in one call (a recorded run's events file holds tens of
    thousands of lines), or None when one of them is not a JSON object."""
    if not lines:
        return []
    try:
        rows = json.loads(b"[" + body[:-1].replace(b"\n", b",") + b"]")
    except ValueError:  # UnicodeDecodeError is one
        return None
    return rows if len(rows) == lines and all(isinstance(row, dict) for row in rows) else None


def _row(raw: bytes) -> dict | None:
    try:
        row = json.loads(raw)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None
