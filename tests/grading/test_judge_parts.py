"""The judge's parts that need no kernel: the codec between kernel and judge, the library ban
checks import, the review signs, the sanitising of a kernel's replies."""

from __future__ import annotations

import math

import numpy as np
import pytest

import utils
from utils.grading import codec
from utils.grading.check_api import active_forbidden, forbidding
from utils.grading.execute import CellOutcome
from utils.grading.grade import review_notes
from utils.grading.judge import _bindings, _reply, _sanitised
from utils.grading.student_side import ENTRY_EXPRESSION, REPLY_MIME


def roundtrip(value):
    return codec.decode(codec.encode(value))


@pytest.mark.parametrize("value", [
    None, True, 0, -3, 1.5, "文字", [], [1, 2.0, "x"], (1, (2.0, [3])), {"a": (1,), 2: [None]},
    {(1, 2): "tuple key"},
])
def test_plain_values_come_back_equal_and_of_the_same_type(value):
    back = roundtrip(value)
    assert back == value and type(back) is type(value)
    if isinstance(value, (list, tuple)):
        assert [type(v) for v in back] == [type(v) for v in value]


def test_int_and_float_stay_apart_and_non_finite_floats_survive():
    assert type(roundtrip(1)) is int and type(roundtrip(1.0)) is float
    assert math.isnan(roundtrip(float("nan"))) and roundtrip(float("-inf")) == float("-inf")


def test_numpy_scalars_and_arrays_keep_their_dtype():
    assert type(roundtrip(np.float64(0.5))) is np.float64 and roundtrip(np.float64(0.5)) == 0.5
    assert type(roundtrip(np.int64(4))) is np.int64
    array = roundtrip(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert array.dtype == np.float32 and array.shape == (2, 3) and array[1, 2] == 5.0


def test_events_and_timelines_come_back_as_the_library_types():
    event = utils.Event(stage=1, rank=1, step=0, kind="forward", micro_batch=2, start=0.5, end=1.0)
    assert roundtrip(event) == event and type(roundtrip(event)) is utils.Event
    timeline = utils.Timeline(events=(event,), num_stages=2, num_micro_batches=4, meta={"schedule": "1f1b"})
    back = roundtrip(timeline)
    assert type(back) is utils.Timeline and back.events == (event,) and back.meta == {"schedule": "1f1b"}
    assert roundtrip([timeline.select(step=0)])[0] == [event]


class AlwaysEqual:
    def __eq__(self, other):
        return True

    __hash__ = None


class SneakyFloat(float):
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [AlwaysEqual(), SneakyFloat(0.25), [AlwaysEqual()], np.array(["a"])])
def test_objects_with_behaviour_arrive_as_objects_that_equal_nothing(value):
    back = roundtrip(value)
    if isinstance(back, list):
        back = back[0]
    assert isinstance(back, codec.StudentObject)
    assert back != back and not (back == 0.25) and back != AlwaysEqual()
    assert type(back) is not float
    with pytest.raises(TypeError):
        abs(back - 0.25)


def test_a_repr_that_raises_does_not_escape():
    class Bad:
        def __repr__(self):
            raise RuntimeError("no")

    assert "repr failed" in repr(roundtrip(Bad()))


