"""Real multi-process DeepSpeed pipeline jobs (CPU, gloo): timelines and correctness."""

import sys

import pytest
from deepspeed.runtime.pipe.schedule import BackwardPass, ForwardPass, TrainSchedule

from tests.helpers import SMALL_GPT
from utils import JobSpec, run_job, start_job
from utils.jobs.launchers import TORCHRUN_MODULE, WARM_AGENT_MODULE
from utils.runtime.warm_agent import BANNER
from utils.system.private_apis import WARM_START_ENV
from utils.workloads.reference import train_sequential
from utils.timeline import COMM_KINDS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def four_stage(runs_root):
    """The job the README promises works on any machine."""
    return run_job(JobSpec(num_stages=4, micro_batches=8, steps=3), progress=False)


def test_job_succeeds_and_records_everything(four_stage):
    run = four_stage
    assert run.ok and len(run.losses) == 3 and len(run.step_times) == 3
    assert run.parts[0] == 0 and run.parts[-1] == 8 and len(run.parts) == 5
    assert sorted(run.peak_memory) == [0, 1, 2, 3] and all(v > 0 for v in run.peak_memory.values())
    # The venv's own interpreter runs torchrun's module: works as pasted, venv activated or not.
    assert (f"{sys.executable} -m torch.distributed.run --standalone --local-addr=127.0.0.1 --nproc-per-node=4 "
            "-m utils.runtime.rank") in run.command
    assert run.timeline.steps == [0, 1, 2]


def test_every_stage_runs_forward_and_backward_once_per_micro_batch(four_stage):
    tl = four_stage.timeline
    for step in tl.steps:
        for stage in range(4):
            for kind in ("forward", "backward"):
                mbs = sorted(e.micro_batch for e in tl.select(step=step, stage=stage, kinds=[kind]))
                assert mbs == list(range(8)), (step, stage, kind)
            per_step = [e.kind for e in tl.select(step=step, stage=stage)
                        if e.kind in ("reduce_grads", "optimizer_step")]
            assert per_step == ["reduce_grads", "optimizer_step"]


def test_dependencies_hold_across_processes(four_stage):
    """F(s, m) starts after F(s-1, m) ends; B(s, m) after B(s+1, m): a common clock."""
    tl = four_stage.timeline
    for step in tl.steps:
        f = {(e.stage, e.micro_batch): e for e in tl.select(step=step, kinds=["forward"])}
        b = {(e.stage, e.micro_batch): e for e in tl.select(step=step, kinds=["backward"])}
        for mb in range(8):
            for s in range(1, 4):
                assert f[s, mb].start >= f[s - 1, mb].end, (step, s, mb)
                assert b[s - 1, mb].start >= b[s, mb].end, (step, s, mb)
            assert b[3, mb].start >= f[3, mb].end


def test_micro_batch_ids_match_deepspeed_train_schedule(four_stage):
    tl = four_stage.timeline
    for stage in range(4):
        expected = []
        schedule = TrainSchedule(micro_batches=8, stages=4, stage_id=stage)
        for step_id, cmds in enumerate(schedule.steps()):
            for cmd in cmds:
                if isinstance(cmd, (ForwardPass, BackwardPass)):
                    mb, is_forward = schedule._step_to_micro_batch(step_id)
                    expected.append(f"{'F' if is_forward else 'B'}{mb}")
        assert tl.compute_order(stage, 1) == expected


def test_communication_is_traced_per_micro_batch(four_stage):
    tl = four_stage.timeline
    for stage in range(4):
        counts = {k: len(tl.select(step=1, stage=stage, kinds=[k])) for k in COMM_KINDS}
        assert counts["send_act"] == (8 if stage < 3 else 0)
        assert counts["recv_act"] == (8 if stage > 0 else 0)
        assert counts["send_grad"] == (8 if stage > 0 else 0)
        assert counts["recv_grad"] == (8 if stage < 3 else 0)
        loads = len(tl.select(step=1, stage=stage, kinds=["load"]))
        assert loads == (8 if stage in (0, 3) else 0)


def test_chrome_trace_has_one_row_per_stage(four_stage, tmp_path):
    import json

    trace = json.loads(four_stage.timeline.to_chrome_trace(tmp_path / "t.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {f"stage {s}" for s in range(4)}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(four_stage.timeline.events) and all(e["dur"] >= 0 for e in spans)


@pytest.mark.parametrize("stages, schedule, partition", [
    (1, "1f1b", "parameters"),
    (2, "1f1b", "parameters"),
    (2, "gpipe", "parameters"),
    (4, "1f1b", [0, 1, 2, 3, 4]),
    (4, "gpipe", "uniform"),
])
def test_losses_equal_a_sequential_model(runs_root, stages, schedule, partition):
    spec = JobSpec(**SMALL_GPT, num_stages=stages, micro_batches=4, steps=3, schedule=schedule,
                   partition=partition)
    run = run_job(spec, progress=False)
    expected = train_sequential(spec)
    assert run.losses == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert run.losses[-1] < run.losses[0]  # it trains
    if not isinstance(partition, str):
        assert run.parts == partition
        layers = {data["stage"]: data["layers"] for data in run.results.values()}
        assert layers == {s: [partition[s], partition[s + 1]] for s in range(stages)}


def test_gpipe_and_1f1b_are_bit_identical_and_order_differently(runs_root):
    common = dict(**SMALL_GPT, num_stages=2, micro_batches=4, steps=2)
    # Two jobs at once: separate ports and directories, no collision.
    jobs = [start_job(JobSpec(**common, schedule=s)) for s in ("gpipe", "1f1b")]
    gpipe, one_f_one_b = (job.wait() for job in jobs)
    assert gpipe.path != one_f_one_b.path
    assert gpipe.losses == one_f_one_b.losses
    assert gpipe.timeline.compute_order(0, 1) == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
    assert one_f_one_b.timeline.compute_order(0, 1) == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]


def test_torchruns_own_command_and_the_warm_agent_run_the_same_job(runs_root, monkeypatch):
    """A CPU job's ranks start through `utils.runtime.warm_agent`; with ``WORKBOOK_WARM_START=0``
    torchrun's own command (what command.txt holds and a GPU node runs) starts the same job
    with the same result."""
    spec = JobSpec(**SMALL_GPT, num_stages=2, micro_batches=2, steps=2)
    monkeypatch.delenv(WARM_START_ENV, raising=False)
    warm_job = start_job(spec)
    warm = warm_job.wait()
    monkeypatch.setenv(WARM_START_ENV, "0")
    plain_job = start_job(spec)
    plain = plain_job.wait()
    assert warm_job.launcher.agents[0].args[1:3] == ["-m", WARM_AGENT_MODULE]  # what was really run
    assert plain_job.launcher.agents[0].args[1:3] == ["-m", TORCHRUN_MODULE]
    assert warm.ok and plain.ok
    assert not [n for n in (*warm.notes, *plain.notes) if "torchrun's own command" in n]  # no fallback note
    assert warm.losses == plain.losses == pytest.approx(train_sequential(spec), rel=1e-5, abs=1e-6)
    assert warm.command.replace(warm.name, "") == plain.command.replace(plain.name, "")
    assert (warm.path / "launcher.log").read_text().splitlines()[0] == BANNER
    assert BANNER not in (plain.path / "launcher.log").read_text()
