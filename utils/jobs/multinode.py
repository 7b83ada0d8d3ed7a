"""Launchers for a job over several nodes, and `launcher_for`, which picks the launcher a plan asks for.

* `TorchrunNodes`: one torchrun agent per node (``--nnodes``, ``--node-rank``,
  ``--rdzv-backend=c10d`` with the store on node 0), as a cluster runs PyTorch jobs. The
  notebook starts the agents of the nodes that are this machine — two or more loopback
  addresses make a real multi-node job on one machine: separate agents, a real rendezvous,
  ranks numbered across nodes — and prints the command for any other node.
* `DeepSpeedRunner`: DeepSpeed's own runner (``deepspeed --hostfile``). With one host it
  starts the ranks here; with more it reaches the others through pdsh and ssh, as
  DeepSpeed's multi-node runner does.

Records: every rank writes into the run directory, so every node must see it at the same
path — a shared filesystem (NFS, Lustre) on a cluster; loopback nodes share it trivially.
A node that cannot see it fails at its first write, and a rank on it is named as never
having started.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import socket
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

import psutil

from utils.jobs.hosts import Node, is_local_host
from utils.jobs.exitreport import ExitReport, read_log, torchrun_report
from utils.jobs.launchers import RANK_PROGRAM, SHOWN_ENVIRONMENT, TORCHRUN_MODULE, Launcher, LocalTorchrun
from utils.jobs.rundir import NODE_HOST_ENV, RUN_TOKEN_ENV, RunDir
from utils.system import shm
from utils.system.procs import end_process_tree

if TYPE_CHECKING:
    from utils.jobs.plan import JobPlan

RENDEZVOUS_TIMEOUT = "RendezvousTimeoutError"
"""What torchrun's agent raises when the other nodes did not join within ``join_timeout``."""


