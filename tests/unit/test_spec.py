"""JobSpec checks: every mistake is caught before launch with a message saying what to change."""

import pytest

from utils import Fault, JobSpec, get_model

SMALL = {"model_options": {"blocks": 2}}  # 4 layers: embedding, 2 blocks, head


@pytest.mark.parametrize("fields, message", [
    ({"num_stages": 5}, r"num_stages=5 but model 'gpt' has only 4 layers.*num_stages <= 4"),
    ({"micro_batches": 0}, r"micro_batches must be at least 1, got 0"),
    ({"micro_batch_size": -1}, r"micro_batch_size must be at least 1, got -1"),
    ({"num_stages": 2, "micro_batches": 3, "train_batch_size": 16},
     r"train_batch_size=16 but .* = 12; DeepSpeed asserts they are equal. Change micro_batches to 4"),
    ({"partition": "profile-ish"}, r"unknown partition 'profile-ish'"),
    ({"num_stages": 2, "partition": [0, 4]}, r"have 2 entries; 2 stages need 3 boundaries"),
    ({"num_stages": 2, "partition": [0, 2, 5]}, r"must end at 4 \(the layer count\)"),
    ({"num_stages": 2, "partition": [1, 2, 4]}, r"must start at 0"),
    ({"num_stages": 3, "partition": [0, 2, 2, 4]}, r"not strictly increasing: stage 1 would own no layers"),
    # Before, floats passed the check and every rank truncated them: [0, 2.5, 4] ran as [0, 2, 4].
    ({"num_stages": 2, "partition": [0, 2.5, 4]}, r"boundary \[1\] = 2.5 is not an integer layer index"),
    ({"schedule": "zb-h1"}, r"unknown schedule 'zb-h1'.*DeepSpeed has no config key"),
    ({"device": "tpu"}, r"unknown device"),
    ({"timeout": 0}, r"timeout must be positive"),
    ({"fault": Fault(stage=3)}, r"fault stage 3 is outside 0..1"),
    ({"fault": Fault(instruction="jump")}, r"unknown fault instruction"),
])
def test_bad_specs_are_explained(fields, message):
    with pytest.raises(ValueError, match=message):
        JobSpec(**{**SMALL, **fields}).check()


@pytest.mark.parametrize("name", ["num_stages", "micro_batches", "micro_batch_size", "steps", "data_parallel"])
@pytest.mark.parametrize("value", [True, 2.0])
def test_counts_are_integers_not_booleans_or_floats(name, value):
    # Before, True passed as a count (bool is an int to Python) and 2.0 reached DeepSpeed.
    with pytest.raises(TypeError, match=f"{name} must be an integer"):
        JobSpec(**{**SMALL, name: value}).check()


def test_unknown_preset_and_option():
    with pytest.raises(ValueError, match=r"unknown model preset 'bert'; choose one of"):
        JobSpec(model="bert").check()
    with pytest.raises(ValueError, match=r"has no option\(s\) \['layers'\]"):
        JobSpec(model_options={"layers": 3}).check()
    with pytest.raises(ValueError, match=r"hidden \(128\) must be divisible by heads \(3\)"):
        JobSpec(model_options={"heads": 3}).check()  # before any rank fails building a block


def test_spec_round_trips_through_json():
    spec = JobSpec(num_stages=3, partition=[0, 2, 5, 8], fault=Fault(kind="hang", stage=1),
                   model_options={"blocks": 6})
    import json

    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec
    # A list and a tuple of the same boundaries are the same spec (find_run relies on it).
    assert JobSpec(partition=[0, 3, 8]) == JobSpec(partition=(0, 3, 8))
    assert JobSpec(partition=[0, 3, 8]).partition == (0, 3, 8)
    with pytest.raises(ValueError, match="unknown JobSpec field"):
        JobSpec.from_dict({"pipe_parallel_size": 4})


def test_for_this_machine_fits_the_model_to_the_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert JobSpec.for_this_machine(num_stages=2).model == "gpt-large"
    on_cpu = JobSpec.for_this_machine(num_stages=2, device="cpu")
    assert (on_cpu.model, on_cpu.device) == ("gpt", "cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert (JobSpec.for_this_machine(num_stages=2).model, JobSpec.for_this_machine(num_stages=2).device) == ("gpt", "cpu")
    assert JobSpec.for_this_machine(num_stages=2, model="mlp").model == "mlp"
