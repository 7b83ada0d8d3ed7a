"""How a job's rank processes are started, found, stopped and explained when they exit.

`RunningJob` (``utils.jobs.launch``) watches a job through this interface only, so another
way of starting ranks is one more `Launcher`, not a change to the watcher: `LocalTorchrun`
(``torchrun --standalone`` on this machine; on a CPU its arguments go to torchrun's agent with
warm-forked ranks, `utils.runtime.warm_agent`) here, torchrun agents per node and DeepSpeed's
runner in `utils.jobs.multinode`.

What a launch hands its ranks besides the run directory is part of the run-directory
contract (`utils.jobs.rundir`): the launching process's pid and start time (the ranks exit when
it is gone: torchrun runs in a session of its own and would outlive a killed notebook), a
launch token (a ``command.txt`` run by hand records a new run instead of appending to this one)
and ``TMPDIR`` inside the run directory (torchrun's ``torchelastic_*`` folders go with the job).
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from utils.jobs.exitreport import ExitReport, placed_pids, read_log, torchrun_report
from utils.jobs.rundir import LAUNCHER_CREATED_ENV, LAUNCHER_PID_ENV, RUN_TOKEN_ENV, RunDir
from utils.jobs.stacks import FLIGHT_RECORDER_DIR, FLIGHT_RECORDER_PREFIX
from utils.system.extensions import LOCK_NAME, build_locks, extensions_dir, remove_stale_build_locks
from utils.system.paths import PROJECT_ROOT
from utils.system.private_apis import warm_start
from utils.system.procs import end_process_tree, job_processes, process_created
from utils.system.shm import remove_stale_buffers

if TYPE_CHECKING:
    from utils.jobs.plan import JobPlan

RANK_PROGRAM = "utils.runtime.rank"
"""The module every rank runs: ``python -m utils.runtime.rank RUN_DIR``."""
TORCHRUN_MODULE = "torch.distributed.run"
"""torchrun's module: ``python -m torch.distributed.run`` is the ``torchrun`` command."""
WARM_AGENT_MODULE = "utils.runtime.warm_agent"
"""torchrun's agent with ranks forked from a preloaded fork server (CPU jobs started here)."""
SHOWN_ENVIRONMENT = ("OMP_NUM_THREADS", "DS_ACCELERATOR", "CUDA_VISIBLE_DEVICES", "TORCH_EXTENSIONS_DIR")
"""The launch environment a pasted command repeats (the rest is the terminal's own)."""
INTERPRETER_BIN = str(Path(sys.executable).parent)
"""This interpreter's scripts folder, first on the ranks' PATH (its ``ninja`` builds the ops)."""
WARM_LOAD_SECONDS = 2.0
"""Longer than a load of an already compiled op holds its build lock."""

def ranks_path(path: str) -> str:
    """`path` with `INTERPRETER_BIN` first: the ranks' PATH, so that one ninja builds DeepSpeed's
    ops, this interpreter's (pip's, a DeepSpeed dependency), as in an activated venv. Debian's
    ninja 1.11 and pip's 1.13 rewrite each other's build log (v5, v7) and each then rebuilds the
    op (~35 s): jobs from a plain shell and from a kernel whose PATH starts with the venv rebuilt
    it for each other, job after job."""
    return path if path.split(os.pathsep)[0] == INTERPRETER_BIN else os.pathsep.join([INTERPRETER_BIN, path])


