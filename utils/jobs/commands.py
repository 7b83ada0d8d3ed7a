"""A job to run outside the notebook: its run directory, each node's command and a SLURM script.

`prepare_job(spec)` plans the job as `run_job` would, creates its run directory
(spec, plan, launch token) and returns `NodeCommands`: the exact command for every node and a
SLURM batch script. Run them in terminals on the nodes, or ``sbatch`` the script; the ranks
record into the prepared directory, and ``Run.load(path)`` reads the result in the notebook
(a run nobody watched reads as succeeded once every rank wrote its result, see
`utils.jobs.runs.Run.load`).

The commands need what `run_job` needs: the project at the same path on every node (the
``cd``), this Python environment there, and the run directory on a filesystem every node
sees at the same path.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from utils.jobs.hosts import Node
from utils.jobs.launchers import INTERPRETER_BIN, RANK_PROGRAM, TORCHRUN_MODULE, LocalTorchrun
from utils.jobs.multinode import DeepSpeedRunner, TorchrunNodes, launcher_for
from utils.jobs.plan import JobPlan, plan_job
from utils.jobs.rundir import RUN_TOKEN_ENV, RunDir
from utils.jobs.spec import JobSpec
from utils.system.paths import PROJECT_ROOT

SLURM_SCRIPT = "job.slurm"
"""The batch script's name in the prepared run directory."""


@dataclass(frozen=True)
class NodeCommands:
    """What to run, per node, for one prepared job (see the module docstring)."""

    path: Path
    """The prepared run directory: ``Run.load(path)`` once the job ran."""
    nodes: tuple[Node, ...]
    per_node: tuple[str, ...]
    """One shell command per node, node 0 first: run each on its node."""
    slurm: str
    """A SLURM batch script that runs the job with torchrun on an allocation of
    ``len(nodes)`` nodes (also saved as ``job.slurm`` in the run directory)."""
    runner: str | None = None
    """``launcher="deepspeed"``: the single command for node 0 with which DeepSpeed's runner
    starts every node through pdsh (instead of `per_node`)."""

    def __str__(self) -> str:
        lines = [f"# run directory (shared by every node): {self.path}"]
        for node, command in zip(self.nodes, self.per_node):
            lines += [f"# node {node.index} ({node.host}): ranks {node.ranks[0]}-{node.ranks[-1]}", command]
        if self.runner:
            lines += ["# or, on node 0, DeepSpeed's runner starts them all through pdsh + ssh:", self.runner]
        lines += [f"# or on a SLURM cluster: sbatch {self.path / SLURM_SCRIPT}", self.slurm]
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows it as printed
        printer.text(str(self))


def prepare_job(spec: JobSpec, *, directory: str | Path | None = None) -> NodeCommands:
    """Plan `spec`, create its run directory and return the commands that run it (module docstring)."""
    plan = plan_job(spec, directory=directory)
    launcher = launcher_for(plan)
    run_dir = RunDir.create(spec.name or spec.model, directory)
    run_dir.write_spec(spec.to_dict())
    run_dir.write_plan(plan.to_record())
    run_dir.file(RunDir.LAUNCH_TOKEN).write_text(launcher.token, encoding="utf-8")
    token = {RUN_TOKEN_ENV: launcher.token}
    runner = None
    if isinstance(launcher, TorchrunNodes):
        per_node = [launcher.node_command(plan, run_dir, n, token=True) for n in plan.nodes]
    elif isinstance(launcher, DeepSpeedRunner):
        launcher.write_hostfile(plan, run_dir)
        per_node = [launcher.shell_line(plan, launcher.argv(plan, run_dir, node=n), token) for n in plan.nodes]
        runner = launcher.shell_line(plan, launcher.argv(plan, run_dir), token) if len(plan.nodes) > 1 else None
    else:
        per_node = [launcher.shell_line(plan, launcher.argv(plan, run_dir), token)]
    script = slurm_script(plan, run_dir, launcher)
    run_dir.file(SLURM_SCRIPT).write_text(script, encoding="utf-8")
    run_dir.write_command("\n".join(per_node))
    return NodeCommands(path=run_dir.path, nodes=plan.nodes, per_node=tuple(per_node), slurm=script, runner=runner)


def slurm_script(plan: JobPlan, run_dir: RunDir, launcher: LocalTorchrun) -> str:
    """A batch script for `plan` on SLURM: one task per node (``srun``), each a torchrun agent
    meeting the others in a c10d rendezvous on the allocation's first node, with the job's
    launch environment and token. torchrun, not DeepSpeed's runner, because the hosts are
    SLURM's to choose: a hostfile would have to name them before the allocation exists."""
    spec, nodes = plan.spec, plan.nodes
    slots = nodes[0].slots
    port = getattr(launcher, "port", 29500)
    env = launcher.environment(plan)
    shown = [f"{k}={env[k]}" for k in ("OMP_NUM_THREADS", "DS_ACCELERATOR", "CUDA_VISIBLE_DEVICES",
                                         "TORCH_EXTENSIONS_DIR", "DEEPSPEED_TIMEOUT") if k in env]
    shown.append(f"{RUN_TOKEN_ENV}={launcher.token}")
    resources = (f"#SBATCH --gpus-per-node={slots}" if plan.device == "cuda" else
                 f"#SBATCH --cpus-per-task={slots * (plan.threads or 1)}")
    minutes = max(1, int(spec.timeout // 60) + 1)
    fixed = shlex.join(["env", *shown, sys.executable, "-m", TORCHRUN_MODULE,
                        f"--nnodes={len(nodes)}", f"--nproc-per-node={slots}", "--rdzv-backend=c10d"])
    after = shlex.join([f"--rdzv-conf=join_timeout={spec.join_limit}", "--max-restarts=0",
                        "-m", RANK_PROGRAM, str(run_dir.path)])
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={shlex.quote(spec.name or spec.model)}",
        f"#SBATCH --nodes={len(nodes)}",
        "#SBATCH --ntasks-per-node=1",
        resources,
        f"#SBATCH --time={minutes}",
        f"#SBATCH --output={run_dir.path}/slurm-%j.out",
        "# Every node must see the project and this run directory at the same paths (a shared filesystem).",
        "set -euo pipefail",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"cd {shlex.quote(str(PROJECT_ROOT))}",
        "# This venv's bin first, as for every job: its ninja builds DeepSpeed's ops (srun passes PATH on).",
        f'export PATH={shlex.quote(INTERPRETER_BIN)}:"$PATH"',
        f'srun --kill-on-bad-exit=1 {fixed} --rdzv-endpoint="$head_node:{port}" --rdzv-id="$SLURM_JOB_ID" {after}',
        ""])
