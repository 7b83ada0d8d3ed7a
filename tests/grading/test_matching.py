"""The grader's parts that need no kernel: reading submissions, matching cells to the source,
feedback messages, the resource-limit wrapper."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.grading.submissions import ROOT, build
from utils.grading.execute import CellOutcome
from utils.grading.feedback import explain_check
from utils.grading.grade import plan, read_submission
from utils.grading.notebook_source import Check, LabSource, find_lab, hidden_regions
from utils.grading.sandbox import Limits

LAB = LabSource.load(find_lab(ROOT, "lab03"))


def _cells(tmp_path, text: str):
    path = tmp_path / "s.ipynb"
    path.write_text(text, encoding="utf-8")
    return read_submission(path)


def _layout(planned):
    """Student cells as their number, checks as their id."""
    return [p.check.id if p.check else p.number for p in planned]


def test_checks_follow_their_answers_and_student_test_cells_are_dropped(tmp_path):
    planned, notes = plan(LAB, _cells(tmp_path, build(LAB, "tests_edited")), 10)
    order = _layout(planned)
    assert notes == []
    assert order[:2] == [1, 2]  # setup, stage_loads answer
    assert order[2:4] == ["loads_public", "loads_hidden"]
    assert "assert True" not in "".join(p.source for p in planned)  # the edited test cells are gone
    assert [x for x in order if isinstance(x, str)] == [c.id for c in LAB.checks]
    ran = {p.check.id: p.source for p in planned if p.check}
    student_copy = "\n".join(c.source for c in LAB.student_copy().cells)
    hidden = [c for c in LAB.checks if c.hidden]
    assert hidden
    for check in hidden:  # what runs is the source's whole cell, hidden region included
        assert ran[check.id] == check.source
        regions = hidden_regions(check.source)
        assert regions and all(r.strip() and r not in student_copy for r in regions)


def test_metadata_lost_still_matches_by_function_name_and_keeps_setup_timeouts(tmp_path):
    cells = _cells(tmp_path, build(LAB, "metadata_lost"))
    assert all(c.metadata == {} and c.cell_id is None for c in cells)
    planned, notes = plan(LAB, cells, 10)
    assert notes == []
    assert planned[0].timeout == 300  # the unchanged setup cell keeps its own timeout
    assert _layout(planned)[2:4] == ["loads_public", "loads_hidden"]


def test_a_later_redefinition_wins_and_a_missing_answer_runs_its_checks_at_the_end(tmp_path):
    nb = json.loads(build(LAB, "correct"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    moved = next(c for c in code if c["metadata"].get("grading", {}).get("task") == "stage_loads")
    nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                        "source": moved["source"]})  # the student redefined it at the very end
    moved["source"] = "# 我把函数移到最后了"
    gone = next(c for c in code if c["metadata"].get("grading", {}).get("task") == "speedup_over_uniform")
    nb["cells"].remove(gone)
    planned, notes = plan(LAB, _cells(tmp_path, json.dumps(nb)), 10)
    order = _layout(planned)
    assert order.index("loads_public") == order.index(max(x for x in order if isinstance(x, int))) + 1
    assert order[-2:] == ["speedup_public", "speedup_hidden"]
    assert any("speedup_over_uniform" in n and "末尾" in n for n in notes)


def test_position_is_the_last_resort(tmp_path):
    nb = json.loads(build(LAB, "metadata_lost"))
    for cell in nb["cells"]:  # renamed function and no metadata: only the position is left
        cell["source"] = "".join(cell["source"]).replace("def stage_loads(", "def my_loads(")
    planned, notes = plan(LAB, _cells(tmp_path, json.dumps(nb)), 10)
    assert _layout(planned)[2:4] == ["loads_public", "loads_hidden"]
    assert any("stage_loads" in n and "位置" in n for n in notes)


def test_reading_tolerates_broken_structure_and_rejects_non_notebooks(tmp_path):
    cells = _cells(tmp_path, json.dumps({"cells": [{"cell_type": "code", "source": ["a = 1\n", "b = 2"]},
                                                   {"source": "c = 3", "metadata": None}, "junk"]}))
    assert [c.source for c in cells] == ["a = 1\nb = 2", "c = 3"]
    assert cells[1].grading == {}
    for text in ("not json {", "[1, 2]", json.dumps({"nbformat": 4})):
        with pytest.raises(ValueError):
            _cells(tmp_path, text)


CHECK = Check(id="c", task="t", points=1, description="", source="x", public_source=None)
PUBLIC = Check(id="p", task="t", points=1, description="", source="x", public_source="x")


@pytest.mark.parametrize("outcome, check, expected, absent", [
    (CellOutcome("error", "AssertionError", "应为 0.5"), CHECK, "应为 0.5", None),
    (CellOutcome("error", "AssertionError", ""), CHECK, "没有附带说明", None),
    (CellOutcome("error", "ZeroDivisionError", "division by zero"), CHECK, "ZeroDivisionError", "division by zero"),
    (CellOutcome("error", "ZeroDivisionError", "division by zero"), PUBLIC, "ZeroDivisionError: division by zero", None),
    (CellOutcome("error", "NotImplementedError", "f"), CHECK, "NotImplementedError", None),
    (CellOutcome("timeout", "CellTimeout", ""), CHECK, "超时：10 秒", None),
    (CellOutcome("dead", "DeadKernelError", ""), CHECK, "崩溃", None),
])
def test_feedback_messages(outcome, check, expected, absent):
    message = explain_check(check, outcome, 10)
    assert expected in message
    assert absent is None or absent not in message


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"),
                    reason="the sandbox skips the address-space limit where an NVIDIA driver is present")
def test_sandbox_wrapper_applies_limits_before_exec():
    limits = Limits(memory_gb=3, cpu_seconds=100, file_gb=1)
    code = ("import resource as r; print(r.getrlimit(r.RLIMIT_AS)[0], r.getrlimit(r.RLIMIT_CPU)[0], "
            "r.getrlimit(r.RLIMIT_FSIZE)[0], r.getrlimit(r.RLIMIT_CORE)[0])")
    done = subprocess.run([*limits.wrapper_args(), sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == [str(3 * 1024 ** 3), "100", str(1024 ** 3), "0"]
    unlimited = Limits(memory_gb=0, cpu_seconds=0, file_gb=0)
    done = subprocess.run([*unlimited.wrapper_args(), sys.executable, "-c", code], capture_output=True,
                          text=True, check=True)
    assert done.stdout.split()[0] == "-1"
