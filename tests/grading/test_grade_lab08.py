"""Grading lab 8 (dynamic re-balancing under a freezing workload), which launches two real jobs.

`validate` runs the lab source once (its set-up runs the static and the re-balancing job),
records the runs, and grades the solution (full marks) and the unchanged student copy (no
marks) with them; three prepared wrong submissions are then graded with the same records
(``--runs``), so no kernel and no judge launches a job again.

The wrong submissions are written here, not in `tests.grading.submissions` (shared): each
replaces the answer code of some tasks of the solution.
"""

from __future__ import annotations

import csv

import pytest

from tests.grading import submissions
from tests.grading.submissions import (ROOT, assert_nothing_hidden_leaks, assert_solution_full_and_copy_empty, build,
                                       not_passed, validate_and_grade)
from utils.grading.notebook_source import LabSource, find_lab
from utils.jobs.runs import list_runs

pytestmark = pytest.mark.integration

LAB = LabSource.load(find_lab(ROOT, "lab08"))
FULL = {"step_seconds": 2, "predict_boundaries": 2, "economics": 3, "justify": 3}

#: The justification's numbers typed in from one run (the verdict follows the rule): it cites
#: nothing of any other summary, the real run's included.
HARD_CODED = '''
def justify(summary):
    payback = summary["payback_steps"]
    pays = payback is not None and payback <= summary["remaining_steps"]
    text = ("重均衡策略在第 8 步之前把切分从 [0, 6, 12] 移到了 [0, 8, 12]。移动之后，静态切分每步 412.3 ms，"
            "动态切分每步 301.7 ms，每步节省 110.6 ms；一次迁移花了 352.9 ms，3.2 步回本，剩余 8 步。")
    return text + "\\n推荐：" + ("动态重切分" if pays else "静态切分")
'''

#: Cites every number right, but always recommends moving.
ALWAYS_DYNAMIC = '''
def justify(summary):
    def ms(seconds):
        return f"{seconds * 1e3:.1f} ms"

    payback, policy = summary["payback_steps"], summary["policy"]
    said = ("策略没有移动。" if policy is None else
            f"策略在第 {policy['step']} 步把 {list(policy['from'])} 换成 {list(policy['to'])}。")
    said += (f"静态 {ms(summary['static_after'])}，动态 {ms(summary['dynamic_after'])}，每步节省 "
             f"{ms(summary['saving_per_step'])}，迁移 {ms(summary['migration'])}，"
             + ("无法回本" if payback is None else f"{payback:.1f} 步回本")
             + f"，剩余 {summary['remaining_steps']} 步。")
    return said + "\\n推荐：动态重切分"
'''

#: Three tasks each wrong in a common way: the migration counted in its step (task 1), the
#: freezing ignored (task 2), the mean instead of the median (task 3: only the payback rules,
#: which the mean does not change on their inputs, still pass).
PARTLY_WRONG = {
    "step_seconds": '''
def step_seconds(timeline):
    return {s: float(max(e.end for e in timeline.select(step=s)) - min(e.start for e in timeline.select(step=s)))
            for s in timeline.steps}
''',
    "predict_boundaries": '''
def predict_boundaries(forward, backward, frozen, num_stages):
    return [int(b) for b in utils.partition_layers([f + b for f, b in zip(forward, backward)], num_stages)]
''',
    "economics": '''
def economics(static_steps, dynamic_steps, repartitions, total_steps):
    steps = {e.step for e in repartitions}
    if len(steps) != 1:
        raise ValueError("one move")
    move_step = steps.pop()
    migration = max(e.end for e in repartitions) - min(e.start for e in repartitions)
    static_after = statistics.fmean(t for s, t in static_steps.items() if s > move_step)
    dynamic_after = statistics.fmean(t for s, t in dynamic_steps.items() if s > move_step)
    saving = static_after - dynamic_after
    payback = migration / saving if saving > 0 else None
    remaining = total_steps - move_step
    return {"move_step": move_step, "migration": float(migration), "static_after": float(static_after),
            "dynamic_after": float(dynamic_after), "saving_per_step": float(saving), "remaining_steps": remaining,
            "payback_steps": payback, "pays": payback is not None and payback <= remaining}
''',
}

WRONG = {"hard_coded": {"justify": HARD_CODED}, "always_dynamic": {"justify": ALWAYS_DYNAMIC},
         "partly_wrong": PARTLY_WRONG}
EXPECTED = {
    # wrong numbers everywhere (public and cited checks fail); the verdict's rule is right
    "hard_coded": {**FULL, "justify": 1},
    # the public self-check's crafted summary (21 steps to pay back, 8 left) already fails it
    "always_dynamic": {**FULL, "justify": 1},
    "partly_wrong": {"step_seconds": 0, "predict_boundaries": 0, "economics": 1, "justify": 3},
}


def _submission(answers: dict[str, str]) -> str:
    """The solution with the answer code of some tasks replaced (through the shared builder)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(submissions.WRONG, LAB.name, answers)
        return build(LAB, "partly_wrong")


@pytest.fixture(scope="module")
def graded(tmp_path_factory, record_timings):
    # validate runs the lab source once (two real jobs) with the lab's own per-cell timeout;
    # the solution, the student copy and every submission below are graded with those records.
    notebooks = {kind: _submission(answers) for kind, answers in WRONG.items()}
    return validate_and_grade(LAB, tmp_path_factory.mktemp("lab08"), notebooks, validate_timeout=120,
                              record_timings=record_timings)


def test_the_lab_has_ten_points_in_four_tasks():
    assert {name: task.points for name, task in LAB.tasks.items()} == FULL


def test_the_solution_earns_full_marks_and_the_student_copy_nothing(graded):
    assert_solution_full_and_copy_empty(graded[0], LAB)


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_score_of_each_wrong_submission(graded, kind):
    results, _, _ = graded
    assert results[kind].per_task(LAB) == EXPECTED[kind], not_passed(results[kind])


def test_the_two_real_runs_are_recorded_and_the_policy_moved_once(graded):
    _, _, recorded = graded
    runs = {r.spec.name: r for r in list_runs(recorded)}
    assert sorted(runs) == ["lab08-dynamic", "lab08-static"] and all(r.ok for r in runs.values())
    assert len(runs["lab08-dynamic"].partition_history) == 2 and len(runs["lab08-static"].partition_history) == 1
    # The hidden checks' verdicts and the real run's recommendation agree with the numbers, whatever they were.
    assert any(d.migrate for d in runs["lab08-dynamic"].rebalance_decisions)


def test_feedback_names_what_the_justification_missed(graded):
    results, _, _ = graded
    hard = {c.id: c for c in results["hard_coded"].checks}
    assert hard["justify_hidden_verdict"].status == "passed"
    assert "没有找到" in hard["justify_public"].message and "没有找到" in hard["justify_hidden_cited"].message
    always = {c.id: c for c in results["always_dynamic"].checks}
    assert always["justify_hidden_cited"].status == "passed"
    assert "应推荐静态切分" in always["justify_public"].message
    assert always["justify_hidden_verdict"].status != "passed"
    partly = {c.id: c for c in results["partly_wrong"].checks}
    assert "repartition" in partly["step_seconds_public"].message
    assert partly["economics_hidden_payback"].status == "passed"


def test_grades_csv_and_feedback_are_safe(graded):
    _, out, _ = graded
    rows = list(csv.DictReader((out / "grades.csv").open(encoding="utf-8")))
    assert sorted(r["student"] for r in rows) == sorted([*EXPECTED, "correct", "empty"])
    assert_nothing_hidden_leaks(LAB, out)
