"""Build what an instructor hands out: the workbook without solutions or hidden tests.

The release holds ``chapters/``, ``labs/`` (copied as committed, after checking that they
are what ``solutions/`` generates: a stale copy fails the build), ``utils/`` **without** the
grader (students do not grade; the grader's sources name the hidden markers) except
``utils/grading/check_api.py``, which the labs' set-up cells import, ``environment.yml``,
the course outline ``docs/outline.md`` if there is one, and files of its own: a README and a
Makefile (from ``release_files/``, around the project Makefile's set-up recipe) whose
commands work on what the release contains — ``make lab``, ``make test`` (every chapter,
by nbval) and ``make check LAB=labNN`` (one lab and its public self-checks) — and
``pyproject.toml`` with pytest pointed at ``chapters``. No ``solutions/``, no ``tests/``
(they exercise the solutions), no ``benchmarks/``, no instructor docs, no ``runs/``.

Before it returns, the release is scanned: any solution or hidden-test marker, any
solution region or hidden check from a lab source, makes the build fail.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .notebook_source import LabSource, generate, secret_lines, sources

INCLUDED = ("chapters", "labs", "utils", "environment.yml", "docs/outline.md")
EXCLUDED_PATTERNS = ("__pycache__", "*.pyc", ".ipynb_checkpoints", "grading")
OWN_FILES = Path(__file__).with_name("release_files")
"""The release's README.md and Makefile."""
GRADING_INIT = '''"""The grader is not part of the student release; only `check_api`, which the labs'
self-checks import, is."""
'''
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


class ReleaseError(RuntimeError):
    """The release would leak solutions or hidden tests, or labs/ is stale."""


def secrets(root: Path) -> list[str]:
    """Lines of every lab's solutions and hidden tests (see `secret_lines`), but those that
    some lab hands out anyway (one lab's hidden check may import what another's set-up does)."""
    labs = [LabSource.load(path) for path in sources(root)]
    public = "\n".join(cell.source for lab in labs for cell in lab.student_copy().cells)
    return sorted({line for lab in labs for line in secret_lines(lab) if line not in public})


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


SETUP_MARK = "# @SETUP@"


def _release_makefile(root: Path) -> str:
    """The release's Makefile: its own targets around the project Makefile's set-up recipe
    (``$(STAMP): pyproject.toml`` to ``touch $(STAMP)``), so the pinned installs exist once."""
    template = (OWN_FILES / "Makefile").read_text(encoding="utf-8")
    project = (root / "Makefile").read_text(encoding="utf-8")
    found = re.search(r"^\$\(STAMP\): pyproject\.toml\n.*?^\ttouch \$\(STAMP\)\n", project, re.M | re.S)
    if found is None:
        raise ReleaseError("the project Makefile has no `$(STAMP): pyproject.toml` ... `touch $(STAMP)` recipe")
    lines = template.splitlines(keepends=True)
    return "".join(found.group(0) if line.startswith(SETUP_MARK) else line for line in lines)


def _own_files(root: Path, out: Path) -> list[str]:
    """README.md and Makefile for the release, and pyproject.toml with the tests it lacks
    taken out of pytest's paths."""
    readme = (OWN_FILES / "README.md").read_text(encoding="utf-8")
    if (out / "docs" / "outline.md").exists():
        readme += "\n课程大纲（各章状态）见 `docs/outline.md`。· The course outline is in `docs/outline.md`.\n"
    (out / "README.md").write_text(readme, encoding="utf-8")
    written = ["README.md"]
    if (root / "Makefile").exists():
        (out / "Makefile").write_text(_release_makefile(root), encoding="utf-8")
        written.append("Makefile")
    if (root / "pyproject.toml").exists():
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
        text, n = re.subn(r"(?m)^testpaths = .*$", 'testpaths = ["chapters"]', text)
        if n != 1:
            raise ReleaseError("pyproject.toml has no single `testpaths = ...` line to point at chapters")
        (out / "pyproject.toml").write_text(text, encoding="utf-8")
        written.append("pyproject.toml")
    return written


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
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, out / name, ignore=shutil.ignore_patterns(*EXCLUDED_PATTERNS))
        else:
            shutil.copy2(source, out / name)
        copied.append(name)
    if (root / "utils").is_dir():  # the labs' set-up cells import the checks' library ban
        (out / "utils" / "grading").mkdir()
        (out / "utils" / "grading" / "__init__.py").write_text(GRADING_INIT, encoding="utf-8")
        shutil.copy2(Path(__file__).with_name("check_api.py"), out / "utils" / "grading" / "check_api.py")
    copied += _own_files(root, out)
    leaks = scan(out, root)
    if leaks:
        shutil.rmtree(out)
        raise ReleaseError("the release would leak solutions or hidden tests:\n  " + "\n  ".join(leaks))
    return copied
