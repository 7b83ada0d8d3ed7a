"""A batch killed at any moment (attack B: SIGKILL of ``python -m utils.grading grade``)
leaves complete grades for everyone finished and no process behind, and ``--resume`` grades
only the rest — to the same grades as a run that was never interrupted."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.grading.submissions import ROOT, TEST_TIMEOUT, build
from utils.grading.notebook_source import LabSource, find_lab

LAB = LabSource.load(find_lab(ROOT, "lab03"))
KINDS = {"a_correct": "correct", "b_sleepy": "correct", "c_partly_wrong": "partly_wrong", "d_raising": "raising",
         "e_empty": "empty"}
"""Student name -> kind; graded in name order with one worker: "b_sleepy" (a set-up cell
that sleeps) keeps the batch busy after the first result, when it is killed."""


def _write_submissions(folder: Path) -> None:
    folder.mkdir(parents=True)
    for student, kind in KINDS.items():
        text = build(LAB, kind)
        if student == "b_sleepy":
            nb = json.loads(text)
            nb["cells"].insert(0, {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                   "source": "import time\ntime.sleep(4)"})
            text = json.dumps(nb, ensure_ascii=False)
        (folder / f"{student}.ipynb").write_text(text, encoding="utf-8")


def _grade(folder: Path, out: Path, env: dict, *extra: str, background: bool = False, workers: int = 1):
    command = [sys.executable, "-m", "utils.grading", "grade", "lab03", str(folder), "--out", str(out),
               "--workers", str(workers), "--timeout", str(TEST_TIMEOUT), *extra]
    if background:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _students(out: Path) -> list[str]:
    try:
        return [s["student"] for s in json.loads((out / "results.json").read_text(encoding="utf-8"))["students"]]
    except (OSError, ValueError, KeyError):
        return []


def _rows(out: Path) -> dict[str, dict]:
    """grades.csv without the seconds column (timing differs between runs)."""
    rows = list(csv.DictReader((out / "grades.csv").open(encoding="utf-8")))
    return {r["student"]: {k: v for k, v in r.items() if k != "seconds"} for r in rows}


def _left_behind(*paths: Path) -> list[str]:
    """Processes whose command line, working directory or environment names one of `paths`
    (the batch's grading processes name the output folder; kernels run in temporary
    directories under the test's own TMPDIR)."""
    needles = [str(p) for p in paths]
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            where = " ".join(p.info["cmdline"] or []) + " " + (p.info["cwd"] or "")
            if not any(n in where for n in needles):
                where += " " + " ".join(p.environ().values())
            if any(n in where for n in needles):
                found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:120]}")
        except psutil.Error:
            continue
    return found


def test_a_killed_batch_keeps_finished_results_and_resume_completes_it(tmp_path):
    folder = tmp_path / "submissions"
    _write_submissions(folder)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    out = tmp_path / "out"

    batch = _grade(folder, out, env, background=True)
    try:
        deadline = time.monotonic() + 120
        while not _students(out) and batch.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert batch.poll() is None, "the batch ended before it could be killed: " + batch.stdout.read()
        os.kill(batch.pid, signal.SIGKILL)  # the top process only, as the OOM killer or `kill -9 PID` would
        batch.wait(10)
    finally:
        if batch.poll() is None:
            batch.kill()

    # Complete files for the students finished when it died, and nothing running any more.
    finished = _students(out)
    assert finished and set(finished) < set(KINDS)
    assert sorted(_rows(out)) == sorted(finished)
    assert sorted(p.stem for p in (out / "feedback").glob("*.md")) == sorted(finished)
    deadline = time.monotonic() + 15
    while _left_behind(out, scratch) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _left_behind(out, scratch), "processes of the killed batch are still running"

    # Resumed: the finished students are kept (not graded again), the rest graded.
    kept = {s: (out / "instructor" / f"{s}.result.json").stat().st_mtime_ns for s in finished}
    stdout = _grade(folder, out, env, "--resume")
    for student in finished:
        assert f"{student}: " in stdout and "kept from the previous run" in stdout
        assert (out / "instructor" / f"{student}.result.json").stat().st_mtime_ns == kept[student]
    assert sorted(_students(out)) == sorted(KINDS)

    # The same grades as a run that was never interrupted (two at a time: grades do not depend on it).
    whole = tmp_path / "whole"
    _grade(folder, whole, env, workers=2)
    assert _rows(out) == _rows(whole)
    assert _rows(whole)["a_correct"]["total"] == "10" and _rows(whole)["d_raising"]["total"] == "8"

    # A changed submission is graded again on resume; the others are kept.
    (folder / "a_correct.ipynb").write_text(build(LAB, "empty"), encoding="utf-8")
    stdout = _grade(folder, out, env, "--resume")
    assert "a_correct: 0/10 in" in stdout
    assert stdout.count("kept from the previous run") == len(KINDS) - 1
