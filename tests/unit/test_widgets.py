"""The notebook panels without processes: controls -> spec, errors shown in the panel, the
watcher thread driven by a fake job, the timeline explorer redrawing on slider and filter."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from types import SimpleNamespace

import pytest

import utils
import utils.ui.widgets as W
from utils.ui.display import PLOTLY_MIME
from utils.ui.explorer import TimelineExplorer
from utils.jobs.launch import JobFailed
from utils.jobs.spec import JobSpec
from utils.timeline import Timeline


# --- fixtures ---------------------------------------------------------------------------------
def two_step_timeline() -> Timeline:
    """A simulated timeline with two steps that differ: step 0 runs 8 micro-batches, step 1
    runs 4 with other costs (the explorer must redraw when the slider moves)."""
    a = utils.simulate(utils.build_schedule("1f1b", 4, 8), forward=1, backward=2)
    b = utils.simulate(utils.build_schedule("1f1b", 4, 4), forward=0.5, backward=1.5)
    offset = max(e.end for e in a.events) + 1
    events = list(a.events) + [dataclasses.replace(e, step=1, start=e.start + offset, end=e.end + offset)
                               for e in b.events]
    return Timeline(events=tuple(events), num_stages=4, num_micro_batches=8, source="simulated",
                    label="two steps")


def fake_run(timeline: Timeline, name: str = "fake-run") -> SimpleNamespace:
    """What `RunPanel.show` and `compare` read from a `Run`, without a run directory."""
    return SimpleNamespace(name=name, timeline=timeline, losses=[2.0, 1.5], parts=[0, 4, 8], ok=True,
                           spec=JobSpec(num_stages=timeline.num_stages, micro_batches=8),
                           started=0.0, finished=1.0)


class FakeJob:
    """Stands in for `RunningJob`: `steps` polls of progress, then success (or failure)."""

    def __init__(self, spec: JobSpec, *, fail: bool = False, explode: bool = False):
        self.spec, self.fail, self.explode = spec, fail, explode
        self.path = SimpleNamespace(name="fake-job")
        self.notes: list[str] = []
        self.started = time.time()
        self.state = "running"
        self.polls = 0
        self.stop_thread: str | None = None

    def poll(self) -> str:
        if self.explode:
            raise RuntimeError("boom")
        if self.state == "running":
            self.polls += 1
            if self.polls > self.spec.steps:
                self.state = "failed" if self.fail else "succeeded"
        return self.state

    def progress(self) -> list[dict]:
        return [{"step": i, "loss": 3.0 - i * 0.1, "seconds": 0.01}
                for i in range(min(self.polls, self.spec.steps))]

    def stop(self, reason: str = "") -> None:
        self.stop_thread = threading.current_thread().name
        if self.state == "running":
            self.state = "stopped"

    def result(self):
        if self.state != "succeeded":
            raise JobFailed(f"job fake-job {self.state}: rank 1 (stage 1) raised ValueError: bad", None)
        return fake_run(two_step_timeline())


@pytest.fixture
def no_launch(monkeypatch):
    """Any attempt to start processes fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a job was started")
    monkeypatch.setattr(W, "start_job", forbidden)


# --- parsing ----------------------------------------------------------------------------------
def test_parse_boundaries_and_options():
    assert W.parse_boundaries("0,3,8") == [0, 3, 8]
    assert W.parse_boundaries(" [0, 3, 8] ") == [0, 3, 8]
    assert W.parse_boundaries("0 3 8") == [0, 3, 8]
    for bad in ("", "0,a,8", "0;3"):
        with pytest.raises(ValueError, match="boundaries"):
            W.parse_boundaries(bad)
    assert W.parse_options("blocks=2, hidden=64") == {"blocks": 2, "hidden": 64}
    assert W.parse_options("") == {}
    with pytest.raises(ValueError, match="name=value"):
        W.parse_options("blocks")
    with pytest.raises(ValueError, match="whole number"):
        W.parse_options("blocks=two")


