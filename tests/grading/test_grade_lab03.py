"""Grading lab 3 (no real jobs): every kind of prepared submission, scored exactly, graded
through the command line as an instructor types it (files and submission folders mixed)."""

from __future__ import annotations

import csv
import json

import pytest

from tests.grading.submissions import ROOT, assert_nothing_hidden_leaks, grade_prepared, not_passed
from utils.grading.notebook_source import LabSource, find_lab

LAB = LabSource.load(find_lab(ROOT, "lab03"))
FULL = {"stage_loads": 2, "balanced_partition": 6, "speedup_over_uniform": 2}
NONE = {task: 0 for task in FULL}
PARTLY = {"stage_loads": 2, "balanced_partition": 1, "speedup_over_uniform": 0}
"""Equal layer counts pass only the edge cases (1 of 6); speed-up then is 1.0 everywhere."""
EXPECTED = {
    "correct": FULL,
    "partly_wrong": PARTLY,
    "raising": {**FULL, "speedup_over_uniform": 0},  # the stray top-level raise costs nothing
    "looping": {**FULL, "speedup_over_uniform": 0},
    "tests_edited": PARTLY,  # `assert True` earns nothing
    "tests_deleted": FULL,  # deleting the self-checks loses nothing
    "liar": NONE,
    "empty": NONE,
    "metadata_lost": FULL,
    "answers_first": FULL,
    # Calls the library through an alias: the two checks that forbid it (random instances 2,
    # large instance 1) fail, because the ban swaps the functions' code inside the kernel.
    "aliased": {**FULL, "balanced_partition": 3},
    # Runs the library's algorithm from a code object saved before the ban: it escapes the ban
    # (and fails only the edge cases it does not check), and is flagged for review (see below).
    "code_saver": {**FULL, "balanced_partition": 5},
    "other_algorithm": FULL,  # honest variants
    "helper_early": FULL,
    "answers_moved": FULL,
    # Issue 37: the grader's in-kernel entry point and its bans.
    "namespace_hook": {**FULL, "balanced_partition": 3},  # the hook is never reached: the ban holds as for aliased
    "entry_swap": NONE,  # every call answered by an unsigned, fabricated reply: failed and flagged
    "child_process": FULL,  # the ban is per process: escapes it, flagged for review (below)
    "fresh_copy": FULL,  # functions the ban never swapped: escapes it, flagged for review (below)
    "garbage": NONE,  # not a notebook
    "no_notebook": NONE,  # a submission folder without a notebook
}
@pytest.fixture(scope="module")
def graded(tmp_path_factory, record_timings):
    results, out, printed = grade_prepared(LAB, list(EXPECTED), tmp_path_factory.mktemp("lab03"))
    record_timings(LAB, results)
    return {r.student: r for r in results}, out, printed


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_score_of_each_kind_of_submission(graded, kind):
    results, _, _ = graded
    assert results[kind].per_task(LAB) == EXPECTED[kind], not_passed(results[kind])


def test_grades_csv_has_one_row_per_student_with_task_points(graded):
    _, out, _ = graded
    rows = list(csv.DictReader((out / "grades.csv").open(encoding="utf-8")))
    assert [r["student"] for r in rows] == sorted(EXPECTED)
    for row in rows:
        expected = EXPECTED[row["student"]]
        assert {t: float(row[t]) for t in FULL} == expected
        assert float(row["total"]) == sum(expected.values()) and float(row["max"]) == 10
        # timing-claim: construction — a duration read off a monotonic clock is never negative, however slow the machine
        assert float(row["seconds"]) >= 0
    by_student = {r["student"]: r for r in rows}
    assert "timeouts: 2" in by_student["looping"]["notes"]
    assert "error:" in by_student["garbage"]["notes"]


def test_feedback_never_shows_hidden_tests_or_tracebacks(graded):
    _, out, _ = graded
    assert_nothing_hidden_leaks(LAB, out)
    assert sorted(p.stem for p in (out / "feedback").glob("*.md")) == sorted(EXPECTED)


