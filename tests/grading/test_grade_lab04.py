"""Grading lab 4 (rebalance the seed's case), which launches three real 4-stage DeepSpeed jobs.

`validate` grades the solution (full marks; the lab's three jobs run once, in a judge, and are
recorded) and the unchanged student copy (no marks); the prepared wrong submissions below are
then graded with those recorded runs (``--runs``): their judges find every job among the
records. The third job's boundaries come from the student's `stage_times` on the first run, so
a kernel whose `stage_times` is wrong may launch that job again (grading time only: the checks
run in the judge, on the judge's data).

The wrong answers are this module's own: `graded` adds them to the shared tables of
`tests.grading.submissions` for this module only and restores them afterwards.
"""

from __future__ import annotations

import csv

import pytest

from tests.grading import submissions
from tests.grading.submissions import (ROOT, TEST_TIMEOUT, assert_nothing_hidden_leaks,
                                       assert_solution_full_and_copy_empty, build, not_passed, validate_and_grade)
from utils.grading.notebook_source import LabSource, find_lab
from utils.jobs.runs import list_runs
from utils.planning.partitioning import partition_layers

pytestmark = pytest.mark.integration

LAB = LabSource.load(find_lab(ROOT, "lab04"))
FULL = {"stage_times": 3, "candidate_partitions": 2, "bubble_report": 3, "verdict": 2}
NONE = {task: 0 for task in FULL}

#: One common mistake per task; each keeps part of its task's points (`PARTLY`).
WRONG = {
    # the shortest forward + backward of one micro-batch instead of the shortest of each: right on
    # the public check's small timeline, where both shortest events belong to one micro-batch
    "stage_times": '''
def stage_times(timeline):
    steps = [s for s in timeline.steps if s != 0] or list(timeline.steps)
    times = []
    for stage in range(timeline.num_stages):
        pairs = {}
        for e in timeline.select(stage=stage, kinds=["forward", "backward"]):
            if e.step in steps:
                pairs[(e.step, e.micro_batch)] = pairs.get((e.step, e.micro_batch), 0.0) + (e.end - e.start)
        times.append(float(min(pairs.values()) * 1e3))
    return times
''',
    # i * n // p is DeepSpeed's uniform split only when the layers divide evenly among the stages
    "candidate_partitions": '''
def candidate_partitions(layer_ms, num_stages, moved):
    if num_stages < 2 or moved < 0:
        raise ValueError("bad arguments")
    n = len(layer_ms)
    uniform = [i * n // num_stages for i in range(num_stages + 1)]
    fix = list(uniform)
    fix[-2] += moved
    if fix[-2] >= fix[-1]:
        raise ValueError("the last stage would be empty")
    balanced = [int(b) for b in utils.partition_layers(layer_ms, num_stages, method="balanced")]
    return {name: {"parts": parts, "stage_ms": [float(sum(layer_ms[a:b])) for a, b in zip(parts, parts[1:])]}
            for name, parts in (("uniform", uniform), ("seed_fix", fix), ("balanced", balanced))}
''',
    # the floor taken as 1 - min/max instead of 1 - mean/max (the public check leaves floor out)
    "bubble_report": '''
def bubble_report(timeline):
    p, m = timeline.num_stages, int(timeline.num_micro_batches)
    steps = [s for s in timeline.steps if s != 0] or list(timeline.steps)
    ratios = []
    for s in steps:
        compute = [e for e in timeline.select(step=s) if e.kind in COMPUTE]
        span = max(e.end for e in compute) - min(e.start for e in compute)
        ratios.append(1.0 - sum(e.end - e.start for e in compute) / (p * span))
    t = stage_times(timeline)
    makespan = sum(t) + (m - 1) * max(t)
    return {"m": m, "measured": float(statistics.median(ratios)),
            "predicted": float(1.0 - m * sum(t) / (p * makespan)), "floor": float(1.0 - min(t) / max(t))}
''',
    # "fell to 14%" read as "14% give or take 3 points": a fix that did much better is not supported
    "verdict": '''
def verdict(report):
    before, after, best = report["uniform"], report["seed_fix"], report["balanced"]
    times = before["stage_ms"]
    scale = sum(SEED_MS) / sum(times)
    spread = lambda ts: max(ts) / (sum(ts) / len(ts))
    return {
        "stage4_slowest": all(times[-1] > t for t in times[:-1]),
        "proportions_match": all(abs(t * scale - s) <= SHARE_TOLERANCE * s for t, s in zip(times, SEED_MS)),
        "bubble_32": abs(before["bubble"] - SEED_BUBBLE["before"]) <= BUBBLE_TOLERANCE,
        "bubble_14": abs(after["bubble"] - SEED_BUBBLE["after"]) <= BUBBLE_TOLERANCE,
        "fix_balances": spread(after["stage_ms"]) < spread(times),
        "needs_more_micro_batches": best["bubble"] > SEED_BUBBLE["after"] + BUBBLE_TOLERANCE,
    }
''',
}
PARTLY = {"stage_times": 1, "candidate_partitions": 1, "bubble_report": 2, "verdict": 1}

