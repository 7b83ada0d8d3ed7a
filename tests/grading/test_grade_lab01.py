"""Grading lab 1, which launches four real DeepSpeed jobs.

`validate` runs the lab source's four real jobs once, then grades the lab's solution (full
marks) and its unchanged student copy (no marks) with those recorded runs, through the same
path as students' work.
The full matrix of submission kinds runs on labs 2 and 3, whose grading is cheaper.
"""

from __future__ import annotations

import pytest

from tests.grading.submissions import ROOT, TEST_TIMEOUT, assert_nothing_hidden_leaks, build, not_passed
from utils.grading import Options, grade_batch, validate
from utils.grading.notebook_source import LabSource, find_lab
from utils.jobs.runs import list_runs

pytestmark = pytest.mark.integration

LAB = LabSource.load(find_lab(ROOT, "lab01"))


@pytest.fixture(scope="module")
def validated(tmp_path_factory, record_timings):
    out = tmp_path_factory.mktemp("lab01")
    solution, empty = validate(LAB.path, out, options=Options(timeout=TEST_TIMEOUT))
    solution.student, empty.student = "correct", "empty"
    record_timings(LAB, [solution, empty])
    return solution, empty, out


def test_the_solution_earns_full_marks(validated):
    solution, _, _ = validated
    assert solution.per_task(LAB) == {"theory_bubble": 2, "measured_bubble": 2, "fit_pipeline_model": 4,
                                      "predict_bubble": 2}, not_passed(solution)
    assert not solution.error


def test_the_unchanged_student_copy_earns_nothing(validated):
    _, empty, _ = validated
    assert empty.total == 0
    assert all(c.status == "error" for c in empty.checks)
    assert all("NotImplementedError" in c.message for c in empty.checks)


def test_the_four_real_runs_are_recorded_once_and_reused(validated):
    """The lab source ran its jobs once; the solution's and the student copy's kernels found
    them recorded (a kernel that launched its own would have added a second set)."""
    _, _, out = validated
    runs = list_runs(out / "recorded-runs")
    assert sorted(r.spec.micro_batches for r in runs) == [1, 2, 4, 8] and all(r.ok for r in runs)


def test_the_library_shortcut_for_task_2_earns_nothing_there(validated, tmp_path):
    """`return float(timeline.metrics().bubble_ratio)` used to pass task 2's checks: the lab now
    forbids the library's metrics while its checks call measured_bubble."""
    _, _, out = validated
    (tmp_path / "submissions").mkdir()
    (tmp_path / "submissions" / "shortcut.ipynb").write_text(build(LAB, "metrics_shortcut"), encoding="utf-8")
    [result] = grade_batch(LAB.path, tmp_path / "submissions", tmp_path / "out", workers=1,
                           options=Options(timeout=TEST_TIMEOUT, runs=out / "recorded-runs"))
    assert result.per_task(LAB) == {"theory_bubble": 2, "measured_bubble": 0, "fit_pipeline_model": 4,
                                    "predict_bubble": 2}, not_passed(result)
    assert any("原始事件" in c.message for c in result.checks if c.task == "measured_bubble")


def test_feedback_is_safe(validated):
    _, _, out = validated
    assert_nothing_hidden_leaks(LAB, out)
