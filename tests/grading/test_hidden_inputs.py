"""Issue 37, point 4: hidden checks draw fresh inputs per grading, from a seed the grader picks
per submission and records in its result, so that answers prepared from an earlier grading's
inputs do not fit and a regrade with the recorded seed draws the same inputs again.

Lab 3 submissions print what they are called with in each check (the instructor's executed
notebook keeps what a function prints during a check): the inputs differ between seeds, and a
table of answers recorded in one grading earns nothing in the next."""

from __future__ import annotations

import ast
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


RECORDER = "\n\n_correct_partition = balanced_partition\n\n\n" \
           "def balanced_partition(costs, num_stages):\n" \
           "    answer = _correct_partition(costs, num_stages)\n" \
           "    print('ENTRY', repr([list(costs), num_stages, list(answer)]))\n" \
           "    return answer\n"


def _graded(tmp_path, name: str, nb: dict, seed: int) -> tuple:
    folder = tmp_path / name / "submissions"
    folder.mkdir(parents=True)
    (folder / f"{name}.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    [result] = grade_batch(LAB.path, folder, tmp_path / name / "out", workers=1, echo=lambda text: None,
                           options=Options(timeout=TEST_TIMEOUT, seed=seed))
    executed = json.loads((tmp_path / name / "out" / "instructor" / f"{name}.ipynb").read_text(encoding="utf-8"))
    return result, executed


def _with_answer(kind: str, extra: str) -> dict:
    nb = json.loads(build(LAB, kind))
    cell = next(c for c in nb["cells"] if (c.get("metadata", {}).get("grading") or {}).get("task")
                == "balanced_partition" and c["metadata"]["grading"]["kind"] == "answer")
    cell["source"] = "".join(cell["source"]) + extra
    return nb


def test_a_table_of_answers_from_an_earlier_grading_earns_nothing_more(tmp_path):
    """The route of the review (issue 37, point 4): a wrong algorithm plus a table of the right
    answers for the hidden inputs an earlier grading drew. Replayed with that grading's seed the
    table pays; with the fresh seed of a new grading the submission gets its honest score."""
    _, executed = _graded(tmp_path, "recorder", _with_answer("correct", RECORDER), seed=11)
    table = {}
    for c in executed["cells"]:
        if ((c["metadata"].get("grading_run") or {}).get("check") or "").startswith("balanced_hidden"):
            text = "".join("".join(o["text"]) for o in c["outputs"] if o.get("output_type") == "stream")
            for line in text.splitlines():
                if line.startswith("ENTRY "):
                    costs, p, answer = ast.literal_eval(line[len("ENTRY "):])
                    table[repr((costs, p))] = answer
    assert len(table) > 50
    lookup = (f"\n\n_TABLE = {table!r}\n_wrong_partition = balanced_partition\n\n\n"
              "def balanced_partition(costs, num_stages):\n"
              "    return _TABLE.get(repr((list(costs), num_stages))) or _wrong_partition(costs, num_stages)\n")
    honest, _ = _graded(tmp_path, "honest", json.loads(build(LAB, "partly_wrong")), seed=12)
    replayed, _ = _graded(tmp_path, "replayed", _with_answer("partly_wrong", lookup), seed=11)
    fresh, _ = _graded(tmp_path, "fresh", _with_answer("partly_wrong", lookup), seed=12)
    task = "balanced_partition"
    assert replayed.per_task(LAB)[task] > honest.per_task(LAB)[task]  # the old inputs again: the table pays
    assert fresh.per_task(LAB)[task] == honest.per_task(LAB)[task]    # fresh inputs: the honest score
