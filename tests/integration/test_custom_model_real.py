"""A learner's own model, defined in this file and imported by the ranks from a folder of its
own, as a real job: profiled, partitioned by the profile, re-partitioned live, on both
runtimes, with the losses of the sequential reference."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from utils import JobSpec, find_run, run_job
from utils.system.procs import job_processes
from utils.workloads.reference import train_sequential

pytestmark = pytest.mark.integration

MODULE = '''
import torch
from torch import nn
from deepspeed.pipe import LayerSpec

import utils


class Gated(nn.Module):
    """A residual block whose cost grows with `wide`: uneven stages to balance."""

    def __init__(self, width, wide=1):
        super().__init__()
        self.up, self.down = nn.Linear(width, width * wide), nn.Linear(width * wide, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


def build(width=32, wide=(1, 1, 8, 8, 1, 1)):
    def make_batch(generator, batch):
        x = torch.randn(batch, width, generator=generator)
        return x, torch.sin(x.roll(1, dims=1))

    def loss(outputs, targets):  # small on purpose: no step's gradient norm reaches DeepSpeed's clipping (1.0)
        return 0.01 * nn.functional.mse_loss(outputs, targets)

    return utils.ModelDef(layers=[*[LayerSpec(Gated, width, w) for w in wide], lambda x: x.clamp(-10, 10)],
                          loss_fn=loss, make_batch=make_batch)
'''


@pytest.fixture(scope="module")
def learner_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner")
    (folder / "my_gated_model.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    sys.path.insert(0, str(folder))  # the notebook can import it; the ranks learn the folder from the plan
    yield "my_gated_model:build"
    sys.path.remove(str(folder))
    sys.modules.pop("my_gated_model", None)


def test_a_learners_model_is_profiled_partitioned_moved_and_trains_like_the_sequential_model(runs_root, learner_model):
    spec = JobSpec(model=learner_model, num_stages=2, micro_batches=4, micro_batch_size=8, steps=4, device="cpu",
                   partition="profile", repartition_at={2: [0, 2, 7]}, timeout=240)
    run = run_job(spec, progress=False)
    assert run.ok and job_processes(run.path) == []
    assert run.partition_method == "profile" and len(run.parts) == 3
    assert run.partition_history == [(0, run.parts_at(0)), (2, [0, 2, 7])]
    expected = train_sequential(spec)
    assert expected == pytest.approx(train_sequential(spec, clip="global"))  # nothing clipped: one reference
    assert run.losses == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert run.losses[-1] < run.losses[0]
    assert run.timeline.steps == list(range(4))
    # find_run reuses the run only while the model's code is the same: the source digest is in its plan
    assert find_run(spec).path == run.path
    module_file = Path(sys.modules["my_gated_model"].__file__)
    module_file.write_text(module_file.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert find_run(spec) is None


def test_a_learners_model_runs_on_torchs_runtime_too(runs_root, learner_model):
    spec = JobSpec(model=learner_model, schedule="zbv", num_stages=2, micro_batches=4, micro_batch_size=8,
                   steps=3, device="cpu", partition="uniform", timeout=240)
    run = run_job(spec, progress=False)
    assert run.ok and run.timeline.meta["runtime"] == "torch" and len(run.parts) == 5
    assert run.losses == pytest.approx(train_sequential(spec, clip="global"), rel=1e-5, abs=1e-7)
    for rank in range(2):
        assert run.actions(rank, 1) == [str(a) for a in run.schedule.actions[rank]]


def test_the_rebalancing_policy_moves_a_learners_model(runs_root, learner_model):
    """The dynamic half on a model the workbook did not write: the job measures each of its
    layers, the policy decides, the job moves, and it still trains exactly like the sequential
    model (the live migration carries weights and optimizer state)."""
    from utils import Rebalance

    spec = JobSpec(model=learner_model, num_stages=2, micro_batches=4, micro_batch_size=8, steps=8, device="cpu",
                   partition=[0, 1, 7], rebalance=Rebalance(every=2, window=2, min_gain=0.05, payback=0.02),
                   timeout=240)
    run = run_job(spec, progress=False)
    decisions = run.rebalance_decisions
    assert [d.step for d in decisions] == [2, 4, 6] and run.layer_costs
    # all seven layers timed: the clamp function runs as a FunctionLayer module (utils.workloads.custom)
    assert all(len(layers) == 7 for layers in run.layer_costs.values())
    moved = [d for d in decisions if d.migrate]
    assert moved, [d.reason for d in decisions]
    # timing-claim: construction — the policy migrates only when its predicted step is at least min_gain below
    # the measured one (utils.planning.rebalance), so a move it made was predicted faster by its own rule
    assert moved[0].predicted_step_seconds < moved[0].measured_step_seconds
    assert run.partition_history[1] == (moved[0].step, list(moved[0].candidate))
    assert run.losses == pytest.approx(train_sequential(spec), rel=1e-5, abs=1e-7)


def test_autotune_and_the_micro_batch_policy_work_on_a_learners_model(runs_root, learner_model):
    """The tuner profiles, calibrates on and confirms a learner's model (its confirmed run
    trains like the sequential model of its own configuration); the micro-batch policy looks at
    the measured costs of that model and whatever count it picks, the losses stay the static
    job's (the same 32 samples per step, a per-sample mean loss)."""
    from utils import MicroBatchPolicy, autotune

    spec = JobSpec(model=learner_model, num_stages=2, micro_batches=4, micro_batch_size=8, steps=2, device="cpu",
                   timeout=240)
    tuning = autotune(spec, schedules=("1f1b",), confirm=1, steps=2)
    assert tuning.baseline.run.ok and tuning.baseline.run.spec.model == learner_model
    assert tuning.candidates and all(c.num_stages == 2 for c in tuning.candidates)
    for confirmed in tuning.confirmed:
        run = confirmed.run
        assert run.ok and run.spec.model == learner_model and run.spec.global_batch == spec.global_batch
        assert run.losses == pytest.approx(train_sequential(run.spec), rel=1e-5, abs=1e-7)
    print(tuning)  # measured step times and prediction errors: observations

    fields = dict(num_stages=2, micro_batches=4, micro_batch_size=8, steps=5, device="cpu", timeout=240)
    static = JobSpec(model=learner_model, **fields, name="learner-static")
    policy = JobSpec(model=learner_model, **fields, name="learner-policy",
                     micro_batch_policy=MicroBatchPolicy(memory_samples=32, every=2, min_gain=0.0, overhead_samples=4.0))
    run = run_job(policy, progress=False)
    decisions = run.micro_batch_decisions
    assert run.ok and [d.step for d in decisions] == [2, 4]
    for d in decisions:  # each look picks the fastest count of its own predictions (min_gain=0)
        assert d.chosen == min(d.predicted, key=lambda m: (d.predicted[m], m)), (d.step, d.predicted, d.reason)
    print("micro-batch counts chosen:", [(d.step, d.current, d.chosen) for d in decisions])
    assert run.losses == pytest.approx(train_sequential(static), rel=1e-5, abs=1e-7)
