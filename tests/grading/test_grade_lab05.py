"""Grading lab 5 (schedules as data, no real jobs): the kinds of prepared submission that concern
this lab, scored exactly, graded through the command line as an instructor types it (files and
folders mixed)."""

from __future__ import annotations

import csv
import json

import pytest

from tests.grading.submissions import ROOT, assert_nothing_hidden_leaks, grade_prepared, not_passed
from utils.grading.notebook_source import LabSource, find_lab

LAB = LabSource.load(find_lab(ROOT, "lab05"))
FULL = {"gpipe": 2, "one_f_one_b": 4, "deepspeed_order": 2, "summarize": 2}
NONE = {task: 0 for task in FULL}
PARTLY = {"gpipe": 2, "one_f_one_b": 1, "deepspeed_order": 0, "summarize": 0}
"""p - s warm-up forwards: still a valid schedule (1 of 4), but over the memory bound and not
DeepSpeed's order; the buffer id taken for the micro-batch fails both checks of task 3; the peak
read after a backward has freed its micro-batch (one short, makespan right) fails both of task 4."""
#: The kinds that depend on this lab's own tasks and checks; edited self-checks exercise the
#: grader, not the lab, and are graded on labs 2, 3 and 7 (docs/suite-time.md).
EXPECTED = {
    "correct": FULL,
    "partly_wrong": PARTLY,
    "raising": {**FULL, "summarize": 0},  # the stray top-level raise after gpipe's def costs nothing
    "liar": NONE,
    "empty": NONE,
    # utils.build_schedule through an alias imported beforehand: the ban swaps its code inside the
    # kernel, so every check of tasks 1-3 fails, public ones included; task 4 may use the library.
    "aliased": {**NONE, "summarize": 2},
    "other_algorithm": FULL,  # a greedy 1F1B and TrainSchedule's own step map: honest variants
    # task 4 through utils.simulate: the right numbers, but its checks run inside no_simulator()
    "metrics_shortcut": {**FULL, "summarize": 0},
    # utils.Action objects are not plain data: the judge gets placeholders, the type checks fail.
    "actions_returned": {**FULL, "gpipe": 0, "one_f_one_b": 0},
}
"""The kinds that say something about this lab. The grader's lab-independent paths (a loop cut
by the timeout, lost metadata, moved or deleted cells, files that are not notebooks) are
graded on lab 3, whose submissions cost seconds."""


@pytest.fixture(scope="module")
def graded(tmp_path_factory, record_timings):
    results, out, printed = grade_prepared(LAB, list(EXPECTED), tmp_path_factory.mktemp("lab05"))
    record_timings(LAB, results)
    return {r.student: r for r in results}, out, printed


def test_the_lab_has_ten_points_in_four_tasks():
    assert {name: task.points for name, task in LAB.tasks.items()} == FULL


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


def test_feedback_never_shows_hidden_tests_or_tracebacks(graded):
    _, out, _ = graded
    assert_nothing_hidden_leaks(LAB, out)
    assert sorted(p.stem for p in (out / "feedback").glob("*.md")) == sorted(EXPECTED)


def test_partial_credit_names_what_failed(graded):
    results, _, _ = graded
    partly = {c.id: c for c in results["partly_wrong"].checks}
    assert partly["one_f_one_b_valid"].status == "passed"
    assert "1F1B 最多" in partly["one_f_one_b_memory"].message
    assert "TrainSchedule" in partly["one_f_one_b_deepspeed"].message
    assert "deepspeed_order(2, 3, 0) 不对" in partly["deepspeed_public"].message  # public: the values are shown
    # task 4, off by one in the in-flight count: the makespan passes, the peak is named
    assert "GPipe 每个阶段同时保存 8 个微批" in partly["summarize_public"].message
    assert partly["summarize_hidden"].message.endswith("激活峰值（字节）不对")


def test_the_simulator_is_refused_in_task_4_with_the_labs_reason(graded):
    results, _, _ = graded
    shortcut = {c.id: c for c in results["metrics_shortcut"].checks}
    for check in ("summarize_public", "summarize_hidden"):
        assert shortcut[check].status != "passed"
    assert "AssertionError" in shortcut["summarize_public"].message
    assert "utils.simulate" in shortcut["summarize_public"].message
    for check in ("gpipe_public", "one_f_one_b_deepspeed", "deepspeed_hidden"):  # the other tasks keep their points
        assert shortcut[check].status == "passed"


def test_an_object_equal_to_everything_earns_nothing(graded):
    results, _, _ = graded
    assert all(c.status == "error" for c in results["liar"].checks)
    assert any("应返回" in c.message for c in results["liar"].checks)  # the instructor's type message


def test_calling_build_schedule_is_refused_with_the_labs_reason_and_honest_code_is_not_flagged(graded):
    results, _, _ = graded
    aliased = {c.id: c for c in results["aliased"].checks}
    for check in ("gpipe_public", "one_f_one_b_public", "deepspeed_public"):
        assert "AssertionError" in aliased[check].message and "utils.build_schedule" in aliased[check].message
    assert aliased["summarize_public"].status == aliased["summarize_hidden"].status == "passed"
    for honest in ("correct", "other_algorithm", "actions_returned"):
        assert results[honest].review == [], (honest, results[honest].review)


def test_actions_instead_of_strings_are_told_to_use_str(graded):
    results, _, _ = graded
    checks = {c.id: c for c in results["actions_returned"].checks}
    assert "str()" in checks["gpipe_public"].message
    assert checks["gpipe_hidden"].status == checks["one_f_one_b_public"].status == "error"


def test_errors_in_hidden_checks_show_the_type_only(graded):
    results, out, _ = graded
    raising = {c.id: c for c in results["raising"].checks}
    assert raising["summarize_public"].message == "你的函数抛出了 ZeroDivisionError: division by zero"
    assert "ZeroDivisionError" in raising["summarize_hidden"].message
    assert "division by zero" not in raising["summarize_hidden"].message
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