NCCL_FLIGHT_RECORDER = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                        "TORCH_NCCL_ENABLE_MONITORING": "1"}
"""torch's NCCL flight recorder, on for an NCCL job: a ring of each rank's last 2000 operations,
written to a file when NCCL's watchdog times out (the dump needs all three: torch 2.13's
``ProcessGroupNCCL.hpp``; 2000 is its default, set so that no torch version leaves it at 0), and
where to (``TORCH_FR_DUMP_TEMP_FILE``, `nccl_debug_environment`)."""
OLDER_NAMES = {"TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
               "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
"""torch reads the newer name first and the older one with a deprecation warning
(``FlightRecorder.hpp``: ``{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}``)."""


def model_root(plan: JobPlan) -> str | None:
    """The folder a learner's model module (``JobSpec(model="pkg.mod:fn")``) is imported from,
    for the ranks' ``PYTHONPATH``: they import it in their own processes. None for a preset."""
    from utils.workloads.presets import is_import_path

    if not is_import_path(plan.spec.model):
        return None
    from utils.workloads.custom import import_root

    return import_root(plan.spec.model)


def nccl_debug_environment(run_dir: RunDir, environ: Mapping[str, str]) -> dict[str, str]:
    """The flight-recorder variables to add to an NCCL job's `environ` (`NCCL_FLIGHT_RECORDER`, and
    the dumps' file prefix in the run directory: torch appends the rank), each unless `environ`
    sets it under either of its names."""
    folder = run_dir.file(FLIGHT_RECORDER_DIR)
    folder.mkdir(exist_ok=True)
    wanted = {**NCCL_FLIGHT_RECORDER, "TORCH_FR_DUMP_TEMP_FILE": str(folder / FLIGHT_RECORDER_PREFIX)}
    return {k: v for k, v in wanted.items() if k not in environ and OLDER_NAMES.get(k) not in environ}


class Launcher(ABC):
    """Starts one job's processes and answers for them until they are gone."""

    name = "the launcher"
    """What error messages call the launcher process."""

    @property
    def pid(self) -> int | None:
        """The launcher process's pid, once started."""
        return None

    def blocking_build_locks(self) -> str | None:
        """A sentence about build locks the ranks may be waiting for, or None (for the hang
        report). Launchers that build nothing on this machine have none."""
        return None

    def building_ops(self) -> list[str]:
        """Names of the ops the ranks are compiling now (for the progress line); none by default."""
        return []

    def check(self, plan: JobPlan) -> None:
        """Raise ValueError, saying what to change, when this launcher cannot start `plan`
        from here; called before the run directory exists."""

    def notes(self, plan: JobPlan, run_dir: RunDir) -> list[str]:
        """What the learner must know or do for this launch (a node to start by hand)."""
        return []

    def node_trouble(self, run_dir: RunDir) -> str | None:
        """A node lost or never joined, which explains every rank's failure; None by default."""
        return None

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


#: torchrun's arguments for a job on this machine alone. ``--standalone`` starts the
#: rendezvous store on a free local port, but the address it hands the workers as
#: MASTER_ADDR is the host's fully qualified name (torch's ``RendezvousStoreInfo.build``:
#: ``local_addr or socket.getfqdn()``): in a fresh VM whose hostname does not resolve, every
#: worker retries that name until the job times out. ``--local-addr`` makes it loopback.
SINGLE_NODE_ARGS = ("--standalone", "--local-addr=127.0.0.1")


class LocalTorchrun(Launcher):
    """``torchrun --standalone --nproc-per-node=N -m utils.runtime.rank RUN_DIR`` on this machine.

    It watches its processes as *agents* (node index -> process): here one, torchrun on
    node 0; `utils.jobs.multinode` starts one agent per node, or DeepSpeed's runner, through
    the same bookkeeping.
    """

    name = "torchrun"

    def __init__(self, *, warm: bool = True):
        self.warm = warm
        """On a CPU, run torchrun's arguments through `WARM_AGENT_MODULE` (`agent_argv`);
        False runs torchrun's own command, as ``command.txt`` does (the benchmark's baseline)."""
        self.agents: dict[int, subprocess.Popen] = {}
        """Node index -> the agent process this launcher started for it."""
        self.extensions_dir: Path | None = None
        """Where the ranks JIT-build DeepSpeed's ops (known once started)."""
        self._temp: Path | None = None
        self.run_dir: RunDir | None = None
        """The run directory of the last start (its placement files name forked ranks)."""
        self.world_size = 0
        """The ranks of that start (how many placement files to read)."""
        self._seen: dict[int, psutil.Process] = {}
        self._ranks_of: dict[int, set[int]] = {}
        """Node index -> the ranks ever seen under its agent."""
        self.token = secrets.token_hex(16)
        """This launch's token (`utils.jobs.rundir.RUN_TOKEN_ENV`)."""

    @property
    def pid(self) -> int | None:
        return next((p.pid for p in self.agents.values()), None)

    def _args(self, plan: JobPlan, run_dir: RunDir) -> list[str]:
        return [*SINGLE_NODE_ARGS, f"--nproc-per-node={plan.spec.world_size}", "-m", RANK_PROGRAM,
                str(run_dir.path)]

    def environment(self, plan: JobPlan) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), model_root(plan), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env["DS_ACCELERATOR"] = plan.device
        # DeepSpeed JIT-builds a comm op per torch install, in one folder per environment ...
        env["TORCH_EXTENSIONS_DIR"] = str(extensions_dir())
        env["PATH"] = ranks_path(env.get("PATH", os.defpath))
        # The process group must outlive the job's own timeout, so the launcher reports hangs.
        env["DEEPSPEED_TIMEOUT"] = str(int(plan.spec.timeout // 60) + 2)
        # The ranks exit when this process is gone (a killed notebook, a script that ended).
        env[LAUNCHER_PID_ENV] = str(os.getpid())
        env[LAUNCHER_CREATED_ENV] = repr(process_created(os.getpid()))
        if plan.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["OMP_NUM_THREADS"] = str(plan.threads)
        return env

    def command(self, plan: JobPlan, run_dir: RunDir) -> str:
        """A command that works as pasted into any terminal, venv activated or not.

        ``torchrun`` is not on the PATH outside an activated venv, so the command names this
        interpreter (an absolute path) and runs ``-m torch.distributed.run``, torchrun's own
        module. ``env`` sets what the ranks need to run as the notebook ran them (threads per
        rank, the device, the extensions folder holding DeepSpeed's compiled communication op:
        without it a terminal run would compile it again, for minutes; the venv's ``bin`` first
        on the PATH, for the ninja that built it) in any POSIX shell.
        Run so, rank 0 prints its phases and steps to the terminal (`utils.runtime.rank`).
        """
        return self.shell_line(plan, self.argv(plan, run_dir))

    def shell_line(self, plan: JobPlan, argv: list[str], extra: dict[str, str] | None = None) -> str:
        """``cd PROJECT && env K=V ... ARGV``: `argv` as a terminal runs it, with the launch
        environment a pasted command must repeat (`SHOWN_ENVIRONMENT`) and `extra`.

        A torchrun command runs in a subshell with a temporary folder of its own, removed when
        the subshell exits however torchrun ended: torchrun makes a ``torchelastic_*`` folder in
        the temporary directory and never removes it (a notebook's job has its TMPDIR in the run
        directory instead, removed by `stop`)."""
        env = self.environment(plan)
        shown = [f"{k}={env[k]}" for k in SHOWN_ENVIRONMENT if k in env]
        if (root := model_root(plan)) is not None:  # the ranks import the learner's model from there
            shown.append(f"PYTHONPATH={root}")
        shown += [f"{k}={v}" for k, v in (extra or {}).items()]
        path = f'PATH={shlex.quote(INTERPRETER_BIN)}:"$PATH"'  # the shell expands $PATH: not quoted
        if TORCHRUN_MODULE not in argv:
            return f"cd {shlex.quote(str(PROJECT_ROOT))} && env {path} {shlex.join([*shown, *argv])}"
        return (f"(cd {shlex.quote(str(PROJECT_ROOT))} && t=\"$(mktemp -d)\" && trap 'rm -rf \"$t\"' EXIT INT TERM && "
                f"env TMPDIR=\"$t\" {path} {shlex.join([*shown, *argv])})")

    def argv(self, plan: JobPlan, run_dir: RunDir) -> list[str]:
        """The launcher's argument vector: this interpreter running torchrun's module."""
        return [sys.executable, "-m", TORCHRUN_MODULE, *self._args(plan, run_dir)]

    def check(self, plan: JobPlan) -> None:
        self.warm_start(plan, [])  # a mistyped WORKBOOK_WARM_START stops the job before it has a run directory

    def notes(self, plan: JobPlan, run_dir: RunDir) -> list[str]:
        note = self.warm_start(plan, self.argv(plan, run_dir))[1]
        if note:  # also where the job's output goes
            with open(run_dir.launcher_log(), "a", encoding="utf-8") as log:
                log.write(f"[workbook] {note}\n")
        return [note] if note else []

    def warm_start(self, plan: JobPlan, argv: list[str]) -> tuple[bool, str | None]:
        """Whether torchrun's `argv` runs through `WARM_AGENT_MODULE`, and a note when it cannot
        (`utils.system.private_apis.warm_start`: the switch, then the agent's private APIs)."""
        return warm_start(self.warm and plan.device == "cpu" and TORCHRUN_MODULE in argv)

    def agent_argv(self, plan: JobPlan, argv: list[str]) -> list[str]:
        """What this launcher runs for a torchrun `argv`: on a CPU the same arguments to
        `utils.runtime.warm_agent` (torchrun's agent, with ranks forked from a fork server that
        imported torch and DeepSpeed once; ``benchmarks/warm_start.py`` measures the gain), on a
        GPU `argv` itself (no process that forks ranks may touch CUDA), and `argv` too when
        `warm_start` says no. ``command.txt`` keeps `argv`: the same job, started the slower way."""
        if not self.warm_start(plan, argv)[0]:
            return argv
        at = argv.index(TORCHRUN_MODULE)
        return [*argv[:at], WARM_AGENT_MODULE, *argv[at + 1:]]

    def building_ops(self) -> list[str]:
        """The DeepSpeed ops being JIT-compiled now: those whose build lock exists and which
        have no library yet, or whose lock is older than a load takes (a warm load holds it
        for a moment too). The first job in an environment compiles the CPU communication op
        (``deepspeed_shm_comm``) for one to two minutes: what a progress line should say."""
        if self.extensions_dir is None:
            return []
        now, found = time.time(), []
        for lock in sorted(self.extensions_dir.glob(f"*/{LOCK_NAME}")):
            op = lock.parent
            try:
                age = now - lock.stat().st_mtime
            except OSError:  # released meanwhile
                continue
            if age > WARM_LOAD_SECONDS or not (op / f"{op.name}.so").exists():
                found.append(op.name)
        return found

    def start(self, plan: JobPlan, run_dir: RunDir) -> None:
        self.spawn(0, self.agent_argv(plan, self.argv(plan, run_dir)), self.prepare(plan, run_dir),
                   run_dir.launcher_log())

    def prepare(self, plan: JobPlan, run_dir: RunDir) -> dict[str, str]:
        """What every start needs once: the launch environment with a fresh launch token,
        TMPDIR inside the run directory (torchrun's ``torchelastic_*`` folders and the ranks'
        temporary files go with `stop`), no stale JIT build lock and no stale shared-memory
        buffer of DeepSpeed's (`utils.system.shm`)."""
        env = self.environment(plan)
        self.run_dir, self.world_size = run_dir, plan.spec.world_size
        self.extensions_dir = Path(env["TORCH_EXTENSIONS_DIR"])
        self._temp = run_dir.file(RunDir.TEMP)
        self._temp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(self._temp)
        if plan.device == "cuda":  # where NCCL's own record of a timed-out operation goes
            env.update(nccl_debug_environment(run_dir, env))
        run_dir.file(RunDir.LAUNCH_TOKEN).write_text(self.token, encoding="utf-8")
        env[RUN_TOKEN_ENV] = self.token
        # A lock left by a build that was stopped midway makes every rank wait forever.
        removed = remove_stale_build_locks(self.extensions_dir)
        # DeepSpeed's shared-memory buffers of jobs whose launcher could not remove them.
        buffers, freed = remove_stale_buffers()
        with open(run_dir.launcher_log(), "ab") as log:
            if removed:
                log.write(f"[workbook] removed stale JIT build lock(s) that no live process held "
                          f"(left by a build that was stopped midway): "
                          f"{', '.join(map(str, removed))}\n".encode())
            if buffers:
                log.write(f"[workbook] removed {len(buffers)} DeepSpeed shared-memory buffer(s) that no live "
                          f"process held ({freed / 2 ** 20:.0f} MiB in /dev/shm, left by a job whose launcher "
                          f"was killed or run by hand): {', '.join(buffers)}\n".encode())
        return env

    def spawn(self, node: int, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        """Start `argv` as node `node`'s agent, in a session of its own, output to `log_path`."""
        with open(log_path, "ab") as log:
            self.agents[node] = subprocess.Popen(argv, cwd=PROJECT_ROOT, env=env, stdout=log,
                                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                 start_new_session=True)

    def blocking_build_locks(self) -> str | None:
        """A sentence naming each JIT build lock present now and who holds it, or None.

        For the hang report (call it before `stop`, while the holders still run): ranks that
        load DeepSpeed's op wait while its lock exists, so a lock still there when a job
        times out is the likely reason it never started training.
        """
        if self.extensions_dir is None:
            return None
        locks = build_locks(self.extensions_dir)
        if not locks:
            return None
        ranks = {proc.pid: rank for rank, proc in self.workers().items()}
        sentences = []
        for lock in locks:
            if lock.stale:
                sentences.append(f"The JIT build lock {lock.path} is held by no live process (a build "
                                 "stopped midway left it), so ranks loading DeepSpeed's op wait for it "
                                 "forever; the next job removes it, or delete it by hand.")
            else:
                holders = ", ".join(f"pid {pid}" + (f" (rank {ranks[pid]} of this job)" if pid in ranks else "")
                                    for pid in lock.holders)
                sentences.append(f"The JIT build lock {lock.path} is held by {holders}: ranks loading "
                                 "DeepSpeed's op wait until that build ends.")
        return " ".join(sentences)

    def workers(self) -> dict[int, psutil.Process]:
        placed = self._placed_pids()
        for node, agent in self.agents.items():
            found = _ranks_below(agent.pid, placed)
            self._ranks_of.setdefault(node, set()).update(found)
            self._seen.update(found)
        return {rank: proc for rank, proc in self._seen.items() if proc.is_running()}

    def _placed_pids(self) -> dict[int, int]:
        """Pid -> rank, as the ranks of this launch recorded themselves (placement files)."""
        if self.run_dir is None:
            return {}
        placed = {}
        for rank in range(self.world_size):
            placement = self.run_dir.placement(rank)
            if placement and isinstance(placement.get("pid"), int):
                placed[placement["pid"]] = rank
        return placed

    def ranks_seen(self, node: int) -> set[int]:
        """The ranks ever seen running under node `node`'s agent (as of the last `workers`)."""
        return set(self._ranks_of.get(node, ()))

    def returncode(self) -> int | None:
        """None while the agents run; the first failing agent's code as soon as one fails
        (the job is over: its ranks lost a peer); 0 once every agent exited cleanly."""
        codes = [agent.poll() for agent in self.agents.values()]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            return failed[0]
        return None if None in codes or not codes else 0

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for agent in self.agents.values():
            try:
                agent.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def stop(self, grace: float = 3.0) -> None:
        for agent in self.agents.values():
            end_process_tree(agent.pid, grace=grace)
        # Ranks seen earlier whose agent is already gone (killed) are no longer its
        # children: end them by the handles kept (psutil checks they are the same processes).
        end_process_tree([p for p in self._seen.values() if p.is_running()], grace=grace)
        if self._temp is not None:
            # Processes of this launch that lost their agent: a fork server still tearing torch
            # down after the warm agent exited (about a second) lies in no tree, but it has
            # this launch's TMPDIR.
            end_process_tree(job_processes(self._temp), grace=grace)
        self.wait(grace)
        if self._temp is not None:  # nothing runs that could still write there
            shutil.rmtree(self._temp, ignore_errors=True)

    def exit_report(self, run_dir: RunDir) -> ExitReport:
        return torchrun_report(read_log(run_dir.launcher_log()), placed_pids(run_dir))


def _ranks_below(pid: int, placed: dict[int, int]) -> dict[int, psutil.Process]:
    """Rank -> process for the rank processes below `pid` at any depth (torchrun's workers
    are its children, DeepSpeed's runner's are grandchildren, the warm agent's are its fork
    server's children). A rank started by exec carries ``RANK`` in its environment, and its
    own children (a JIT compiler) inherit it, so the highest process carrying a rank is the
    rank. A forked rank's environment is its fork server's, without ``RANK``: it is known by
    the pid it wrote in its placement file (`placed`: pid -> rank)."""
    found: dict[int, psutil.Process] = {}
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return found
    for proc in below:
        if proc.pid in placed:
            found[placed[proc.pid]] = proc
            continue
        try:
            rank = proc.environ().get("RANK")
            parent_rank = proc.parent().environ().get("RANK") if proc.ppid() != pid else None
        except (psutil.Error, AttributeError):
            continue
        if rank is not None and rank != parent_rank:
            found[int(rank)] = proc
    return found
