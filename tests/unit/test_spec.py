"""JobSpec checks: every mistake is caught before launch with a message saying what to change."""

import pytest

from utils import Fault, JobSpec, get_model

SMALL = {"model_options": {"blocks": 2}}  # 4 layers: embedding, 2 blocks, head


@pytest.mark.parametrize("fields, message", [
    ({"num_stages": 5}, r"num_stages=5 but model 'gpt' has only 4 layers.*num_stages <= 4"),
    ({"micro_batches": 0}, r"micro_batches must be a positive integer"),
    ({"micro_batch_size": -1}, r"micro_batch_size must be a positive integer"),
    ({"num_stages": 2, "micro_batches": 3, "train_batch_size": 16},
     r"train_batch_size=16 but .* = 12; DeepSpeed asserts they are equal. Change micro_batches to 4"),
    ({"partition": "profile-ish"}, r"unknown partition 'profile-ish'"),
    ({"num_stages": 2, "partition": [0, 4]}, r"has 2 boundaries; 2 stages need"),
    ({"num_stages": 2, "partition": [0, 2, 5]}, r"must start at 0 and end at 4"),
    ({"num_stages": 3, "partition": [0, 2, 2, 4]}, r"strictly increasing"),
    ({"schedule": "zb-h1"}, r"unknown schedule 'zb-h1'.*DeepSpeed has no config key"),
    ({"device": "tpu"}, r"unknown device"),
    ({"timeout": 0}, r"timeout must be positive"),
    ({"fault": Fault(stage=3)}, r"fault stage 3 is outside 0..1"),
    ({"fault": Fault(instruction="jump")}, r"unknown fault instruction"),
])
def test_bad_specs_are_explained(fields, message):
    with pytest.raises(ValueError, match=message):
        JobSpec(**{**SMALL, **fields}).check()


def test_unknown_preset_and_option():
    with pytest.raises(ValueError, match=r"unknown model preset 'bert'; choose one of"):
        JobSpec(model="bert").check()
    with pytest.raises(ValueError, match=r"has no option\(s\) \['layers'\]"):
        JobSpec(model_options={"layers": 3}).check()
    with pytest.raises(ValueError, match=r"hidden \(128\) must be divisible by heads \(3\)"):
        JobSpec(model_options={"heads": 3}).check()  # before any rank fails building a block


def test_deepspeed_config_uses_real_keys_only():
    spec = JobSpec(num_stages=4, micro_batches=8, micro_batch_size=2, data_parallel=2)
    config = spec.deepspeed_config()
    assert config["train_batch_size"] == 2 * 8 * 2 == spec.global_batch
    assert config["gradient_accumulation_steps"] == 8
    assert "pipeline" not in config and "pipe_parallel_size" not in config
    assert spec.world_size == 8


def test_boundaries_follow_deepspeed_methods():
    spec = JobSpec(num_stages=2)  # gpt: embedding, 6 blocks, head
    assert spec.boundaries() == [0, 4, 8]
    # Parameter balance puts the parameter-heavy but cheap embedding with three blocks.
    model = get_model("gpt")
    params = model.param_counts()
    assert params[0] > 4 * params[1] and params[-1] > 4 * params[1]
    assert JobSpec(num_stages=4, partition="uniform").boundaries() == [0, 2, 4, 6, 8]
    assert JobSpec(num_stages=2, partition=(0, 3, 8)).boundaries() == [0, 3, 8]


def test_spec_round_trips_through_json():
    spec = JobSpec(num_stages=3, partition=[0, 2, 5, 8], fault=Fault(kind="hang", stage=1),
                   model_options={"blocks": 6})
    import json

    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec
    with pytest.raises(ValueError, match="unknown JobSpec field"):
        JobSpec.from_dict({"pipe_parallel_size": 4})


def test_for_this_machine_fits_the_model_to_the_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert JobSpec.for_this_machine(num_stages=2).model == "gpt-large"
    on_cpu = JobSpec.for_this_machine(num_stages=2, device="cpu")
    assert (on_cpu.model, on_cpu.device) == ("gpt", "cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert (JobSpec.for_this_machine(num_stages=2).model, JobSpec.for_this_machine(num_stages=2).device) == ("gpt", "cpu")
    assert JobSpec.for_this_machine(num_stages=2, model="mlp").model == "mlp"
