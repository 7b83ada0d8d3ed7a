"""The student release: everything a student needs, no solutions, no hidden tests, and
commands of its own that work on what it contains."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.grading.submissions import ROOT, build
from utils.grading.notebook_source import LabSource, find_lab
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
    assert sorted(p.name for p in (release / "utils" / "grading").iterdir()) == ["__init__.py", "check_api.py"]
    for absent in ("benchmarks", "docs/instructors.md", "docs/architecture.md", ".ci"):
        assert not (release / absent).exists(), absent
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


def _make(release: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The release's own make command, with this machine's environment as the venv (set-up
    itself is pip installing the pinned packages: not repeated here, see below) and the
    release's own `utils` first on the path (as its editable install would have it)."""
    venv = Path(sys.executable).parents[1]
    env = {**os.environ, "PYTHONPATH": str(release)}
    return subprocess.run(["make", f"VENV={venv}", *args], cwd=release, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_release_readme_names_only_what_the_release_has(release):
    readme = (release / "README.md").read_text(encoding="utf-8")
    makefile = (release / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z-]+):", makefile, re.M))
    named = set(re.findall(r"make ([a-z-]+)", readme))
    assert named == {"lab", "test", "check"} and named <= targets
    for path in re.findall(r"`((?:chapters|labs|utils|docs)/[^`]*)`", readme):
        assert (release / path.rstrip("/")).exists(), path
    for word in ("solutions", "tests/", "benchmarks", "instructors"):
        assert word not in readme + makefile, word
    assert 'testpaths = ["chapters"]' in (release / "pyproject.toml").read_text(encoding="utf-8")


def test_the_released_copy_runs_its_own_commands(release, tmp_path):
    """`make test` and `make check` as the release's README prints them, in the release."""
    stamp = Path(sys.executable).parents[1] / ".installed"
    if not stamp.exists():
        stamp.touch()
    os.utime(release / "pyproject.toml", (0, 0))  # set-up is done: make sees the stamp as newer
    dry = _make(release, "-n", "lab")
    assert dry.returncode == 0 and "jupyter lab" in dry.stdout and "chapters/01_course_intro.ipynb" in dry.stdout
    assert (release / "chapters" / "01_course_intro.ipynb").exists()

    # `make test` runs every chapter (they are executed by this project's own `make test`
    # already); a small notebook stands in for them here, so the command runs as printed
    # without the chapters' real jobs: the release's pytest config, nbval, a kernel, its utils.
    assert re.search(r"pytest chapters\b", _make(release, "-n", "test").stdout)
    smoke = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import utils\n"
        f"assert utils.__file__.startswith({str(release)!r}), utils.__file__\n"
        "timeline = utils.simulate(utils.build_schedule('1f1b', 2, 4), forward=1.0, backward=2.0)\n"
        "assert abs(timeline.metrics().bubble_ratio - 1 / 5) < 1e-9")])
    nbformat.write(smoke, release / "chapters" / "00_smoke.ipynb")
    chapter = _make(release, "test", "CHAPTERS=chapters/00_smoke.ipynb", "PYTEST_ARGS=-p no:cacheprovider -q")
    assert chapter.returncode == 0, chapter.stdout[-3000:] + chapter.stderr[-2000:]
    assert "1 passed" in chapter.stdout

    lab = LabSource.load(find_lab(ROOT, "lab03"))
    unanswered = _make(release, "check", "LAB=lab03", "PYTEST_ARGS=-p no:cacheprovider -q")
    assert unanswered.returncode != 0 and "NotImplementedError" in unanswered.stdout
    (release / "labs" / f"{lab.name}.ipynb").write_text(build(lab, "correct"), encoding="utf-8")
    answered = _make(release, "check", "LAB=lab03", "PYTEST_ARGS=-p no:cacheprovider -q")
    assert answered.returncode == 0, answered.stdout[-3000:]
    usage = _make(release, "check")
    assert usage.returncode != 0 and "make check LAB=lab01" in usage.stdout
