"""Grading lab 6 (micro-batch search under a memory budget), which launches four real jobs.

`validate` grades the solution (full marks) and the unchanged student copy (no marks): the lab
source runs its jobs once in a judge (three calibration runs and the run of the chosen micro-batch
count), recorded and reused by both. Three prepared submissions are then graded with those
recorded runs: one common mistake per task (each keeps part of its task's points), the library's
search called through an alias (forbidden while the checks run), and an object equal to
everything. Their wrong answers are defined here and patched into `tests.grading.submissions`
for this module only.
"""

from __future__ import annotations

import csv

import pytest

from tests.grading import submissions
from tests.grading.submissions import (ROOT, TEST_TIMEOUT, assert_nothing_hidden_leaks, build, not_passed,
                                       validate_and_grade)
from utils.grading.notebook_source import LabSource, find_lab
from utils.jobs.runs import list_runs

pytestmark = pytest.mark.integration

LAB = LabSource.load(find_lab(ROOT, "lab06"))
FULL = {"fit_memory_model": 3, "fit_time_model": 2, "search_under_budget": 3, "confirm_choice": 2}
NONE = {task: 0 for task in FULL}

#: One common mistake per task.
WRONG = {
    # every measurement fitted, also those with m <= p - s where the model does not hold: the
    # noisy in-range check passes (1 of 3), the crafted ones with out-of-range points fail
    "fit_memory_model": '''
def fit_memory_model(measurements, num_stages):
    p = num_stages
    fixed, per_sample = [], []
    for s in range(p):
        points = [(min(p - s, x["micro_batches"]) * x["micro_batch_size"], x["step_memory"][s]) for x in measurements]
        if len({n for n, _ in points}) < 2:
            raise ValueError("need two sizes")
        n_mean = sum(n for n, _ in points) / len(points)
        y_mean = sum(y for _, y in points) / len(points)
        slope = sum((n - n_mean) * (y - y_mean) for n, y in points) / sum((n - n_mean) ** 2 for n, _ in points)
        fixed.append(float(y_mean - slope * n_mean))
        per_sample.append(float(slope))
    return {"fixed": fixed, "per_sample": per_sample}
''',
    # the shortest step *including* step 0: right whenever step 0 is the slowest (public, 1 of 2)
    "fit_time_model": '''
def fit_time_model(measurements, num_stages):
    points = [(x["micro_batch_size"], min(x["step_times"]) / (x["micro_batches"] + num_stages - 1)) for x in measurements]
    if len({b for b, _ in points}) < 2:
        raise ValueError("need two sizes")
    b_mean = sum(b for b, _ in points) / len(points)
    y_mean = sum(y for _, y in points) / len(points)
    c = sum((b - b_mean) * (y - y_mean) for b, y in points) / sum((b - b_mean) ** 2 for b, _ in points)
    return {"t0": float(y_mean - c * b_mean), "c": float(c)}
''',
    # ties go to the larger m (`<=` while scanning m upwards): rows right, best wrong on ties (2 of 3)
    "search_under_budget": '''
def search_under_budget(global_batch, num_stages, memory_model, time_model, budget):
    p = num_stages
    rows = []
    for m in [d for d in range(1, global_batch + 1) if global_batch % d == 0]:
        b = global_batch // m
        memory = [float(memory_model["fixed"][s] + memory_model["per_sample"][s] * min(p - s, m) * b) for s in range(p)]
        rows.append({"micro_batches": m, "micro_batch_size": b,
                     "step_time": float((m + p - 1) * (time_model["t0"] + time_model["c"] * b)),
                     "memory": memory, "fits": all(x <= budget for x in memory)})
    best = None
    for row in rows:
        if row["fits"] and (best is None or row["step_time"] <= best["step_time"]):
            best = row
    return {"rows": rows, "best": best}
''',
    # fits judged on stage 0 only (the stage that holds most in flight): public right (1 of 2)
    "confirm_choice": '''
def confirm_choice(choice, record, budget):
    if record["micro_batches"] != choice["micro_batches"]:
        raise ValueError("not the same configuration")
    measured = min(record["step_times"][1:] or record["step_times"])
    return {"step_time": float(measured), "time_error": float((choice["step_time"] - measured) / measured),
            "memory_error": [float((a - r) / r) for a, r in zip(choice["memory"], record["step_memory"])],
            "fits": record["step_memory"][0] <= budget}
''',
}
PARTLY = {"fit_memory_model": 1, "fit_time_model": 1, "search_under_budget": 2, "confirm_choice": 1}