#: The library where the lab asks for the raw events, through aliases imported before the checks.
SHORTCUTS = {
    "stage_times": '''
from utils.planning.whatif import measured_stage_costs as _costs


def stage_times(timeline):
    costs = _costs(timeline)
    return [float((f + b) * 1e3) for f, b in zip(costs.forward, costs.backward)]
''',
    "bubble_report": '''
def bubble_report(timeline):
    p, m = timeline.num_stages, int(timeline.num_micro_batches)
    t = stage_times(timeline)
    makespan = sum(t) + (m - 1) * max(t)
    return {"m": m, "measured": float(timeline.metrics().bubble_ratio),
            "predicted": float(1.0 - m * sum(t) / (p * makespan)), "floor": float(1.0 - (sum(t) / p) / max(t))}
''',
}

EXPECTED = {
    "partly_wrong": PARTLY,
    "liar": NONE,
    # the ban swaps the library's code inside the kernel while the checks call the student's functions
    "metrics_shortcut": {**FULL, "stage_times": 0, "bubble_report": 0},
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, record_timings):
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(submissions.WRONG, LAB.name, WRONG)
        patch.setitem(submissions.SHORTCUTS, LAB.name, SHORTCUTS)
        notebooks = {kind: build(LAB, kind) for kind in EXPECTED}
    return validate_and_grade(LAB, tmp_path_factory.mktemp("lab04"), notebooks, validate_timeout=TEST_TIMEOUT,
                              record_timings=record_timings)


def test_the_lab_has_ten_points_in_four_tasks():
    assert {name: task.points for name, task in LAB.tasks.items()} == FULL


def test_the_solution_earns_full_marks_and_the_student_copy_nothing(graded):
    assert_solution_full_and_copy_empty(graded[0], LAB)


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_score_of_each_kind_of_submission(graded, kind):
    results, _, _ = graded
    assert results[kind].per_task(LAB) == EXPECTED[kind], not_passed(results[kind])


def test_the_three_real_runs_are_recorded_once(graded):
    _, _, recorded = graded
    runs = {r.spec.name: r for r in list_runs(recorded)}
    assert sorted(runs) == ["lab04-balanced", "lab04-seed-fix", "lab04-uniform"] and all(r.ok for r in runs.values())
    assert runs["lab04-seed-fix"].parts == [0, 8, 16, 26, 32] and runs["lab04-seed-fix"].spec.micro_batches == 32
    # The balanced run's boundaries follow from the recorded uniform run alone (its stage times give the
    # per-layer costs), so every kernel and judge that reads the records asks for the same job and finds it.
    timeline = runs["lab04-uniform"].timeline
    ms = [(min(e.end - e.start for e in timeline.select(stage=s, kinds=["forward"]) if e.step > 0)
           + min(e.end - e.start for e in timeline.select(stage=s, kinds=["backward"]) if e.step > 0)) * 1e3
          for s in range(4)]
    block = (ms[1] + ms[2]) / 16
    layers = [max(ms[0] - 7 * block, 0.0)] + [block] * 30 + [max(ms[3] - 7 * block, 0.0)]
    assert runs["lab04-balanced"].parts == partition_layers(layers, 4)


def test_partial_credit_names_what_failed(graded):
    results, _, _ = graded
    checks = {c.id: c for c in results["partly_wrong"].checks}
    failed = {cid for cid, c in checks.items() if c.status != "passed"}
    assert failed == {"stage_times_crafted", "stage_times_real", "partitions_hidden", "bubble_predicted_hidden",
                      "verdict_hidden"}, failed
    assert "各取各的最小值" in checks["stage_times_crafted"].message
    assert "DeepSpeed" in checks["partitions_hidden"].message
    assert "floor" in checks["bubble_predicted_hidden"].message
    assert "bubble_14" in checks["verdict_hidden"].message


def test_the_library_metrics_are_refused_with_the_labs_reason(graded):
    results, _, _ = graded
    checks = {c.id: c for c in results["metrics_shortcut"].checks}
    for check in ("stage_times_public", "bubble_public"):
        assert "AssertionError" in checks[check].message and "原始事件" in checks[check].message
    assert results["correct"].review == [] and results["partly_wrong"].review == []


def test_an_object_equal_to_everything_earns_nothing(graded):
    results, _, _ = graded
    assert all(c.status == "error" for c in results["liar"].checks)


def test_grades_csv_and_feedback_are_safe(graded):
    _, out, _ = graded
    rows = list(csv.DictReader((out / "grades.csv").open(encoding="utf-8")))
    assert sorted(r["student"] for r in rows) == sorted([*EXPECTED, "correct", "empty"])
    assert_nothing_hidden_leaks(LAB, out)
