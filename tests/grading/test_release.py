"""The student release: everything a student needs, no solutions, no hidden tests."""

from __future__ import annotations

import shutil

import pytest

from tests.grading.submissions import ROOT
from utils.grading.__main__ import main
from utils.grading.release import MARKERS, ReleaseError, _json_unescaped, build_release, secrets


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "workbook"
    assert main(["release", "--out", str(out)]) == 0
    return out


def test_release_has_what_students_need(release):
    for name in ("chapters", "labs", "utils", "README.md", "pyproject.toml", "environment.yml", "Makefile"):
        assert (release / name).exists(), name
    for path in (ROOT / "labs").glob("*.ipynb"):
        assert (release / "labs" / path.name).read_bytes() == path.read_bytes()
    assert (release / "utils" / "__init__.py").exists()


def test_release_has_no_solutions_hidden_tests_or_grader(release):
    assert not (release / "solutions").exists()
    assert not (release / "tests").exists()
    assert not (release / "utils" / "grading").exists()
    assert not list(release.rglob("__pycache__"))
    lines = secrets(ROOT)
    assert len(lines) > 50
    for path in release.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        plain = _json_unescaped(text)
        for marker in MARKERS:
            assert marker not in text, f"{path}: {marker}"
        if path.suffix == ".ipynb" and path.parent.name == "labs":
            assert [line for line in lines if line in plain] == [], path


def test_release_refuses_a_non_empty_folder_and_stale_labs(tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(ReleaseError, match="not empty"):
        build_release(ROOT, tmp_path / "busy")
    root = tmp_path / "project"
    shutil.copytree(ROOT / "solutions", root / "solutions")
    shutil.copytree(ROOT / "labs", root / "labs")
    lab = root / "labs" / "lab01_measure_bubble.ipynb"
    lab.write_text(lab.read_text(encoding="utf-8").replace("测量气泡", "测量"), encoding="utf-8")
    with pytest.raises(ReleaseError, match="labs/ is not what the sources generate"):
        build_release(root, tmp_path / "out")


def test_release_refuses_a_leak(tmp_path):
    root = tmp_path / "project"
    shutil.copytree(ROOT / "solutions", root / "solutions")
    shutil.copytree(ROOT / "labs", root / "labs")
    (root / "chapters").mkdir()
    (root / "chapters" / "99_leak.md").write_text("### BEGIN HIDDEN TESTS\n", encoding="utf-8")
    with pytest.raises(ReleaseError, match="99_leak"):
        build_release(root, tmp_path / "out")
    assert not (tmp_path / "out").exists()
