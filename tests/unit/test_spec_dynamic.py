"""The dynamic fields of `JobSpec` (issue 22): every mistake is caught before any process
starts, with a message that says what to change, and the fields survive the JSON record."""

import json

import pytest

from utils import Fault, JobSpec, Rebalance, run_job

# gpt default: 8 layers (embedding, 6 blocks, head); steps=6 below.
BASE = {"num_stages": 2, "steps": 6}


@pytest.mark.parametrize("fields, message", [
    ({"repartition_at": {0: [0, 2, 8]}}, r"repartition_at: step 0 is outside 1..5 .*set partition= for it"),
    ({"repartition_at": {6: [0, 2, 8]}}, r"repartition_at: step 6 is outside 1..5"),
    ({"repartition_at": {2: [0, 9, 8]}}, r"repartition_at\[2\]: "),
    ({"repartition_at": {2: [0, 2, 4, 8]}}, r"repartition_at\[2\]: "),
    ({"repartition_at": {2: [0, 2.5, 8]}}, r"repartition_at\[2\]: "),
    ({"repartition_at": [2, [0, 2, 8]]}, r"repartition_at must be a dict"),
    ({"repartition_mode": "hot"}, r"unknown repartition_mode 'hot'; choose one of \('live', 'restart'\)"),
    ({"repartition_optimizer": "keep"}, r"unknown repartition_optimizer 'keep'"),
    ({"repartition_optimizer": "deepspeed"}, r"DeepSpeed's own optimizer loader.*set repartition_mode='restart'"),
    ({"rebalance": Rebalance(), "repartition_at": {2: [0, 2, 8]}}, r"either repartition_at .* or rebalance"),
    ({"rebalance": Rebalance(), "repartition_mode": "restart"}, r"needs repartition_mode='live'"),
    ({"rebalance": {"every": 2}}, r"rebalance must be a utils.Rebalance"),
    ({"rebalance": Rebalance(window=5, every=2)}, r"window"),
    ({"freeze_at": {1: 8}}, r"freeze_at\[1\]=8 freezes every layer of the 8: .*at most 7"),
    ({"freeze_at": {1: 4, 3: 2}}, r"freeze_at\[3\]=2 unfreezes layers frozen earlier \(4\)"),
    ({"freeze_at": {7: 2}}, r"freeze_at: step 7 is outside 0..5"),
    ({"freeze_at": {1: 0}}, r"freeze_at\[1\]"),
    ({"seq_len_at": {1: 65}}, r"seq_len_at\[1\]=65 exceeds the model's seq_len 64"),
    ({"seq_len_at": {1: 8}, "model": "mlp"}, r"seq_len_at needs a language model preset"),
    ({"fault": Fault(instruction="repartition", step=2)}, r"a fault in 'repartition' at step 2 needs a live"),
    ({"fault": Fault(instruction="repartition", step=2), "repartition_at": {2: [0, 2, 8]},
      "repartition_mode": "restart"}, r"needs a live re-partition"),
    ({"lr_warmup_steps": -1}, r"lr_warmup_steps"),
])
def test_bad_dynamic_fields_are_explained(fields, message):
    with pytest.raises((ValueError, TypeError), match=message):
        JobSpec(**{**BASE, **fields}).check()


