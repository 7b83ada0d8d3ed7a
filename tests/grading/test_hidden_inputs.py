"""Issue 37, point 4: hidden checks draw fresh inputs per grading, from a seed the grader picks
per submission and records in its result, so that answers prepared from an earlier grading's
inputs do not fit and a regrade with the recorded seed draws the same inputs again.

A lab 3 submission prints the first costs it is called with (what it sees in each check);
the instructor's executed notebook keeps what a function prints during a check."""

from __future__ import annotations

import json

import pytest

from tests.grading.submissions import ROOT, TEST_TIMEOUT, build
from utils.grading.batch import grade_batch
from utils.grading.check_api import SEED_ENV, hidden_seed
from utils.grading.grade import Options
from utils.grading.notebook_source import LabSource, find_lab

pytestmark = pytest.mark.integration

LAB = LabSource.load(find_lab(ROOT, "lab03"))
PRINTER = "\n\n_correct_partition = balanced_partition\n\n\n" \
          "def balanced_partition(costs, num_stages):\n" \
          "    print('seen', len(costs), list(costs)[:4])\n" \
          "    return _correct_partition(costs, num_stages)\n"


def test_hidden_seed_is_the_base_outside_grading_and_mixed_with_the_graders_seed_inside(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    assert hidden_seed(99) == 99  # the solution run top to bottom, nbval: the lab's own instances
    monkeypatch.setenv(SEED_ENV, "1")
    one = hidden_seed(99)
    monkeypatch.setenv(SEED_ENV, "2")
    assert one != hidden_seed(99) != 99 and hidden_seed(99) != hidden_seed(7)
    monkeypatch.setenv(SEED_ENV, "1")
    assert hidden_seed(99) == one


def _seen(tmp_path, name: str, seed: int | None) -> tuple[list[str], int, float]:
    """What the submission saw in the hidden checks, the seed recorded and the score."""
    nb = json.loads(build(LAB, "correct"))
    cell = next(c for c in nb["cells"] if (c.get("metadata", {}).get("grading") or {}).get("task")
                == "balanced_partition" and c["metadata"]["grading"]["kind"] == "answer")
    cell["source"] = "".join(cell["source"]) + PRINTER
    folder = tmp_path / name / "submissions"
    folder.mkdir(parents=True)
    (folder / "printer.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    [result] = grade_batch(LAB.path, folder, tmp_path / name / "out", workers=1, echo=lambda text: None,
                           options=Options(timeout=TEST_TIMEOUT, seed=seed))
    executed = json.loads((tmp_path / name / "out" / "instructor" / "printer.ipynb").read_text(encoding="utf-8"))
    seen = []
    for c in executed["cells"]:
        run = c["metadata"].get("grading_run") or {}
        if run.get("check") in ("balanced_hidden_random", "balanced_hidden_large"):
            # joined: one print may arrive as several stream messages
            text = "".join("".join(o["text"]) for o in c["outputs"] if o.get("output_type") == "stream")
            seen += [line for line in text.splitlines() if line.startswith("seen")]
    return seen, result.seed, result.total


def test_hidden_inputs_are_fresh_per_grading_and_the_same_again_with_the_recorded_seed(tmp_path):
    first, seed, total = _seen(tmp_path, "first", None)
    assert total == 10 and isinstance(seed, int)  # the solution passes on the drawn instances too
    again, same_seed, _ = _seen(tmp_path, "again", seed)
    other, _, other_total = _seen(tmp_path, "other", seed + 1)
    assert first and same_seed == seed
    assert again == first      # a regrade with the recorded seed: the same inputs
    assert other != first      # another seed: other inputs (a prepared table no longer fits)
    assert other_total == 10
