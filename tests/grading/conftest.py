"""Fixtures of the grader's tests: a per-submission timing table printed at the end of the run."""

from __future__ import annotations

import pytest

from utils.grading.notebook_source import LabSource

#: (lab, student, seconds, points, max) for every submission graded in this session.
TIMINGS: list[tuple[str, str, float, float, float]] = []


@pytest.fixture(scope="session")
def record_timings():
    """Call with (lab, results) to add submissions to the timing table."""
    def record(lab: LabSource, results) -> None:
        for r in results:
            TIMINGS.append((lab.name, r.student, r.seconds, r.total, lab.max_points))
    return record


def pytest_terminal_summary(terminalreporter):
    if not TIMINGS:
        return
    terminalreporter.section("per-submission grading time")
    for lab, student, seconds, points, maximum in TIMINGS:
        terminalreporter.write_line(f"{lab:<28} {student:<15} {seconds:6.1f} s   {points:g}/{maximum:g}")
    by_lab: dict[str, list[float]] = {}
    for lab, _, seconds, _, _ in TIMINGS:
        by_lab.setdefault(lab, []).append(seconds)
    for lab, times in by_lab.items():
        terminalreporter.write_line(f"{lab}: {len(times)} submission(s), mean {sum(times) / len(times):.1f} s, "
                                    f"max {max(times):.1f} s")
