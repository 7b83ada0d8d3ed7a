"""JSON files that several processes read while others write them.

A launcher polls files its ranks are writing; a reader must never see half a file. JSON
documents are therefore written to a private temporary file and renamed into place, and
JSON-lines readers skip a last line that is still being written.
"""

from __future__ import annotations

import json
import os
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


def read_jsonl(path: Path) -> list[dict]:
    """Complete lines only: a line still being written is skipped, not misread."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]
