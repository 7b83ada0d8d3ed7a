"""Prepared submissions, built from the committed student copy (labs/) inside the tests.

Each kind is what a real class produces sooner or later:

==============  =====================================================================
correct         every answer cell filled with the solution's code
partly_wrong    some answers wrong (per lab, see WRONG)
raising         one answer cell raises at top level *after* its ``def`` (no loss),
                one function raises when called
looping         one function never returns (cut by the per-cell timeout)
stubborn        right on the lab's data, but on other inputs a loop that swallows
                KeyboardInterrupt (the interrupt fails: kernel restart and replay; lab03)
tests_edited    partly_wrong answers, every test cell replaced by ``assert True``
tests_deleted   correct answers, every test cell deleted
liar            every function returns an object whose ``==`` is always True (and whose
                arithmetic makes ``abs(got - want) < tol`` true as well)
empty           the student copy, unchanged
metadata_lost   correct answers; every cell's metadata and id removed (nbformat's
                validator rejects such a file)
aliased         lab03 only: balanced_partition calls the library through an alias imported
                before the checks run (``from utils import partition_layers as p``)
answers_first   correct answers, all in one cell at the top of the notebook, above the set-up
                cells (it runs top to bottom; an honest layout that must keep full marks)
garbage         not a notebook at all
==============  =====================================================================
"""

from __future__ import annotations

import json
from pathlib import Path

from utils.grading.notebook_source import BEGIN_SOLUTION, END_SOLUTION, LabSource, hidden_regions

ROOT = Path(__file__).resolve().parents[2]
TEST_TIMEOUT = 10
"""Per-cell timeout the grading tests use for cells without their own (a looping check costs
this much)."""

LIAR = '''
class AlwaysEqual:
    """Compares equal to anything; arithmetic keeps returning itself; abs() is 0."""
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __hash__(self): return 0
    def __float__(self): return 0.0
    def __index__(self): return 0
    def __abs__(self): return 0.0
    def __sub__(self, other): return self
    __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __sub__
    def __len__(self): return 2
    def __iter__(self): return iter([self, self])
    def __getitem__(self, index): return self
    def __bool__(self): return True
'''

#: Wrong answers per lab and task, and the points each task then earns.
WRONG = {
    "lab02_metrics_from_events": {
        # skips stages without events: right on the real run, wrong on the synthetic check
        "stage_utilisation": '''
def stage_utilisation(events, num_stages):
    span = makespan(events)
    present = sorted({e.stage for e in events})
    return [float(sum(b - a for a, b in compute_intervals(events, s)) / span) for s in present]
''',
        # forgot "1 -"
        "bubble_ratio": '''
def bubble_ratio(events, num_stages):
    return float(sum(stage_utilisation(events, num_stages)) / num_stages)
''',
    },
    "lab03_balanced_partition": {
        # equal layer counts: valid form, optimal only by luck
        "balanced_partition": '''
def balanced_partition(costs, num_stages):
    n = len(costs)
    if not 1 <= num_stages <= n:
        raise ValueError("bad num_stages")
    return [k * n // num_stages for k in range(num_stages + 1)]
''',
    },
}

RAISING = {
    "lab02_metrics_from_events": ("compute_intervals", "bubble_ratio"),
    "lab03_balanced_partition": ("stage_loads", "speedup_over_uniform"),
}
"""(task whose cell raises after its def, task whose function raises when called)."""

LOOPING = {"lab02_metrics_from_events": "bubble_ratio", "lab03_balanced_partition": "speedup_over_uniform"}


def solution_code(source: str) -> str:
    """An answer cell's solution with the region markers removed."""
    return "\n".join(line for line in source.splitlines()
                     if not (BEGIN_SOLUTION.match(line) or END_SOLUTION.match(line)))


def _signature(lab: LabSource, task: str) -> str:
    """The ``def`` line(s) of a task's function, up to the colon."""
    cell = next(c for c in lab.nb.cells if c.get("metadata", {}).get("grading", {}).get("task") == task
                and c.metadata["grading"]["kind"] == "answer")
    lines = cell.source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def "))
    end = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith(":"))
    return "\n".join(lines[start:end + 1])


def _is(cell: dict, kind: str) -> bool:
    return cell.get("metadata", {}).get("grading", {}).get("kind") == kind


