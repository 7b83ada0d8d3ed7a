"""How a job's rank processes are started, found, stopped and explained when they exit.

`RunningJob` (``utils.jobs.launch``) watches a job through this interface only, so another
way of starting ranks — DeepSpeed's launcher with a hostfile, torchrun across nodes — is one
more `Launcher`, not a change to the watcher. Today's launcher is `LocalTorchrun`:
``torchrun --standalone`` on this machine.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from utils.jobs.rundir import RunDir
from utils.system.paths import PROJECT_ROOT
from utils.system.procs import end_process_tree

if TYPE_CHECKING:
    from utils.jobs.plan import JobPlan

RANK_PROGRAM = "utils.runtime.rank"
"""The module every rank runs: ``python -m utils.runtime.rank RUN_DIR``."""


@dataclass(frozen=True)
class ExitReport:
    """What the launcher knows about how the ranks ended."""

    exit_codes: dict[int, int] = field(default_factory=dict)
    """Rank -> exit code for the ranks that failed (negative: killed by that signal)."""
    first_failed: tuple[int, ...] = ()
    """The rank(s) the launcher saw fail first (the likely cause)."""

    def stopped_by_launcher(self, rank: int) -> bool:
        """True when the launcher itself ended this rank (SIGTERM after another failed)."""
        return self.exit_codes.get(rank) == -signal.SIGTERM


class Launcher(ABC):
    """Starts one job's processes and answers for them until they are gone."""

    @abstractmethod
    def command(self, plan: JobPlan, run_dir: RunDir) -> str:
        """The shell command that runs the job by hand (saved as ``command.txt``)."""

    @abstractmethod
    def start(self, plan: JobPlan, run_dir: RunDir) -> None:
        """Start the job's processes in the background; output goes to the run's launcher log."""

    @abstractmethod
    def workers(self) -> dict[int, psutil.Process]:
        """Rank -> process, for the ranks that have a process now."""

    @abstractmethod
    def returncode(self) -> int | None:
        """The launcher process's exit code, or None while it runs."""

    @abstractmethod
    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the launcher to exit by itself."""

    @abstractmethod
    def stop(self) -> None:
        """End every process of the job, with no process left behind."""

    @abstractmethod
    def exit_report(self, run_dir: RunDir) -> ExitReport:
        """How the ranks ended, as far as the launcher saw it."""


#: One failed rank in torchrun's closing summary: "  rank      : 1 (local_rank: 1)" and
#: on the next line "  exitcode  : 3 (pid: 123)" (negative: killed by that signal).
TORCHRUN_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+)\b.*\n\s*exitcode\s*:\s*(-?\d+)", re.M)
#: Where torchrun's summary names the failure it observed first.
TORCHRUN_ROOT_CAUSE = "Root Cause (first observed failure)"


class LocalTorchrun(Launcher):
    """``torchrun --standalone --nproc-per-node=N -m utils.runtime.rank RUN_DIR`` on this machine."""

    def __init__(self):
        self.process: subprocess.Popen | None = None

    def _args(self, plan: JobPlan, run_dir: RunDir) -> list[str]:
        return ["--standalone", f"--nproc-per-node={plan.spec.world_size}", "-m", RANK_PROGRAM,
                str(run_dir.path)]

    def environment(self, plan: JobPlan) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env["DS_ACCELERATOR"] = plan.device
        # DeepSpeed JIT-builds a comm op per torch install; a cache per environment keeps two
        # environments (say a checkout and its CI clone) from rebuilding it for each other.
        env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
        # The process group must outlive the job's own timeout, so the launcher reports hangs.
        env["DEEPSPEED_TIMEOUT"] = str(int(plan.spec.timeout // 60) + 2)
        if plan.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["OMP_NUM_THREADS"] = str(plan.threads)
        return env

    def command(self, plan: JobPlan, run_dir: RunDir) -> str:
        env = self.environment(plan)
        shown_env = " ".join(f"{k}={env[k]}" for k in ("OMP_NUM_THREADS", "DS_ACCELERATOR") if k in env)
        return f"cd {shlex.quote(str(PROJECT_ROOT))} && {shown_env} torchrun {shlex.join(self._args(plan, run_dir))}"

    def start(self, plan: JobPlan, run_dir: RunDir) -> None:
        with open(run_dir.file(RunDir.LAUNCHER_LOG), "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", *self._args(plan, run_dir)],
                cwd=PROJECT_ROOT, env=self.environment(plan), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def workers(self) -> dict[int, psutil.Process]:
        found = {}
        try:
            for child in psutil.Process(self.process.pid).children():
                try:
                    rank = child.environ().get("RANK")
                except psutil.Error:
                    continue
                if rank is not None:
                    found[int(rank)] = child
        except (psutil.Error, ValueError):
            pass
        return found

    def returncode(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float) -> None:
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def stop(self, grace: float = 3.0) -> None:
        end_process_tree(self.process.pid, grace=grace)
        self.wait(grace)

    def exit_report(self, run_dir: RunDir) -> ExitReport:
        log = run_dir.file(RunDir.LAUNCHER_LOG).read_text(errors="replace") \
            if run_dir.file(RunDir.LAUNCHER_LOG).exists() else ""
        codes = {int(r): int(c) for r, c in TORCHRUN_FAILURE.findall(log)}
        _, _, root_cause = log.partition(TORCHRUN_ROOT_CAUSE)
        return ExitReport(exit_codes=codes,
                          first_failed=tuple(int(r) for r, _ in TORCHRUN_FAILURE.findall(root_cause)))