def free_port() -> int:
    """A TCP port free on this machine now, for the rendezvous store or DeepSpeed's master."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def launcher_for(plan: JobPlan) -> Launcher:
    """The launcher `plan` asks for: DeepSpeed's runner, torchrun agents per node, or
    ``torchrun --standalone`` for a job on this machine alone."""
    if plan.spec.launcher == "deepspeed":
        return DeepSpeedRunner()
    if plan.spec.hosts or plan.spec.hostfile is not None:
        return TorchrunNodes()
    return LocalTorchrun()


class TorchrunNodes(LocalTorchrun):
    """One ``torchrun`` agent per node, meeting in a c10d rendezvous hosted by node 0.

    `start_nodes`: the nodes this process starts (default: all, each must be this machine);
    the others are expected to run their command (see `notes`) within the job's
    ``join_timeout``, which is also how a node that never joins is practised.
    """

    name = "torchrun"

    def __init__(self, *, start_nodes: Iterable[int] | None = None, port: int | None = None):
        super().__init__()
        self.start_nodes = None if start_nodes is None else frozenset(start_nodes)
        self.port = port or free_port()
        self.rendezvous_id = secrets.token_hex(4)
        self.plan: JobPlan | None = None

    def _starts(self, plan: JobPlan) -> list[Node]:
        return [n for n in plan.nodes if self.start_nodes is None or n.index in self.start_nodes]

    def check(self, plan: JobPlan) -> None:
        super().check(plan)  # the warm-start switch
        remote = [n.host for n in self._starts(plan) if not is_local_host(n.host)]
        if remote:
            raise ValueError(f"host(s) {remote} are not this machine, and the notebook starts torchrun agents only "
                             "here: run utils.prepare_job(spec) to get each node's command and a SLURM script, or "
                             "launcher='deepspeed' (DeepSpeed's runner reaches other hosts through pdsh and ssh)")
        unknown = sorted((self.start_nodes or set()) - {n.index for n in plan.nodes})
        if unknown:
            raise ValueError(f"start_nodes {unknown} are not nodes of this job (nodes 0..{len(plan.nodes) - 1})")

    def node_argv(self, plan: JobPlan, run_dir: RunDir, node: Node) -> list[str]:
        """torchrun's arguments on `node`: the same on every node but the node rank, the host
        it presents (``--local-addr``, which also orders the nodes: `utils.jobs.hosts`) and
        whether it hosts the rendezvous store (node 0, ``is_host=1``)."""
        return [sys.executable, "-m", TORCHRUN_MODULE, f"--nnodes={len(plan.nodes)}",
                f"--nproc-per-node={node.slots}", f"--node-rank={node.index}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={plan.nodes[0].host}:{self.port}", f"--rdzv-id={self.rendezvous_id}",
                f"--rdzv-conf=join_timeout={plan.spec.join_limit},is_host={int(node.index == 0)}", f"--local-addr={node.host}",
                "--max-restarts=0", "-m", RANK_PROGRAM, str(run_dir.path)]

    def node_command(self, plan: JobPlan, run_dir: RunDir, node: Node, *, token: bool = False) -> str:
        """`node`'s command for a terminal on that host; with `token` it records into this run
        directory (a node of this launch), else into a new sibling (a rerun)."""
        extra = {NODE_HOST_ENV: node.host, **({RUN_TOKEN_ENV: self.token} if token else {})}
        return self.shell_line(plan, self.node_argv(plan, run_dir, node), extra)

    def command(self, plan: JobPlan, run_dir: RunDir) -> str:
        return "\n".join(f"# node {n.index} ({n.host}): ranks {n.ranks[0]}-{n.ranks[-1]}\n"
                         + self.node_command(plan, run_dir, n) for n in plan.nodes)

    def notes(self, plan: JobPlan, run_dir: RunDir) -> list[str]:
        starts = self._starts(plan)
        warm = self.warm_start(plan, self.node_argv(plan, run_dir, starts[0]))[1] if starts else None
        return ([warm] if warm else []) + [f"node {n.index} ({n.host}) is not started from here: run this on it within "
                f"join_timeout={plan.spec.join_limit} s: {self.node_command(plan, run_dir, n, token=True)}"
                for n in plan.nodes if n not in self._starts(plan)]

    def start(self, plan: JobPlan, run_dir: RunDir) -> None:
        self.plan = plan
        env = self.prepare(plan, run_dir)
        for node in self._starts(plan):
            self.spawn(node.index, self.agent_argv(plan, self.node_argv(plan, run_dir, node)),
                       {**env, NODE_HOST_ENV: node.host}, run_dir.launcher_log(node.index))

    def kill_node(self, index: int) -> None:
        """Lose node `index` at once, as a power cut would: SIGKILL its agent and its ranks.
        Returns once the agent is reaped, so that the failure the other nodes' ranks report
        next is explained by a lost node (`node_trouble` reads the agent's exit status), not
        by a rank that vanished.

        The agent is killed and reaped through its Popen, its ranks (listed first) through
        psutil: had psutil reaped the agent, Popen would find no child to wait for and record
        exit code 0 (CPython's `_try_wait`), and the loss would read as a clean exit."""
        agent = self.agents[index]
        try:
            ranks = psutil.Process(agent.pid).children(recursive=True)
        except psutil.Error:
            ranks = []
        agent.kill()
        agent.wait(timeout=30)
        end_process_tree(ranks, grace=0)

    def exit_report(self, run_dir: RunDir) -> ExitReport:
        reports = [torchrun_report(read_log(run_dir.launcher_log(i))) for i in self.agents]
        return ExitReport(exit_codes={r: c for rep in reports for r, c in rep.exit_codes.items()},
                          first_failed=tuple(r for rep in reports for r in rep.first_failed))

    def node_trouble(self, run_dir: RunDir) -> str | None:
        """A node lost mid-run (its agent killed by a signal after its ranks ran), or nodes
        that never joined the rendezvous; None when every node joined and none was lost."""
        plan = self.plan
        if plan is None:
            return None
        self.workers()  # brings the ranks seen under each agent up to date
        lost, never = [], []
        for node in plan.nodes:
            agent = self.agents.get(node.index)
            code = agent.poll() if agent is not None else None
            ran = self.ranks_seen(node.index) | {r for r in node.ranks if run_dir.placement(r) is not None}
            log = read_log(run_dir.launcher_log(node.index)) if agent is not None else ""
            if ran and code is not None and code < 0:
                lost.append(f"node {node.index} ({node.host}) was lost during the run: its torchrun agent was "
                            f"killed by {signal.Signals(-code).name}, and its ranks {list(node.ranks)} "
                            f"(stage(s) {_stages(plan, node)}) ended with it{_doing(run_dir, node)}")
            elif not ran and agent is None:
                never.append(f"node {node.index} ({node.host}) never joined: its agent is not started from here "
                             "and none of its ranks appeared; run its command (job notes, command.txt) on that "
                             "host, and check that the host is up and reaches the rendezvous")
            elif not ran and code not in (None, 0) and RENDEZVOUS_TIMEOUT not in log:
                tail = "\n".join(log.strip().splitlines()[-6:])
                never.append(f"node {node.index} ({node.host}) never joined: its torchrun agent exited with code "
                             f"{code} before starting a rank; the end of its log "
                             f"({run_dir.launcher_log(node.index).name}):\n{tail}")
        if lost:
            steps = len(run_dir.progress(0))
            return "; ".join(lost) + (f". {steps} of {plan.spec.steps} steps were done; the ranks on the other "
                                      "nodes then lost their connection to it (their errors are consequences)")
        if never:
            waited = [n.index for n in plan.nodes if RENDEZVOUS_TIMEOUT in read_log(run_dir.launcher_log(n.index))]
            after = (f". Node(s) {waited} waited join_timeout={plan.spec.join_limit} s at the rendezvous "
                     f"{plan.nodes[0].host}:{self.port} and gave up ({RENDEZVOUS_TIMEOUT})") if waited else ""
            return "; ".join(never) + after
        return None


class DeepSpeedRunner(LocalTorchrun):
    """DeepSpeed's runner: ``python -m deepspeed.launcher.runner --hostfile=F --module
    utils.runtime.rank RUN_DIR`` (the ``deepspeed`` command). Its ``launch.py`` starts the
    ranks of a node; with several hosts the runner starts ``launch.py`` on each through pdsh."""

    name = "DeepSpeed's runner"

    def __init__(self, *, port: int | None = None):
        super().__init__()
        self.port = port or free_port()
        self._buffers_of: tuple[str, int] | None = None
        """(master address, port) of a start whose ranks make shared-memory buffers (`uses_shm`)."""

    def check(self, plan: JobPlan) -> None:
        if len(plan.nodes) > 1 and shutil.which("pdsh") is None:
            raise ValueError("DeepSpeed's runner starts the other hosts' ranks through pdsh, which is not installed "
                             "here (apt-get install pdsh; passwordless ssh to every host), or run each node's "
                             "command from utils.prepare_job(spec) on that node")
        if uses_shm(plan):
            space = shm.space_for(plan.spec.world_size)  # counting stale buffers as free: `prepare` removes them
            if not space.enough:
                mib = 2 ** 20
                raise ValueError(
                    f"/dev/shm 的空间不够 (not enough room in /dev/shm): DeepSpeed's CPU communication op gives "
                    f"each of the {plan.spec.world_size} ranks a {shm.buffer_bytes() / mib:.0f} MiB shared-memory "
                    f"buffer when DeepSpeed's runner starts them ({space.needed / mib:.0f} MiB in all) and "
                    f"/dev/shm has {space.free / mib:.0f} MiB free; with less, the buffers are cut short. Give "
                    "the container a bigger /dev/shm (docker run --shm-size=1g), or leave launcher at its default "
                    "(torchrun: the op then uses no shared memory)")

    def _head(self, plan: JobPlan) -> str:
        host = plan.nodes[0].host
        return "127.0.0.1" if host == "localhost" else host

    def argv(self, plan: JobPlan, run_dir: RunDir, *, node: Node | None = None) -> list[str]:
        """The runner's arguments; for one `node` of several, the ``--no_ssh --node_rank=i``
        form that starts only that node's ranks (run on each node, as pdsh would)."""
        args = [sys.executable, "-m", "deepspeed.launcher.runner", f"--hostfile={run_dir.file('hostfile')}",
                f"--master_addr={self._head(plan)}", f"--master_port={self.port}"]
        if node is not None:
            args += ["--no_ssh", f"--node_rank={node.index}"]
        elif len(plan.nodes) == 1:
            args.append("--no_ssh_check")  # else the runner would ssh into the one host to test ssh
        # --no_local_rank: the rank program takes the run directory as its only argument.
        return [*args, "--no_local_rank", "--module", RANK_PROGRAM, str(run_dir.path)]

    def write_hostfile(self, plan: JobPlan, run_dir: RunDir) -> None:
        run_dir.file("hostfile").write_text("".join(f"{n.host} slots={n.slots}\n" for n in plan.nodes),
                                            encoding="utf-8")

    def command(self, plan: JobPlan, run_dir: RunDir) -> str:
        self.write_hostfile(plan, run_dir)
        return self.shell_line(plan, self.argv(plan, run_dir))

    def start(self, plan: JobPlan, run_dir: RunDir) -> None:
        self.write_hostfile(plan, run_dir)
        env = self.prepare(plan, run_dir)
        if len(plan.nodes) > 1:
            # pdsh passes on only a few variables (PYTHON*, ...) and those in the file DS_ENV_FILE
            # names: the rest of the launch environment goes there.
            path = run_dir.file("deepspeed_env")
            keys = [*SHOWN_ENVIRONMENT, "DEEPSPEED_TIMEOUT", RUN_TOKEN_ENV]
            path.write_text("".join(f"{k}={env[k]}\n" for k in keys if env.get(k)), encoding="utf-8")
            env["DS_ENV_FILE"] = str(path)
        if uses_shm(plan):
            self._buffers_of = (self._head(plan), self.port)
        self.spawn(0, self.argv(plan, run_dir), env, run_dir.launcher_log())

    def stop(self, grace: float = 3.0) -> None:
        """Stop the ranks, then remove their shared-memory buffers (DeepSpeed never does)."""
        super().stop(grace)
        if self._buffers_of is not None:
            shm.remove_job_buffers(*self._buffers_of)

    def exit_report(self, run_dir: RunDir) -> ExitReport:
        return ExitReport()  # launch.py logs the pids it kills, not which rank failed first


def uses_shm(plan: JobPlan) -> bool:
    """Whether the ranks DeepSpeed's runner starts for `plan` make shared-memory buffers
    (`utils.system.shm`): on a CPU with every rank on one node (``LOCAL_SIZE`` = world size)."""
    return plan.device == "cpu" and len(plan.nodes) == 1


def _stages(plan: JobPlan, node: Node) -> list[int]:
    return sorted({plan.spec.stage_of_rank(r) for r in node.ranks})


def _doing(run_dir: RunDir, node: Node) -> str:
    """What the node's first rank was executing, from its status slot."""
    status = run_dir.slot(node.ranks[0])
    return f" (rank {node.ranks[0]} was in: {status.describe()})" if status is not None else ""