# --- controls -> spec -------------------------------------------------------------------------
def test_controls_make_the_spec():
    panel = W.RunPanel(JobSpec(timeout=42.0, name="mine"))
    panel.model.value = "mlp"
    panel.stages.value = 4
    panel.micro_batches.value = 8
    panel.micro_batch_size.value = 2
    panel.partition.value = "uniform"
    panel.schedule.value = "gpipe"
    panel.steps.value = 5
    spec = panel.spec()
    assert (spec.model, spec.num_stages, spec.micro_batches, spec.micro_batch_size) == ("mlp", 4, 8, 2)
    assert (spec.partition, spec.schedule, spec.steps) == ("uniform", "gpipe", 5)
    assert (spec.timeout, spec.name) == (42.0, "mine")  # fields without a control come from the base
    assert "✓" in panel.plan.value and "8 processes" not in panel.plan.value and "4 processes" in panel.plan.value


def test_model_options_and_explicit_boundaries():
    panel = W.RunPanel()
    panel.model_options.value = "blocks=2, hidden=64, heads=4, vocab=512, seq_len=16"
    panel.stages.value = 2
    assert panel.boundaries.disabled
    panel.partition.value = W.BOUNDARIES  # pre-filled with what the previous method chose
    assert not panel.boundaries.disabled
    assert W.parse_boundaries(panel.boundaries.value)[0] == 0
    panel.boundaries.value = "0,1,4"
    spec = panel.spec()
    assert spec.model_options == {"blocks": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 16}
    assert list(spec.partition) == [0, 1, 4]
    assert "stage 0: layers 0–0" in panel.plan.value


def test_panel_starts_from_a_spec_with_boundaries():
    panel = W.RunPanel(JobSpec(num_stages=2, partition=[0, 3, 8]))
    assert panel.partition.value == W.BOUNDARIES and panel.boundaries.value == "0,3,8"
    assert list(panel.spec().partition) == [0, 3, 8]


@pytest.mark.parametrize("setup, expected", [
    ({"stages": 20}, "num_stages=20"),
    ({"partition": W.BOUNDARIES, "boundaries": "0,x,8"}, "whole numbers"),
    ({"partition": W.BOUNDARIES, "boundaries": "0,6,3"}, "not strictly increasing|must start at 0|must end at"),
    ({"model_options": "blocks=0"}, "model option blocks must be at least 1"),
])
def test_invalid_input_is_shown_and_nothing_starts(no_launch, setup, expected):
    panel = W.RunPanel()
    for name, value in setup.items():
        getattr(panel, name).value = value
    assert "✗" in panel.plan.value  # shown while typing, before Run
    panel.run_button.click()
    assert panel.state == "invalid" and panel.job is None and not panel.running
    assert re.search(expected, panel.message.value), panel.message.value
    assert "cannot start" in panel.message.value
    assert not panel.run_button.disabled and panel.stop_button.disabled


# --- the watcher thread, with a fake job -------------------------------------------------------
def test_run_shows_progress_result_and_history(monkeypatch):
    jobs = []
    monkeypatch.setattr(W, "start_job", lambda spec, directory=None: jobs.append(FakeJob(spec)) or jobs[-1])
    panel = W.RunPanel(JobSpec(steps=3), poll_interval=0.01)
    run = panel.run(wait=True, timeout=10)
    assert run is not None and panel.state == "succeeded" and panel.error is None
    assert jobs[0].stop_thread is None
    assert panel.progress.value == 3 and panel.progress.bar_style == "success"
    assert "succeeded" in panel.status.value
    assert panel.history == [run] and panel.history_select.options[0][1] == 0
    assert panel.figure is not None and panel.explorer.bar_count() > 0
    assert PLOTLY_MIME in panel.explorer.output.outputs[0]["data"]
    assert "bubble_ratio" in panel.metrics.value and "diagnosis" in panel.diagnosis.value
    assert not panel.run_button.disabled and panel.stop_button.disabled


