"""Grading lab 7 (diagnosing broken or stuck pipeline jobs), which launches real failing jobs.

`validate` runs the lab source once (its set-up runs the lab's four faulty jobs, one of which
hangs until its 20 s timeout, and the fixed job), recording the runs; it then grades the
solution (full marks) and the unchanged student copy (no marks) with them, and so is every
other kind of prepared submission (``--runs``): neither a kernel nor a judge launches a job: the
fixed spec of an honest answer equals the solution's and is found among the recorded runs.
"""

from __future__ import annotations

import csv

import pytest

from tests.grading.submissions import (ROOT, assert_nothing_hidden_leaks, assert_solution_full_and_copy_empty, build,
                                       not_passed, validate_and_grade)
from utils.grading.notebook_source import LabSource, find_lab
from utils.jobs.runs import list_runs

pytestmark = pytest.mark.integration

LAB = LabSource.load(find_lab(ROOT, "lab07"))
FULL = {"read_status": 2, "diagnose_failure": 4, "fix_spec": 2, "find_straggler": 2}
NONE = {task: 0 for task in FULL}
PARTLY = {"read_status": 2, "diagnose_failure": 3, "fix_spec": 1, "find_straggler": 1}
"""The hang blamed on a rank that waits (3 of 4), the whole deepspeed_config dropped (the
right key goes too: 1 of 2), step 0 counted when looking for the straggler (1 of 2)."""
EXPECTED = {
    "partly_wrong": PARTLY,
    "tests_edited": PARTLY,  # `assert True` earns nothing
    "tests_deleted": FULL,  # deleting the self-checks loses nothing
    "liar": NONE,
    "garbage": NONE,  # not a notebook
    # utils.diagnose called where the lab asks for the student's own reading: the ban swaps its code
    # inside the kernel while the checks call the student's functions (read_status is the solution's).
    "metrics_shortcut": {**FULL, "diagnose_failure": 0},
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, record_timings):
    # validate runs the lab source once (its faulty jobs, and the fixed job inside fix_spec's
    # hidden check), with the lab's own 120 s per cell; everything graded finds them recorded.
    notebooks = {kind: build(LAB, kind) for kind in EXPECTED}
    return validate_and_grade(LAB, tmp_path_factory.mktemp("lab07"), notebooks, validate_timeout=120,
                              record_timings=record_timings)


def test_the_lab_has_ten_points_in_four_tasks():
    assert {name: task.points for name, task in LAB.tasks.items()} == FULL


def test_the_solution_earns_full_marks_and_the_student_copy_nothing(graded):
    assert_solution_full_and_copy_empty(graded[0], LAB)


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_score_of_each_kind_of_submission(graded, kind):
    results, _, _ = graded
    assert results[kind].per_task(LAB) == EXPECTED[kind], not_passed(results[kind])


def test_the_faulty_runs_are_recorded_once_and_reused(graded):
    results, _, recorded = graded
    states = sorted((r.spec.name, r.state) for r in list_runs(recorded))
    assert states == [("lab07-config", "failed"), ("lab07-config", "succeeded"), ("lab07-hang", "timeout"),
                      ("lab07-mismatch", "failed"), ("lab07-slow", "succeeded")], states
    # No kernel of a graded submission launched a job of its own: what their runs/ folders
    # held at the end (kept) is exactly the recorded runs.
    assert sorted(r.name for r in list_runs(recorded.parent.parent / "kept-runs")) \
        == sorted(r.name for r in list_runs(recorded))


def test_partial_credit_names_what_failed(graded):
    results, _, _ = graded
    partly = {c.id: c for c in results["partly_wrong"].checks}
    assert partly["diagnose_public"].status == partly["diagnose_config"].status == "passed"
    assert "hang" in partly["diagnose_hang"].message and "rank 不对" in partly["diagnose_hang"].message
    assert "gradient_clipping" in partly["fix_hidden"].message
    assert "第 0 步" in partly["straggler_hidden"].message


def test_the_library_diagnosis_is_refused_with_the_labs_reason(graded):
    results, _, _ = graded
    checks = {c.id: c for c in results["metrics_shortcut"].checks}
    assert "AssertionError" in checks["diagnose_public"].message
    assert "utils.diagnose" in checks["diagnose_public"].message
    assert results["correct"].review == [] and results["partly_wrong"].review == []


def test_an_object_equal_to_everything_earns_nothing(graded):
    results, _, _ = graded
    assert all(c.status == "error" for c in results["liar"].checks)


def test_grades_csv_and_feedback_are_safe(graded):
    _, out, _ = graded
    rows = list(csv.DictReader((out / "grades.csv").open(encoding="utf-8")))
    assert sorted(r["student"] for r in rows) == sorted([*EXPECTED, "correct", "empty"])
    assert_nothing_hidden_leaks(LAB, out)