def build(lab: LabSource, kind: str) -> str:
    """The JSON text of one prepared submission of `lab`."""
    if kind == "garbage":
        return "this is not a notebook {"
    nb = json.loads((ROOT / "labs" / f"{lab.name}.ipynb").read_text(encoding="utf-8"))
    if kind == "empty":
        return json.dumps(nb, ensure_ascii=False)
    answers = {name: solution_code(next(c.source for c in lab.nb.cells
                                        if c.get("metadata", {}).get("grading", {}).get("id") == task.answer_id))
               for name, task in lab.tasks.items()}
    wrong = WRONG.get(lab.name, {})
    if kind in ("partly_wrong", "tests_edited"):
        answers.update({task: code.strip() for task, code in wrong.items()})
    elif kind == "raising":
        after_def, when_called = RAISING[lab.name]
        answers[after_def] += '\n\nraise RuntimeError("a stray line at the end of my cell")'
        answers[when_called] = _signature(lab, when_called) + "\n    return 1 / 0"
    elif kind == "looping":
        task = LOOPING[lab.name]
        answers[task] = _signature(lab, task) + "\n    while True:\n        pass"
    elif kind == "stubborn":  # right on the lab's own data, a loop that ignores interrupts elsewhere
        task = LOOPING[lab.name]
        real = answers[task].replace(f"def {task}(", f"def _{task}_impl(", 1)
        answers[task] = (real + "\n\n\n" + _signature(lab, task) + "\n    if len(costs) != len(COSTS):\n"
                         "        import time\n        while True:\n            try:\n"
                         "                time.sleep(0.2)\n            except BaseException:\n"
                         f"                pass\n    return _{task}_impl(costs, num_stages)")
    elif kind == "liar":
        first = next(iter(lab.tasks))
        for task in lab.tasks:
            answers[task] = _signature(lab, task) + "\n    return AlwaysEqual()"
        answers[first] = LIAR.strip() + "\n\n\n" + answers[first]
    elif kind == "aliased":
        answers["balanced_partition"] = ("from utils import partition_layers as p\n\n\n"
                                         + _signature(lab, "balanced_partition")
                                         + "\n    return p(list(costs), num_stages)")
    cells = []
    for cell in nb["cells"]:
        if _is(cell, "answer"):
            cell = {**cell, "source": answers[cell["metadata"]["grading"]["task"]]}
        elif _is(cell, "test"):
            if kind == "tests_deleted":
                continue
            if kind == "tests_edited":
                cell = {**cell, "source": "assert True  # 我把测试改掉了"}
        cells.append(cell)
    if kind == "answers_first":
        together = next(c for c in cells if _is(c, "answer"))
        together = {**together, "source": "\n\n\n".join(answers.values())}
        cells = [together] + [c for c in cells if not _is(c, "answer")]
    if kind == "metadata_lost":
        cells = [{k: v for k, v in c.items() if k not in ("metadata", "id")} for c in cells]
        nb["metadata"] = {}
    nb["cells"] = cells
    return json.dumps(nb, ensure_ascii=False)


def write_all(lab: LabSource, kinds: list[str], folder: Path) -> dict[str, Path]:
    """Write one submission per kind as ``folder/<kind>.ipynb``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind in kinds:
        paths[kind] = folder / f"{kind}.ipynb"
        paths[kind].write_text(build(lab, kind), encoding="utf-8")
    return paths


def hidden_lines(lab: LabSource) -> list[str]:
    """Lines of the lab's hidden test *code* that students never see: long enough not to occur
    by chance, not shared with a public test, and not a line that is only the text of an
    assertion message (feedback shows those messages on purpose)."""
    public = "\n".join(c.public_source or "" for c in lab.checks)
    message = ('"', "'", 'f"', "f'", '("', "(f\"")
    return sorted({line.strip() for cell in lab.nb.cells for region in hidden_regions(cell.source)
                   for line in region.splitlines()
                   if len(line.strip()) >= 16 and line.strip() not in public
                   and not line.strip().startswith(message)})


def assert_nothing_hidden_leaks(lab: LabSource, out: Path) -> None:
    """Feedback, grades.csv and results.json show no hidden test code and no traceback."""
    lines = hidden_lines(lab)
    assert lines, "the lab has hidden tests to look for"
    files = [*sorted((out / "feedback").glob("*.md")), out / "grades.csv", out / "results.json"]
    assert len(files) > 2
    for path in files:
        text = path.read_text(encoding="utf-8")
        for marker in ("Traceback", "BEGIN HIDDEN", "_grading_run_check", 'File "', "check:"):
            assert marker not in text, f"{path.name} contains {marker!r}"
        leaked = [line for line in lines if line in text]
        assert not leaked, f"{path.name} shows hidden test code: {leaked[:3]}"
