"""Grading lab 9 (interleaved / zero-bubble what-if, simulation only): every kind of prepared
submission, scored exactly, graded through the command line as an instructor types it.

The lab's wrong answers, its stray raise and its formula shortcut are added to the shared tables
of `tests.grading.submissions` for this module only (`graded` patches them and restores them)."""

from __future__ import annotations

import csv
import json

import pytest

from tests.grading import submissions
from tests.grading.submissions import ROOT, assert_nothing_hidden_leaks, grade_prepared, not_passed
from utils.grading.notebook_source import LabSource, find_lab

LAB = LabSource.load(find_lab(ROOT, "lab09"))
FULL = {"interleaved_bubble": 3, "best_chunks": 2, "zero_bubble_gain": 3, "fastest_within_cap": 2}
NONE = {task: 0 for task in FULL}

#: One common mistake per task; each keeps part of its task's points (`PARTLY`).
WRONG = {
    # v = 1 handed to "interleaved-1f1b", which refuses chunks=1: right for v >= 2 only
    "interleaved_bubble": '''
def interleaved_bubble(p, m, v):
    metrics = utils.simulate(utils.build_schedule("interleaved-1f1b", p, m, chunks=v), T_F / v, T_B / v).metrics()
    ideal = m * (T_F + T_B)
    return {"bubble_ratio": float(metrics.bubble_ratio), "overhead": float((metrics.makespan - ideal) / ideal)}
''',
    # only interleaved chunk counts (v >= 2): never answers v = 1, None when max_v = 1
    "best_chunks": '''
def best_chunks(p, m, max_v, comm):
    best_v, best_span = None, None
    for v in range(2, max_v + 1):
        schedule = utils.build_schedule("interleaved-1f1b", p, m, chunks=v)
        span = utils.simulate(schedule, T_F / v, T_B / v, comm=comm).metrics().makespan
        if best_span is None or span < best_span - 1e-9:
            best_v, best_span = v, span
    return best_v
''',
    # the speedup upside down (ZB-H1 / 1F1B); the makespans are right
    "zero_bubble_gain": '''
def zero_bubble_gain(p, m, f, b, w):
    spans = {name: float(utils.simulate(utils.build_schedule(name, p, m), f, b, weight=w).metrics().makespan)
             for name in ("1f1b", "zb-h1")}
    return {**spans, "speedup": spans["zb-h1"] / spans["1f1b"]}
''',
    # no try/except: an m that interleaving refuses raises ValueError instead of skipping that candidate
    "fastest_within_cap": '''
def fastest_within_cap(p, m, f, b, w, comm, cap):
    best = None
    for name, v in CANDIDATES:
        schedule = utils.build_schedule(name, p, m, chunks=v)
        if max(schedule.in_flight(r) for r in range(p)) / v > cap + 1e-9:
            continue
        span = utils.simulate(schedule, f / v, b / v, weight=w / v, comm=comm).metrics().makespan
        if best is None or span < best[0] - 1e-9:
            best = (span, (name, v))
    return None if best is None else best[1]
''',
}
PARTLY = {"interleaved_bubble": 2, "best_chunks": 1, "zero_bubble_gain": 1, "fastest_within_cap": 1}

#: The closed forms instead of the simulator, through aliases imported before the checks run.
FORMULA_SHORTCUT = {
    "interleaved_bubble": '''
from utils import bubble_overhead_interleaved as _overhead, bubble_ratio_interleaved as _ratio


def interleaved_bubble(p, m, v):
    return {"bubble_ratio": float(_ratio(p, m, v)), "overhead": float(_overhead(p, m, v))}
''',
    "zero_bubble_gain": '''
from utils.analysis.theory import bubble_time_zb_h1 as _zb_bubble


def zero_bubble_gain(p, m, f, b, w):
    one = float((m + p - 1) * (f + b + w))
    zb = float(m * (f + b + w) + _zb_bubble(p, m, f, b, w))
    return {"1f1b": one, "zb-h1": zb, "speedup": one / zb}
''',
}

#: The kinds that depend on this lab's own tasks and checks. The generic ones (self-checks edited
#: or deleted, metadata lost, answers before the functions) exercise the grader, not the lab's
#: checks: labs 2 and 3 grade them (docs/suite-time.md).
EXPECTED = {
    "correct": FULL,  # the solution
    "empty": NONE,  # the generated student copy, unchanged
    "partly_wrong": PARTLY,
    "raising": {**FULL, "zero_bubble_gain": 0},  # the stray top-level raise after a def costs nothing
    "liar": NONE,  # every check guards the type of what it compares
    # the formulas are forbidden while the checks call the student's code, public checks included
    "aliased": {**FULL, "interleaved_bubble": 0, "zero_bubble_gain": 0},
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, record_timings):
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(submissions.WRONG, LAB.name, WRONG)
        patch.setitem(submissions.RAISING, LAB.name, ("interleaved_bubble", "zero_bubble_gain"))
        patch.setitem(submissions.ALIASED, LAB.name, FORMULA_SHORTCUT)
        results, out, printed = grade_prepared(LAB, list(EXPECTED), tmp_path_factory.mktemp("lab09"))
    record_timings(LAB, results)
    return {r.student: r for r in results}, out, printed


