"""Grade a folder of submissions in parallel and write grades, feedback and instructor files.

Each submission is graded in a process of its own (forked from this one, so nothing is
imported again), which starts its own kernel in its own temporary directory. A submission
that crashes its grading process, or runs past ``submission_timeout``, gets a result that
says so — the other submissions are not affected.

Every grading process runs under a `containment.Containment`: it is a child subreaper (so
every process the submission starts, double-forked daemons included, stays below it and is
ended with the submission), it dies with this process (parent-death signal; its kernel
too), and a watchdog keeps all of the submission's processes together within
`containment.Budget.memory_gb`. While the batch runs this process is a subreaper as well, so
what a submission leaves behind after killing its own grading process is ended here.

Results are durable: each grading process writes its result (stamped with the sha256 of
the submission, of the lab source, of the grader's code and of the options) atomically as
soon as it is known, and ``grades.csv``, ``results.json`` and the student's feedback are
rewritten atomically (temporary file, then rename) after every finished submission — a
batch killed at any moment leaves complete files for everyone finished. ``resume=True``
(``grade --resume``) then grades only the rest: a submission whose stamped result matches
is kept. Resuming is not the default, because a plain re-run is how an instructor re-grades
after a change the stamp cannot see (recorded runs, installed packages, a loaded machine
that caused timeouts).

Output folder::

    grades.csv                        one row per student: points per task, total, max, seconds, notes
    results.json                      every check of every student (student-safe messages only)
    feedback/<student>.md             what each student gets
    instructor/<student>.ipynb        the executed notebook WITH hidden checks: never hand it out
    instructor/<student>.log          the grading process's log
    instructor/<student>.result.json  the stamped result (what ``resume`` reads)
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import wait
from pathlib import Path

import psutil

from utils.system.procs import end_process_tree
from . import containment
from .containment import GIB, Budget, Containment
from .feedback import fmt, markdown, write_csv
from .grade import Options, SubmissionResult, grade_notebook, record_reference_runs
from .isolation import check_mode
from .notebook_source import LabSource, dumps

RESULT_FORMAT = 2
"""Version of ``instructor/<student>.result.json``: ``{"format", "stamp", "result"}``."""


@dataclass(frozen=True)
class Submission:
    student: str
    notebook: Path | None
    folder: Path | None = None
    """A submission folder: its other files are copied into the working directory."""
    problem: str | None = None


def safe_name(name: str) -> str:
    """A file-name-safe version of a student name (letters of any script are kept)."""
    return re.sub(r"[^\w.-]+", "_", name).strip("._") or "student"


def discover(folder: Path, lab: LabSource) -> list[Submission]:
    """``folder/<student>.ipynb`` files and ``folder/<student>/`` folders holding one notebook
    (or several, one of whose names starts with the lab's ``labNN``)."""
    found = []
    prefix = lab.name.split("_")[0]
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and entry.suffix == ".ipynb":
            found.append(Submission(entry.stem, entry))
        elif entry.is_dir():
            notebooks = sorted(p for p in entry.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
            named = [p for p in notebooks if p.name.startswith(prefix)]
            chosen = named if len(named) == 1 else notebooks
            if len(chosen) == 1:
                found.append(Submission(entry.name, chosen[0], entry))
            else:
                why = "没有 notebook" if not notebooks else f"有 {len(notebooks)} 个 notebook，无法确定哪个是 {prefix}"
                found.append(Submission(entry.name, None, entry, problem=why))
    return found


# --- durable files --------------------------------------------------------------------------------
def write_atomic(path: Path, text: str) -> None:
    """Write `text` so that `path` is always either the old or the new complete file, even
    when this process is killed halfway: a private temporary file, flushed to disk, renamed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))  # length-prefixed: no two inputs hash alike
        h.update(part)
    return h.hexdigest()


def submission_digest(s: Submission) -> str:
    """sha256 of what is graded: the notebook, and for a folder every file in it."""
    files = []
    if s.folder is not None:
        files = [p for p in sorted(s.folder.rglob("*")) if p.is_file() and ".ipynb_checkpoints" not in p.parts]
        parts = [part for p in files for part in (str(p.relative_to(s.folder)).encode(), p.read_bytes())]
    else:
        parts = [s.notebook.read_bytes()] if s.notebook is not None else []
    return _digest(*parts)


def _grader_digest() -> str:
    """sha256 of the grader's own code: a fixed grader re-grades on resume."""
    here = Path(__file__).parent
    return _digest(*(p.read_bytes() for p in sorted(here.glob("*.py"))))


def stamp(lab: LabSource, s: Submission, options: Options, budget: Budget, grader: str) -> dict:
    """What a result depends on; a stored result is reused by ``resume`` only if its stamp
    is equal."""
    graded = replace(options, executed_path=None, extra_files=None, keep_runs=None, judge_runs=None)
    return {"submission": submission_digest(s), "lab": _digest(lab.path.read_bytes()), "grader": grader,
            "options": json.dumps({"options": asdict(graded), "budget": asdict(budget)}, sort_keys=True,
                                  default=str)}


def write_result(path: Path, result: SubmissionResult, stamp: dict | None) -> None:
    write_atomic(path, json.dumps({"format": RESULT_FORMAT, "stamp": stamp, "result": result.to_dict()},
                                  ensure_ascii=False))


def read_result(path: Path) -> tuple[dict | None, SubmissionResult] | None:
    """A stored result and its stamp (None for a file of the old, unstamped format); None
    when the file is missing or not a complete result."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("format") == RESULT_FORMAT:
            return data.get("stamp"), SubmissionResult.from_dict(data["result"])
        return None, SubmissionResult.from_dict(data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


# --- one grading process ----------------------------------------------------------------------------
def _child(lab: LabSource, submission: Submission, options: Options, result_path: str, log_path: str,
           result_stamp: dict, budget: Budget, parent: int) -> None:
    """Body of a grading process: contain the submission, grade it, write the result, exit."""
    # A process group of its own: Ctrl-C in a terminal (or a kill of the batch's group)
    # reaches the batch process only, which ends this one and its tree; were this process
    # killed with it, it could not end the submission's processes itself.
    os.setpgid(0, 0)
    log = open(log_path, "a", encoding="utf-8", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    with Containment(budget, parent=parent, log=lambda text: print(text, flush=True)) as contained:
        # `lab` was read once, before any submission ran: what a submission does to the file on
        # disk cannot change how the next one is graded.
        try:
            result = grade_notebook(lab, submission.notebook, submission.student, options,
                                    log=lambda text: print(text, flush=True))
        except Exception as error:  # the grader itself failed: say so, score nothing
            import traceback
            traceback.print_exc()
            result = SubmissionResult.failed(lab, submission.student, f"grader error: {error!r}", why="评分程序出错")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"grading process peak RSS {peak:.0f} MiB; submission's processes peak {contained.peak / GIB:.2f} GiB"
          + (f"; memory budget exceeded {len(contained.trips)} time(s)" if contained.trips else ""), flush=True)
    write_result(Path(result_path), result, result_stamp)


def _kill(process: multiprocessing.Process) -> None:
    """Kill a grading process and everything it started (kernel, jobs) at once: no grace.
    The grading process is a subreaper, so its descendants are all of the submission's."""
    end_process_tree(process.pid, grace=0, reap=5)
    process.join(5)


def _end_adopted(known: set[int], workers: set[int]) -> None:
    """End processes re-parented to this (subreaper) process: what a submission left behind
    after its grading process died. `known`: children this process had before the batch."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        if child.pid not in known and child.pid not in workers:
            end_process_tree(child.pid, grace=0, reap=5)


def _load(lab: LabSource | str | Path) -> LabSource:
    return lab if isinstance(lab, LabSource) else LabSource.load(lab)


# --- a batch ----------------------------------------------------------------------------------------
def grade_batch(lab_path: LabSource | str | Path, submissions: str | Path, out: str | Path, *, workers: int = 2,
                options: Options | None = None, submission_timeout: float = 3600,
                echo: Callable[[str], None] = print, write: bool = True, budget: Budget | None = None,
                resume: bool = False) -> list[SubmissionResult]:
    """Grade every submission in `submissions` with `workers` processes; write `out`
    (unless `write` is False: then only the instructor/ files), updated after every
    submission. `lab_path` may be the loaded lab source. `budget`: what one submission may
    use in all (default `Budget()`). `resume`: keep stored results whose stamp matches."""
    lab = _load(lab_path)
    check_mode((options or Options()).limits.isolation)  # no sandbox here: one clear error, not N
    out = Path(out)
    (out / "instructor").mkdir(parents=True, exist_ok=True)
    _remove_leftovers(out)
    options = options or Options()
    if options.runs is None and options.judge_runs is None:  # the judges record the lab's jobs once
        options = replace(options, judge_runs=(out / "instructor" / "judge-runs").resolve())
    budget = budget or Budget()
    queue = discover(Path(submissions), lab)
    names = [safe_name(s.student) for s in queue]
    if len(set(names)) != len(names):
        raise ValueError("two submissions map to the same student name; rename one")
    results: list[SubmissionResult] = []
    echo(f"grading {len(queue)} submission(s) of {lab.name} with {workers} worker(s)")
    for s in [s for s in queue if s.problem]:
        results.append(SubmissionResult.failed(lab, s.student, s.problem))
        echo(f"  {s.student}: 0/{fmt(lab.max_points)} in 0.0 s  [{s.problem}]")
    queue = [s for s in queue if not s.problem]
    grader = _grader_digest()
    stamps = {s.student: stamp(lab, s, options, budget, grader) for s in queue}
    if resume:
        for s in list(queue):
            stored = read_result(out / "instructor" / f"{safe_name(s.student)}.result.json")
            if stored is not None and stored[0] == stamps[s.student]:
                results.append(stored[1])
                queue.remove(s)
                echo(f"  {s.student}: {fmt(stored[1].total)}/{fmt(lab.max_points)} (kept from the previous run)")
    # Isolated kernels see neither this batch's output (other students' results, executed
    # notebooks with hidden checks) nor the other submissions (after the stamps: where the
    # folders are does not change a result).
    options = replace(options, limits=replace(options.limits,
                                              hide=(*options.limits.hide, out, Path(submissions))))
    _warn_about_memory(budget, workers, echo)

    def publish(result: SubmissionResult | None) -> None:
        if write:  # the aggregate files, and the one new student's feedback
            write_outputs(out, results, lab, feedback=None if result is None else [result])

    publish(None)
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    running: dict[int, tuple[multiprocessing.Process, Submission, float, Path]] = {}
    batch_started = time.monotonic()
    was_subreaper = containment.is_child_subreaper()
    containment.set_child_subreaper(True)
    known = {c.pid for c in psutil.Process().children()}
    try:
        _run_queue(lab, queue, running, results, out, options, workers, context, submission_timeout, echo,
                   stamps, budget, publish, known)
    finally:  # Ctrl-C or a grader bug: leave no grading process (or kernel, or job) behind
        for process, *_ in running.values():
            _kill(process)
        _end_adopted(known, set())
        if not was_subreaper:
            containment.set_child_subreaper(False)
    echo(f"done in {time.monotonic() - batch_started:.1f} s: {out / 'grades.csv'}")
    return sorted(results, key=lambda r: r.student)


PROGRESS_EVERY = 30.0
"""Seconds between two progress lines of one submission (a new step shows at once when a
single worker grades, as `validate` does)."""


def _show_progress(running: dict, out: Path, workers: int, echo: Callable[[str], None],
                   shown: dict[str, tuple[str, float]]) -> None:
    """Echo what each long-running submission is doing: its step and elapsed time."""
    now = time.monotonic()
    for _, s, started, _ in running.values():
        try:
            step = (out / "instructor" / f"{safe_name(s.student)}.progress").read_text(encoding="utf-8")
        except OSError:
            continue
        last_step, last_time = shown.get(s.student, ("", started))
        if (step != last_step and workers <= 1) or now - last_time >= PROGRESS_EVERY:
            echo(f"    {s.student}: {step} — {now - started:.0f} s")
            shown[s.student] = (step, now)


def _remove_leftovers(out: Path) -> None:
    """Temporary files of `write_atomic` that a killed batch left in `out`."""
    for folder in (out, out / "feedback", out / "instructor"):
        for path in folder.glob(".*.tmp") if folder.is_dir() else []:
            if _TEMPORARY.fullmatch(path.name):
                path.unlink(missing_ok=True)


_TEMPORARY = re.compile(r"\..+\.\d+\.tmp")


def _warn_about_memory(budget: Budget, workers: int, echo: Callable[[str], None]) -> None:
    total = psutil.virtual_memory().total
    if budget.memory_gb and max(1, workers) * budget.memory_bytes > 0.9 * total:
        echo(f"warning: {workers} worker(s) x {budget.memory_gb:g} GiB memory budget is more than this "
             f"machine's {total / GIB:.0f} GiB: use fewer workers or a smaller budget")


def _run_queue(lab: LabSource, queue: list[Submission], running: dict, results: list[SubmissionResult],
               out: Path, options: Options, workers: int, context, submission_timeout: float,
               echo: Callable[[str], None], stamps: dict[str, dict], budget: Budget,
               publish: Callable[[SubmissionResult | None], None], known: set[int]) -> None:
    """Start up to `workers` grading processes at a time until `queue` is done; publish
    every result as soon as it is known."""
    shown: dict[str, tuple[str, float]] = {}
    while queue or running:
        while queue and len(running) < max(1, workers):
            s = queue.pop(0)
            name = safe_name(s.student)
            result_path = out / "instructor" / f"{name}.result.json"
            result_path.unlink(missing_ok=True)
            child_options = replace(options, executed_path=out / "instructor" / f"{name}.ipynb",
                                    extra_files=s.folder, progress_path=out / "instructor" / f"{name}.progress")
            process = context.Process(target=_child, args=(lab, s, child_options, str(result_path),
                                                           str(out / "instructor" / f"{name}.log"),
                                                           stamps[s.student], budget, os.getpid()), daemon=False)
            process.start()
            running[process.sentinel] = (process, s, time.monotonic(), result_path)
        wait(list(running), timeout=1.0)
        _show_progress(running, out, workers, echo, shown)
        for sentinel in list(running):
            process, s, started, result_path = running[sentinel]
            elapsed = time.monotonic() - started
            if process.exitcode is None and elapsed > submission_timeout:
                _kill(process)
                result = SubmissionResult.failed(lab, s.student, f"评分超过 {submission_timeout:g} 秒，已终止",
                                                 seconds=elapsed)
                write_result(result_path, result, stamps[s.student])  # final: resume keeps it
            elif process.exitcode is None:
                continue
            else:
                process.join()
                stored = read_result(result_path)
                if stored is not None:
                    result = stored[1]
                else:  # not stored: a resumed batch grades it again
                    result = SubmissionResult.failed(lab, s.student,
                                                     f"评分进程异常退出（exit code {process.exitcode}）",
                                                     seconds=elapsed)
            del running[sentinel]
            shown.pop(s.student, None)
            (out / "instructor" / f"{safe_name(s.student)}.progress").unlink(missing_ok=True)
            _end_adopted(known, {p.pid for p, *_ in running.values()})
            results.append(result)
            publish(result)
            echo(f"  {s.student}: {fmt(result.total)}/{fmt(lab.max_points)} in {result.seconds:.1f} s"
                 + (f"  [{result.error}]" if result.error else ""))


def write_outputs(out: Path, results: list[SubmissionResult], lab: LabSource, *,
                  feedback: list[SubmissionResult] | None = None) -> None:
    """grades.csv, results.json and the feedback files of `feedback` (default: everyone's),
    each written atomically, results.json last: a student it lists has a row in grades.csv
    and a feedback file, whenever the batch is killed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
    for r in results if feedback is None else feedback:
        write_atomic(out / "feedback" / f"{safe_name(r.student)}.md", markdown(r, lab))
    tmp = out / f".grades.csv.{os.getpid()}.tmp"
    write_csv(tmp, results, lab)
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, out / "grades.csv")
    write_atomic(out / "results.json", json.dumps(
        {"lab": lab.name, "max": lab.max_points, "tasks": {n: t.points for n, t in lab.tasks.items()},
         "students": [r.to_dict() for r in sorted(results, key=lambda r: r.student)]},
        ensure_ascii=False, indent=1))


def validate(lab_path: LabSource | str | Path, out: str | Path, *, runs_out: str | Path | None = None,
             options: Options | None = None, echo: Callable[[str], None] = print,
             budget: Budget | None = None) -> tuple[SubmissionResult, SubmissionResult]:
    """Grade the lab's own solution (it must get full marks) and its unchanged student copy
    (it must get none), through the same path as students' work.

    Unless `options.runs` gives recorded runs, the lab source first runs in a judge and its
    real jobs are recorded in `runs_out` (a folder under `out` when None); the solution and
    the student copy are then graded with them, so the lab's jobs run once (the solution's
    notebook launching them itself is what executing the source, e.g. under nbval, checks).
    Pass the same folder to ``grade --runs`` to spare every submission the jobs as well.
    `lab_path` may be the loaded lab source.
    """
    lab = _load(lab_path)
    out = Path(out)
    runs_out = Path(runs_out) if runs_out is not None else out / "recorded-runs"
    options = options or Options()
    with tempfile.TemporaryDirectory(prefix="validate-") as tmp:
        first, second = Path(tmp) / "solution", Path(tmp) / "empty"
        first.mkdir()
        second.mkdir()
        (first / "solution.ipynb").write_text(lab.path.read_text(encoding="utf-8"), encoding="utf-8")
        (second / "student_copy.ipynb").write_text(dumps(lab.student_copy()), encoding="utf-8")
        if options.runs is None:
            echo(f"validate {lab.name}: the lab source runs once in a judge; the real jobs it launches (if any) "
                 f"are recorded in {runs_out}")
            record_reference_runs(lab, runs_out, timeout=options.timeout)
        runs = runs_out if runs_out.exists() else options.runs
        echo(f"validate {lab.name}, 1/2: the solution must earn full marks (with the recorded runs)")
        solution = grade_batch(lab, first, out, workers=1, echo=echo, write=False, budget=budget,
                               options=replace(options, runs=runs, keep_runs=runs_out))[0]
        runs = runs_out if runs_out.exists() else options.runs
        echo(f"validate {lab.name}, 2/2: the unchanged student copy must earn nothing (reuses the runs just "
             "recorded: seconds)")
        empty = grade_batch(lab, second, out, workers=1, echo=echo, write=False, budget=budget,
                            options=replace(options, runs=runs))[0]
    write_outputs(out, [solution, empty], lab)
    return solution, empty
