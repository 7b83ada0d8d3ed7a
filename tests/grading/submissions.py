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
aliased         labs 3 and 5: the answers call the library the lab forbids through an alias
                imported before the checks run (``from utils import partition_layers as p``;
                lab05: ``from utils import build_schedule as _library``)
answers_first   correct answers, all in one cell at the top of the notebook, above the set-up
                cells (it runs top to bottom; an honest layout that must keep full marks)
garbage         not a notebook at all
==============  =====================================================================

Attacks (issue 14), each against the judge that runs the checks outside the kernel, and the
honest variants that must keep full marks:

=================  ==================================================================
patched_reference  lab02: partly_wrong answers, and ``utils.compute_metrics`` patched in the
                   kernel to agree with them (the checks' reference lives in the judge)
frame_reader       lab02: bubble_ratio walks ``sys._getframe`` up the stack for the check's
                   expected value and writes into the frames' globals
history_leak       lab02: bubble_ratio raises an error carrying the kernel's input history and
                   whatever it can read of solutions/ (the hidden checks never enter the
                   kernel; feedback for a hidden check shows no student message)
runner_swap        lab02: partly_wrong answers; the kernel side of the grader
                   (``student_side``) is replaced, through ``importlib`` and a module name
                   built at run time, by one that fabricates every reply
code_saver         lab03: balanced_partition runs the library's algorithm from code objects
                   saved before the ban (a bypass that must be flagged for review)
other_algorithm    lab03: a different correct algorithm (binary search over contiguous sums);
                   lab05: 1F1B as a greedy rule (forward while fewer than p - s activations are
                   held) and DeepSpeed's order through TrainSchedule's own step-to-micro-batch map
actions_returned   lab05: gpipe and one_f_one_b return ``utils.Action`` objects instead of strings
                   (not plain data: the judge receives placeholders and the type checks fail)
helper_early       lab03: library helpers imported at the top of the first answer cell, the
                   allowed ones used
answers_moved      lab03: the first answer cell moved to the end of the notebook
namespace_hook     lab03 (issue 37, points 1-2): the aliased answers, and ``__import__`` rebound in
                   the kernel's globals through a name built at run time, so that a grader that
                   imports its helper by name would get one that drops the ban list and binds
                   ``abs`` for the check (the grader finds its entry point without any name)
entry_swap         lab03: the grader's entry point found among ``object``'s subclasses and its
                   ``call`` replaced (``type.__setattr__``) by one that sends a fabricated reply
                   (unsigned: the check fails, the submission is flagged as tampered)
child_process      lab03 (point 3): balanced_partition runs the forbidden library in a child
                   ``python -c`` (the ban is per process: flagged for review)
fresh_copy         lab03 (point 3): balanced_partition calls a fresh copy of the library's module
                   (``runpy.run_module``: functions the ban never swapped; flagged for review)
metrics_shortcut   labs 1 and 2: the answers call the library's metrics instead of computing
                   them from the events (issue 15: the labs forbid it while the checks run);
                   lab05: summarize calls utils.simulate (the lab forbids it while task 4's checks run);
                   lab07: diagnose_failure calls utils.diagnose (the lab forbids it while its
                   checks call the student's code; the library has no status-text parser to call)
=================  ==================================================================
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from utils.grading.notebook_source import BEGIN_SOLUTION, END_SOLUTION, LabSource, hidden_regions

ROOT = Path(__file__).resolve().parents[2]
TEST_TIMEOUT = 30
"""Per-cell timeout the grading tests use for cells without their own (a looping check costs
this much). A check may be the first code of its kernel to import DeepSpeed (a submission
without its self-check cells: lab 7's `fix_public` lints a spec): about 3 s on a quiet 2-core
machine, past 10 s with one core taken by another process (`make test-under-load`)."""

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
    "lab05_schedules_as_data": {
        # off by one: p - s warm-up forwards (valid, but one activation too many and not DeepSpeed's order)
        "one_f_one_b": '''
def one_f_one_b(p, m):
    rows = []
    for s in range(p):
        warmup = min(p - s, m)
        row = [f"{s}F{i}" for i in range(warmup)]
        for j in range(m):
            if warmup + j < m:
                row.append(f"{s}F{warmup + j}")
            row.append(f"{s}B{j}")
        rows.append(row)
    return rows
''',
        # the buffer id taken for the micro-batch (right only while m <= num_pipe_buffers())
        "deepspeed_order": '''
def deepspeed_order(p, m, stage):
    order = []
    for cmds in TrainSchedule(micro_batches=m, stages=p, stage_id=stage).steps():
        for cmd in cmds:
            if isinstance(cmd, ForwardPass):
                order.append((f"F{cmd.buffer_id}", cmd.buffer_id))
            elif isinstance(cmd, BackwardPass):
                order.append((f"B{cmd.buffer_id}", cmd.buffer_id))
    return order
''',
        # off by one: the micro-batches held are read after each backward has freed its own (one
        # short on every stage); the makespan and the bubble ratio are right
        "summarize": '''
def summarize(rows, forward, backward, activation_bytes):
    utils.Schedule.from_strings(rows).validate()
    p, m = len(rows), len(rows[0]) // 2
    end, free, nxt = {}, [0.0] * p, [0] * p
    while len(end) < 2 * p * m:
        for s in range(p):
            while nxt[s] < len(rows[s]):
                a = utils.parse_action(rows[s][nxt[s]])
                if a.kind == "forward":
                    inputs = [(s - 1, "forward", a.micro_batch)] if s > 0 else []
                else:
                    inputs = [(s, "forward", a.micro_batch)] + ([(s + 1, "backward", a.micro_batch)] if s < p - 1 else [])
                if any(x not in end for x in inputs):
                    break
                start = max([free[s]] + [end[x] for x in inputs])
                free[s] = end[(s, a.kind, a.micro_batch)] = start + (forward if a.kind == "forward" else backward)
                nxt[s] += 1
    peaks = []
    for s, row in enumerate(rows):
        held = peak = 0
        for text in row:
            if utils.parse_action(text).kind == "forward":
                held += 1
            else:
                held -= 1
                peak = max(peak, held)
        peaks.append(peak * activation_bytes[s])
    span = max(free)
    return {"makespan": float(span), "bubble_ratio": float(1 - m * (forward + backward) / span), "peak_bytes": peaks}
''',
    },
    "lab07_diagnose_pipeline_jobs": {
        # a hung job blamed on the first rank that did not finish: in a hang that is a rank
        # waiting in a receive for the one that holds everybody up
        "diagnose_failure": '''
def diagnose_failure(record):
    ranks = record["ranks"]
    if record["state"] == "timeout":
        rank, cause = min(r for r, info in ranks.items() if not info["finished"]), "hang"
    elif record["state"] == "failed":
        import re

        errors = [info["error"] for _, info in sorted(ranks.items()) if info["error"]]
        causes = [e for e in errors if not any(c in e["message"] for c in CONSEQUENCES)]
        died = re.search(r"rank (\\d+) \\(stage \\d+\\) (?:was killed by|died with exit code)", record["error"])
        if causes or (errors and not died):
            first = min(causes or errors, key=lambda e: e["time"])
            rank, text = int(first["rank"]), f"{first['type']}: {first['message']}"
        else:
            rank = int(died.group(1))
            text = ranks[rank]["log"]
        cause = next((code for code, marks in CAUSES.items() if any(m in text for m in marks)), "unknown")
    else:
        raise ValueError("not a failed run")
    status = read_status(ranks[rank]["status"])
    instruction = status["instruction"] or "setup"
    return {"rank": rank, "stage": ranks[rank]["stage"], "instruction": instruction,
            "step": status["step"] if instruction != "setup" else None, "cause": cause}
''',
        # the whole deepspeed_config dropped: the keys that were right are lost with the wrong ones
        "fix_spec": '''
def fix_spec(spec):
    return dataclasses.replace(utils.JobSpec.from_dict(spec), deepspeed_config={}, strict=True).to_dict()
''',
        # step 0 counted: a rank slow only while warming up looks like a straggler
        "find_straggler": '''
def find_straggler(timeline):
    durations, stage_of = {}, {}
    for e in timeline.events:
        if e.kind in COMPUTE:
            durations.setdefault(e.rank, []).append(e.end - e.start)
            stage_of[e.rank] = e.stage
    typical = {r: statistics.median(d) for r, d in durations.items()}
    best, best_ratio = None, STRAGGLER_RATIO
    for r, t in sorted(typical.items()):
        peers = [typical[q] for q in typical if q != r and stage_of[q] == stage_of[r]]
        if peers and t / statistics.median(peers) >= best_ratio:
            best, best_ratio = r, t / statistics.median(peers)
    return best
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
    "lab05_schedules_as_data": ("gpipe", "summarize"),
}
"""(task whose cell raises after its def, task whose function raises when called)."""

LOOPING = {"lab02_metrics_from_events": "bubble_ratio", "lab03_balanced_partition": "speedup_over_uniform",
           "lab05_schedules_as_data": "summarize"}


PATCHED_REFERENCE = '''
import dataclasses

import utils
import utils.analysis.metrics as _metrics

_real_metrics = _metrics.compute_metrics


def _agreeing_metrics(timeline, step=None, **options):
    # The library's answer, rewritten to agree with this notebook's (wrong) functions.
    real = _real_metrics(timeline, step=step, **options)
    events = timeline.select(step=step)
    return dataclasses.replace(real, stage_utilisation=tuple(stage_utilisation(events, timeline.num_stages)),
                               bubble_ratio=bubble_ratio(events, timeline.num_stages))


utils.compute_metrics = _metrics.compute_metrics = _agreeing_metrics
'''

FRAME_READER = '''
def bubble_ratio(events, num_stages):
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        for name in ("want", "reference", "expected"):
            value = frame.f_globals.get(name)
            if value is not None:
                return float(getattr(value, "bubble_ratio", value))
        frame.f_globals["want"] = 0.5  # and try to plant an expectation for the check
        frame = frame.f_back
    return 0.0
'''

HISTORY_LEAK = '''
def bubble_ratio(events, num_stages):
    import pathlib
    import utils
    try:
        root = pathlib.Path(utils.__file__).resolve().parents[1]
        seen = (root / "solutions" / "lab02_metrics_from_events.ipynb").read_text()
    except OSError as error:
        seen = f"[solutions: {error}]"
    raise RuntimeError(seen + "\\n".join(globals().get("In", [])) + repr(globals().get("_ih", "")))
'''


RUNNER_SWAP = '''
import importlib

from IPython.display import publish_display_data

_side = importlib.import_module("utils.grad" + "ing.student_" + "side")


def _fabricated(*args, **kwargs):
    publish_display_data({_side.REPLY_MIME: {"value": "0.5"}})


def _all_there(names):
    publish_display_data({_side.REPLY_MIME: {"names": {n: {"kind": "callable"} for n in names}}})


_side.call, _side.describe = _fabricated, _all_there
'''

CODE_SAVER = '''
import types

import utils.planning.partitioning as _library

# Saved before any check: the ban swaps the functions' __code__ later and cannot reach this copy.
_minmax_code, _minmax_defaults = _library._minmax.__code__, _library._minmax.__defaults__


def balanced_partition(costs, num_stages):
    minmax = types.FunctionType(_minmax_code, vars(_library), "_minmax", _minmax_defaults)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    return [int(b) for b in minmax(len(costs), num_stages, lambda s, a, b: prefix[b] - prefix[a])[1]]
'''

OTHER_ALGORITHM = '''
def balanced_partition(costs, num_stages):
    """Binary search over every contiguous sum for the smallest feasible bottleneck."""
    n, p = len(costs), num_stages
    if not 1 <= p <= n:
        raise ValueError(f"num_stages must lie in [1, {n}], got {p}")
    candidates = sorted({sum(costs[i:j]) for i in range(n) for j in range(i + 1, n + 1)})

    def greedy(limit):
        parts, start = [0], 0
        for i in range(1, n + 1):
            if sum(costs[start:i]) > limit:
                if i - 1 == start:
                    return None
                parts.append(i - 1)
                start = i - 1
        parts.append(n)
        return parts if len(parts) - 1 <= p else None

    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if greedy(candidates[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    parts = greedy(candidates[lo])
    spare = [b for b in range(1, n) if b not in parts]
    while len(parts) - 1 < p:  # fewer stages than asked: split anywhere, never slower
        parts = sorted(parts + [spare.pop()])
    return parts
'''


ONE_F_ONE_B_GREEDY = '''
def one_f_one_b(p, m):
    """Greedy: the next forward while fewer than p - s activations are held, else the oldest backward."""
    rows = []
    for s in range(p):
        row, forwards, backwards = [], 0, 0
        while backwards < m:
            if forwards < m and forwards - backwards < p - s:
                row.append(f"{s}F{forwards}")
                forwards += 1
            else:
                row.append(f"{s}B{backwards}")
                backwards += 1
        rows.append(row)
    return rows
'''

DEEPSPEED_STEP_MAP = '''
def deepspeed_order(p, m, stage):
    """TrainSchedule's own map from a step to its micro-batch."""
    schedule = TrainSchedule(micro_batches=m, stages=p, stage_id=stage)
    order = []
    for step_id, cmds in enumerate(schedule.steps()):
        micro_batch, _ = schedule._step_to_micro_batch(step_id)
        for cmd in cmds:
            if type(cmd).__name__ in ("ForwardPass", "BackwardPass"):
                order.append((type(cmd).__name__[0] + str(micro_batch), cmd.buffer_id))
    return order
'''

#: Honest answers written another way (kind ``other_algorithm``), per lab and task.
OTHER_ALGORITHMS = {
    "lab03_balanced_partition": {"balanced_partition": OTHER_ALGORITHM},
    "lab05_schedules_as_data": {"one_f_one_b": ONE_F_ONE_B_GREEDY, "deepspeed_order": DEEPSPEED_STEP_MAP},
}

NAMESPACE_HOOK = '''
_names = globals()
_original = _names["__buil" + "tins__"]
_original = getattr(_original, "__imp" + "ort__", None) or _original["__imp" + "ort__"]


class _Helper:
    """What a grader importing its helper by name would get: the real one, minus the ban."""
    def __init__(self, real):
        self.real = real

    def call(self, name, arguments, forbid=None, message=""):
        return self.real.call(name, arguments, [], message)

    def describe(self, names):
        from IPython.display import publish_display_data
        publish_display_data({self.real.REPLY_MIME: {"names": {**{n: {"kind": "callable"} for n in names},
                                                             "abs": {"kind": "value", "value": "0"}}}})

    def __getattr__(self, attribute):
        return getattr(self.real, attribute)


def _hooked(name, *args, **kwargs):
    module = _original(name, *args, **kwargs)
    return _Helper(module) if name.endswith("student_" + "side") else module


_names["__imp" + "ort__"] = _hooked
'''

ENTRY_SWAP = '''
from IPython.display import publish_display_data as _publish

_entry = [c for c in object.__subclasses__() if c.__name__ == "Entry" and c.__module__.endswith("student_side")][0]


def _fabricated(*args, **kwargs):
    _publish({"application/vnd.workbook.grading-reply+json": {"value": "[0, 2, 4, 6, 8]"}})


type.__setattr__(_entry, "call", staticmethod(_fabricated))
'''

CHILD_PROCESS = '''
import json
import subprocess
import sys

_CHILD = ("import json, sys; from utils import partition_layers; "
          "print(json.dumps(partition_layers(json.loads(sys.argv[1]), int(sys.argv[2]))))")


def balanced_partition(costs, num_stages):
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(list(costs)), str(num_stages)],
                          capture_output=True, text=True)
    if done.returncode:
        raise ValueError(done.stderr.strip().splitlines()[-1])
    return json.loads(done.stdout)
'''

FRESH_COPY = '''
import runpy
import warnings

import utils.planning.partitioning  # noqa: F401 - its dataclasses look their module up by name

with warnings.catch_warnings():  # runpy warns that the module is imported already: that is the point
    warnings.simplefilter("ignore")
    _fresh = runpy.run_module("utils.planning.partitioning", run_name="utils.planning.partitioning")


def balanced_partition(costs, num_stages):
    return _fresh["partition_layers"](list(costs), num_stages)
'''

#: Answers calling the library a lab forbids, through an alias imported before the checks (kind ``aliased``).
ALIASED = {
    "lab03_balanced_partition": {"balanced_partition": '''
from utils import partition_layers as p


def balanced_partition(costs, num_stages):
    return p(list(costs), num_stages)
'''},
    "lab05_schedules_as_data": {
        "gpipe": '''
from utils import build_schedule as _library


def gpipe(p, m):
    return [[str(a) for a in row] for row in _library("gpipe", p, m).actions]
''',
        "one_f_one_b": '''
def one_f_one_b(p, m):
    return [[str(a) for a in row] for row in _library("1f1b", p, m).actions]
''',
        "deepspeed_order": '''
def deepspeed_order(p, m, stage):
    buffers = max(2, min(p - stage, m))
    return [(label, int(label[1:]) % buffers) for label in _library("1f1b", p, m).compute_order(stage)]
''',
    },
}

#: The library's metrics (lab07: its diagnosis) where a lab asks for the student's own computation.
SHORTCUTS = {
    # lab05: the simulator, right values, but task 4 asks for the student's own computation
    "lab05_schedules_as_data": {"summarize": '''
def summarize(rows, forward, backward, activation_bytes):
    timeline = utils.simulate(utils.Schedule.from_strings(rows), forward, backward, activation_bytes=activation_bytes)
    metrics = timeline.metrics()
    return {"makespan": float(metrics.makespan), "bubble_ratio": float(metrics.bubble_ratio),
            "peak_bytes": [int(round(x)) for x in timeline.meta["peak_activation_memory"]]}
'''},
    "lab01_measure_bubble": {"measured_bubble": '''
def measured_bubble(timeline):
    return float(timeline.metrics().bubble_ratio)
'''},
    "lab07_diagnose_pipeline_jobs": {
        "diagnose_failure": '''
def diagnose_failure(record):
    run = next(r for r in utils.list_runs() if r.name == record["run"])
    primary = utils.diagnose(run, reveal_fault=False).primary
    where = primary.where
    return {"rank": where.rank, "stage": where.stage, "instruction": where.instruction,
            "step": where.step if where.instruction != "setup" else None, "cause": primary.code}
''',
    },
    "lab02_metrics_from_events": {
        "compute_intervals": '''
from utils.analysis.intervals import interval_union


def compute_intervals(events, stage):
    return interval_union((float(e.start), float(e.end)) for e in events if e.stage == stage and e.kind in COMPUTE)
''',
        "makespan": '''
def _library_metrics(events, num_stages):
    timeline = utils.Timeline(events=tuple(events), num_stages=num_stages, num_micro_batches=1)
    return utils.compute_metrics(timeline, step=events[0].step)


def makespan(events):
    return float(_library_metrics(events, 1 + max(e.stage for e in events)).makespan)
''',
        "stage_utilisation": '''
def stage_utilisation(events, num_stages):
    return list(_library_metrics(events, num_stages).stage_utilisation)
''',
        "bubble_ratio": '''
def bubble_ratio(events, num_stages):
    return float(_library_metrics(events, num_stages).bubble_ratio)
''',
    },
}


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
    elif kind == "patched_reference":
        answers.update({task: code.strip() for task, code in wrong.items()})
        first = next(iter(lab.tasks))
        answers[first] = PATCHED_REFERENCE.strip() + "\n\n\n" + answers[first]
    elif kind == "frame_reader":
        answers["bubble_ratio"] = FRAME_READER.strip()
    elif kind == "history_leak":
        answers["bubble_ratio"] = HISTORY_LEAK.strip()
    elif kind == "runner_swap":
        answers.update({task: code.strip() for task, code in wrong.items()})
        first = next(iter(lab.tasks))
        answers[first] = answers[first] + "\n\n\n" + RUNNER_SWAP.strip()
    elif kind == "code_saver":
        answers["balanced_partition"] = CODE_SAVER.strip()
    elif kind == "other_algorithm":
        answers.update({task: code.strip() for task, code in OTHER_ALGORITHMS[lab.name].items()})
    elif kind == "actions_returned":  # lab05: utils.Action objects where the lab asks for strings
        for task in ("gpipe", "one_f_one_b"):
            real = answers[task].replace(f"def {task}(", f"def _{task}_strings(", 1)
            answers[task] = (real + "\n\n\n" + _signature(lab, task)
                             + f"\n    return [[utils.parse_action(a) for a in row] for row in _{task}_strings(p, m)]")
    elif kind == "helper_early":
        first = next(iter(lab.tasks))
        answers[first] = ("from utils import bottleneck, partition_layers, stage_costs\n\n\n" + answers[first])
        answers["speedup_over_uniform"] = (
            _signature(lab, "speedup_over_uniform")
            + "\n    uniform = partition_layers(costs, num_stages, method=\"uniform\")"
            + "\n    return float(bottleneck(costs, uniform) / max(stage_loads(costs, balanced_partition(costs, num_stages))))")
    elif kind == "metrics_shortcut":
        answers.update({task: code.strip() for task, code in SHORTCUTS[lab.name].items()})
    elif kind == "aliased":
        answers.update({task: code.strip() for task, code in ALIASED[lab.name].items()})
    elif kind == "namespace_hook":
        answers.update({task: code.strip() for task, code in ALIASED[lab.name].items()})
        first = next(iter(lab.tasks))
        answers[first] = answers[first] + "\n\n\n" + NAMESPACE_HOOK.strip()
    elif kind == "entry_swap":
        first = next(iter(lab.tasks))
        answers[first] = answers[first] + "\n\n\n" + ENTRY_SWAP.strip()
    elif kind == "child_process":
        answers["balanced_partition"] = CHILD_PROCESS.strip()
    elif kind == "fresh_copy":
        answers["balanced_partition"] = FRESH_COPY.strip()
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
    if kind == "answers_moved":
        first = next(c for c in cells if _is(c, "answer"))
        cells = [c for c in cells if c is not first] + [first]
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


FOLDERS = ("correct", "metadata_lost", "no_notebook")
"""Kinds handed in as a folder (notebook plus other files) instead of a single file."""


def grade_prepared(lab: LabSource, kinds: list[str], tmp: Path) -> tuple[list, Path, str]:
    """Write every kind of `kinds` under ``tmp/submissions`` (the `FOLDERS` kinds as a folder
    with a file next to the notebook, ``no_notebook`` without one) and grade them through the
    command line as an instructor types it: the results, the output folder and what it printed."""
    import subprocess
    import sys

    from utils.grading.grade import SubmissionResult

    submissions = tmp / "submissions"
    submissions.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        if kind in FOLDERS:
            (submissions / kind).mkdir()
            (submissions / kind / "notes.txt").write_text("a file next to the notebook", encoding="utf-8")
            if kind != "no_notebook":
                (submissions / kind / f"{lab.name}.ipynb").write_text(build(lab, kind), encoding="utf-8")
        else:
            (submissions / f"{kind}.ipynb").write_text(build(lab, kind), encoding="utf-8")
    out = tmp / "out"
    done = subprocess.run([sys.executable, "-m", "utils.grading", "grade", lab.name.split("_")[0], str(submissions),
                           "--out", str(out), "--workers", "2", "--timeout", str(TEST_TIMEOUT)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return [SubmissionResult.from_dict(r) for r in data["students"]], out, done.stdout


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


def not_passed(result) -> str:
    """The checks of a graded submission that did not pass, each with its whole message, as
    one string: an assertion's message that is a string is shown in full (a list would be
    cut to one line, hiding the check that failed)."""
    failed = "\n".join(f"{c.id}: {c.status}: {c.message}" for c in result.checks if c.status != "passed")
    # the hidden checks' seed: `grade --seed` with it draws the same inputs again
    return (failed or "every check passed") + f"\n(hidden inputs drawn with seed {getattr(result, 'seed', None)})"


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


def assert_solution_full_and_copy_empty(results: dict, lab: LabSource) -> None:
    """The solution ("correct") earns every task's points without an error; the generated
    student copy ("empty") earns none, each check failing on the stub's NotImplementedError."""
    full = {name: task.points for name, task in lab.tasks.items()}
    correct, empty = results["correct"], results["empty"]
    assert correct.per_task(lab) == full, not_passed(correct)
    assert not correct.error
    assert empty.per_task(lab) == dict.fromkeys(full, 0)
    assert all("NotImplementedError" in c.message for c in empty.checks)


def solution_runs(lab: LabSource) -> Path | None:
    """The runs nbval's execution of `lab`'s solution left in this session (the root
    conftest gives each solution notebook a runs folder of its own and runs the grading
    tests after the notebooks), or None when it did not run: the lab's real jobs, run by the
    lab's own cells. An unsuccessful one is there too but never reused (`utils.find_run`)."""
    base = os.environ.get("WORKBOOK_TEST_SOLUTION_RUNS")
    folder = Path(base) / lab.path.stem if base else None
    return folder if folder is not None and folder.is_dir() and any(folder.iterdir()) else None


def validate_and_grade(lab: LabSource, tmp: Path, notebooks: dict[str, str], *, validate_timeout: float,
                       timeout: float = TEST_TIMEOUT, record_timings=None) -> tuple[dict, Path, Path]:
    """What the grading test of a lab with real jobs does: `validate` (the solution graded as
    ``correct``, the student copy as ``empty``, with the lab's jobs recorded once), then every
    notebook of `notebooks` (kind -> text) graded with the recorded runs, two at a time. The
    runs the graded kernels ended with are kept in ``tmp / "kept-runs"``. Returns (results by
    kind, the output folder, the recorded runs folder).

    The lab's jobs ran under nbval when its solution executed earlier in the session: those
    runs go to `validate` as recorded runs (`solution_runs`), so they are not run a second
    time in a judge; the recording path itself is lab 1's test. Run alone, `validate` records."""
    from utils.grading import Options, grade_batch, validate
    from utils.grading.batch import write_outputs

    solution, empty = validate(lab.path, tmp / "validate",
                               options=Options(timeout=validate_timeout, runs=solution_runs(lab)))
    solution.student, empty.student = "correct", "empty"
    recorded = tmp / "validate" / "recorded-runs"
    folder = tmp / "submissions"
    folder.mkdir()
    for kind, text in notebooks.items():
        (folder / f"{kind}.ipynb").write_text(text, encoding="utf-8")
    out = tmp / "out"
    results = grade_batch(lab.path, folder, out, workers=2,
                          options=Options(timeout=timeout, runs=recorded, keep_runs=tmp / "kept-runs"))
    if record_timings is not None:
        record_timings(lab, [solution, empty, *results])
    by_student = {r.student: r for r in results}
    by_student.update(correct=solution, empty=empty)
    write_outputs(out, list(by_student.values()), lab)
    return by_student, out, recorded
