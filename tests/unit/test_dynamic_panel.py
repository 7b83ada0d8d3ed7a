"""The dynamic half of `RunPanel` without processes: its controls make the dynamic `JobSpec`
fields with the spec's own live errors, and a dynamic run shows its partition history,
one diagnosis per phase, its decision logs, the partition plot and the marked slider.
The same with a real job and a browser: tests/browser/test_jupyterlab.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import utils
from utils.jobs.spec import JobSpec
from utils.planning.microbatching import MicroBatchPolicy
from utils.planning.rebalance import LayerCosts, Rebalance, decide
from utils.timeline import Event, Timeline
from utils.ui.dynamic_controls import parse_freeze
from utils.ui.dynamic_view import history_text, phases
from utils.ui.widgets import RunPanel

BASE = JobSpec(model="gpt", model_options={"blocks": 6}, num_stages=2, micro_batches=4, steps=8)


def test_freezing_parses_and_says_what_to_type():
    assert parse_freeze("") == {} and parse_freeze("6:4, 10:6") == {6: 4, 10: 6}
    with pytest.raises(ValueError, match="step:layers, e.g. 6:4"):
        parse_freeze("6-4")


def test_the_controls_make_the_dynamic_fields_and_the_plan_names_them():
    panel = RunPanel(BASE, lang="zh")
    d = panel.dynamic
    assert all(k.disabled for k in d.rebalance_knobs) and d.token_budget.disabled
    d.freeze.value = "4:2"
    d.rebalance.value = True
    d.rebalance_every.value, d.rebalance_window.value, d.rebalance_min_gain.value = 2, 2, 0.1
    spec = panel.spec()
    assert spec.freeze_at == {4: 2}
    assert spec.rebalance == Rebalance(every=2, window=2, min_gain=0.1, payback=Rebalance().payback)
    assert not any(k.disabled for k in d.rebalance_knobs)
    assert "冻结：第 4 步起前 2 层" in panel.plan.value and "重新均衡：每 2 步看最近 2 步" in panel.plan.value
    d.mb_policy.value = True
    d.mb_memory.value = 8
    assert panel.spec().micro_batch_policy == MicroBatchPolicy(memory_samples=8)
    assert "微批策略" in panel.plan.value


@pytest.mark.parametrize("change, error", [
    (lambda d: (setattr(d.rebalance, "value", True), setattr(d.rebalance_min_gain, "value", 1.5)), "min_gain"),
    (lambda d: (setattr(d.rebalance, "value", True), setattr(d.rebalance_window, "value", 9)), "window"),
    (lambda d: setattr(d.freeze, "value", "4"), "step:layers"),
    (lambda d: (setattr(d.mb_policy, "value", True), setattr(d.mb_every, "value", 0)), "every"),
])
def test_a_wrong_dynamic_value_is_named_live_and_nothing_starts(change, error):
    panel = RunPanel(BASE, lang="en")
    change(panel.dynamic)
    assert "✗" in panel.plan.value and error in panel.plan.value
    panel.run()
    assert panel.state == "invalid" and panel.job is None


@pytest.mark.parametrize("method", ["token-budget", "packing", "deepspeed"])
def test_token_budget_only_with_a_budgeted_batching(method):
    panel = RunPanel(BASE, lang="en")
    panel.dynamic.batching.value = method
    assert not panel.dynamic.token_budget.disabled
    panel.dynamic.token_budget.value = 4096
    assert panel.spec().token_budget == 4096 and panel.spec().batching == method
    panel.dynamic.batching.value = "sorted"
    assert panel.spec().token_budget is None and panel.dynamic.token_budget.disabled


# --- a dynamic run, shown -----------------------------------------------------------------------
MOVE = 2


def dynamic_run() -> SimpleNamespace:
    """What `RunPanel.show` reads from a `Run` that moved from [0, 4, 8] to [0, 3, 8] before step 2:
    four simulated steps (stage 0 heavy before the move, even after) and real decisions."""
    events, offset = [], 0.0
    for step in range(4):
        fwd = [2.0, 1.0] if step < MOVE else [1.5, 1.5]
        one = utils.simulate(utils.build_schedule("1f1b", 2, 4), forward=fwd, backward=[2 * f for f in fwd])
        events += [dataclasses.replace(e, step=step, start=e.start + offset, end=e.end + offset) for e in one.events]
        if step == MOVE:
            events += [Event(stage=s, rank=s, step=step, kind="repartition", micro_batch=None,
                             start=offset - 0.5, end=offset) for s in range(2)]
        offset = max(e.end for e in events) + 1
    history = [(0, [0, 4, 8]), (MOVE, [0, 3, 8])]
    timeline = Timeline(events=tuple(events), num_stages=2, num_micro_batches=4, label="dyn",
                        meta={"partitions": history})
    obs = [LayerCosts(s, (2e-3,) * 4 + (1e-3,) * 4, (4e-3,) * 4 + (2e-3,) * 4) for s in range(MOVE)]
    decisions = [decide(obs, step=MOVE, boundaries=[0, 4, 8], policy=Rebalance(every=2, window=2), schedule="1f1b",
                        num_micro_batches=4, step_seconds=[1.0, 1.0], remaining_steps=6, migration_seconds=0.1,
                        migration_source="estimated")]
    return SimpleNamespace(name="dyn", timeline=timeline, losses=[2.0, 1.5], parts=[0, 4, 8], ok=True,
                           spec=dataclasses.replace(BASE, steps=4, rebalance=Rebalance(every=2, window=2)),
                           partition_history=history, rebalance_decisions=decisions, micro_batch_decisions=[],
                           started=0.0, finished=1.0)


def test_a_dynamic_run_shows_its_history_phases_decisions_plot_and_marks():
    run = dynamic_run()
    assert history_text(run) == "[0, 4, 8] → [0, 3, 8] @ 2"
    assert phases(run) == [(0, 1, [0, 4, 8]), (2, 3, [0, 3, 8])]
    panel = RunPanel(BASE, history=[run], lang="zh")
    panel.show(0)
    assert "切分历史 [0, 4, 8] → [0, 3, 8] @ 2" in panel.result_title.value
    diagnosis = panel.diagnosis.value
    assert "分阶段诊断" in diagnosis and "step 0–1，切分 [0, 4, 8]：阶段 0 是瓶颈" in diagnosis
    assert "step 2–3，切分 [0, 3, 8]" in diagnosis and "各阶段均衡" in diagnosis.split("step 2–3")[1]
    assert "重新均衡的决策日志" in panel.decisions.value and "迁移" in panel.decisions.value
    assert "(估计)" in panel.decisions.value
    assert panel.partition_figure is not None and panel.partition_plot.outputs
    labels = [label for label, _ in panel.explorer.step_slider.options]
    assert labels == ["0", "1", "2 ⇄ 重切分", "3"]
    assert "重切分发生在 step [2]" in panel.explorer.marks_line.children[0].value
    panel.explorer.mark_buttons[0].click()
    assert panel.explorer.step == MOVE and f"step {MOVE}：" in panel.explorer.summary.value  # redrawn there


def test_a_static_run_has_no_dynamic_parts():
    run = dynamic_run()
    static = SimpleNamespace(**{**vars(run), "spec": BASE, "partition_history": [(0, [0, 4, 8])]})
    panel = RunPanel(BASE, history=[static], lang="en")
    panel.show(0)
    assert "partition [0, 4, 8] ·" in panel.result_title.value and "@" not in panel.result_title.value
    assert panel.decisions.value == ""
    assert panel.partition_figure is None and not panel.partition_plot.outputs
    assert "diagnosis:" in panel.diagnosis.value


def test_the_status_line_names_a_move_while_the_job_runs():
    from utils.jobs.rundir import PartitionChange

    spec = dataclasses.replace(BASE, rebalance=Rebalance(every=2, window=2))
    moves: list = []
    job = SimpleNamespace(spec=spec, started=0.0, run_dir=SimpleNamespace(partition_changes=lambda: list(moves)))
    panel = RunPanel(spec, lang="zh")
    row = {"step": 5, "loss": 1.25, "seconds": 0.1}
    panel._show_progress(job, [row])
    assert "step 6/8" in panel.status.value and "重切分" not in panel.status.value
    moves.append(PartitionChange(step=6, boundaries=(0, 4, 6)))
    panel._show_progress(job, [row, {**row, "step": 6}])
    assert "重切分 @ step 6 → [0, 4, 6]" in panel.status.value
