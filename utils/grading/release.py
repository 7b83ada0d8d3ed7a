"""Build what an instructor hands out: the workbook without solutions or hidden tests.

The release holds ``chapters/``, ``labs/`` (copied as committed, after checking that they
are what ``solutions/`` generates: a stale copy fails the build), ``utils/``
**without** ``utils/grading`` (students do not grade; the grader's sources name the hidden
markers), ``README.md``, ``pyproject.toml``, ``environment.yml`` and ``Makefile``. No
``solutions/``, no ``tests/`` (they exercise the solutions), no ``runs/``.

Before it returns, the release is scanned: any solution or hidden-test marker, any
solution region or hidden check from a lab source, makes the build fail.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .notebook_source import LabSource, generate, secret_lines, sources

INCLUDED = ("chapters", "labs", "utils", "README.md", "pyproject.toml", "environment.yml", "Makefile")
EXCLUDED_PATTERNS = ("__pycache__", "*.pyc", ".ipynb_checkpoints", "grading")
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


class ReleaseError(RuntimeError):
    """The release would leak solutions or hidden tests, or labs/ is stale."""


def secrets(root: Path) -> list[str]:
    """Lines of every lab's solutions and hidden tests (see `secret_lines`)."""
    return sorted({line for path in sources(root) for line in secret_lines(LabSource.load(path))})


def scan(folder: Path, root: Path) -> list[str]:
    """Files under `folder` that contain a marker, and lab notebooks that contain a line of
    a lab's secrets. (Secret lines are looked for in ``labs/`` only: a chapter may well
    derive the same formula as a solution does.)"""
    leaks = []
    lines = secrets(root)
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        hits = [m for m in MARKERS if m in text]
        if path.relative_to(folder).parts[0] == "labs":
            plain = _json_unescaped(text)
            hits += [f"line {line[:40]!r}" for line in lines if line in text or line in plain]
        if hits:
            leaks.append(f"{path.relative_to(folder)}: {', '.join(hits[:3])}")
    return leaks


def _json_unescaped(text: str) -> str:
    """Notebook JSON escapes quotes and backslashes; compare against the plain text too."""
    return text.replace('\\"', '"').replace("\\\\", "\\")


def build_release(root: str | Path, out: str | Path) -> list[str]:
    """Write the student release to `out` (which must not exist or be empty); return its
    top-level entries. Raises ReleaseError on a stale labs/ or any leak."""
    root, out = Path(root), Path(out)
    if out.exists() and any(out.iterdir()):
        raise ReleaseError(f"{out} exists and is not empty; give a new folder")
    stale = generate(root, check=True)
    if stale:
        raise ReleaseError("labs/ is not what the sources generate:\n  " + "\n  ".join(stale))
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in INCLUDED:
        source = root / name
        if not source.exists():
            continue
        if source.is_dir():
            shutil.copytree(source, out / name, ignore=shutil.ignore_patterns(*EXCLUDED_PATTERNS))
        else:
            shutil.copy2(source, out / name)
        copied.append(name)
    leaks = scan(out, root)
    if leaks:
        shutil.rmtree(out)
        raise ReleaseError("the release would leak solutions or hidden tests:\n  " + "\n  ".join(leaks))
    return copied
