"""The commands that run a job outside the notebook, checked against the tools that run them:
DeepSpeed's own runner builds the same per-node launch for a 2-host hostfile as the per-node
commands do, the SLURM script is valid bash whose torchrun line torchrun's parser accepts, and
a prepared run reads back as what its ranks wrote."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

import pytest
from torch.distributed.run import get_args_parser

from utils import JobSpec, Run, plan_job, prepare_job
from utils.jobs.multinode import DeepSpeedRunner
from utils.jobs.records import RankResult
from utils.jobs.rundir import RUN_TOKEN_ENV, RunDir
from utils.system.paths import PROJECT_ROOT


@pytest.fixture
def two_hosts(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("node-a slots=2\nnode-b slots=2\n")
    return JobSpec(num_stages=4, hostfile=str(path), launcher="deepspeed", name="two-hosts")


def _deepspeed_builds(argv: list[str], monkeypatch) -> list[str]:
    """The command DeepSpeed's runner (``deepspeed.launcher.runner.main``) would start for
    `argv` (our argv after ``-m deepspeed.launcher.runner``), captured instead of started;
    pdsh is taken as installed and ssh as working, as on a cluster."""
    from deepspeed.launcher import multinode_runner, runner

    started = []

    class Captured:
        returncode = 0

        def __init__(self, cmd, env=None):
            started.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", Captured)
    monkeypatch.setattr(runner.subprocess, "check_call", lambda *a, **k: 0)  # the ssh check
    monkeypatch.setattr(multinode_runner.PDSHRunner, "backend_exists", lambda self: True)
    # The pdsh path installs SIGINT/SIGTERM handlers that kill the started command: kept out
    # of this process, where they would outlive the test and meet a later Ctrl-C.
    monkeypatch.setattr(runner.signal, "signal", lambda signum, handler: None)
    monkeypatch.chdir(PROJECT_ROOT)  # the pdsh command cds to the runner's working directory
    runner.main(argv)
    return started[0]


def _launch_args(cmd: list[str]) -> dict[str, str]:
    """``--key=value`` and flags of a ``deepspeed.launcher.launch`` invocation, and its program."""
    launch = cmd[cmd.index("deepspeed.launcher.launch") + 1:]
    options = {a.split("=", 1)[0]: a.partition("=")[2] for a in launch if a.startswith("--")}
    options.pop("--log_level", None)  # the runner adds its logging level on the local path only
    options.pop("--enable_each_rank_log", None)
    return {**options, "program": [a for a in launch if not a.startswith("--")]}


def test_running_deepspeeds_runner_here_leaves_the_signal_handlers_alone(two_hosts, tmp_path, monkeypatch):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    plan = plan_job(two_hosts)
    launcher, run_dir = DeepSpeedRunner(), RunDir(tmp_path)
    launcher.write_hostfile(plan, run_dir)
    with monkeypatch.context() as patch:
        _deepspeed_builds(launcher.argv(plan, run_dir)[3:], patch)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_per_node_commands_start_what_deepspeeds_multinode_runner_starts(two_hosts, tmp_path, monkeypatch):
    plan = plan_job(two_hosts)
    launcher, run_dir = DeepSpeedRunner(), RunDir(tmp_path)
    launcher.write_hostfile(plan, run_dir)
    # What DeepSpeed's runner starts on every host through pdsh (%n: pdsh's node number) ...
    pdsh = _deepspeed_builds(launcher.argv(plan, run_dir)[3:], monkeypatch)
    assert pdsh[:6] == ["pdsh", "-S", "-f", "1024", "-w", "node-a,node-b"]
    via_pdsh = _launch_args(pdsh)
    assert via_pdsh["--node_rank"] == "%n"
    # ... and what each node's own command (--no_ssh --node_rank=i) starts there.
    for node in plan.nodes:
        own = _launch_args(_deepspeed_builds(launcher.argv(plan, run_dir, node=node)[3:], monkeypatch))
        assert own == {**via_pdsh, "--node_rank": str(node.index)}
    assert via_pdsh["program"] == ["utils.runtime.rank", str(tmp_path)]
    assert "--no_local_rank" in via_pdsh and "--module" in via_pdsh


def test_a_multi_host_deepspeed_job_needs_pdsh_before_anything_starts(two_hosts, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="through pdsh, which is not installed"):
        DeepSpeedRunner().check(plan_job(two_hosts))


def test_prepared_commands_carry_the_token_and_the_slurm_script_is_valid(tmp_path):
    prepared = prepare_job(JobSpec(num_stages=4, hosts=["127.0.0.1", "127.0.0.2"], name="prep"), directory=tmp_path)
    token = (prepared.path / RunDir.LAUNCH_TOKEN).read_text()
    assert len(prepared.per_node) == 2 and all(f"{RUN_TOKEN_ENV}={token}" in c for c in prepared.per_node)
    assert (prepared.path / "spec.json").exists() and (prepared.path / "plan.json").exists()
    assert str(prepared.path) in str(prepared) and "sbatch" in str(prepared)
    script = prepared.path / "job.slurm"
    assert script.read_text() == prepared.slurm
    subprocess.run(["bash", "-n", str(script)], check=True)  # valid bash
    assert "#SBATCH --nodes=2" in prepared.slurm and "#SBATCH --ntasks-per-node=1" in prepared.slurm
    srun = next(line for line in prepared.slurm.splitlines() if line.startswith("srun "))
    argv = shlex.split(srun.replace("$head_node", "node-a").replace("$SLURM_JOB_ID", "42"))
    args = get_args_parser().parse_args(argv[argv.index("torch.distributed.run") + 1:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_endpoint, args.rdzv_id) == ("2", "2", "node-a:"
                                                                                   + args.rdzv_endpoint[7:], "42")
    assert args.training_script_args == [str(prepared.path)] and argv[argv.index("-m") - 1] == sys.executable
    assert f'export PATH={os.path.dirname(sys.executable)}:"$PATH"' in prepared.slurm.splitlines()  # the jobs' ninja


def test_a_one_node_job_has_one_command(tmp_path):
    prepared = prepare_job(JobSpec(num_stages=2, name="one"), directory=tmp_path)
    assert len(prepared.per_node) == 1 and "--standalone" in prepared.per_node[0] and prepared.runner is None


def test_a_run_nobody_watched_reads_as_its_ranks_wrote(tmp_path):
    prepared = prepare_job(JobSpec(num_stages=2, name="by-hand"), directory=tmp_path)
    run_dir = RunDir(prepared.path)
    assert Run.load(prepared.path).state == "incomplete"  # nothing ran yet (or it still runs)
    run_dir.write_result(RankResult(rank=0, stage=0))
    assert Run.load(prepared.path).state == "incomplete"
    run_dir.write_result(RankResult(rank=1, stage=1))
    assert Run.load(prepared.path).state == "succeeded"
    run_dir.write_error(1, {"rank": 1, "message": "boom"})
    assert Run.load(prepared.path).state == "failed"
