"""Start a real multi-process DeepSpeed pipeline job and watch it to the end.

`run_job(spec)` checks the spec, creates the run directory, starts
``torchrun --standalone --nproc-per-node=N -m utils.job RUN_DIR`` (the same command is saved
in ``command.txt`` so a learner can run it in a terminal), shows progress, and returns a
`Run`. Whatever happens the job ends with no process left behind:

- a rank raises      -> its error file appears; the job is stopped and `JobFailed` names the
                        rank, its stage and the tail of its traceback, within seconds;
- a rank dies        -> torchrun reports the root cause; the same error names it;
- a rank hangs       -> after `spec.timeout` the job is stopped and the error names the
                        instruction each rank was executing;
- Ctrl-C / the notebook's stop button -> the job is stopped, state "stopped".

`start_job` returns the `RunningJob` handle that widgets drive without blocking.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from .cpu_setup import rank_threads
from .profiling import launch_profile, partition_record
from .runs import Run, read_json, read_jsonl, runs_dir, write_json
from .spec import JobSpec
from .tracing import StatusSlot

PACKAGE_PARENT = Path(__file__).resolve().parent.parent
POLL_SECONDS = 0.2
TORCHRUN_GRACE = 10.0
"""Seconds torchrun gets to stop the other ranks and report exit codes after a failure."""
#: One failed rank in torchrun's closing summary: "  rank      : 1 (local_rank: 1)" and
#: on the next line "  exitcode  : 3 (pid: 123)" (negative: killed by that signal).
TORCHRUN_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+)\b.*\n\s*exitcode\s*:\s*(-?\d+)", re.M)
#: Where torchrun's summary names the failure it observed first.
TORCHRUN_ROOT_CAUSE = "Root Cause (first observed failure)"
PEER_FAILURE_TEXTS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


class JobFailed(RuntimeError):
    """A job did not succeed; `.run` holds its record (logs, partial timeline)."""

    def __init__(self, message: str, run: Run):
        super().__init__(message)
        self.run = run


class RunningJob:
    """A started job: poll it, stop it, or wait for its `Run`."""

    def __init__(self, spec: JobSpec, path: Path, process: subprocess.Popen, command: str,
                 notes: list[str]):
        self.spec, self.path, self.process, self.command = spec, path, process, command
        self.notes = notes
        self.started = time.time()
        self.state = "running"
        self.error: str | None = None
        self._started_ranks: set[int] = set()

    # --- observation ---------------------------------------------------------------------------
    def progress(self) -> list[dict]:
        """Steps finished so far (step, loss, seconds), as rank 0 reports them."""
        return read_jsonl(self.path / "progress-rank0.jsonl")

    def poll(self) -> str:
        """Advance the state machine once; returns the state (``"running"`` until the end)."""
        if self.state != "running":
            return self.state
        self._track_workers()
        errors = self._errors()
        code = self.process.poll()
        if errors or code is not None:
            if code is None:  # a rank failed: let torchrun stop the rest and report exit codes
                try:
                    self.process.wait(timeout=TORCHRUN_GRACE)
                except subprocess.TimeoutExpired:
                    pass
                errors = self._errors()
            finished = [r for r in range(self.spec.world_size) if (self.path / f"result-rank{r}.json").exists()]
            if not errors and self.process.returncode == 0 and len(finished) == self.spec.world_size:
                self._finish("succeeded", None)
            else:
                self._finish("failed", self._describe_failure(errors))
        elif time.time() - self.started > self.spec.timeout:
            self._finish("timeout", self._describe_hang())
        return self.state

    def _errors(self) -> list[dict]:
        return [e for r in range(self.spec.world_size)
                if (e := read_json(self.path / f"error-rank{r}.json")) is not None]

    def _track_workers(self) -> None:
        """Remember which ranks have a process, so that a rank that died without a Python
        error can be told from one that never started."""
        if len(self._started_ranks) == self.spec.world_size:
            return
        try:
            for child in psutil.Process(self.process.pid).children():
                rank = child.environ().get("RANK")
                if rank is not None:
                    self._started_ranks.add(int(rank))
        except (psutil.Error, ValueError):
            pass

    def stop(self, reason: str = "stopped by the user") -> None:
        """Stop every process of the job now."""
        if self.state == "running":
            self._finish("stopped", reason)

    def wait(self, *, on_progress: Callable[[list[dict]], None] | None = None) -> Run:
        """Block until the job ends; raise `JobFailed` unless it succeeded. Ctrl-C stops it."""
        seen = -1
        try:
            while self.poll() == "running":
                rows = self.progress()
                if on_progress and len(rows) != seen:
                    seen = len(rows)
                    on_progress(rows)
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            self.stop("interrupted (KeyboardInterrupt)")
            raise
        rows = self.progress()
        if on_progress and len(rows) != seen:  # steps that finished after the last poll
            on_progress(rows)
        return self.result()

    def result(self) -> Run:
        run = Run.load(self.path)
        if self.state != "succeeded":
            raise JobFailed(f"job {self.path.name} {self.state}: {self.error}\n"
                            f"(run directory: {self.path})", run)
        return run

    # --- ending ----------------------------------------------------------------------------------
    def _finish(self, state: str, error: str | None) -> None:
        _kill_tree(self.process)
        self.state, self.error = state, error
        _write_status(self.path, state=state, error=error, started=self.started,
                      finished=time.time(), command=self.command, notes=self.notes)

    def _describe_failure(self, errors: list[dict]) -> str:
        """Name the rank that failed first: the others usually fail *because* of it (their
        peer connection closed), so their errors are reported as consequences."""
        causes = [e for e in errors if not _is_peer_failure(e)]
        if causes:
            return _describe_error(min(causes, key=lambda e: e["time"]), errors)
        log = (self.path / "launcher.log").read_text(errors="replace")
        exit_codes = {int(r): int(c) for r, c in TORCHRUN_FAILURE.findall(log)}
        _, _, root_cause = log.partition(TORCHRUN_ROOT_CAUSE)
        first = [int(r) for r, _ in TORCHRUN_FAILURE.findall(root_cause)]
        reported = {e["rank"] for e in errors}
        # torchrun stops the surviving ranks with SIGTERM: those are consequences, not causes.
        vanished = [r for r in first + sorted(self._started_ranks)
                    if r not in reported and not (self.path / f"result-rank{r}.json").exists()
                    and exit_codes.get(r) != -signal.SIGTERM]
        if vanished:
            rank = vanished[0]
            code = exit_codes.get(rank)
            if code is None:
                how = "died"
            elif code < 0:
                how = f"was killed by {signal.Signals(-code).name} (exit code {code})"
            else:
                how = f"died with exit code {code}"
            after = f" (rank(s) {sorted(reported)} then lost their connection to it)" if reported else ""
            return (f"rank {rank} (stage {rank // self.spec.data_parallel}) {how} and no Python error{after}; "
                    f"the end of its log:\n{_tail(self.path / f'rank{rank}.log')}")
        if errors:
            return _describe_error(min(errors, key=lambda e: e["time"]), errors)
        return (f"torchrun exited with code {self.process.returncode}; the end of launcher.log:\n"
                f"{_tail(self.path / 'launcher.log')}")

    def _describe_hang(self) -> str:
        lines = [f"no progress to the end within timeout={self.spec.timeout:g} s; "
                 "the instruction each rank was executing when it was stopped:"]
        for rank in range(self.spec.world_size):
            status = StatusSlot.read(self.path / f"status-rank{rank}") or "not started (still initialising)"
            lines.append(f"  rank {rank} (stage {rank // self.spec.data_parallel}): {status}")
        lines.append("A rank blocked in recv_* waits for a neighbour; the rank that is not in a "
                     "send/recv is usually the one that hangs.")
        return "\n".join(lines)


def start_job(spec: JobSpec, *, directory: str | Path | None = None) -> RunningJob:
    """Check `spec`, create its run directory and start its processes."""
    spec.check()
    device = _check_device(spec)  # before any profiling: a job that cannot start fails at once
    profile = launch_profile(spec)  # chooses "profile" boundaries and predicts stage costs
    parts = spec.boundaries(profile=profile)
    root = Path(directory) if directory else runs_dir()
    path = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(spec.name or spec.model)}-{secrets.token_hex(3)}"
    path.mkdir(parents=True)
    (path / "spec.json").write_text(spec.to_json(), encoding="utf-8")
    # {"parts", "method", "predicted_stage_costs", "layer_costs", "profile"}: see partition_record
    (path / "partition.json").write_text(json.dumps(partition_record(spec, parts, profile)), encoding="utf-8")

    env, notes = _environment(spec, device)
    args = ["--standalone", f"--nproc-per-node={spec.world_size}", "-m", "utils.job", str(path)]
    shown_env = " ".join(f"{k}={env[k]}" for k in ("OMP_NUM_THREADS", "DS_ACCELERATOR") if k in env)
    command = f"cd {shlex.quote(str(PACKAGE_PARENT))} && {shown_env} torchrun {shlex.join(args)}"
    (path / "command.txt").write_text(command + "\n", encoding="utf-8")
    log = open(path / "launcher.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args],
                               cwd=PACKAGE_PARENT, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    job = RunningJob(spec, path, process, command, notes)
    _write_status(path, state="running", error=None, started=job.started, finished=None,
                  command=command, notes=notes, launcher_pid=os.getpid())
    return job


def run_job(spec: JobSpec | None = None, *, directory: str | Path | None = None,
            progress: bool | Callable[[list[dict]], None] = True, **fields) -> Run:
    """Run a real DeepSpeed pipeline job to the end and return its `Run`.

    ``run_job(JobSpec(num_stages=4))`` or ``run_job(num_stages=4)``. `progress`: True shows
    "step k/N, loss" (a live line in a notebook, a line per step in a terminal), False is
    silent, a callable receives the progress rows. Raises `JobFailed` if the job fails.
    """
    if spec is None:
        spec = JobSpec(**fields)
    elif fields:
        raise TypeError("give either a JobSpec or its fields, not both")
    job = start_job(spec, directory=directory)
    reporter = progress if callable(progress) else (_ProgressLine(job) if progress else None)
    return job.wait(on_progress=reporter)


class _ProgressLine:
    """'step k/N  loss x' as one live line: a display handle in Jupyter, stderr elsewhere."""

    def __init__(self, job: RunningJob):
        self.job = job
        self.handle = None
        for note in job.notes:
            print(f"note: {note}", file=sys.stderr)
        try:
            from IPython import get_ipython

            if get_ipython() is not None and hasattr(get_ipython(), "kernel"):
                from IPython.display import display

                self.handle = display(self._text([]), display_id=True)
        except ImportError:
            pass

    def _text(self, rows: list[dict]) -> str:
        spec = self.job.spec
        head = f"{self.job.path.name}: {spec.num_stages} stages × {spec.micro_batches} micro-batches"
        if not rows:
            return f"{head}: starting ..."
        last = rows[-1]
        return f"{head}: step {last['step'] + 1}/{spec.steps}  loss {last['loss']:.4f}  ({last['seconds']:.2f} s/step)"

    def __call__(self, rows: list[dict]) -> None:
        text = self._text(rows)
        if self.handle is not None:
            self.handle.update(text)
        else:
            print(text, file=sys.stderr)


def _check_device(spec: JobSpec) -> str:
    device = spec.resolved_device()
    if device == "cuda":
        import torch

        available = torch.cuda.device_count()
        if spec.world_size > available:
            raise ValueError(f"the job needs {spec.world_size} GPUs (num_stages × data_parallel) but "
                             f"{available} are visible; use fewer stages or device='cpu'")
    return device


def _environment(spec: JobSpec, device: str) -> tuple[dict[str, str], list[str]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env["DS_ACCELERATOR"] = device
    # DeepSpeed JIT-builds a comm op per torch install; a cache per environment keeps two
    # environments (say a checkout and its CI clone) from rebuilding it for each other.
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    # The process group must outlive the job's own timeout, so the launcher reports hangs.
    env["DEEPSPEED_TIMEOUT"] = str(int(spec.timeout // 60) + 2)
    notes = []
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        cores = len(os.sched_getaffinity(0))
        env["OMP_NUM_THREADS"] = str(rank_threads(spec.world_size))
        if spec.world_size > cores:
            notes.append(f"{spec.world_size} ranks share {cores} CPU cores: timings include contention "
                         "between stages, not only their work")
    return env, notes


def _write_status(path: Path, **status) -> None:
    write_json(path / "status.json", status, indent=2)


def end_process_tree(root: int | Iterable[psutil.Process], *, grace: float = 3.0,
                     reap: float | None = None) -> None:
    """End a process and every process below it, found by parent links (so descendants that
    run in sessions of their own, which a process-group signal would miss, are ended too).

    `root` is a pid (that process and its descendants are listed now) or processes listed
    earlier (say a kernel's children, listed before the kernel shut down). Each gets
    SIGTERM, `grace` seconds to exit, then SIGKILL (at once, without SIGTERM, when `grace`
    is 0); then this waits up to `reap` seconds (default: `grace`) for the killed ones.
    """
    if isinstance(root, int):
        try:
            parent = psutil.Process(root)
            procs = [parent, *parent.children(recursive=True)]
        except psutil.Error:
            procs = []
    else:
        procs = list(root)
    alive = procs
    if grace > 0:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace if reap is None else reap)


def _kill_tree(process: subprocess.Popen, grace: float = 3.0) -> None:
    """End torchrun and every worker (see `end_process_tree`), then reap torchrun."""
    end_process_tree(process.pid, grace=grace)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


def _is_peer_failure(error: dict) -> bool:
    """Errors a rank gets because a *neighbour* went away, not because of its own code."""
    return any(text in error["message"] for text in PEER_FAILURE_TEXTS)


def _describe_error(first: dict, errors: list[dict]) -> str:
    tail = "\n".join(first["traceback"].strip().splitlines()[-12:])
    others = sorted(e["rank"] for e in errors if e is not first)
    also = f" (then rank(s) {others} failed too)" if others else ""
    return (f"rank {first['rank']} (stage {first['stage']}) raised {first['type']}: {first['message']}{also}\n"
            f"--- end of its traceback ---\n{tail}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "job"
