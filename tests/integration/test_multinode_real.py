"""Issue 19 on real jobs: two torchrun agents on loopback addresses are two nodes (c10d
rendezvous, ranks numbered across them), DeepSpeed's runner with a one-host hostfile, the
prepared per-node commands and the SLURM script run by hand, and a node that is lost or never
joins ends the job with an error naming it and no process left."""

from __future__ import annotations

import os
import stat
import subprocess
import time

import psutil
import pytest

from utils import (JobFailed, JobSpec, Run, TorchrunNodes, boundary_links, plot_timeline, prepare_job, run_job,
                   start_job)
from utils.system.procs import end_process_tree

pytestmark = pytest.mark.integration

LOOPBACK = ["127.0.0.1", "127.0.0.2"]
# 4 stages of a small gpt: stages 0-1 on node 0, 2-3 on node 1, so the cut 1|2 crosses nodes.
BASE = {"num_stages": 4, "micro_batches": 4, "steps": 3, "device": "cpu", "model_options": {"blocks": 4},
        "timeout": 240}


@pytest.fixture(scope="module")
def single(runs_root):
    return run_job(JobSpec(**BASE, name="one-node"), progress=False)


def _job_processes(path) -> list[psutil.Process]:
    """Live processes anywhere on this machine whose command line names the run directory."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(path) in " ".join(proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def test_two_loopback_nodes_train_like_one_machine(single):
    run = run_job(JobSpec(**BASE, hosts=LOOPBACK, name="two-nodes"), progress=False)
    assert run.ok and run.losses == pytest.approx(single.losses, rel=1e-6)
    assert {r: (p["node"], p["host"]) for r, p in run.placement.items()} == {
        0: (0, "127.0.0.1"), 1: (0, "127.0.0.1"), 2: (1, "127.0.0.2"), 3: (1, "127.0.0.2")}
    assert sorted({e.rank for e in run.timeline.events}) == [0, 1, 2, 3]
    assert (run.path / "launcher-node0.log").exists() and (run.path / "launcher-node1.log").exists()
    assert "--nnodes=2" in run.command and "--rdzv-backend=c10d" in run.command
    links = boundary_links(run.timeline)
    assert [link.cross_node for link in links] == [False, True, False]
    # timing-claim: construction — medians of real transfers' durations: moving bytes takes a positive
    # time however fast or slow the machine; no two measurements are compared
    assert all(link.activation_s is not None and link.activation_s > 0 for link in links)
    rows = plot_timeline(run.timeline).layout.yaxis.categoryarray
    assert "stage 2 · node 1" in rows and "stage 1 · node 0" in rows


def test_deepspeeds_runner_with_a_one_host_hostfile(single):
    run = run_job(JobSpec(**BASE, launcher="deepspeed", name="ds-runner"), progress=False)
    assert run.ok and run.losses == pytest.approx(single.losses, rel=1e-6)
    assert "deepspeed.launcher.runner" in run.command and "--hostfile=" in run.command
    assert (run.path / "hostfile").read_text() == "localhost slots=4\n"
    assert "deepspeed.launcher.launch" in (run.path / "launcher.log").read_text()  # DeepSpeed's own launch.py ran


def _own_tmp(tmp_path) -> dict[str, str]:
    """The environment of a command run by hand, with torchrun's ``torchelastic_*`` folders in
    the test's own temporary directory (the launcher puts them in the run directory; by hand
    they would go to the system's, which test_launcher_faults checks stays clean)."""
    return {**os.environ, "TMPDIR": str(tmp_path)}


def test_prepared_per_node_commands_run_by_hand(single, tmp_path):
    prepared = prepare_job(JobSpec(**BASE, hosts=LOOPBACK, name="by-hand"))
    agents = [subprocess.Popen(["bash", "-c", c], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                               env=_own_tmp(tmp_path)) for c in prepared.per_node]
    assert [a.wait(timeout=240) for a in agents] == [0, 0]
    run = Run.load(prepared.path)  # recorded into the prepared directory, read as its ranks wrote
    assert run.state == "succeeded" and run.losses == pytest.approx(single.losses, rel=1e-6)
    assert run.nodes == {0: 0, 1: 0, 2: 1, 3: 1}