#: Chapter 18's library search through aliases imported before the checks run.
LIBRARY_SEARCH = {"search_under_budget": '''
from utils.planning.whatif import fastest_within_memory as _fastest, search_micro_batches as _search


def search_under_budget(global_batch, num_stages, memory_model, time_model, budget):
    found = _search(global_batch, num_stages=num_stages, schedules=("1f1b",), forward_per_sample=time_model["c"],
                    backward_per_sample=0.0, fixed_overhead=time_model["t0"] / 2,
                    activation_bytes_per_sample=memory_model["per_sample"],
                    memory_budget=[budget - g for g in memory_model["fixed"]])
    rows = [{"micro_batches": r.micro_batches, "micro_batch_size": r.micro_batch_size, "step_time": float(r.step_time),
             "memory": [float(g + a) for g, a in zip(memory_model["fixed"], r.peak_activation)], "fits": bool(r.feasible)}
            for r in found]
    try:
        best = _fastest(found).micro_batches
    except ValueError:
        return {"rows": rows, "best": None}
    return {"rows": rows, "best": next(r for r in rows if r["micro_batches"] == best)}
'''}

EXPECTED = {
    "partly_wrong": PARTLY,
    "aliased": {**FULL, "search_under_budget": 0},
    "liar": NONE,
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, record_timings):
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(submissions.WRONG, LAB.name, WRONG)
        patch.setitem(submissions.ALIASED, LAB.name, LIBRARY_SEARCH)
        notebooks = {kind: build(LAB, kind) for kind in EXPECTED}
    return validate_and_grade(LAB, tmp_path_factory.mktemp("lab06"), notebooks, validate_timeout=TEST_TIMEOUT,
                              record_timings=record_timings)


def test_the_lab_has_ten_points_in_four_tasks():
    assert {name: task.points for name, task in LAB.tasks.items()} == FULL


def test_the_solution_earns_full_marks_and_the_student_copy_nothing(graded):
    results, _, _ = graded
    assert results["correct"].per_task(LAB) == FULL, not_passed(results["correct"])
    assert not results["correct"].error
    assert results["correct"].review == []
    assert results["empty"].per_task(LAB) == NONE
    assert all("NotImplementedError" in c.message for c in results["empty"].checks)


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_score_of_each_kind_of_submission(graded, kind):
    results, _, _ = graded
    assert results[kind].per_task(LAB) == EXPECTED[kind], not_passed(results[kind])


def test_the_four_real_runs_are_recorded_once(graded):
    _, _, recorded = graded
    runs = list_runs(recorded)
    assert all(r.ok for r in runs)
    counts = sorted(r.spec.micro_batches for r in runs)
    # three calibration runs (m = 2, 4, 16) and the chosen count, unless the choice was one of them
    assert counts[:1] == [2] and 4 in counts and 16 in counts and len(counts) in (3, 4), counts
    assert all(r.spec.global_batch == 16 for r in runs)


def test_partial_credit_names_what_failed(graded):
    results, _, _ = graded
    checks = {c.id: c for c in results["partly_wrong"].checks}
    passed = {cid for cid, c in checks.items() if c.status == "passed"}
    assert passed == {"memory_noisy", "time_public", "search_public", "search_rows", "confirm_public"}, passed
    assert "m ≤ p − s" in checks["memory_public"].message          # a public check shows its hint
    assert "第 1 步起" in checks["time_hidden"].message
    assert "m 最小" in checks["search_best"].message
    assert "每个阶段" in checks["confirm_hidden"].message


def test_the_library_search_is_refused_with_the_labs_reason(graded):
    results, _, _ = graded
    checks = {c.id: c for c in results["aliased"].checks}
    assert "AssertionError" in checks["search_public"].message and "自己做搜索" in checks["search_public"].message
    assert all(checks[c].status == "passed" for c in ("memory_public", "time_hidden", "confirm_hidden"))


def test_an_object_equal_to_everything_earns_nothing(graded):
    results, _, _ = graded
    assert all(c.status == "error" for c in results["liar"].checks)


def test_grades_csv_and_feedback_are_safe(graded):
    _, out, _ = graded
    rows = list(csv.DictReader((out / "grades.csv").open(encoding="utf-8")))
    assert sorted(r["student"] for r in rows) == sorted([*EXPECTED, "correct", "empty"])
    assert_nothing_hidden_leaks(LAB, out)
