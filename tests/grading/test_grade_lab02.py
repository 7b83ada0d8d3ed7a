"""Grading lab 2, which starts with a real DeepSpeed job.

The lab's job ran once, when nbval executed the solution (or, this file run alone, in a
judge, as `validate` records it); the solution and every prepared submission are graded with
that recorded run (``grade --runs``), as an instructor does for a class: the lab reuses a
recorded run whose spec matches, so each submission is graded in seconds. Every kind of
submission is scored exactly.
"""

from __future__ import annotations

import csv

import pytest

from tests.grading.submissions import (ROOT, TEST_TIMEOUT, assert_nothing_hidden_leaks, not_passed, solution_runs,
                                       write_all)
from utils.grading import Options, grade_batch
from utils.grading.grade import record_reference_runs
from utils.grading.notebook_source import LabSource, find_lab
from utils.jobs.runs import list_runs

pytestmark = pytest.mark.integration

LAB = LabSource.load(find_lab(ROOT, "lab02"))
FULL = {"compute_intervals": 3, "makespan": 2, "stage_utilisation": 3, "bubble_ratio": 2}
NONE = {task: 0 for task in FULL}
PARTLY = {**FULL, "stage_utilisation": 2, "bubble_ratio": 0}
"""Utilisation that skips idle stages passes on the real run, fails the synthetic check;
the bubble ratio without its "1 -" fails both checks."""
EXPECTED = {
    "correct": FULL,
    "partly_wrong": PARTLY,
    "raising": {**FULL, "bubble_ratio": 0},  # the stray raise after compute_intervals' def costs nothing
    "tests_edited": PARTLY,
    "tests_deleted": FULL,
    "liar": NONE,
    "empty": NONE,
    "metadata_lost": FULL,
    # Attacks: the checks' reference values and helpers live in the judge, out of reach.
    "patched_reference": PARTLY,  # utils.compute_metrics patched in the kernel to agree
    "frame_reader": {**FULL, "bubble_ratio": 0},  # found no expected value up the stack
    "history_leak": {**FULL, "bubble_ratio": 0},
    # The module's call/describe replaced: the grader reaches its entry point without the module's
    # names (student_side.ENTRY_EXPRESSION), so the swap changes nothing: the honest score, flagged.
    "runner_swap": PARTLY,
    # The library's metrics instead of the student's own (issue 15): forbidden while checks call.
    "metrics_shortcut": NONE,
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, record_timings):
    """The lab's real job as nbval's run of the solution left it (`solution_runs`), else
    recorded once in a judge (as `validate` does); the solution graded with it."""
    tmp = tmp_path_factory.mktemp("lab02-solution")
    (tmp / "submissions").mkdir()
    (tmp / "submissions" / "solution.ipynb").write_bytes(LAB.path.read_bytes())
    runs = solution_runs(LAB)
    if runs is None:  # this file run alone
        runs = tmp / "recorded-runs"
        record_reference_runs(LAB, runs, timeout=TEST_TIMEOUT)
    results = grade_batch(LAB.path, tmp / "submissions", tmp / "out", workers=1,
                          options=Options(timeout=TEST_TIMEOUT, runs=runs))
    record_timings(LAB, results)
    return results[0], runs


@pytest.fixture(scope="module")
def graded(recorded, tmp_path_factory, record_timings):
    _, runs = recorded
    tmp = tmp_path_factory.mktemp("lab02")
    write_all(LAB, list(EXPECTED), tmp / "submissions")
    results = grade_batch(LAB.path, tmp / "submissions", tmp / "out", workers=2,
                          options=Options(timeout=TEST_TIMEOUT, runs=runs, keep_runs=tmp / "kept-runs"))
    record_timings(LAB, results)
    return {r.student: r for r in results}, tmp / "out"


def test_the_solution_earns_full_marks_with_the_recorded_job(recorded):
    solution, runs = recorded
    assert solution.total == 10 and not solution.issues, solution
    [run] = list_runs(runs)
    assert run.ok and run.spec.name == "lab02" and len(run.timeline.steps) == 3


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_score_of_each_kind_of_submission(graded, kind):
    results, _ = graded
    assert results[kind].per_task(LAB) == EXPECTED[kind], not_passed(results[kind])


def test_submissions_reuse_the_recorded_run(recorded, graded):
    _, runs = recorded
    _, out = graded
    # No kernel of a graded submission launched a job of its own: what their runs/ folders held at the
    # end (kept) is exactly the recorded run. (Counted, not timed: a slow machine changes no count.)
    assert sorted(r.name for r in list_runs(out.parent / "kept-runs")) == sorted(r.name for r in list_runs(runs))


def test_attacks_steal_nothing_leak_nothing_and_are_flagged(graded):
    results, out = graded
    leak = {c.id: c for c in results["history_leak"].checks}
    # The public check shows the student's own message: their cells, and no solutions/ (hidden
    # by the sandbox); the kernel's history holds no check (checks never run there).
    message = leak["bubble_public"].message
    assert message.startswith("你的函数抛出了 RuntimeError: [solutions: ") and "import utils" in message
    for word in ("student_side", "HIDDEN", "want = utils.compute_metrics", "_getframe"):
        assert word not in message
    assert "RuntimeError" in leak["bubble_hidden"].message and "def " not in leak["bubble_hidden"].message
    assert any("importlib" in note for note in results["runner_swap"].review)
    assert any("_getframe" in note for note in results["frame_reader"].review)
    assert results["correct"].review == []


def test_grades_and_feedback(graded):
    results, out = graded
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open(encoding="utf-8"))}
    assert {k: float(rows[k]["total"]) for k in EXPECTED} == {k: sum(v.values()) for k, v in EXPECTED.items()}
    assert_nothing_hidden_leaks(LAB, out)
    text = (out / "feedback" / "partly_wrong.md").read_text(encoding="utf-8")
    assert "应返回每个阶段一个 float 的 list（包括没有事件的阶段）" in text  # the message of the failed hidden check
    assert "总分：7 / 10" in text