def test_bounds_on_depth_and_size():
    deep: list = []
    for _ in range(codec.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(codec.EncodeError, match="deeper"):
        codec.encode(deep)
    looped: list = []
    looped.append(looped)
    with pytest.raises(codec.EncodeError):
        codec.encode(looped)


@pytest.mark.parametrize("text", ["not json", "[1,", '{"__grading__": "evil"}', '{"plain": "dict"}',
                                  '{"__grading__": "ndarray", "dtype": "O", "shape": [1], "v": [1]}', None, 3])
def test_what_the_kernel_sends_is_decoded_only_into_the_listed_types(text):
    with pytest.raises(ValueError):
        codec.decode(text)


def test_function_references_resolve_on_each_side():
    def f():
        return 1

    text = codec.encode([f], refs={id(f): "balanced_partition"})
    [ref] = codec.decode(text)
    assert isinstance(ref, codec.StudentFunction) and ref.name == "balanced_partition"
    assert codec.decode(text, resolve=lambda name: name.upper()) == ["BALANCED_PARTITION"]


def test_forbidding_reaches_aliases_and_restores_the_code():
    from utils import partition_layers as alias

    assert alias([1, 1], 2) == [0, 1, 2]
    with forbidding("utils.planning.partitioning.partition_layers", message="自己实现"):
        assert active_forbidden() == (["utils.planning.partitioning.partition_layers"], "自己实现")
        with pytest.raises(AssertionError, match="自己实现"):
            alias([1, 1], 2)
        assert utils.bottleneck([1, 2], [0, 1, 2]) == 2  # not forbidden
    assert alias([1, 1], 2) == [0, 1, 2] and active_forbidden() == ([], "")
    with pytest.raises(ValueError, match="package.module.function"):
        with forbidding("utils.planning.partitioning.NOPE", message="x"):
            pass


def test_review_signs_name_what_matched_and_why():
    notes = review_notes(["import importlib\nm = importlib.import_module('utils.' + 'grading')",
                          "f.__code__ = g.__code__", "x = eval(s)", "frame = sys._getframe(1)"])
    text = "\n".join(notes)
    for word in ("import_module", "importlib", "__code__", "eval", "_getframe", "library ban", "run time"):
        assert word in text
    honest = ["import re\npattern = re.compile('x')\nmodel.eval()\nfrom utils import partition_layers",
              "import itertools, random"]
    assert review_notes(honest) == []
    given = "from utils.grading.check_api import forbidding\nx = 1"
    assert review_notes(["from utils.grading.check_api import forbidding\nx = 2"], given) == []
    assert review_notes(["import utils.grading.judge"], given) != []


def _published(*payloads) -> CellOutcome:
    return CellOutcome("ok", outputs=[{"output_type": "display_data", "data": {REPLY_MIME: p}} for p in payloads])


def test_only_one_reply_signed_with_the_sessions_token_is_trusted():
    """Issue 37, point 1: what the kernel publishes is believed only with this session's token."""
    token = "t" * 32
    signed = {"value": "1", "token": token, "tampered": ""}
    assert _reply(_published(signed), token) == (signed, "")
    assert _reply(CellOutcome("ok"), token) == (None, "")
    reply, why = _reply(_published({"value": "1"}), token)
    assert reply is None and "token" in why                       # unsigned: forged
    reply, why = _reply(_published(signed, {**signed, "value": "2"}), token)
    assert reply is None and "2 grader replies" in why            # a second, signed or not
    reply, why = _reply(_published({**signed, "tampered": "altered: call"}), token)
    assert reply is None and why == "altered: call"               # the entry's own self-check


def test_the_kernels_description_binds_only_the_task_names_asked_about():
    described = {"names": {"f": {"kind": "callable"}, "abs": {"kind": "value", "value": "0"},
                           "g": {"kind": "value", "value": 3}, "h": "callable"}}
    assert _bindings(described, ["f", "g", "h", "missing"]) == {
        "f": {"kind": "callable"}, "g": {"kind": "missing"}, "h": {"kind": "missing"},
        "missing": {"kind": "missing"}}


def test_the_entry_point_is_reached_without_any_name_of_the_kernels_namespace():
    """`ENTRY_EXPRESSION` finds the class with literals and attributes of builtin types only;
    run with globals that rebind every builtin it could use, it still finds the real one."""
    import ast

    from utils.grading import student_side

    names = {n.id for n in ast.walk(ast.parse(ENTRY_EXPRESSION)) if isinstance(n, ast.Name)}
    assert names == {"c"}  # the comprehension's own variable, nothing else
    hostile = {"__builtins__": {}, "__import__": None, "object": None, "type": None}
    assert eval(ENTRY_EXPRESSION, hostile) is student_side.Entry
    with pytest.raises(AttributeError, match="read-only"):
        student_side.Entry.call = print


def test_a_kernel_reply_is_reduced_to_known_fields():
    ok = CellOutcome("ok")
    assert _sanitised({"value": "1.0", "op": "done", "status": "ok"}, ok) == {"value": "1.0"}
    assert _sanitised({"raised": "ValueError", "message": "x" * 10_000}, ok)["raised"] == []
    assert len(_sanitised({"raised": ["ValueError"], "message": "x" * 10_000}, ok)["message"]) <= 2000
    assert _sanitised({"value": 3}, ok) == {"unsendable": "a reply the grader cannot read"}
    assert _sanitised(None, CellOutcome("error", "SystemExit", "0"))["raised"] == ["RuntimeError"]


def test_progress_lines_show_each_new_step_with_one_worker_and_every_30_s_with_more(tmp_path):
    import time
    from types import SimpleNamespace

    from utils.grading.batch import PROGRESS_EVERY, _show_progress

    (tmp_path / "instructor").mkdir()
    progress = tmp_path / "instructor" / "ann.progress"
    started = time.monotonic()
    running = {1: (None, SimpleNamespace(student="ann"), started, None)}
    lines: list[str] = []
    shown: dict = {}
    for step in ("step 1/3: code cell 1", "step 1/3: code cell 1", "step 2/3: check a"):
        progress.write_text(step, encoding="utf-8")
        _show_progress(running, tmp_path, 1, lines.append, shown)
    assert [line.split(" — ")[0].strip() for line in lines] == ["ann: step 1/3: code cell 1", "ann: step 2/3: check a"]
    lines.clear()
    progress.write_text("step 3/3: check b", encoding="utf-8")
    _show_progress(running, tmp_path, 2, lines.append, shown)  # several workers: not yet
    assert lines == []
    running = {1: (None, SimpleNamespace(student="ann"), started - PROGRESS_EVERY, None)}
    shown = {}
    _show_progress(running, tmp_path, 2, lines.append, shown)
    assert len(lines) == 1 and "step 3/3: check b" in lines[0] and lines[0].endswith(" s")


def _tiny_lab(path, plain_cell: str, setup_cell: str = "DATA = [1, 2, 3]"):
    """A lab source: set-up, a plain (demonstration) cell, an answer and its test."""
    import nbformat

    cells = [nbformat.v4.new_code_cell(setup_cell, metadata={"grading": {"kind": "setup", "id": "data"}}),
             nbformat.v4.new_code_cell(plain_cell),
             nbformat.v4.new_code_cell("def total(xs):\n    ### BEGIN SOLUTION\n    return float(sum(xs))\n"
                                       "    ### END SOLUTION",
                                       metadata={"grading": {"kind": "answer", "id": "total", "task": "total"}}),
             nbformat.v4.new_code_cell("assert total(DATA) == 6.0",
                                       metadata={"grading": {"kind": "test", "id": "total_public", "task": "total",
                                                             "points": 1}})]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def _prepare(lab_path) -> dict:
    import json
    import subprocess
    import sys

    from tests.grading.submissions import ROOT

    commands = json.dumps({"op": "prepare", "check": "total_public"}) + "\n" + json.dumps({"op": "quit"}) + "\n"
    done = subprocess.run([sys.executable, "-m", "utils.grading.judge_process", str(lab_path)], input=commands,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0] == {"op": "ready"}, done.stderr
    return {"reply": lines[1], "log": done.stderr}


def test_the_judge_goes_on_past_a_failing_plain_cell_but_not_a_failing_set_up(tmp_path):
    # A demonstration cell's claim about noisy measurements must not stop every grade.
    plain = _prepare(_tiny_lab(tmp_path / "a.ipynb", "assert False, 'a noisy claim'"))
    assert plain["reply"] == {"op": "prepared"} and "a noisy claim" in plain["log"]
    broken = _prepare(_tiny_lab(tmp_path / "b.ipynb", "x = 1", setup_cell="DATA = 1 / 0"))
    assert broken["reply"]["op"] == "failed" and "ZeroDivisionError" in broken["reply"]["error"]