def test_the_lab_has_ten_points_in_four_tasks():
    assert {name: task.points for name, task in LAB.tasks.items()} == FULL


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_score_of_each_kind_of_submission(graded, kind):
    results, _, _ = graded
    assert results[kind].per_task(LAB) == EXPECTED[kind], not_passed(results[kind])


def test_solution_earns_full_marks_student_copy_none_and_each_wrong_task_part_of_its_points(graded):
    results, _, _ = graded
    assert results["correct"].total == 10 and results["empty"].total == 0
    partly = results["partly_wrong"].per_task(LAB)
    for task, points in FULL.items():
        assert 0 < partly[task] < points, (task, partly[task])


def test_grades_csv_has_one_row_per_student_with_task_points(graded):
    _, out, _ = graded
    rows = list(csv.DictReader((out / "grades.csv").open(encoding="utf-8")))
    assert [r["student"] for r in rows] == sorted(EXPECTED)
    for row in rows:
        expected = EXPECTED[row["student"]]
        assert {t: float(row[t]) for t in FULL} == expected
        assert float(row["total"]) == sum(expected.values()) and float(row["max"]) == 10


def test_feedback_never_shows_hidden_tests_or_tracebacks(graded):
    _, out, _ = graded
    assert_nothing_hidden_leaks(LAB, out)
    assert sorted(p.stem for p in (out / "feedback").glob("*.md")) == sorted(EXPECTED)


def test_partial_credit_names_what_failed(graded):
    results, _, _ = graded
    checks = {c.id: c for c in results["partly_wrong"].checks}
    passed = {cid for cid, c in checks.items() if c.status == "passed"}
    assert passed == {"interleaved_public", "interleaved_formula", "best_chunks_public", "zero_bubble_simulated",
                      "fastest_public"}
    # a hidden check whose call raised shows the exception's type only
    assert "ValueError" in checks["interleaved_beyond"].message
    assert "ValueError" in checks["fastest_hidden"].message
    assert "应返回 int" in checks["best_chunks_hidden"].message  # None for max_v = 1
    assert "加速比是 1F1B 的 makespan 除以 ZB-H1 的" in checks["zero_bubble_public"].message  # public: values shown
    assert "加速比" in checks["zero_bubble_formula"].message


def test_calling_the_formulas_is_refused_and_honest_code_is_not_flagged(graded):
    results, _, _ = graded
    aliased = {c.id: c for c in results["aliased"].checks}
    for check in ("interleaved_public", "zero_bubble_public"):
        assert "AssertionError" in aliased[check].message and "模拟器" in aliased[check].message
    assert all(aliased[c].status == "passed" for c in ("best_chunks_public", "best_chunks_hidden",
                                                       "fastest_public", "fastest_hidden"))
    for honest in ("correct", "partly_wrong"):
        assert results[honest].review == [], (honest, results[honest].review)


def test_an_object_equal_to_everything_earns_nothing(graded):
    results, _, _ = graded
    assert all(c.status == "error" for c in results["liar"].checks)
    assert any("应返回" in c.message for c in results["liar"].checks)  # the instructor's type message


def test_errors_in_hidden_checks_show_the_type_only(graded):
    results, out, _ = graded
    raising = {c.id: c for c in results["raising"].checks}
    assert raising["zero_bubble_public"].message == "你的函数抛出了 ZeroDivisionError: division by zero"
    assert "ZeroDivisionError" in raising["zero_bubble_formula"].message
    assert "division by zero" not in raising["zero_bubble_formula"].message
    text = (out / "feedback" / "raising.md").read_text(encoding="utf-8")
    assert "a stray line at the end of my cell" in text and "总分：7 / 10" in text


def test_executed_notebooks_are_kept_for_instructors_only(graded):
    _, out, _ = graded
    executed = json.loads((out / "instructor" / "correct.ipynb").read_text(encoding="utf-8"))
    assert "instructors only" in executed["metadata"]["grading"]["warning"]
    assert any("BEGIN HIDDEN TESTS" in "".join(c["source"]) for c in executed["cells"])


def test_command_line_prints_each_submission_with_its_time(graded):
    _, _, stdout = graded
    for kind in EXPECTED:
        assert f"{kind}: {sum(EXPECTED[kind].values()):g}/10 in " in stdout
