"""Issue 17 on real jobs: PP × DP records per replica, the memory meter per schedule and with
activation checkpointing, bf16, and DeepSpeed's own error when a linted config is forced."""

import pytest

from utils import JobFailed, JobSpec, compute_metrics, rank_grid, run_job

pytestmark = pytest.mark.integration

# 2 stages of the default gpt (embedding, 6 blocks, head): small enough for 2 cores.
BASE = {"num_stages": 2, "micro_batches": 8, "steps": 3, "device": "cpu", "model_options": {"blocks": 6}}


@pytest.fixture(scope="module")
def memory_runs(runs_root):
    return {name: run_job(JobSpec(**BASE, **fields), progress=False) for name, fields in {
        "1f1b": {}, "gpipe": {"schedule": "gpipe"}, "1f1b-ckpt": {"activation_checkpoint_interval": 1}}.items()}


def test_pp_x_dp_records_every_replica(runs_root):
    run = run_job(JobSpec(**{**BASE, "micro_batches": 4, "steps": 2}, data_parallel=2, zero_stage=1),
                  progress=False)
    grid = rank_grid(2, 2)
    assert run.ok and sorted(run.results) == [0, 1, 2, 3]
    for rank, (stage, replica) in grid.coords.items():
        assert (run.results[rank]["stage"], run.results[rank]["replica"]) == (stage, replica)
        assert len(run.memory[rank]) == 2  # the memory record of every rank
    tl = run.timeline
    assert tl.data_parallel == 2 and sorted({e.rank for e in tl.events}) == [0, 1, 2, 3]
    for rank in range(4):  # every replica runs every micro-batch of its stage, then all-reduces
        forwards = sorted(e.micro_batch for e in tl.events if e.rank == rank and e.step == 1 and e.kind == "forward")
        assert forwards == [0, 1, 2, 3]
        assert [e.kind for e in tl.events if e.rank == rank and e.step == 1][-2:] == ["reduce_grads", "optimizer_step"]
    # timing-claim: construction — 2 stages: the second waits for the first's first forward (idle > 0)
    # and both compute (busy > 0), at any machine speed
    assert 0 < compute_metrics(tl, step=1).bubble_ratio < 1


def test_gpipe_holds_more_than_1f1b_and_checkpointing_holds_less(memory_runs):
    added = {name: run.step_memory for name, run in memory_runs.items()}
    assert all(len(a) == 2 and all(v > 0 for v in a.values()) for a in added.values())
    # GPipe keeps all 8 micro-batches' activations; 1F1B at most 2 on stage 0, 1 on stage 1
    assert added["gpipe"][0] > 1.8 * added["1f1b"][0] and added["gpipe"][1] > 2.5 * added["1f1b"][1]
    # keeping only each layer's input (interval 1) holds less on both stages
    assert added["1f1b-ckpt"][0] < 0.7 * added["1f1b"][0] and added["1f1b-ckpt"][1] < added["1f1b"][1]
    # the same training: checkpointing recomputes the forward with the same seeds
    assert memory_runs["1f1b-ckpt"].losses == pytest.approx(memory_runs["1f1b"].losses, rel=1e-5)


def test_the_memory_curve_climbs_through_gpipes_forwards(memory_runs):
    curve = memory_runs["gpipe"].memory_trace(2)[0]  # rank 0 = stage 0
    times = [t for t, _ in curve]
    # timing-claim: construction — one rank's curve: its instructions run one after another, so their
    # ends come in order, and the curve starts at the step's own base
    assert times == sorted(times) and curve[0][1] == 0
    peak = max(b for _, b in curve)
    first_backward = next(e.end for e in memory_runs["gpipe"].timeline.events
                          if e.rank == 0 and e.step == 2 and e.kind == "backward")
    # the forwards build the peak up (the first backward adds only its gradient buffers), the
    # backwards release it, and the step ends near where it began
    assert max(b for t, b in curve if t < first_backward) > 0.95 * peak
    assert curve[-1][1] < 0.1 * peak


def test_bf16_trains_like_fp32(runs_root, memory_runs):
    run = run_job(JobSpec(**BASE, precision="bf16"), progress=False)
    assert run.ok
    assert run.losses == pytest.approx(memory_runs["1f1b"].losses, rel=0.05)


def test_a_forced_zero2_fails_with_deepspeeds_own_assertion(runs_root):
    spec = JobSpec(**{**BASE, "steps": 1}, zero_stage=2, strict=False)
    with pytest.raises(JobFailed, match="ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"):
        run_job(spec, progress=False)
