"""One source per lab: `solutions/labNN_slug.ipynb`, and the student copy generated from it.

A lab's source is the completed notebook. Cell metadata under ``"grading"`` marks what
the grader needs (the conventions of nbgrader, kept small)::

    {"grading": {"kind": "answer", "id": "theory_bubble", "task": "theory_bubble"}}
    {"grading": {"kind": "test", "id": "theory_bubble_hidden", "task": "theory_bubble",
                 "points": 1, "description": "随机的 (p, m)"}}
    {"grading": {"kind": "setup", "id": "sweep", "timeout": 900}}
    {"grading": {"kind": "instructor"}}

* ``answer``: the student's work. Each ``### BEGIN SOLUTION`` / ``### END SOLUTION``
  region becomes a stub raising ``NotImplementedError("<task>")``; lines above the region
  (the ``def`` line, the docstring) stay.
* ``test``: checks of one task, worth ``points``. ``### BEGIN HIDDEN TESTS`` /
  ``### END HIDDEN TESTS`` regions are removed from the student copy; a test cell with
  nothing public left is removed entirely. A task's test cells follow its answer cell
  (only markdown and other tests of the same task in between): the grader re-inserts them
  after the student's answer, so they may rely only on what exists at that point.
* ``setup``: an ordinary cell with an optional per-cell ``timeout`` (seconds) for slow work
  such as launching real jobs.
* ``instructor``: dropped from the student copy (notes for instructors).

Notebook metadata ``{"grading": {"cell_timeout": 120}}`` sets the lab's default per-cell
timeout. Generated notebooks have no outputs, only the metadata listed above, and are
written in one stable JSON form, so generating twice gives identical bytes.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode

BEGIN_SOLUTION = re.compile(r"^\s*#+\s*BEGIN SOLUTION\s*$")
END_SOLUTION = re.compile(r"^\s*#+\s*END SOLUTION\s*$")
BEGIN_HIDDEN = re.compile(r"^\s*#+\s*BEGIN HIDDEN TESTS\s*$")
END_HIDDEN = re.compile(r"^\s*#+\s*END HIDDEN TESTS\s*$")
KINDS = ("answer", "test", "setup", "instructor")
STUB_COMMENT = "# 在这里写你的代码 (write your code here)"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
#: Keys of a cell's ``grading`` metadata kept in the student copy.
STUDENT_KEYS = {"answer": ("kind", "id", "task"),
                "test": ("kind", "id", "task", "points", "description"),
                "setup": ("kind", "id", "timeout")}


class SourceError(ValueError):
    """A lab source breaks the conventions; the message names the cell and what to fix."""


@dataclass(frozen=True)
class Check:
    """One test cell: worth `points` when it runs without an error."""

    id: str
    task: str
    points: float
    description: str
    source: str
    """The full cell, public and hidden parts (what the grader runs)."""
    public_source: str | None
    """What the student copy shows, or None when the whole cell is hidden."""

    @property
    def hidden(self) -> bool:
        """Whether any part of the cell is hidden from students: it has a hidden-test region,
        or nothing of it is shown at all."""
        return self.public_source is None or bool(hidden_regions(self.source))


@dataclass(frozen=True)
class Task:
    """One exercise: an answer cell and the checks that grade it."""

    name: str
    answer_id: str
    answer_cell_id: str
    names: tuple[str, ...]
    """Top-level functions and classes the answer defines (for matching a student's cell
    that lost its metadata)."""
    checks: tuple[Check, ...] = ()
    prerequisites: tuple[frozenset[str], ...] = ()
    """The code cells students get that come before this task's checks in the source (set-up
    cells, given code, earlier answers), each as the keys that recognise it in a submission
    (grading id, cell id, normalised source). The checks run after all of them that the
    submission still has, so a notebook with its answers moved above the set-up is graded
    as it runs top to bottom."""

    @property
    def points(self) -> float:
        return sum(c.points for c in self.checks)


@dataclass
class LabSource:
    """A parsed, validated lab source notebook."""

    path: Path
    nb: NotebookNode
    tasks: dict[str, Task] = field(default_factory=dict)
    setup_timeouts: dict[str, float] = field(default_factory=dict)
    """Per-cell timeouts of setup cells, by grading id, by cell id and by (normalised) source,
    so an unchanged setup cell that lost its metadata keeps its timeout."""
    cell_timeout: float | None = None

    @property
    def name(self) -> str:
        """``labNN_slug``, the file name without extension."""
        return self.path.stem

    @property
    def checks(self) -> list[Check]:
        return [c for t in self.tasks.values() for c in t.checks]

    @property
    def max_points(self) -> float:
        return sum(t.points for t in self.tasks.values())

    @classmethod
    def load(cls, path: str | Path) -> LabSource:
        path = Path(path)
        nb = nbformat.read(path, as_version=4)
        lab = cls(path=path, nb=nb, cell_timeout=nb.metadata.get("grading", {}).get("cell_timeout"))
        lab._parse()
        return lab

    # --- parsing -----------------------------------------------------------------------------
    def _parse(self) -> None:
        seen_ids: set[str] = set()
        current: str | None = None  # task whose answer or tests came last among code cells
        pending: dict[str, list[Check]] = {}
        given: list[frozenset[str]] = []  # student-visible code cells so far (see Task.prerequisites)
        before: dict[str, tuple[frozenset[str], ...]] = {}
        for index, cell in enumerate(self.nb.cells):
            meta = cell.get("metadata", {}).get("grading")
            where = f"{self.path.name}, cell {index} (id {cell.get('id')!r})"
            if cell.cell_type == "code" and (meta or {}).get("kind") in (None, "setup", "answer"):
                keys = {cell.get("id"), (meta or {}).get("id"), normalise(cell.source)}
                given.append(frozenset(k for k in keys if k))
            if meta is None:
                _forbid_markers(cell.source, where, solution=True, hidden=True)
                if cell.cell_type == "code":
                    current = None
                continue
            kind = meta.get("kind")
            if kind not in KINDS:
                raise SourceError(f"{where}: grading kind {kind!r}; use one of {KINDS}")
            gid = meta.get("id")
            if kind != "instructor":
                if not gid or not isinstance(gid, str):
                    raise SourceError(f"{where}: a {kind} cell needs a grading id")
                if gid in seen_ids:
                    raise SourceError(f"{where}: grading id {gid!r} is used twice")
                seen_ids.add(gid)
            if kind in ("answer", "test", "setup") and cell.cell_type != "code":
                raise SourceError(f"{where}: a {kind} cell must be a code cell")
            if kind == "answer":
                current = self._parse_answer(cell, meta, where)
                pending.setdefault(current, [])
                before[current] = tuple(given[:-1])
            elif kind == "test":
                check = _parse_test(cell, meta, where)
                if check.task != current:
                    raise SourceError(f"{where}: test of task {check.task!r} must follow that task's "
                                      f"answer cell (only markdown or tests of the same task between)")
                pending[check.task].append(check)
            elif kind == "setup":
                _forbid_markers(cell.source, where, solution=True, hidden=True)
                timeout = meta.get("timeout")
                if timeout is not None:
                    self.setup_timeouts[gid] = float(timeout)
                    self.setup_timeouts[cell.get("id", gid)] = float(timeout)
                    self.setup_timeouts[normalise(cell.source)] = float(timeout)
                current = None
            elif cell.cell_type == "code":  # instructor-only code
                current = None
        for name, checks in pending.items():
            if not checks:
                raise SourceError(f"{self.path.name}: task {name!r} has no test cell")
            task = self.tasks[name]
            self.tasks[name] = Task(task.name, task.answer_id, task.answer_cell_id, task.names, tuple(checks),
                                    before[name])
        if not self.tasks:
            raise SourceError(f"{self.path.name}: no answer cells (grading kind 'answer')")

    def _parse_answer(self, cell: NotebookNode, meta: dict, where: str) -> str:
        task = meta.get("task")
        if not task:
            raise SourceError(f"{where}: an answer cell needs a task name")
        if task in self.tasks:
            raise SourceError(f"{where}: task {task!r} has a second answer cell; one per task")
        _forbid_markers(cell.source, where, solution=False, hidden=True)
        stubbed = stub_solutions(cell.source, task, where)
        if stubbed == cell.source:
            raise SourceError(f"{where}: answer cell without a '### BEGIN SOLUTION' region")
        try:
            names = defined_names(cell.source)
            ast.parse(stubbed)
        except SyntaxError as error:
            raise SourceError(f"{where}: answer cell (or its stub) is not valid Python: {error}") from None
        self.tasks[task] = Task(task, meta["id"], cell.get("id", meta["id"]), names)
        return task

    # --- student copy ---------------------------------------------------------------------------
    def student_copy(self) -> NotebookNode:
        """The notebook students get: stubs for solutions, no hidden tests, no outputs."""
        cells = []
        for cell in self.nb.cells:
            meta = cell.get("metadata", {}).get("grading")
            kind = meta.get("kind") if meta else None
            if kind == "instructor":
                continue
            source = cell.source
            if kind == "answer":
                source = stub_solutions(source, meta["task"], "")
            elif kind == "test":
                source = strip_hidden(source)
                if source is None:
                    continue
            cells.append(_clean_cell(cell, source, kind, meta))
        nb = nbformat.v4.new_notebook(cells=cells)
        nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"},
                       "grading": {"lab": self.name, "student_copy": True}}
        nb.nbformat, nb.nbformat_minor = 4, 5
        return nb


def _parse_test(cell: NotebookNode, meta: dict, where: str) -> Check:
    task = meta.get("task")
    points = meta.get("points")
    if not task:
        raise SourceError(f"{where}: a test cell needs a task name")
    if isinstance(points, bool) or not isinstance(points, (int, float)) or points <= 0:
        raise SourceError(f"{where}: a test cell needs positive points, got {points!r}")
    _forbid_markers(cell.source, where, solution=True, hidden=False)
    public = strip_hidden(cell.source, where)
    try:
        ast.parse(cell.source)
        if public is not None:
            ast.parse(public)
    except SyntaxError as error:
        raise SourceError(f"{where}: test cell (or its public part) is not valid Python: {error}") from None
    return Check(id=meta["id"], task=task, points=points, description=meta.get("description", ""),
                 source=cell.source, public_source=public)


def defined_names(source: str) -> tuple[str, ...]:
    """The top-level functions and classes `source` defines, in order. Raises SyntaxError."""
    return tuple(node.name for node in ast.parse(source).body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))


def normalise(source: str) -> str:
    """Source without leading/trailing blank lines and trailing spaces (for comparing cells)."""
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _forbid_markers(source: str, where: str, *, solution: bool, hidden: bool) -> None:
    for line in source.splitlines():
        if solution and (BEGIN_SOLUTION.match(line) or END_SOLUTION.match(line)):
            raise SourceError(f"{where}: solution markers belong in answer cells only")
        if hidden and (BEGIN_HIDDEN.match(line) or END_HIDDEN.match(line)):
            raise SourceError(f"{where}: hidden-test markers belong in test cells only")


def _regions(lines: list[str], begin: re.Pattern, end: re.Pattern, where: str) -> list[tuple[int, int]]:
    """``(begin_line, end_line)`` pairs, checked for balance and nesting."""
    regions, start = [], None
    for i, line in enumerate(lines):
        if begin.match(line):
            if start is not None:
                raise SourceError(f"{where}: line {i + 1}: nested BEGIN marker")
            start = i
        elif end.match(line):
            if start is None:
                raise SourceError(f"{where}: line {i + 1}: END marker without BEGIN")
            regions.append((start, i))
            start = None
    if start is not None:
        raise SourceError(f"{where}: line {start + 1}: BEGIN marker without END")
    return regions


def stub_solutions(source: str, task: str, where: str = "") -> str:
    """Replace every solution region by a stub raising ``NotImplementedError(task)``."""
    lines = source.splitlines()
    out, last = [], 0
    for begin, end in _regions(lines, BEGIN_SOLUTION, END_SOLUTION, where):
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        out += lines[last:begin]
        out += [f"{indent}{STUB_COMMENT}", f"{indent}raise NotImplementedError({task!r})"]
        last = end + 1
    out += lines[last:]
    return "\n".join(out)


def strip_hidden(source: str, where: str = "") -> str | None:
    """The public part of a test cell, or None when nothing but comments would remain."""
    lines = source.splitlines()
    keep, last = [], 0
    for begin, end in _regions(lines, BEGIN_HIDDEN, END_HIDDEN, where):
        keep += lines[last:begin]
        last = end + 1
    keep += lines[last:]
    while keep and not keep[-1].strip():
        keep.pop()
    code = [line for line in keep if line.strip() and not line.strip().startswith("#")]
    return "\n".join(keep) if code else None


def _region_texts(source: str, begin: re.Pattern, end: re.Pattern) -> list[str]:
    """The text inside each `begin` ... `end` region of a cell, markers excluded."""
    lines = source.splitlines()
    return ["\n".join(lines[b + 1:e]) for b, e in _regions(lines, begin, end, "")]


def solution_regions(source: str) -> list[str]:
    """The text inside each solution region of a cell (for checking that none leaks)."""
    return _region_texts(source, BEGIN_SOLUTION, END_SOLUTION)


def hidden_regions(source: str) -> list[str]:
    """The text inside each hidden-test region of a cell."""
    return _region_texts(source, BEGIN_HIDDEN, END_HIDDEN)


def secret_lines(lab: LabSource, min_length: int = 20) -> list[str]:
    """Lines of solution regions and hidden tests that must not reach students: those of at
    least `min_length` characters (shorter ones occur by chance) that are not comments and do
    not also appear in the student copy (which students see anyway)."""
    regions = [text for cell in lab.nb.cells
               for text in solution_regions(cell.source) + hidden_regions(cell.source)]
    seen = "\n".join(cell.source for cell in lab.student_copy().cells)
    lines = {line.strip() for region in regions for line in region.splitlines()}
    return sorted(line for line in lines
                  if len(line) >= min_length and not line.startswith("#") and line not in seen)


def _clean_cell(cell: NotebookNode, source: str, kind: str | None, meta: dict | None) -> NotebookNode:
    metadata: dict = {}
    tags = cell.get("metadata", {}).get("tags")
    if tags:
        metadata["tags"] = list(tags)
    if kind in STUDENT_KEYS:
        metadata["grading"] = {k: meta[k] for k in STUDENT_KEYS[kind] if k in meta}
    if kind == "test":
        metadata["editable"] = False
        metadata["deletable"] = False
    cell_id = cell.get("id")
    if cell.cell_type == "code":
        new = nbformat.v4.new_code_cell(source, id=cell_id)
    elif cell.cell_type == "markdown":
        new = nbformat.v4.new_markdown_cell(source, id=cell_id)
        if cell.get("attachments"):
            new.attachments = copy.deepcopy(cell.attachments)
    else:
        new = nbformat.v4.new_raw_cell(source, id=cell_id)
    new.metadata = metadata
    return new


# --- stable files and the generation step ------------------------------------------------------
def dumps(nb: NotebookNode) -> str:
    """One stable JSON form (sorted keys, one-space indent, trailing newline)."""
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def sources(root: Path) -> list[Path]:
    """Every lab source, ``solutions/lab*.ipynb``, in order."""
    return sorted((root / "solutions").glob("lab*.ipynb"))


def generate(root: str | Path, *, check: bool = False, labs: Iterable[str] | None = None) -> list[str]:
    """Write ``labs/X.ipynb`` for every ``solutions/X.ipynb`` (or only `labs`).

    With `check`, write nothing and return one line per lab whose committed student copy
    differs from what generation gives (missing, stale, or without a source); an empty list
    means up to date. Without `check`, return the paths written.
    """
    root = Path(root)
    wanted = set(labs) if labs is not None else None
    problems, written = [], []
    found = sources(root)
    for path in found:
        if wanted is not None and not any(path.stem.startswith(w) for w in wanted):
            continue
        text = dumps(LabSource.load(path).student_copy())
        target = root / "labs" / path.name
        if check:
            if not target.exists():
                problems.append(f"labs/{path.name}: missing (run: python -m utils.grading generate)")
            elif target.read_text(encoding="utf-8") != text:
                problems.append(f"labs/{path.name}: differs from what solutions/{path.name} generates "
                                "(run: python -m utils.grading generate)")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            written.append(str(target.relative_to(root)))
    if check and wanted is None:
        names = {p.name for p in found}
        for extra in sorted((root / "labs").glob("*.ipynb")):
            if extra.name not in names:
                problems.append(f"labs/{extra.name}: has no source solutions/{extra.name}")
    return problems if check else written


def find_lab(root: str | Path, lab: str) -> Path:
    """Resolve ``lab01``, ``lab01_measure_bubble`` or a path to a lab source notebook."""
    candidate = Path(lab)
    if candidate.suffix == ".ipynb" and candidate.exists():
        return candidate
    matches = [p for p in sources(Path(root)) if p.stem == lab or p.stem.startswith(lab + "_")]
    if len(matches) != 1:
        known = ", ".join(p.stem for p in sources(Path(root))) or "none"
        raise SourceError(f"no single lab source matches {lab!r} (known: {known})")
    return matches[0]