def test_failure_is_shown_not_left_spinning(monkeypatch):
    monkeypatch.setattr(W, "start_job", lambda spec, directory=None: FakeJob(spec, fail=True))
    panel = W.RunPanel(JobSpec(steps=2), poll_interval=0.01)
    assert panel.run(wait=True, timeout=10) is None
    assert panel.state == "failed" and "raised ValueError: bad" in panel.message.value
    assert panel.progress.bar_style == "danger" and panel.history == []


def test_stop_is_done_by_the_watcher_thread(monkeypatch):
    job = FakeJob(JobSpec(steps=10**6))
    monkeypatch.setattr(W, "start_job", lambda spec, directory=None: job)
    panel = W.RunPanel(JobSpec(steps=10**6), poll_interval=0.01)
    panel.run_button.click()  # returns at once: the kernel stays free
    assert panel.running and panel.state == "running" and panel.run_button.disabled
    with pytest.raises(RuntimeError, match="already running"):
        panel.run()
    panel.stop_button.click()
    assert panel.wait(10) == "stopped"
    assert job.stop_thread.startswith("RunPanel-")  # never from the clicking thread
    assert "stopped" in panel.status.value and not panel.running


def test_a_panel_error_stops_the_job(monkeypatch):
    job = FakeJob(JobSpec(), explode=True)
    monkeypatch.setattr(W, "start_job", lambda spec, directory=None: job)
    panel = W.RunPanel(poll_interval=0.01)
    panel.run(wait=True, timeout=10)
    assert panel.state == "error" and "boom" in panel.message.value and job.state == "stopped"
    assert not panel.run_button.disabled


def test_a_failure_to_start_is_shown(monkeypatch):
    def broken(spec, directory=None):
        raise OSError("disk full")
    monkeypatch.setattr(W, "start_job", broken)
    panel = W.RunPanel(poll_interval=0.01)
    assert panel.run(wait=True, timeout=10) is None
    assert panel.state == "error" and "OSError: disk full" in panel.message.value
    assert panel.job is None and not panel.run_button.disabled and panel.stop_button.disabled


def test_profile_partition_is_not_profiled_while_editing(monkeypatch):
    import utils.jobs.plan

    def no_profiling(*args, **kwargs):
        raise AssertionError("a layer profile was looked up on the main thread")
    panel = W.RunPanel()
    monkeypatch.setattr(utils.jobs.plan, "profile_for_job", no_profiling)
    monkeypatch.setattr(utils.jobs.plan, "profile_layers", no_profiling)
    panel.partition.value = W.PROFILE
    assert "measured layer costs" in panel.plan.value and panel.spec().partition == W.PROFILE
    panel.partition.value = W.BOUNDARIES  # no pre-fill from "profile": that would profile
    assert panel.boundaries.value == "" and "✗" in panel.plan.value


# --- history and comparison --------------------------------------------------------------------
def test_history_show_and_compare():
    tl = two_step_timeline()
    one = utils.simulate(utils.build_schedule("gpipe", 4, 8), forward=1, backward=2)
    panel = W.RunPanel(history=[fake_run(tl, "a"), fake_run(one, "b")])
    assert [v for _, v in panel.history_select.options] == [0, 1]
    assert (panel.compare_a.value, panel.compare_b.value) == (0, 1)
    panel.compare_button.click()
    data = panel.compare_output.outputs[0]["data"][PLOTLY_MIME]
    assert len(data["data"]) > 0 and "#1 vs #2" in data["layout"]["title"]["text"]
    panel.history_select.value = 1
    panel.show_button.click()
    assert "<b>b</b>" in panel.result_title.value and panel.explorer.timeline is one


def test_compare_with_empty_history_says_so():
    panel = W.RunPanel()
    panel.compare_button.click()
    assert "cannot compare" in panel.message.value


