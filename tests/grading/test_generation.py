"""One source per lab: labs/ is generated from solutions/, byte for byte, and the committed
copies are up to date (this is the check CI runs)."""

from __future__ import annotations

import ast
import re
import shutil

import nbformat
import pytest

from utils.grading.__main__ import main
from utils.grading.feedback import fmt
from utils.grading.notebook_source import (LabSource, SourceError, generate, secret_lines, sources,
                                           strip_hidden, stub_solutions)
from utils.grading.release import MARKERS, _json_unescaped

from tests.grading.submissions import ROOT

LABS = [LabSource.load(p) for p in sources(ROOT)]


def test_every_lab_has_ten_points():
    assert [lab.name for lab in LABS] == ["lab01_measure_bubble", "lab02_metrics_from_events",
                                          "lab03_balanced_partition", "lab04_rebalance_seed_case",
                                          "lab05_schedules_as_data", "lab06_micro_batch_budget",
                                          "lab07_diagnose_pipeline_jobs", "lab08_dynamic_rebalance",
                                          "lab09_whatif_schedules", "lab10_end_to_end_tuning"]
    assert all(lab.max_points == 10 for lab in LABS)


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_the_rules_state_the_labs_own_cell_timeout(lab):
    """The rules tell students how long a cell may run: the lab's cell_timeout, in minutes."""
    intro = "\n".join(c.source for c in lab.nb.cells if c.cell_type == "markdown")
    stated = re.findall(r"一个单元运行太久（默认 (\d+) 分钟）", intro)
    assert stated == [f"{lab.cell_timeout / 60:g}"], (stated, lab.cell_timeout)


def test_check_command_passes_on_the_repository(capsys):
    assert main(["generate", "--check"]) == 0, capsys.readouterr()
    assert "up to date" in capsys.readouterr().out


def _copy_project(tmp_path):
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    shutil.copytree(ROOT / "labs", tmp_path / "labs")
    return tmp_path


def test_generation_is_byte_identical_and_round_trips(tmp_path):
    root = _copy_project(tmp_path)
    shutil.rmtree(root / "labs")
    generate(root)
    first = {p.name: p.read_bytes() for p in (root / "labs").glob("*.ipynb")}
    generate(root)
    second = {p.name: p.read_bytes() for p in (root / "labs").glob("*.ipynb")}
    assert first == second
    assert first == {p.name: p.read_bytes() for p in (ROOT / "labs").glob("*.ipynb")}
    for name, data in first.items():  # nbformat reads it back and writes the same bytes
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
        assert (nbformat.writes(nb) + "\n").encode("utf-8") == data, name


def test_check_mode_reports_stale_missing_and_orphaned_labs(tmp_path):
    root = _copy_project(tmp_path)
    stale = root / "labs" / "lab02_metrics_from_events.ipynb"
    stale.write_text(stale.read_text(encoding="utf-8").replace("实验 2", "实验 二"), encoding="utf-8")
    (root / "labs" / "lab03_balanced_partition.ipynb").unlink()
    (root / "labs" / "lab99_orphan.ipynb").write_text("{}", encoding="utf-8")
    problems = generate(root, check=True)
    assert len(problems) == 3
    assert any("lab02" in p and "differs" in p for p in problems)
    assert any("lab03" in p and "missing" in p for p in problems)
    assert any("lab99" in p and "no source" in p for p in problems)
    assert main(["--root", str(root), "generate", "--check"]) == 1


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_student_copy_has_stubs_and_public_tests_only(lab):
    text = (ROOT / "labs" / f"{lab.name}.ipynb").read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    for marker in MARKERS:
        assert marker not in text
    plain = _json_unescaped(text)
    secrets = secret_lines(lab)
    assert len(secrets) > 20
    assert [line for line in secrets if line in plain] == []  # not even part of a solution or hidden test
    by_id = {c.metadata.get("grading", {}).get("id"): c for c in nb.cells if "grading" in c.metadata}
    for task in lab.tasks.values():
        stub = by_id[task.answer_id].source
        assert f"raise NotImplementedError({task.name!r})" in stub
        assert f"def {task.name}(" in stub  # the signature stays
        ast.parse(stub)
        for check in task.checks:
            if check.public_source is None:
                assert check.id not in by_id  # a wholly hidden cell is gone
            else:
                assert by_id[check.id].source == check.public_source
                assert by_id[check.id].metadata["grading"]["points"] == check.points
    for cell in nb.cells:
        assert set(cell.metadata) <= {"grading", "tags", "editable", "deletable"}
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert any(c.hidden for c in lab.checks) and any(c.public_source for c in lab.checks)


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_every_task_states_its_points_and_has_a_public_self_check(lab):
    cells = lab.nb.cells
    for task in lab.tasks.values():
        index = next(i for i, c in enumerate(cells) if c.get("id") == task.answer_cell_id)
        prose = next(c.source for c in reversed(cells[:index]) if c.cell_type == "markdown")
        assert f"（{fmt(task.points)} 分）" in prose, f"{task.name}: the task text should state its points"
        assert any(c.public_source for c in task.checks), f"{task.name}: no public self-check"


