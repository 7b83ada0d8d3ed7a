"""Grade one submission: match its cells to the lab source, run them with the instructor's
checks re-inserted, and score every check.

What runs is the student's notebook, code cell by code cell, **minus** every cell that is a
test cell (by metadata, or by being a copy of a public test) **plus** the instructor's checks
taken from the lab *source* (public and hidden), each placed right after the student's
answer to its task. Checks do not run in the student's kernel: the judge runs them against
a trusted reference and calls the student's functions with plain data (`judge`). The answer to a task is found, in this order, by

1. the cell's ``grading`` id (or its nbformat cell id) from the student copy,
2. a cell that defines the task's function (or class) — the last such cell wins, as it
   would when the notebook runs top to bottom — taking the later of 1 and 2,
3. position, when the submission has exactly as many code cells as the student copy,

and when nothing matches, the task's checks run at the end of the notebook. So deleting,
editing or moving test cells changes nothing, and a student whose notebook lost its cell
metadata is graded the same. Student cells after the last check are not run: they cannot
change a score. A setup cell keeps the timeout the source gives it when it is recognised by
grading id, cell id or unchanged source.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import nbformat

from utils.system.paths import PROJECT_ROOT
from . import containment
from .check_api import SEED_ENV
from .execute import Cell, CellOutcome, kernel_env, run_cells
from .feedback import explain_check, explain_cell
from .isolation import IPYTHON_DIR, check_mode
from .judge import Judge, JudgeError, JudgedCheck, judge_env
from .notebook_source import KERNELSPEC, Check, LabSource, defined_names, normalise
from .sandbox import Limits

DEFAULT_CELL_TIMEOUT = 120.0
#: What deserves a human look in a student's code, and why. Checks run outside the kernel, so
#: none of this can change a check's verdict on the values a function returns; it can undo a
#: lab's rule that runs inside the kernel (`check_api.forbidding`), or reach for the answers.
REVIEW_SIGNS: tuple[tuple[str, str], ...] = (
    (r"input_transformers|ast_transformers|set_custom_exc|events\.register|register_magic|sys\.settrace",
     "changes how the kernel runs cells"),
    (r"import\s+builtins|__builtins__", "replaces builtins"),
    (r"import_module|__import__|importlib|sys\.modules", "reaches modules by a name built at run time"),
    (r"__code__|types\.FunctionType|types\.CodeType", "handles function code objects (can undo a lab's library ban)"),
    (r"_getframe|f_globals|f_back|inspect\.stack|inspect\.currentframe", "inspects the caller's frames"),
    (r"(?<![\w.])(exec|eval|compile)\s*\(", "runs code built at run time"),
    (r"utils\.grading|student_side|check_api|from\s+utils\s+import\s+[\w\s,]*\bgrading\b|display_pub|"
     r"publish_display_data|grading-reply", "touches the grader (its entry point in the kernel or its replies)"),
    (r"__subclasses__|__closure__|cell_contents|__defaults__|__kwdefaults__|__setattr__|\bgc\.|import\s+gc\b|"
     r"\bctypes\b", "reaches objects by introspection (the grader's entry point, its state, a ban's saved code)"),
    (r"(?<![\w.])(globals|vars|locals)\(\s*\)", "handles the namespace as a dict (names built at run time)"),
    (r"\bsubprocess\b|os\.(system|popen|exec\w*|spawn\w*|fork)\b|\bmultiprocessing\b|\bpty\b",
     "runs code in another process, where a lab's library ban does not apply"),
    (r"\brunpy\b|\breload\s*\(|spec_from_file_location|SourceFileLoader|exec_module",
     "loads a fresh copy of a module, whose functions a lab's library ban does not swap"),
    (r"solutions/|HIDDEN TESTS", "reaches for the answers"),
)


def review_notes(sources: list[str], given: str = "") -> list[str]:
    """``"<what matched>: <why>"`` for each sign found in the student's code (see
    `REVIEW_SIGNS`). Lines that also occur in `given` (the code the student copy hands out,
    which may itself import the grader's `check_api`) are not the student's and not read."""
    ours = {line.strip() for line in given.splitlines()}
    text = "\n".join(line for s in sources for line in s.splitlines() if line.strip() not in ours)
    notes = []
    for pattern, why in REVIEW_SIGNS:
        found = sorted({m.group(0).strip("( ") for m in re.finditer(pattern, text)})
        if found:
            notes.append(f"{', '.join(found)}: {why}")
    return notes


# --- reading a submission -----------------------------------------------------------------------
@dataclass(frozen=True)
class SubmittedCell:
    """A cell of a submission, read without trusting its structure."""

    cell_type: str
    source: str
    metadata: dict
    cell_id: str | None

    @property
    def grading(self) -> dict:
        value = self.metadata.get("grading") if isinstance(self.metadata, dict) else None
        return value if isinstance(value, dict) else {}


def read_submission(path: str | Path) -> list[SubmittedCell]:
    """The cells of a notebook file, tolerating missing metadata, ids or outputs (which
    nbformat's validator rejects). Raises ValueError when the file is not a notebook."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {Path(path).name} as a notebook: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{Path(path).name} is not a notebook (no cells)")
    if "worksheets" in data:  # nbformat 3
        data = nbformat.convert(nbformat.from_dict(data), 4)
    raw = data.get("cells")
    if not isinstance(raw, list):
        raise ValueError(f"{Path(path).name} is not a notebook (no cells)")
    cells = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        source = item.get("source", "")
        if isinstance(source, list):
            source = "".join(str(s) for s in source)
        metadata = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
        cells.append(SubmittedCell(str(item.get("cell_type", "code")), str(source), metadata,
                                   item.get("id") if isinstance(item.get("id"), str) else None))
    return cells


# --- planning: which cells run, in which order ----------------------------------------------------
@dataclass
class Planned:
    """A cell of the graded run: a student cell or an instructor check."""

    source: str
    """Student cells: what runs in the kernel. Checks: the check's full source (run by the
    judge; kept for the instructor notebook only)."""
    timeout: float
    check: Check | None = None
    number: int | None = None
    """For student cells: the position among the submission's code cells (1-based)."""


def _defines(source: str, names: tuple[str, ...]) -> bool:
    if not names:
        return False
    try:
        return any(name in names for name in defined_names(source))
    except SyntaxError:
        return any(re.search(rf"^(async\s+def|def|class)\s+{re.escape(n)}\b", source, re.M) for n in names)


def _recognised(cell: SubmittedCell, keys: frozenset[str]) -> bool:
    """Whether `cell` is the source cell known by `keys` (grading id, cell id or its source)."""
    return bool({cell.grading.get("id"), cell.cell_id, normalise(cell.source)} & keys)


def plan(lab: LabSource, cells: list[SubmittedCell], timeout: float) -> tuple[list[Planned], list[str]]:
    """The cells to run and notes on how tasks were matched (see the module doc)."""
    code = [(n, c) for n, c in enumerate((c for c in cells if c.cell_type == "code"), start=1)]
    check_ids = {c.id for c in lab.checks}
    public = {normalise(c.public_source) for c in lab.checks if c.public_source}

    def is_test(cell: SubmittedCell) -> bool:
        g = cell.grading
        return g.get("kind") == "test" or g.get("id") in check_ids or normalise(cell.source) in public

    kept = [(n, c) for n, c in code if not is_test(c)]
    template = [c for c in lab.student_copy().cells if c.cell_type == "code"]
    positional = len(template) == len(code)
    notes: list[str] = []
    where: dict[str, int | None] = {}
    for task in lab.tasks.values():
        by_id = [i for i, (_, c) in enumerate(kept)
                 if c.grading.get("id") == task.answer_id or (c.cell_id and c.cell_id == task.answer_cell_id)]
        by_name = [i for i, (_, c) in enumerate(kept) if _defines(c.source, task.names)]
        found = by_id + by_name
        if found:
            # After the answer and after every cell the source runs before the task, wherever
            # the student moved them (answers in one cell above the set-up are graded fairly).
            needed = [i for i, (_, c) in enumerate(kept)
                      if any(_recognised(c, keys) for keys in task.prerequisites)]
            where[task.name] = max(found + needed)
            continue
        where[task.name] = None
        if positional:
            k = next(i for i, c in enumerate(template) if c.metadata.get("grading", {}).get("id") == task.answer_id)
            number = code[k][0]
            where[task.name] = next((i for i, (n, _) in enumerate(kept) if n == number), None)
        if where[task.name] is None:
            notes.append(f"没有找到任务 {task.name} 的答案单元：它的检查在 notebook 末尾运行")
        else:
            notes.append(f"任务 {task.name} 的答案单元按位置匹配（单元元数据丢失）")

    def student_timeout(cell: SubmittedCell) -> float:
        for key in (cell.grading.get("id"), cell.cell_id, normalise(cell.source)):
            if key and key in lab.setup_timeouts:
                return lab.setup_timeouts[key]
        return timeout

    planned: list[Planned] = []
    for i, (number, cell) in enumerate(kept):
        planned.append(Planned(cell.source, student_timeout(cell), number=number))
        for task in lab.tasks.values():
            if where[task.name] == i:
                planned += [Planned(c.source, timeout, check=c) for c in task.checks]
    for task in lab.tasks.values():
        if where[task.name] is None:
            planned += [Planned(c.source, timeout, check=c) for c in task.checks]
    last_check = max(i for i, p in enumerate(planned) if p.check is not None)
    return planned[:last_check + 1], notes


# --- results ----------------------------------------------------------------------------------
@dataclass
class CheckResult:
    """One check of one submission; `message` is safe to show the student."""

    id: str
    task: str
    description: str
    hidden: bool
    points: float
    earned: float
    status: str
    message: str = ""
    seconds: float = 0.0


@dataclass
class CellIssue:
    """A student cell that failed or timed out (their own code: safe to describe)."""

    number: int
    status: str
    message: str
    excerpt: str = ""
    """The cell's first line, so the student finds it."""


@dataclass
class SubmissionResult:
    student: str
    lab: str
    checks: list[CheckResult] = field(default_factory=list)
    issues: list[CellIssue] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    review: list[str] = field(default_factory=list)
    """What in the student's code deserves a look, each with the reason (`review_notes`)."""
    error: str | None = None
    """Why grading itself failed (unreadable notebook, grader crash); scores are then 0."""
    seconds: float = 0.0
    seed: int | None = None
    """The seed the hidden checks drew their inputs from (`check_api.hidden_seed`): regrade
    with ``Options(seed=...)`` / ``grade --seed`` to draw the same inputs again."""

    @classmethod
    def failed(cls, lab: LabSource, student: str, error: str, *, why: str | None = None,
               seconds: float = 0.0) -> SubmissionResult:
        """A result with every check not run, because grading could not go on (`error`);
        `why` is each check's message (default: `error`)."""
        checks = [CheckResult(c.id, c.task, c.description, c.hidden, c.points, 0.0, "not_run", why or error)
                  for c in lab.checks]
        return cls(student, lab.name, checks=checks, error=error, seconds=seconds)

    def per_task(self, lab: LabSource) -> dict[str, float]:
        earned = {name: 0.0 for name in lab.tasks}
        for c in self.checks:
            earned[c.task] = earned.get(c.task, 0.0) + c.earned
        return earned

    @property
    def total(self) -> float:
        return sum(c.earned for c in self.checks)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SubmissionResult:
        data = dict(data)
        data["checks"] = [CheckResult(**c) for c in data.get("checks", [])]
        data["issues"] = [CellIssue(**c) for c in data.get("issues", [])]
        return cls(**data)


@dataclass
class Options:
    """How to grade: timeouts, limits, recorded runs, where to keep the executed notebook."""

    timeout: float | None = None
    """Per-cell timeout (seconds) for cells without their own; None: the lab's default."""
    limits: Limits = field(default_factory=Limits)
    runs: Path | None = None
    """A runs folder copied into the submission's own ``runs/`` before its kernel starts."""
    executed_path: Path | None = None
    """Write the executed notebook (with hidden checks: instructors only) here."""
    keep_runs: Path | None = None
    """Copy the runs the submission produced here (to record a lab's runs once)."""
    judge_runs: Path | None = None
    """A runs folder the judges share (the grader's own, never shown to a kernel): the first
    judge that needs the lab's jobs records them there and later judges find them. None:
    each judge starts from a copy of `runs` (or from nothing)."""
    progress_path: Path | None = None
    """A file rewritten before every step with what runs now (`batch` shows it)."""
    extra_files: Path | None = None
    """A folder whose files are copied into the working directory (a submission folder);
    dot-files and dot-folders (``.ipython/``, ``.config/``...) are left out."""
    seed: int | None = None
    """The seed of the hidden checks' inputs (`check_api.hidden_seed`); None: a fresh one per
    submission, recorded in its result."""


def grade_notebook(lab: LabSource, path: str | Path, student: str, options: Options | None = None,
                   log=lambda text: None) -> SubmissionResult:
    """Grade one notebook file in a fresh kernel and temporary working directory."""
    return asyncio.run(_grade(lab, Path(path), student, options or Options(), log))


async def _grade(lab: LabSource, path: Path, student: str, options: Options, log) -> SubmissionResult:
    started = time.monotonic()
    check_mode(options.limits.isolation)  # isolation asked for and not available: refuse, loudly
    try:
        cells = read_submission(path)
    except ValueError as error:
        return SubmissionResult.failed(lab, student, str(error), why="无法读取提交的 notebook",
                                       seconds=time.monotonic() - started)
    result = SubmissionResult(student=student, lab=lab.name,
                              seed=options.seed if options.seed is not None else secrets.randbelow(2 ** 31))
    timeout = options.timeout or lab.cell_timeout or DEFAULT_CELL_TIMEOUT
    planned, result.notes = plan(lab, cells, timeout)
    given = "\n".join(c.source for c in lab.student_copy().cells if c.cell_type == "code")
    result.review = review_notes([p.source for p in planned if p.check is None], given)
    workdir = Path(tempfile.mkdtemp(prefix="grading-"))
    judge_dir = Path(tempfile.mkdtemp(prefix="judge-"))
    # An isolated kernel sees neither the lab source (answers, hidden checks) nor the
    # submitted file; the batch adds its output and submissions folders.
    limits = replace(options.limits, hide=(*options.limits.hide, lab.path, path))
    judge = Judge(lab, judge_dir, {**judge_env(judge_dir, PROJECT_ROOT, options.judge_runs), SEED_ENV: str(result.seed)},
                  prepare_timeout=_reference_timeout(lab, timeout))
    contained = containment.active()
    try:
        if options.extra_files is not None:
            # No dot-entries: a folder's .ipython/profile_default/startup/*.py would run before
            # any check. Symbolic links are copied as links, never followed.
            shutil.copytree(options.extra_files, workdir, dirs_exist_ok=True, symlinks=True,
                            ignore=shutil.ignore_patterns("*.ipynb", ".*"))
        if options.runs is not None:  # the same recorded runs for the kernel and the judge
            shutil.copytree(options.runs, workdir / "runs", dirs_exist_ok=True)
            if options.judge_runs is None:
                shutil.copytree(options.runs, judge_dir / "runs", dirs_exist_ok=True)
        (workdir / IPYTHON_DIR).mkdir(exist_ok=True)  # the kernel's IPYTHONDIR: fresh, the grader's
        steps = [Cell(p.source, p.timeout) if p.check is None else JudgedCheck(p.check, p.timeout, judge)
                 for p in planned]
        if contained is not None:  # what the submission writes into its folder: bounded (Budget.disk_mib)
            contained.watch_disk(workdir)
        first_check = next((p.check for p in planned if p.check is not None), None)
        if first_check is not None:
            judge.prepare_early(first_check)
        try:
            outcomes = await run_cells(steps, workdir, kernel_env(workdir, PROJECT_ROOT), limits, log=log,
                                       on_step=_progress_writer(planned, options.progress_path))
        except JudgeError as error:
            # The lab source itself failed in the judge: nobody's answers can be judged.
            log(f"judge: {error}")
            return SubmissionResult.failed(lab, student, "评分器的参考运行失败（教师端问题，与你的代码无关）",
                                           seconds=time.monotonic() - started)
        for p, outcome in zip(planned, outcomes):
            _record(result, p, outcome)
        if options.executed_path is not None:
            _save_executed(planned, outcomes, options.executed_path, lab)
        if options.keep_runs is not None and (workdir / "runs").exists():
            shutil.copytree(workdir / "runs", options.keep_runs, dirs_exist_ok=True)
    finally:
        if contained is not None:
            contained.watch_disk(None)
        await judge.stop()
        if options.executed_path is not None and judge.log.exists():  # what the judge printed
            shutil.copy(judge.log, options.executed_path.with_suffix(".judge.log"))
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(judge_dir, ignore_errors=True)
    result.seconds = time.monotonic() - started
    return result


def record_reference_runs(lab: LabSource, runs: Path, *, timeout: float | None = None) -> None:
    """Run the lab source in a judge up to its last check, recording the real jobs its cells
    launch in `runs` (``WORKBOOK_RUNS``). `validate` does this first, so that the solution's
    kernel, its judge and the student copy's all find the jobs recorded (``Options.runs``)
    and the lab's jobs run once, not once per process. Raises JudgeError if the source fails."""
    last = max(lab.checks, key=lambda c: next(i for i, cell in enumerate(lab.nb.cells)
                                              if (cell.metadata.get("grading") or {}).get("id") == c.id))
    judge_dir = Path(tempfile.mkdtemp(prefix="judge-"))
    judge = Judge(lab, judge_dir, judge_env(judge_dir, PROJECT_ROOT, runs),
                  prepare_timeout=_reference_timeout(lab, timeout or lab.cell_timeout or DEFAULT_CELL_TIMEOUT))

    async def prepare() -> None:
        try:
            await judge.prepare(last)
        finally:
            await judge.stop()

    try:
        asyncio.run(prepare())
    finally:
        shutil.rmtree(judge_dir, ignore_errors=True)


def _progress_writer(planned: list[Planned], path: Path | None):
    """``on_step`` for `run_cells`: write "step i/n: what" to `path` (atomically)."""
    def write(index: int) -> None:
        if path is None:
            return
        p = planned[index]
        what = (f"check {p.check.id}" if p.check is not None
                else f"code cell {p.number}" + (f" (up to {p.timeout:g} s)" if p.timeout > 300 else ""))
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(f"step {index + 1}/{len(planned)}: {what}", encoding="utf-8")
        os.replace(tmp, path)
    return write


def _reference_timeout(lab: LabSource, timeout: float) -> float:
    """Seconds the judge may take to run the whole lab source: every code cell's timeout."""
    cells = [c for c in lab.nb.cells if c.cell_type == "code"]
    return sum(lab.setup_timeouts.get((c.metadata.get("grading") or {}).get("id"), timeout) for c in cells)


def _record(result: SubmissionResult, p: Planned, outcome: CellOutcome) -> None:
    if p.check is None:
        if outcome.status != "ok":
            first = next((line.strip() for line in p.source.splitlines() if line.strip()), "")
            first = first.replace("`", "'")
            excerpt = first if len(first) <= 60 else first[:57] + "..."
            result.issues.append(CellIssue(p.number or 0, outcome.status, explain_cell(outcome, p.timeout),
                                           excerpt))
        return
    c = p.check
    if outcome.tampered:
        result.review.append(f"check {c.id}: {outcome.tampered}")
    passed = outcome.ok
    result.checks.append(CheckResult(
        id=c.id, task=c.task, description=c.description, hidden=c.hidden, points=c.points,
        earned=c.points if passed else 0.0, status="passed" if passed else outcome.status,
        message="" if passed else explain_check(c, outcome, p.timeout), seconds=round(outcome.seconds, 3)))


def _save_executed(planned: list[Planned], outcomes: list[CellOutcome], path: Path, lab: LabSource) -> None:
    cells = []
    for p, outcome in zip(planned, outcomes):
        cell = nbformat.v4.new_code_cell(p.source)
        cell.outputs = [nbformat.from_dict(o) for o in outcome.outputs]
        cell.metadata["grading_run"] = {"status": outcome.status, "seconds": round(outcome.seconds, 3),
                                        "check": p.check.id if p.check else None, "student_cell": p.number}
        cells.append(cell)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {"kernelspec": dict(KERNELSPEC),
                   "grading": {"lab": lab.name, "executed_for_grading": True,
                               "warning": "contains hidden tests: instructors only"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
