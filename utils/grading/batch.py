"""Grade a folder of submissions in parallel and write grades, feedback and instructor files.

Each submission is graded in a process of its own (forked from this one, so nothing is
imported again), which starts its own kernel in its own temporary directory. A submission
that crashes its grading process, or runs past ``submission_timeout``, gets a result that
says so — the other submissions are not affected.

Output folder::

    grades.csv                 one row per student: points per task, total, max, seconds, notes
    results.json               every check of every student (student-safe messages only)
    feedback/<student>.md      what each student gets
    instructor/<student>.ipynb the executed notebook WITH hidden checks: never hand it out
    instructor/<student>.log   the grading process's log
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from pathlib import Path

from utils.system.procs import end_process_tree
from .feedback import fmt, markdown, write_csv
from .grade import Options, SubmissionResult, grade_notebook
from .notebook_source import LabSource, dumps


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


def _child(lab_path: str, submission: Submission, options: Options, result_path: str, log_path: str) -> None:
    """Body of a grading process: grade, write the result, exit."""
    log = open(log_path, "a", encoding="utf-8", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    lab = LabSource.load(lab_path)
    try:
        result = grade_notebook(lab, submission.notebook, submission.student, options,
                                log=lambda text: print(text, flush=True))
    except Exception as error:  # the grader itself failed: say so, score nothing
        import traceback
        traceback.print_exc()
        result = SubmissionResult.failed(lab, submission.student, f"grader error: {error!r}", why="评分程序出错")
    Path(result_path).write_text(json.dumps(result.to_dict(), ensure_ascii=False), encoding="utf-8")


def _kill(process: multiprocessing.Process) -> None:
    """Kill a grading process and everything it started (kernel, jobs) at once: no grace."""
    end_process_tree(process.pid, grace=0, reap=5)
    process.join(5)


def _load(lab: LabSource | str | Path) -> LabSource:
    return lab if isinstance(lab, LabSource) else LabSource.load(lab)


def grade_batch(lab_path: LabSource | str | Path, submissions: str | Path, out: str | Path, *, workers: int = 2,
                options: Options | None = None, submission_timeout: float = 3600,
                echo: Callable[[str], None] = print, write: bool = True) -> list[SubmissionResult]:
    """Grade every submission in `submissions` with `workers` processes; write `out`
    (unless `write` is False: then only the instructor/ files). `lab_path` may be the
    loaded lab source."""
    lab = _load(lab_path)
    out = Path(out)
    (out / "instructor").mkdir(parents=True, exist_ok=True)
    options = options or Options()
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
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    running: dict[int, tuple[multiprocessing.Process, Submission, float, Path]] = {}
    batch_started = time.monotonic()
    try:
        _run_queue(lab, queue, running, results, out, options, workers, context, submission_timeout, echo)
    finally:  # Ctrl-C or a grader bug: leave no grading process (or kernel, or job) behind
        for process, *_ in running.values():
            _kill(process)
    if write:
        write_outputs(out, results, lab)
    echo(f"done in {time.monotonic() - batch_started:.1f} s: {out / 'grades.csv'}")
    return sorted(results, key=lambda r: r.student)


def _run_queue(lab: LabSource, queue: list[Submission], running: dict, results: list[SubmissionResult],
               out: Path, options: Options, workers: int, context, submission_timeout: float,
               echo: Callable[[str], None]) -> None:
    """Start up to `workers` grading processes at a time until `queue` is done."""
    while queue or running:
        while queue and len(running) < max(1, workers):
            s = queue.pop(0)
            name = safe_name(s.student)
            result_path = out / "instructor" / f"{name}.result.json"
            result_path.unlink(missing_ok=True)
            child_options = replace(options, executed_path=out / "instructor" / f"{name}.ipynb",
                                    extra_files=s.folder)
            process = context.Process(target=_child, args=(str(lab.path), s, child_options, str(result_path),
                                                           str(out / "instructor" / f"{name}.log")), daemon=False)
            process.start()
            running[process.sentinel] = (process, s, time.monotonic(), result_path)
        wait(list(running), timeout=1.0)
        for sentinel in list(running):
            process, s, started, result_path = running[sentinel]
            elapsed = time.monotonic() - started
            if process.exitcode is None and elapsed > submission_timeout:
                _kill(process)
                result = SubmissionResult.failed(lab, s.student, f"评分超过 {submission_timeout:g} 秒，已终止",
                                                 seconds=elapsed)
            elif process.exitcode is None:
                continue
            else:
                process.join()
                try:
                    result = SubmissionResult.from_dict(json.loads(result_path.read_text(encoding="utf-8")))
                except (OSError, ValueError, TypeError):
                    result = SubmissionResult.failed(lab, s.student,
                                                     f"评分进程异常退出（exit code {process.exitcode}）",
                                                     seconds=elapsed)
            del running[sentinel]
            results.append(result)
            echo(f"  {s.student}: {fmt(result.total)}/{fmt(lab.max_points)} in {result.seconds:.1f} s"
                 + (f"  [{result.error}]" if result.error else ""))


def write_outputs(out: Path, results: list[SubmissionResult], lab: LabSource) -> None:
    """grades.csv, results.json and one feedback file per student."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
    write_csv(out / "grades.csv", results, lab)
    (out / "results.json").write_text(json.dumps(
        {"lab": lab.name, "max": lab.max_points, "tasks": {n: t.points for n, t in lab.tasks.items()},
         "students": [r.to_dict() for r in sorted(results, key=lambda r: r.student)]},
        ensure_ascii=False, indent=1), encoding="utf-8")
    for r in results:
        (out / "feedback" / f"{safe_name(r.student)}.md").write_text(markdown(r, lab), encoding="utf-8")


def validate(lab_path: LabSource | str | Path, out: str | Path, *, runs_out: str | Path | None = None,
             options: Options | None = None, echo: Callable[[str], None] = print
             ) -> tuple[SubmissionResult, SubmissionResult]:
    """Grade the lab's own solution (it must get full marks) and its unchanged student copy
    (it must get none), through the same path as students' work.

    The solution runs first; the runs it records (real jobs) are kept in `runs_out` (a
    folder under `out` when None) and handed to the student copy, so the lab's jobs run once.
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
        solution = grade_batch(lab, first, out, workers=1, echo=echo, write=False,
                               options=replace(options, keep_runs=runs_out))[0]
        runs = runs_out if runs_out.exists() else options.runs
        empty = grade_batch(lab, second, out, workers=1, echo=echo, write=False,
                            options=replace(options, runs=runs))[0]
    write_outputs(out, [solution, empty], lab)
    return solution, empty