def test_stub_keeps_lines_above_the_region_and_its_indentation():
    source = "def f(x):\n    \"\"\"Doc.\"\"\"\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n"
    assert stub_solutions(source, "f") == ("def f(x):\n    \"\"\"Doc.\"\"\"\n"
                                           "    # 在这里写你的代码 (write your code here)\n"
                                           "    raise NotImplementedError('f')")


def test_strip_hidden_keeps_the_public_part_and_drops_a_wholly_hidden_cell():
    mixed = "assert f(1) == 2\n### BEGIN HIDDEN TESTS\nassert f(2) == 3\n### END HIDDEN TESTS\n"
    assert strip_hidden(mixed) == "assert f(1) == 2"
    assert strip_hidden("# 隐藏\n### BEGIN HIDDEN TESTS\nassert f(2) == 3\n### END HIDDEN TESTS") is None


def _cell(source, **grading):
    cell = nbformat.v4.new_code_cell(source)
    if grading:
        cell.metadata["grading"] = grading
    return cell


ANSWER = "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION"


@pytest.mark.parametrize("cells, complaint", [
    ([_cell(ANSWER, kind="answer", id="f", task="f")], "no test cell"),
    ([_cell("def f(x):\n    ### BEGIN SOLUTION\n    return x", kind="answer", id="f", task="f")], "without END"),
    ([_cell("assert f(1) == 1", kind="test", id="t", task="f", points=1),
      _cell(ANSWER, kind="answer", id="f", task="f")], "must follow"),
    ([_cell(ANSWER, kind="answer", id="f", task="f"), _cell("x = 1"),
      _cell("assert f(1) == 1", kind="test", id="t", task="f", points=1)], "must follow"),
    ([_cell(ANSWER, kind="answer", id="f", task="f"),
      _cell("assert f(1) == 1", kind="test", id="t", task="f")], "positive points"),
    ([_cell(ANSWER, kind="answer", id="f", task="f"),
      _cell("assert f(1) == 1", kind="test", id="f", task="f", points=1)], "used twice"),
    ([_cell("x = 1\n### BEGIN HIDDEN TESTS\n### END HIDDEN TESTS")], "test cells only"),
    ([_cell("def f(x):\n    return x", kind="answer", id="f", task="f")], "without a '### BEGIN SOLUTION'"),
])
def test_broken_sources_are_rejected_with_a_reason(tmp_path, cells, complaint):
    path = tmp_path / "lab09_broken.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    with pytest.raises(SourceError, match=complaint):
        LabSource.load(path)


def test_a_check_is_hidden_when_it_has_a_hidden_region_not_when_its_source_ends_in_a_newline(tmp_path):
    path = tmp_path / "lab09_small.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        _cell(ANSWER, kind="answer", id="f", task="f"),
        _cell("assert f(1) == 1\n", kind="test", id="public", task="f", points=1),
        _cell("assert f(1) == 1\n### BEGIN HIDDEN TESTS\nassert f(2) == 2\n### END HIDDEN TESTS\n",
              kind="test", id="mixed", task="f", points=1),
        _cell("### BEGIN HIDDEN TESTS\nassert f(3) == 3\n### END HIDDEN TESTS", kind="test", id="all", task="f",
              points=1)]), path)
    checks = {c.id: c for c in LabSource.load(path).checks}
    assert checks["public"].source == "assert f(1) == 1\n"  # kept as written: the newline is not hidden
    assert [checks[i].hidden for i in ("public", "mixed", "all")] == [False, True, True]
    assert [checks[i].public_source for i in ("public", "mixed", "all")] == ["assert f(1) == 1"] * 2 + [None]
