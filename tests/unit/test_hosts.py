"""Nodes without processes: DeepSpeed's hostfile format, the spec's placement checks, the node
order each launcher uses, the cross-node boundaries, and the per-node torchrun commands read
back with torchrun's own argument parser."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import psutil
import pytest
from torch.distributed.run import get_args_parser

from utils import JobSpec, parse_hostfile, plan_job
from utils.jobs.hosts import cross_node_boundaries, is_local_host, job_nodes
from utils.jobs.launchers import LocalTorchrun
from utils.jobs.multinode import DeepSpeedRunner, TorchrunNodes, launcher_for
from utils.jobs.rundir import RunDir

LOOPBACK = ["127.0.0.1", "127.0.0.2"]


def test_hostfile_lines_comments_and_blank_lines():
    text = "# two nodes\nnode-b slots=2\n\n  node-a slots=2   # the second\n"
    assert parse_hostfile(text) == [("node-b", 2), ("node-a", 2)]


@pytest.mark.parametrize("text, match", [
    ("node1\n", "line 1 .*'HOST slots=N'"),
    ("node1 slots=0\n", "N >= 1"),
    ("node1 gpus=2\n", "line 1"),
    ("a slots=1\na slots=2\n", "line 2 names host 'a' a second time"),
    ("# nothing\n\n", "lists no host"),
])
def test_a_bad_hostfile_names_the_line_and_the_format(text, match):
    with pytest.raises(ValueError, match=match):
        parse_hostfile(text)


def test_a_missing_hostfile_is_named(tmp_path):
    with pytest.raises(ValueError, match="cannot read hostfile .*nope"):
        JobSpec(num_stages=2, hostfile=str(tmp_path / "nope")).check()


@pytest.mark.parametrize("fields, match", [
    ({"hosts": LOOPBACK, "hostfile": "x"}, "either hosts"),
    ({"hosts": ["127.0.0.1", "127.0.0.1"]}, "name a host twice"),
    ({"hosts": ["a", "b", "c"]}, "do not split evenly over 3 hosts"),
    ({"hosts": "127.0.0.1"}, "list of host names"),
    ({"launcher": "mpirun"}, "unknown launcher"),
    ({"hosts": LOOPBACK, "join_timeout": 0}, "join_timeout"),
])
def test_placement_mistakes_are_refused_before_launch(fields, match):
    with pytest.raises((TypeError, ValueError), match=match):
        JobSpec(num_stages=2, data_parallel=2, **fields).check()


def test_hostfile_slots_must_add_up_and_torchrun_needs_equal_slots(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("a slots=3\nb slots=2\n")
    with pytest.raises(ValueError, match="offers 5 slots but the job has 4 ranks"):
        JobSpec(num_stages=4, hostfile=str(path)).check()
    path.write_text("a slots=3\nb slots=1\n")
    with pytest.raises(ValueError, match="same number of ranks on every node"):
        JobSpec(num_stages=4, hostfile=str(path)).check()
    JobSpec(num_stages=4, hostfile=str(path), launcher="deepspeed").check()  # DeepSpeed's runner allows it


def test_node_order_is_the_launchers_order(tmp_path):
    # torchrun's c10d rendezvous numbers agents by sorted --local-addr; DeepSpeed by hostfile line.
    path = tmp_path / "hostfile"
    path.write_text("node-b slots=2\nnode-a slots=2\n")
    by_torchrun = job_nodes(JobSpec(num_stages=4, hostfile=str(path)))
    by_deepspeed = job_nodes(JobSpec(num_stages=4, hostfile=str(path), launcher="deepspeed"))
    assert [(n.index, n.host, n.ranks) for n in by_torchrun] == [(0, "node-a", (0, 1)), (1, "node-b", (2, 3))]
    assert [(n.index, n.host, n.ranks) for n in by_deepspeed] == [(0, "node-b", (0, 1)), (1, "node-a", (2, 3))]
    assert job_nodes(JobSpec(num_stages=2))[0].host == "localhost"


def test_spec_with_hosts_round_trips_through_json():
    spec = JobSpec(num_stages=4, hosts=LOOPBACK, launcher="torchrun", join_timeout=20)
    assert spec.hosts == tuple(LOOPBACK)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert JobSpec(timeout=30, join_timeout=60).join_limit == 30  # never longer than the job


@pytest.mark.parametrize("stages, dp, hosts, crossing", [
    (4, 1, 2, [1]),        # stages 0-1 | 2-3
    (2, 2, 2, [0]),        # both replicas of stage 0 on node 0, of stage 1 on node 1
    (2, 2, 4, [0]),        # one rank per node: every replica crosses
    (4, 1, 1, []),
])
def test_cross_node_boundaries(stages, dp, hosts, crossing):
    spec = JobSpec(num_stages=stages, data_parallel=dp, hosts=[f"127.0.0.{i + 1}" for i in range(hosts)])
    assert cross_node_boundaries(job_nodes(spec), stages, dp) == crossing


def test_local_hosts():
    assert all(is_local_host(h) for h in ("localhost", "127.0.0.1", "127.0.0.2", socket.gethostname()))
    assert not is_local_host("node-that-does-not-exist.invalid")
    assert not is_local_host("10.254.253.252")


def test_launcher_for_each_kind_of_job():
    assert type(launcher_for(plan_job(JobSpec(num_stages=2)))) is LocalTorchrun
    assert type(launcher_for(plan_job(JobSpec(num_stages=2, hosts=LOOPBACK)))) is TorchrunNodes
    assert type(launcher_for(plan_job(JobSpec(num_stages=2, launcher="deepspeed")))) is DeepSpeedRunner


def test_every_node_runs_torchrun_with_the_same_rendezvous(tmp_path):
    plan = plan_job(JobSpec(num_stages=4, hosts=LOOPBACK, join_timeout=25))
    launcher, run_dir = TorchrunNodes(), RunDir(tmp_path)
    parsed = [get_args_parser().parse_args(launcher.node_argv(plan, run_dir, n)[3:]) for n in plan.nodes]
    for node, args in zip(plan.nodes, parsed):
        assert (args.nnodes, args.nproc_per_node, args.rdzv_backend) == ("2", "2", "c10d")
        assert args.rdzv_endpoint == f"127.0.0.1:{launcher.port}" and args.rdzv_id == launcher.rendezvous_id
        assert args.rdzv_conf == f"join_timeout=25,is_host={int(node.index == 0)}"
        assert args.local_addr == node.host and args.max_restarts == 0 and args.module
        assert args.training_script == "utils.runtime.rank" and args.training_script_args == [str(tmp_path)]


def test_torchrun_agents_start_only_on_this_machine():
    plan = plan_job(JobSpec(num_stages=2, hosts=["127.0.0.1", "node-x.invalid"]))
    with pytest.raises(ValueError, match=r"\['node-x.invalid'\] are not this machine.*utils.prepare_job\(spec\)"):
        TorchrunNodes().check(plan)
    TorchrunNodes(start_nodes=[0]).check(plan)  # node 1's command is run there by hand
    with pytest.raises(ValueError, match=r"start_nodes \[5\]"):
        TorchrunNodes(start_nodes=[5]).check(plan)


def test_a_killed_node_keeps_its_signal_as_the_agents_exit_code():
    # `node_trouble` tells a lost node from a clean exit by the agent's exit code: the agent
    # must be reaped by its own Popen (a psutil reap leaves Popen to record 0). A stand-in
    # agent with a child "rank"; repeated, since which side reaped first was a race.
    for _ in range(3):
        launcher = TorchrunNodes()
        agent = subprocess.Popen(["bash", "-c", "sleep 60 & wait"])
        launcher.agents[0] = agent
        time.sleep(0.2)  # the child is started
        rank = psutil.Process(agent.pid).children()[0]
        launcher.kill_node(0)
        assert agent.returncode == -signal.SIGKILL
        assert _ends_within(rank, 10)


def _ends_within(process: psutil.Process, seconds: float) -> bool:
    """Whether `process` is gone or a zombie (dead, its parent not yet reaping) in time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
