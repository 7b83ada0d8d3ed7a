"""Grading lab 10 (the capstone: end-to-end tuning), which launches real jobs.

`validate` runs the lab source once: its set-up runs DeepSpeed's default configuration and the
profiling run, and the check of the tuned configuration runs the default configuration again
and, right after it, the reference solution's tuned job (the cell after task 3 then finds it
recorded): four real jobs. The solution (full marks) and the unchanged
student copy (no marks) are graded with those records, and so are three prepared wrong
submissions (``--runs``): no judge launches a job for them, because each is either the
solution's configuration (found recorded) or refused before any run (the default itself, or a
configuration the lab's memory model already puts far over the budget). The kernel of the
two submissions whose "tuned" configuration is not the solution's each run it once, in the
set-up cell after task 3 (as a student's kernel does: its report cites that run).

The wrong submissions are written here, not in `tests.grading.submissions` (shared): each
replaces the answer code of one task of the solution.
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

LAB = LabSource.load(find_lab(ROOT, "lab10"))
FULL = {"predict": 2, "calibrate": 2, "tuned_spec": 4, "report": 2}
TIMEOUT = 120
"""Per-cell timeout here: the checks take well under a second, but a plain cell that imports
DeepSpeed can take longer than the shared 10 s on a loaded 2-core machine."""

#: DeepSpeed's default configuration handed back as the "tuned" one (only the name changed).
DEFAULT_AS_TUNED = '''
def tuned_spec(default_spec, budget, profile, calibration):
    return {**default_spec, "name": "lab10-tuned"}
'''

#: The report's numbers typed in from one run: right shape, nothing of any other summary.
HARD_CODED = '''
def report(default, tuned, predicted, budget):
    return "\\n".join([
        "调优后的配置：边界 [0, 6, 8]，调度 1f1b，m = 4。",
        "默认配置每步 203.2 ms，调优后每步 150.4 ms，加速比 1.35×。",
        "模型预测调优后每步 162.5 ms，预测误差 +8.0%。",
        "调优后各阶段一步新增的内存 28.5 MiB / 14.9 MiB，预算 30.0 MiB。",
        "结论：达标",
    ])
'''

#: GPipe at 4 micro-batches on the time-balanced split ("as fast as 1F1B"), whatever it holds:
#: every micro-batch's activations stay until the backwards, far over the 30 MiB budget.
OVER_BUDGET = '''
def tuned_spec(default_spec, budget, profile, calibration):
    return {**default_spec, "partition": [0, 6, 8], "schedule": "gpipe", "micro_batches": 4, "micro_batch_size": 4,
            "name": "lab10-tuned"}
'''

WRONG = {"default_as_tuned": {"tuned_spec": DEFAULT_AS_TUNED}, "hard_coded_report": {"report": HARD_CODED},
         "over_budget": {"tuned_spec": OVER_BUDGET}}
EXPECTED = {
    "default_as_tuned": {**FULL, "tuned_spec": 0},    # refused before any run: nothing was tuned
    "hard_coded_report": {**FULL, "report": 0},       # the real runs' numbers and the crafted ones are not cited
    "over_budget": {**FULL, "tuned_spec": 0},         # its own prediction and the lab's model: over the budget
}


def _submission(answers: dict[str, str]) -> str:
    """The solution with the answer code of some tasks replaced (through the shared builder)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(submissions.WRONG, LAB.name, answers)
        return build(LAB, "partly_wrong")


@pytest.fixture(scope="module")
def graded(tmp_path_factory, record_timings):
    # validate runs the lab source once (four real jobs), then grades the solution and the
    # student copy with the records; every submission below is graded with them too.
    notebooks = {kind: _submission(answers) for kind, answers in WRONG.items()}
    return validate_and_grade(LAB, tmp_path_factory.mktemp("lab10"), notebooks, validate_timeout=TIMEOUT,
                              timeout=TIMEOUT, record_timings=record_timings)


def test_the_lab_has_ten_points_in_four_tasks():
    assert {name: task.points for name, task in LAB.tasks.items()} == FULL


def test_the_solution_earns_full_marks_and_the_student_copy_nothing(graded):
    assert_solution_full_and_copy_empty(graded[0], LAB)


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_score_of_each_wrong_submission(graded, kind):
    results, _, _ = graded
    assert results[kind].per_task(LAB) == EXPECTED[kind], not_passed(results[kind])


def test_the_real_runs_are_recorded_once_and_reused(graded):
    _, _, recorded = graded
    runs = sorted((r.spec.name, r.spec.schedule, r.spec.micro_batches) for r in list_runs(recorded))
    assert [name for name, _, _ in runs] == ["lab10-default", "lab10-default-again", "lab10-profile", "lab10-tuned"], runs
    assert all(r.ok for r in list_runs(recorded))
    # What the graded kernels' runs/ folders held at the end: the recorded runs, plus the job each
    # kernel whose "tuned" configuration is not the solution's ran in the set-up cell after task 3
    # (the default one and the GPipe one); no judge ran any.
    kept = list_runs(recorded.parent.parent / "kept-runs")
    new = sorted((r.spec.name, r.spec.schedule, r.spec.micro_batches) for r in kept
                 if r.name not in {x.name for x in list_runs(recorded)})
    assert new == [("lab10-tuned", "1f1b", 1), ("lab10-tuned", "gpipe", 4)], new


def test_feedback_says_why(graded):
    results, _, _ = graded
    default = {c.id: c for c in results["default_as_tuned"].checks}
    assert all("返回的就是默认配置" in default[c].message for c in ("tuned_public", "tuned_search", "tuned_real", "tuned_floor"))
    over = {c.id: c for c in results["over_budget"].checks}
    assert "超过预算" in over["tuned_public"].message
    assert "超出预算 25% 以上" in over["tuned_real"].message and "超出预算 25% 以上" in over["tuned_floor"].message
    hard = {c.id: c for c in results["hard_coded_report"].checks}
    assert "没有找到" in hard["report_public"].message and "没有找到" in hard["report_hidden"].message


def test_grades_csv_and_feedback_are_safe(graded):
    _, out, _ = graded
    rows = list(csv.DictReader((out / "grades.csv").open(encoding="utf-8")))
    assert sorted(r["student"] for r in rows) == sorted([*EXPECTED, "correct", "empty"])
    assert_nothing_hidden_leaks(LAB, out)