def test_the_slurm_script_runs_under_a_stand_in_srun(single, tmp_path):
    # srun and scontrol stand-ins: one task per node of a 2-node "allocation" on this machine.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    (bin_dir / "srun").write_text(
        "#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\npids=()\n"
        "for i in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$i \"$@\" & pids+=($!); done\n"
        "rc=0; for p in \"${pids[@]}\"; do wait $p || rc=$?; done; exit $rc\n")
    for tool in bin_dir.iterdir():
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    prepared = prepare_job(JobSpec(**BASE, hosts=LOOPBACK, name="slurm"))
    env = {**_own_tmp(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "stand-in[1-2]", "SLURM_JOB_ID": "4242"}
    done = subprocess.run(["bash", str(prepared.path / "job.slurm")], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = Run.load(prepared.path)
    assert run.state == "succeeded" and run.losses == pytest.approx(single.losses, rel=1e-6)
    assert sorted(run.nodes.values()) == [0, 0, 1, 1]


def test_a_node_that_never_joins_is_named_within_the_join_timeout(runs_root):
    spec = JobSpec(**BASE, hosts=LOOPBACK, join_timeout=8, name="never-joins")
    t0 = time.monotonic()
    job = start_job(spec, launcher=TorchrunNodes(start_nodes=[0]))  # node 1's command is never run
    assert any("node 1 (127.0.0.2) is not started from here" in note for note in job.notes)
    with pytest.raises(JobFailed) as failed:
        job.wait()
    elapsed = time.monotonic() - t0
    print(f"the missing node was reported {elapsed:.1f} s after the start (join_timeout 8 s)")
    # timing-claim: margin — node 0's start-up plus join_timeout=8 s plus the ending: 34 s measured with
    # other jobs sharing the 2 cores (the former 38 s bound nearly failed); 180 s leaves room for a
    # start-up 3x slower on shared cores and stays under the job's timeout=240 s, which would end the
    # job if the join timeout did not (the message asserted below names the join timeout too)
    assert elapsed < 180
    message = str(failed.value)
    assert "node 1 (127.0.0.2) never joined" in message and "Node(s) [0] waited join_timeout=8 s" in message
    assert not _job_processes(job.path)


def test_a_node_lost_mid_run_is_named_and_nothing_is_left(runs_root):
    job = start_job(JobSpec(**{**BASE, "steps": 40}, hosts=LOOPBACK, name="node-lost"))
    while len(job.progress()) < 1 and job.poll() == "running":
        time.sleep(0.2)
    job.launcher.kill_node(1)
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as failed:
        job.wait()
    elapsed = time.monotonic() - t0
    print(f"the lost node was reported {elapsed:.1f} s after it was killed")
    # timing-claim: margin — the launcher notices the dead agent and ends the other node: 2.8 s measured
    # on shared cores; 120 s is 40x that, ample 3x slower and oversubscribed, and half the job's
    # timeout=240 s that would end it if the loss went unnoticed
    assert elapsed < 120
    message = str(failed.value)
    assert "node 1 (127.0.0.2) was lost during the run" in message and "SIGKILL" in message
    assert "ranks [2, 3]" in message
    assert not _job_processes(job.path)


def test_a_node_started_by_hand_ends_when_the_other_node_is_lost(runs_root, tmp_path):
    # Node 1 runs its printed command in a process this notebook did not start (as on another
    # machine); when node 0 is lost, node 1's ranks lose their peers and its agent exits too.
    launcher = TorchrunNodes(start_nodes=[0])
    job = start_job(JobSpec(**{**BASE, "steps": 40}, hosts=LOOPBACK, name="by-hand-node"), launcher=launcher)
    command = next(n for n in job.notes if "node 1 (127.0.0.2) is not started from here" in n).split(" s: ", 1)[1]
    other = subprocess.Popen(["bash", "-c", command], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                             start_new_session=True, env=_own_tmp(tmp_path))
    try:
        while len(job.progress()) < 1 and job.poll() == "running":
            time.sleep(0.2)
        assert job.run_dir.placement(2)["host"] == "127.0.0.2"  # node 1's ranks record into this run
        launcher.kill_node(0)
        with pytest.raises(JobFailed, match=r"node 0 \(127.0.0.1\) was lost during the run"):
            job.wait()
        assert other.wait(timeout=60) != 0
    finally:
        end_process_tree(other.pid, grace=0)  # only if the assertions failed is anything left
    assert not _job_processes(job.path)
