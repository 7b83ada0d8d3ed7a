"""`plan_job`: device, boundaries, profile and DeepSpeed config decided once, before launch."""

import pytest
import torch

from utils import JobSpec, deepspeed_config, get_model, plan_job
from utils.system.devices import resolve_device


def test_deepspeed_config_uses_real_keys_only():
    spec = JobSpec(num_stages=4, micro_batches=8, micro_batch_size=2, data_parallel=2)
    config = deepspeed_config(spec)
    assert config["train_batch_size"] == 2 * 8 * 2 == spec.global_batch
    assert config["gradient_accumulation_steps"] == 8
    assert "pipeline" not in config and "pipe_parallel_size" not in config
    assert spec.world_size == 8


def test_boundaries_follow_deepspeed_methods():
    plan = plan_job(JobSpec(num_stages=2, device="cpu"))  # gpt: embedding, 6 blocks, head
    assert plan.boundaries == (0, 4, 8) and plan.method == "parameters"
    # Parameter balance puts the parameter-heavy but cheap embedding with three blocks.
    params = get_model("gpt").param_counts()
    assert params[0] > 4 * params[1] and params[-1] > 4 * params[1]
    assert plan_job(JobSpec(num_stages=4, partition="uniform", device="cpu")).boundaries == (0, 2, 4, 6, 8)
    explicit = plan_job(JobSpec(num_stages=2, partition=[0, 3, 8], device="cpu"))
    assert explicit.boundaries == (0, 3, 8) and explicit.method == "explicit"


def test_the_plan_record_is_what_ranks_and_runs_read():
    plan = plan_job(JobSpec(num_stages=2, device="cpu", model_options={"blocks": 2}))
    record = plan.to_record()
    assert record["device"] == "cpu" and record["threads"] == plan.threads >= 1
    assert record["partition"]["parts"] == list(plan.boundaries) == [0, 2, 4] and record["partition"]["method"] == "parameters"


def test_auto_needs_a_gpu_for_every_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto", ranks=1) == "cuda"
    # Before, "auto" meant CUDA whenever a GPU existed, and a 2-stage job on one GPU was refused.
    assert resolve_device("auto", ranks=2) == "cpu"
    plan = plan_job(JobSpec(num_stages=2))
    assert plan.device == "cpu" and any("2 ranks need as many GPUs, 1 are visible" in n for n in plan.notes)
    with pytest.raises(ValueError, match="needs 2 GPUs .* but 1 are visible; use fewer stages or device='cpu'"):
        plan_job(JobSpec(num_stages=2, device="cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", ranks=2) == "cuda"


def test_ranks_sharing_cores_are_noted(monkeypatch):
    import utils.jobs.plan as planning

    monkeypatch.setattr(planning.os, "sched_getaffinity", lambda pid: {0, 1})
    plan = plan_job(JobSpec(num_stages=4, device="cpu"))
    assert any("4 ranks share 2 CPU cores" in note for note in plan.notes)
    assert not plan_job(JobSpec(num_stages=2, device="cpu")).notes


def test_a_bad_spec_is_refused_by_the_plan():
    with pytest.raises(ValueError, match="num_stages=9 but model 'gpt' has only 8 layers"):
        plan_job(JobSpec(num_stages=9))


@pytest.mark.parametrize("preset", ["gpt", "mlp", "seed-case"])
def test_parameters_are_counted_on_uninitialised_meta_layers(preset):
    model = get_model(preset)
    built = [layer.build() for layer in model.layers]  # on the CPU, initialised
    meta = model.meta_layers()
    assert model.param_counts() == [sum(p.numel() for p in layer.parameters()) for layer in built]
    assert [[(n, p.shape) for n, p in layer.named_parameters()] for layer in meta] == \
        [[(n, p.shape) for n, p in layer.named_parameters()] for layer in built]
    assert {p.device.type for layer in meta for p in layer.parameters()} == {"meta"}


def test_planning_a_job_does_not_import_torchs_compiler():
    """Initialising a meta tensor imported torch._dynamo: 1.6 s in every kernel that planned a job."""
    import subprocess
    import sys

    script = ("import sys; import utils; utils.plan_job(utils.JobSpec(num_stages=2, device='cpu')); "
              "print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "False", done.stdout + done.stderr
