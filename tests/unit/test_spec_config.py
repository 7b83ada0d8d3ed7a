"""The configuration fields of `JobSpec` (issue 17): precision, ZeRO stage, activation
checkpointing and raw DeepSpeed keys are checked, merged into the config the job runs with,
and linted before launch (errors stop it unless strict=False, warnings become notes)."""

import json

import pytest

from utils import JobSpec, deepspeed_config, plan_job


@pytest.mark.parametrize("fields, message", [
    ({"precision": "fp8"}, r"unknown precision 'fp8'; choose one of \('fp32', 'bf16', 'fp16'\)"),
    ({"zero_stage": 4}, r"zero_stage=4: ZeRO has stages 0 to 3"),
    ({"zero_stage": -1}, r"zero_stage"),
    ({"activation_checkpoint_interval": -2}, r"activation_checkpoint_interval"),
    ({"deepspeed_config": [("gradient_clipping", 0.0)]}, r"deepspeed_config must be a dict"),
    ({"deepspeed_config": {"x": object()}}, r"plain JSON data"),
    ({"strict": "yes"}, r"strict must be True or False"),
])
def test_bad_config_fields_are_explained(fields, message):
    with pytest.raises((ValueError, TypeError), match=message):
        JobSpec(**fields).check()


def test_the_generated_config_carries_the_fields_and_merges_extra_keys():
    spec = JobSpec(precision="bf16", zero_stage=1, data_parallel=2,
                   deepspeed_config={"gradient_clipping": 0.0, "optimizer": {"params": {"lr": 1e-4}}})
    config = deepspeed_config(spec)
    assert config["bf16"] == {"enabled": True} and "fp16" not in config
    assert config["zero_optimization"] == {"stage": 1}
    assert config["gradient_clipping"] == 0.0
    # a section is merged key by key: the learning rate changes, the optimizer type stays
    assert config["optimizer"]["params"]["lr"] == 1e-4 and config["optimizer"]["type"] == "Adam"
    assert config["train_batch_size"] == spec.global_batch
    assert "zero_optimization" not in deepspeed_config(JobSpec())
    # the fields survive the run directory's JSON record
    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec


def test_lint_errors_stop_the_job_before_any_process_starts():
    with pytest.raises(ValueError, match=r"(?s)zero_optimization.*pipeline.*strict=False"):
        plan_job(JobSpec(zero_stage=2, device="cpu"))
    with pytest.raises(ValueError, match=r"train_batch_size"):
        plan_job(JobSpec(device="cpu", deepspeed_config={"train_batch_size": 7}))
    with pytest.raises(ValueError, match=r"fp16.*precision='bf16'"):
        plan_job(JobSpec(precision="fp16", device="cpu"))


def test_strict_false_launches_with_the_errors_as_notes():
    plan = plan_job(JobSpec(zero_stage=2, device="cpu", strict=False))
    assert any("[error]" in note and "zero_optimization" in note for note in plan.notes)


def test_lint_warnings_become_notes():
    plan = plan_job(JobSpec(device="cpu", deepspeed_config={"gradient_acumulation_steps": 4}))
    assert any("gradient_acumulation_steps" in note and "gradient_accumulation_steps" in note
               for note in plan.notes)
    assert not any(note.startswith("config") for note in plan_job(JobSpec(device="cpu")).notes)
