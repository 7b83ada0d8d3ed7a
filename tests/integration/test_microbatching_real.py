"""Dynamic micro-batching on real DeepSpeed jobs (issues 23, 41): variable-length samples cut by
four methods train identically, DeepSpeed's own dynamic batching runs through its own
functions, a micro-batch count changed at a step takes effect then, and one shape per step
costs one metadata message per shape change.

DeepSpeed runs sorted and token-budget batching with ``PipelineModule(dynamic_shape=True)``
(each micro-batch its own shape), the others with ``reset_activation_shape()`` before a step
whose shape changed, and ``set_train_batch_size`` before a step whose plan has another count."""

from __future__ import annotations

import pytest

from utils import JobSpec, run_job

pytestmark = pytest.mark.integration

MODEL = {"model": "gpt", "model_options": {"blocks": 4, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64},
         "micro_batch_size": 4}
SAME = 1e-5


def _spec(stages: int, **fields) -> JobSpec:
    return JobSpec(**{**MODEL, "num_stages": stages, "micro_batches": 4, "steps": 4, "device": "cpu",
                      "timeout": 240, **fields})


def _gap(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize("stages", [4])
def test_every_batching_method_computes_the_same_gradient(runs_root, stages):
    """Same samples, three cuts: the per-token loss (and so the gradient and every later
    step) agrees to float rounding; averaging per micro-batch instead does not. (Chapter 19
    asserts the same on 2 stages; here 4, where variable shapes cross three boundaries.)"""
    naive = run_job(_spec(stages, batching="pad-to-max", name="pad"), progress=False)
    ordered = run_job(_spec(stages, batching="sorted", name="sorted"), progress=False)
    budget = run_job(_spec(stages, batching="token-budget", token_budget=256, name="budget"), progress=False)
    packed = run_job(_spec(stages, batching="packing", token_budget=128, name="packed"), progress=False)
    assert _gap(ordered.losses, naive.losses) <= SAME and _gap(budget.losses, naive.losses) <= SAME
    assert _gap(packed.losses, naive.losses) <= SAME  # rows of several samples, a block-diagonal mask: the same
    rows = packed.run_dir.micro_batches()
    assert all(r["masked_pairs"] > 0 and sum(r["real"]) <= sum(r["padded"]) for r in rows)
    # the token-budget plan really cut differently: other micro-batch counts than 4
    counts = [len(budget.timeline.select(step=s, stage=0, kinds=("forward",))) for s in range(4)]
    assert counts != [4, 4, 4, 4], counts
    control = run_job(_spec(stages, batching="sorted", loss_per="micro-batch", name="per-mb"), progress=False)
    assert _gap(control.losses, naive.losses) > 100 * SAME


def test_a_new_micro_batch_count_takes_effect_at_its_step(runs_root):
    """The same 16 samples per step as 4 micro-batches of 4, then from step 2 as 8 of 2.
    (The static run names its count at step 0 so both cut the same per-step sample stream.)"""
    static = run_job(_spec(2, micro_batches_at={0: 4}, name="m-static"), progress=False)
    changed = run_job(_spec(2, micro_batches_at={2: 8}, name="m-changed"), progress=False)
    counts = [len(changed.timeline.select(step=s, stage=1, kinds=("backward",))) for s in range(4)]
    assert counts == [4, 4, 8, 8]
    assert _gap(changed.losses, static.losses) <= SAME


def test_the_policy_picks_a_micro_batch_count_and_changes_it_when_costs_change(runs_root):
    """16 fixed-length samples per step, 8 micro-batches of 2 at first. The policy looks every
    2 steps; with the first 4 layers frozen from step 3 a micro-batch costs less compute while
    its fixed cost stays. Each look is recorded; the count in force shows on the timeline;
    and whatever it chose, the losses equal the static job's (the same samples, per token)."""
    from utils import MicroBatchPolicy

    fields = dict(micro_batch_size=2, micro_batches=8, steps=9, freeze_at={3: 4})
    static = run_job(_spec(2, **fields, micro_batches_at={0: 8}, name="policy-static"), progress=False)
    run = run_job(_spec(2, **fields, micro_batch_policy=MicroBatchPolicy(memory_samples=16, every=2, min_gain=0.0),
                        name="policy-m"), progress=False)
    assert _gap(run.losses, static.losses) <= SAME
    decisions = run.micro_batch_decisions
    assert [d.step for d in decisions] == [2, 4, 6, 8] and run.rebalance_decisions == []
    counts = [len(run.timeline.select(step=s, stage=1, kinds=("backward",))) for s in range(9)]
    in_force = 8
    for step in range(9):
        chosen = next((d.chosen for d in decisions if d.step == step), None)
        in_force = chosen or in_force
        assert counts[step] == in_force, (step, counts, [d.reason for d in decisions])
    # Whether a look changes the count depends on the measured costs (a busy machine can flip
    # it): each look picks the fastest count of its own predictions (min_gain=0), whatever they are.
    for d in decisions:
        assert d.chosen == min(d.predicted, key=lambda m: (d.predicted[m], m)), (d.step, d.predicted, d.reason)
    print("micro-batch counts chosen on this run:", [(d.step, d.current, d.chosen) for d in decisions])
    assert all(set(d.predicted) == {1, 2, 4, 8, 16} for d in decisions)  # all fit 16 samples in flight


def test_deepspeeds_dynamic_batching_runs_its_own_plan_and_learning_rate(runs_root):
    """batching="deepspeed": each step is the batch DeepSpeed's batch_by_seqlens made of the
    sample stream (4 micro-batches of equal sample count, at most token_budget real tokens
    each, padded to the step's longest), trained at its scale_lr; the sample count per step
    varies, so its losses are not the fixed-batch methods' (printed, not compared)."""
    from utils.planning.microbatching import deepspeed_lr
    from utils.workloads.models import get_model
    from utils.workloads.varlen import batches_for

    spec = _spec(2, batching="deepspeed", token_budget=256, name="ds-dynamic")
    run = run_job(spec, progress=False)
    data = batches_for(spec, get_model(spec.model, spec.model_options), replica=0)
    rows = run.run_dir.micro_batches()
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        data.begin_step(row["step"])
        assert row["samples"] == [len(g) for g in data.plan.groups] and len(set(row["samples"])) == 1
        assert max(row["real"]) <= 256 and len(set(row["padded"])) == 1
        assert row["lr"] == deepspeed_lr(spec.lr, base_samples=16, samples=sum(row["samples"]))
        forwards = run.timeline.select(step=row["step"], stage=0, kinds=("forward",))
        assert len(forwards) == 4
    assert len({sum(r["samples"]) for r in rows}) > 1
    print("samples per step:", [sum(r["samples"]) for r in rows], "lr:", [r["lr"] for r in rows])
    print("losses:", [round(x, 4) for x in run.losses])


def test_one_shape_per_step_costs_one_metadata_message_per_change(runs_root):
    """pad-to-max keeps one shape per step: the workbook resets DeepSpeed's shape cache before a
    step whose shape changed (reset_activation_shape), so stage 0 sends one metadata message at
    the start and one per change; dynamic_shape=True sends one before every micro-batch.
    Counted in DeepSpeed's own comms log (its sends of TENSOR_META_SIZE int32s); same losses."""
    from collections import Counter

    from deepspeed.runtime.pipe.engine import TENSOR_META_SIZE

    config = {"comms_logger": {"enabled": True, "verbose": False, "prof_all": True}}
    fields = dict(batching="pad-to-max", steps=6, deepspeed_config=config, lengths=[8] * 16 + [40] * 16 + [8] * 16)
    reset = run_job(_spec(2, **fields, name="meta-reset"), progress=False)
    every = run_job(_spec(2, **fields, dynamic_shape=True, name="meta-every"), progress=False)
    assert reset.losses == every.losses
    shapes = [(r["samples"][0], r["padded"][0] // r["samples"][0]) for r in reset.run_dir.micro_batches()]
    changes = sum(a != b for a, b in zip(shapes, shapes[1:]))
    assert shapes == [(4, 8), (4, 40), (4, 8)] * 2  # 16 samples a step from the cycled lengths: 4 changes
    meta = TENSOR_META_SIZE * 4
    sent = {run.name: Counter((op.op, op.bytes) for op in run.comm_ops[0])[("send", meta)] for run in (reset, every)}
    assert sent[reset.name] == 1 + changes and sent[every.name] == 6 * 4, (sent, shapes)
