"""Keep every test's runs — notebooks executed by nbval included, whose kernels inherit this
environment — out of the project's own runs/ folder.

Each lab solution executed by nbval keeps its runs in a folder of its own
(``$WORKBOOK_TEST_SOLUTION_RUNS/<notebook name>``), and the grading tests run after the
notebooks: they hand those runs to `utils.grading.validate` as recorded runs, as an instructor
hands ``grade --runs`` a class, so each lab's real jobs run once in the suite rather than
twice (``tests.grading.submissions.solution_runs``).
"""

import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
SOLUTION_RUNS_ENV = "WORKBOOK_TEST_SOLUTION_RUNS"


def pytest_configure(config):
    if "WORKBOOK_RUNS" not in os.environ:
        os.environ["WORKBOOK_RUNS"] = tempfile.mkdtemp(prefix="workbook-test-runs-")
    os.environ.setdefault(SOLUTION_RUNS_ENV, tempfile.mkdtemp(prefix="workbook-solution-runs-"))


def pytest_collection_modifyitems(session, config, items):
    """The grading tests last (order kept otherwise): by then the solutions have run."""
    grading = ROOT / "tests" / "grading"
    items.sort(key=lambda item: grading in Path(item.path).parents)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    # nbval starts a notebook's kernel while its first cell is set up: the kernel keeps the
    # WORKBOOK_RUNS it started with, so the variable is set for the setup phase only.
    notebook = Path(item.path)
    if notebook.suffix != ".ipynb" or notebook.parent != ROOT / "solutions":
        return (yield)
    folder = Path(os.environ[SOLUTION_RUNS_ENV]) / notebook.stem
    folder.mkdir(parents=True, exist_ok=True)
    previous = os.environ["WORKBOOK_RUNS"]
    os.environ["WORKBOOK_RUNS"] = str(folder)
    try:
        return (yield)
    finally:
        os.environ["WORKBOOK_RUNS"] = previous