def test_a_bad_repartition_starts_nothing(tmp_path):
    with pytest.raises(ValueError, match=r"repartition_at\[3\]"):
        run_job(JobSpec(**BASE, repartition_at={3: [0, 8, 8]}), directory=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_dynamic_fields_round_trip_through_json():
    spec = JobSpec(**BASE, repartition_at={2: [0, 2, 8], 4: (0, 6, 8)}, freeze_at={1: 2, 3: 4},
                   seq_len_at={0: 16}, lr_warmup_steps=2)
    again = JobSpec.from_dict(json.loads(spec.to_json()))  # JSON turns step keys into strings
    assert again == spec and again.repartition_at == {2: (0, 2, 8), 4: (0, 6, 8)}
    again.check()
    policy = JobSpec(**BASE, rebalance=Rebalance(every=2, window=2, payback=1.5))
    assert JobSpec.from_dict(json.loads(policy.to_json())) == policy


def test_a_warm_up_adds_deepspeeds_scheduler():
    from utils import deepspeed_config

    assert "scheduler" not in deepspeed_config(JobSpec())
    scheduler = deepspeed_config(JobSpec(lr_warmup_steps=5, lr=1e-3))["scheduler"]
    assert scheduler["type"] == "WarmupLR"
    assert scheduler["params"]["warmup_num_steps"] == 5 and scheduler["params"]["warmup_max_lr"] == 1e-3


@pytest.mark.parametrize("fields, message", [
    ({"batching": "token-budget", "token_budget": 32}, r"token_budget=32 is smaller than the longest sample \(64"),
    ({"batching": "token-budget", "lengths": [8, 40], "token_budget": 32}, r"smaller than the longest sample \(40"),
    ({"batching": "token-budget"}, r"needs token_budget"),
    ({"batching": "sorted", "lengths": [8, 65]}, r"a sample length 65 exceeds the model's seq_len 64"),
    ({"batching": "sorted", "lengths": []}, r"lengths must be a non-empty list"),
    ({"batching": "sorted", "lengths": [0, 8]}, r"lengths"),
    ({"lengths": [8]}, r"lengths only apply to variable-length batching"),
    ({"batching": "bucketed"}, r"unknown batching 'bucketed'"),
    ({"batching": "sorted", "model": "mlp"}, r"language-model presets .*keep batching='fixed'; micro_batches_at and "
                                             r"micro_batch_policy re-cut any model's samples"),
    ({"micro_batches_at": {2: 3}}, r"micro_batches_at\[2\]=3 does not divide the 16 samples"),
    ({"micro_batches_at": {9: 2}}, r"micro_batches_at: step 9 is outside"),
    ({"batching": "token-budget", "token_budget": 128, "micro_batches_at": {2: 2}}, r"drop micro_batches_at"),
    ({"token_budget": 128}, r"token_budget only applies"),
    ({"batching": "packing"}, r"batching='packing' needs token_budget=\.\.\., the most padded tokens"),
    ({"batching": "packing", "token_budget": 32, "lengths": [8]}, r"smaller than a packed row \(the model's seq_len\) \(64"),
    ({"batching": "deepspeed"}, r"batching='deepspeed' needs token_budget=\.\.\., the most real tokens"),
    ({"batching": "deepspeed", "token_budget": 256, "lr_warmup_steps": 2}, r"drop lr_warmup_steps"),
    ({"batching": "packing", "token_budget": 128, "micro_batches_at": {2: 2}}, r"packing batching chooses"),
    ({"dynamic_shape": 1}, r"dynamic_shape must be True or False"),
    ({"loss_per": "sample"}, r"unknown loss_per 'sample'"),
    ({"batching": "sorted", "seq_len_at": {1: 16}}, r"drop one of them"),
    # micro_batches_at draws its own per-step samples too: a curriculum there would be ignored
    ({"micro_batches_at": {2: 2}, "seq_len_at": {1: 16}}, r"drop one of them"),
])
def test_bad_batching_is_explained_before_launch(fields, message):
    with pytest.raises((ValueError, TypeError), match=message):
        JobSpec(**{**BASE, "micro_batches": 4, "micro_batch_size": 4, **fields}).check()


def test_micro_batch_policy_is_checked_and_recorded():
    from utils import MicroBatchPolicy

    spec = JobSpec(**BASE, micro_batch_policy=MicroBatchPolicy(memory_samples=16, every=2))
    spec.check()
    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec
    with pytest.raises(ValueError, match=r"already keeps 8 samples in flight, over memory_samples=4"):
        JobSpec(**BASE, micro_batch_policy=MicroBatchPolicy(memory_samples=4)).check()
    with pytest.raises(ValueError, match="without batching= and micro_batches_at"):
        JobSpec(**BASE, micro_batch_policy=MicroBatchPolicy(memory_samples=16), micro_batches_at={2: 2}).check()
    with pytest.raises(TypeError, match="micro_batch_policy must be"):
        JobSpec(**BASE, micro_batch_policy={"memory_samples": 4}).check()
    with pytest.raises(ValueError, match="overhead_samples must be a number >= 0"):
        JobSpec(**BASE, micro_batch_policy=MicroBatchPolicy(memory_samples=16, overhead_samples=-1)).check()


def test_a_model_without_token_samples_re_cuts_its_own_but_needs_the_policys_fixed_cost():
    """mlp (like a learner's model) has no token samples the workbook draws: a varying count
    re-cuts its own (utils.workloads.recut), and the policy's cost model needs its fixed part."""
    from utils import MicroBatchPolicy

    fields = {**BASE, "model": "mlp", "micro_batches": 4, "micro_batch_size": 4}
    JobSpec(**fields, micro_batches_at={2: 2}).check()
    with pytest.raises(ValueError, match=r"overhead_samples=\.\.\.\) is needed for 'mlp'.*n \(2 t_n - t_2n\)"):
        JobSpec(**fields, micro_batch_policy=MicroBatchPolicy(memory_samples=16)).check()
    spec = JobSpec(**fields, micro_batch_policy=MicroBatchPolicy(memory_samples=16, overhead_samples=2.5))
    spec.check()
    assert JobSpec.from_dict(json.loads(spec.to_json())).micro_batch_policy.overhead_samples == 2.5


def test_re_cut_micro_batches_hold_the_static_streams_samples():
    import torch

    from utils.workloads.layers import batches
    from utils.workloads.models import get_model
    from utils.workloads.recut import RecutBatches

    model = get_model("mlp", {})
    static = batches(model, seed=3, micro_batch_size=4, replica=1)
    recut = RecutBatches(model, seed=3, replica=1, micro_batch_size=4, micro_batches=4)
    for step, m in enumerate((4, 2, 8, 1)):
        expected = [next(static) for _ in range(4)]
        recut.micro_batches = m
        assert recut.begin_step(step) == m and recut.plan.micro_batches == m
        got = [next(recut) for _ in range(m)]
        assert all(len(x) == 16 // m for x, _ in got)
        for part in (0, 1):
            assert torch.equal(torch.cat([e[part] for e in expected]), torch.cat([g[part] for g in got]))
        with pytest.raises(RuntimeError, match="more micro-batches than it was cut into"):
            next(recut)
    recut.micro_batches = 3
    with pytest.raises(ValueError, match="3 micro-batches do not divide the step's 16 samples"):
        recut.begin_step(4)