# --- timeline explorer -------------------------------------------------------------------------
def test_explorer_slider_and_filter_change_the_figure():
    ex = TimelineExplorer(two_step_timeline())
    assert ex.step == 1 and not ex.step_slider.disabled  # step 0 is warm-up: not the default
    assert ex.bar_count() == 4 * 4 * 2
    ex.step_slider.value = 0
    assert ex.bar_count() == 4 * 8 * 2 and "step 0" in ex.figure.layout.title.text
    ex.kind_boxes["backward"].value = False
    assert ex.bar_count() == 4 * 8 and [t.name for t in ex.figure.data if t.type == "bar"] == ["forward"]
    ex.kinds = ["backward"]
    assert ex.bar_count() == 4 * 8 and ex.kinds == ["backward"]
    ex.kinds = []
    assert ex.bar_count() == 0
    with pytest.raises(ValueError, match="not in this timeline"):
        ex.kinds = ["send_act"]
    bundle = ex.output.outputs[0]["data"]
    assert bundle[PLOTLY_MIME]["layout"]["title"]["text"] == ex.figure.layout.title.text
    assert "bubble" in ex.summary.value


def test_explorer_on_a_one_step_simulation():
    ex = TimelineExplorer(utils.simulate(utils.build_schedule("1f1b", 4, 8), forward=1, backward=2))
    assert ex.step_slider.disabled and ex.step == 0 and ex.bar_count() == 64
    assert "simulated" in ex.figure.layout.title.text
    assert set(ex.kind_boxes) == {"forward", "backward"}


def test_bare_objects_display_their_widget():
    ex = TimelineExplorer(two_step_timeline())
    assert "application/vnd.jupyter.widget-view+json" in ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in W.RunPanel()._repr_mimebundle_()


# --- labels, language and layout ---------------------------------------------------------------
def test_history_label_says_the_bubble_is_a_median():
    panel = W.RunPanel(history=[fake_run(two_step_timeline(), "a")])
    label = panel.history_select.options[0][0]
    m = two_step_timeline().metrics()  # summary over the steps after step 0
    assert label.endswith(f"median bubble {m.bubble_ratio:.0%} over 1 step(s)")
    panel.show(0)
    assert "step 1: bubble" in panel.explorer.summary.value  # the explorer shows one step
    one = W.RunPanel(history=[fake_run(utils.simulate(utils.build_schedule("1f1b", 4, 8), forward=1, backward=2))])
    assert "median bubble 27% over 1 step(s)" in one.history_select.options[0][0]


def test_a_chinese_panel(no_launch):
    panel = W.RunPanel(JobSpec(num_stages=2, micro_batches=4), history=[fake_run(two_step_timeline())], lang="zh")
    assert (panel.run_button.description, panel.stop_button.description) == ("运行", "停止")
    assert panel.stages.description == "阶段数" and panel.micro_batches.description == "微批数"
    assert ("parameters（按参数量）", "parameters") in panel.partition.options
    panel.partition.value = "uniform"  # values stay the API's identifiers
    assert panel.spec().partition == "uniform"
    assert "2 个进程" in panel.plan.value and "阶段 0：第 0–" in panel.plan.value
    assert "空闲" in panel.status.value and "■" in panel.stop_hint.value
    assert "气泡率中位数" in panel.history_select.options[0][0]
    panel.show(0)
    assert "指令类型" in panel.explorer.kinds_row.children[0].value
    assert "气泡率 bubble_ratio" in panel.metrics.value and "诊断：" in panel.diagnosis.value
    assert "模拟" in panel.figure.layout.title.text
    header = panel.widget.children[0].value
    assert "流水线任务" in header and "历史与对比" in panel.history_box.children[0].value


def test_compare_choices_have_room_for_their_labels():
    panel = W.RunPanel(history=[fake_run(two_step_timeline(), "a"), fake_run(two_step_timeline(), "b")])
    longest = max(len(label) for label, _ in panel.compare_a.options)
    for dropdown in (panel.compare_a, panel.compare_b, panel.history_select):
        assert "760px" in dropdown.layout.width  # ~7 px per character at the notebook's font size
    assert 7 * longest + 60 < 760
    # A and B each on a line of their own, not squeezed side by side
    assert panel.compare_a in panel.history_box.children