def test_a_loop_is_cut_by_the_timeout_and_the_rest_is_still_graded(graded):
    results, _, _ = graded
    looping = results["looping"]
    statuses = {c.id: c.status for c in looping.checks}
    assert statuses["speedup_public"] == statuses["speedup_hidden"] == "timeout"
    assert all(s == "passed" for cid, s in statuses.items() if not cid.startswith("speedup"))
    # Cut by the per-cell timeout, and only those two cells: counted from what the grader recorded, not
    # timed (grading one lab 3 submission took 17-90 s on a loaded 2-core machine, so a bound on
    # `looping.seconds` measured the machine; a loop not cut would hold `grade_prepared` to its 900 s).
    assert looping.error is None and sum(c.status == "timeout" for c in looping.checks) == 2
    assert "超时" in looping.checks[-1].message


def test_an_object_equal_to_everything_earns_nothing(graded):
    results, _, _ = graded
    assert all(c.status == "error" for c in results["liar"].checks)
    assert any("应返回" in c.message for c in results["liar"].checks)  # the instructor's type message


def test_tampering_with_the_library_ban_is_flagged_for_review_with_the_reason(graded):
    results, out, _ = graded
    assert any("__code__" in note and "library ban" in note for note in results["code_saver"].review)
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open(encoding="utf-8"))}
    assert "review: " in rows["code_saver"]["notes"] and "__code__" in rows["code_saver"]["notes"]
    for honest in ("correct", "other_algorithm", "helper_early", "answers_moved", "answers_first"):
        assert results[honest].review == [], (honest, results[honest].review)


def test_every_route_around_the_grader_is_flagged_with_its_reason(graded):
    """Issue 37, points 1-3: a hooked namespace, a replaced entry point, a child process and a
    fresh module copy each get their honest score (above) or a review note saying why."""
    results, out, _ = graded
    review = {kind: " | ".join(results[kind].review) for kind in
              ("namespace_hook", "entry_swap", "child_process", "fresh_copy")}
    assert "globals()" in review["namespace_hook"] and "built at run time" in review["namespace_hook"]
    assert "__subclasses__" in review["entry_swap"] and "__setattr__" in review["entry_swap"]
    assert "entry point was altered in the kernel: call" in review["entry_swap"]  # caught before any call
    tampered = [c for c in results["entry_swap"].checks if c.status != "passed"]
    assert tampered and all("交给教师复查" in c.message for c in tampered)
    assert "subprocess" in review["child_process"] and "another process" in review["child_process"]
    assert "runpy" in review["fresh_copy"] and "fresh copy" in review["fresh_copy"]


def test_errors_in_hidden_checks_show_the_type_only(graded):
    results, out, _ = graded
    raising = {c.id: c for c in results["raising"].checks}
    assert raising["speedup_public"].message == "你的函数抛出了 ZeroDivisionError: division by zero"
    assert "ZeroDivisionError" in raising["speedup_hidden"].message
    assert "division by zero" not in raising["speedup_hidden"].message
    issues = results["raising"].issues
    assert [i.message for i in issues if "stray line" in i.message]  # the student's own cell: full message
    text = (out / "feedback" / "raising.md").read_text(encoding="utf-8")
    assert "a stray line at the end of my cell" in text and "总分：8 / 10" in text


def test_executed_notebooks_are_kept_for_instructors_only(graded):
    _, out, _ = graded
    executed = json.loads((out / "instructor" / "correct.ipynb").read_text(encoding="utf-8"))
    assert "instructors only" in executed["metadata"]["grading"]["warning"]
    assert any("BEGIN HIDDEN TESTS" in "".join(c["source"]) for c in executed["cells"])


def test_command_line_prints_each_submission_with_its_time(graded):
    results, _, stdout = graded
    for kind in EXPECTED:
        total = sum(EXPECTED[kind].values())
        assert f"{kind}: {total:g}/10 in " in stdout
    assert "没有 notebook" in results["no_notebook"].error


@pytest.mark.parametrize("kind", ["namespace_hook", "entry_swap", "fresh_copy"])
def test_the_single_grade_path_treats_the_routes_alike(tmp_path, kind):
    """Issue 37: one notebook graded on its own (`grade_notebook`, no batch worker) gets the
    same score and review notes as in the batch above."""
    from tests.grading.submissions import TEST_TIMEOUT, build
    from utils.grading.grade import Options, grade_notebook

    path = tmp_path / f"{kind}.ipynb"
    path.write_text(build(LAB, kind), encoding="utf-8")
    result = grade_notebook(LAB, path, kind, Options(timeout=TEST_TIMEOUT))
    assert result.per_task(LAB) == EXPECTED[kind], not_passed(result)
    assert result.review, kind
