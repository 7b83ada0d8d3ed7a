"""Start a real multi-process DeepSpeed pipeline job and watch it to the end.

`run_job(spec)` plans the job (`plan_job`: check, device, profile, boundaries), creates its
run directory, starts its ranks through a `Launcher` (``torchrun --standalone`` on this
machine by default; the command is saved in ``command.txt`` so a learner can run it in a
terminal), shows progress, and returns a `Run`. Whatever happens the job ends with no
process left behind:

- a rank raises      -> its error file appears; the job is stopped and `JobFailed` names the
                        rank, its stage and the tail of its traceback, within seconds;
- a rank dies        -> the launcher reports the root cause; the same error names it;
- a rank hangs       -> after `spec.timeout` the job is stopped and the error names the
                        instruction each rank was executing;
- a rank is stopped  -> (SIGSTOP, ^Z) the same report after `FROZEN_AFTER` seconds, not the
                        whole timeout: its peers would wait for it that long;
- Ctrl-C / the notebook's stop button -> the job is stopped, state "stopped", and
                        `JobStopped` (a KeyboardInterrupt) says so in one line.

`start_job` returns the `RunningJob` handle that widgets drive without blocking.
"""

from __future__ import annotations

import atexit
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil

from utils.jobs.launchers import RANK_PROGRAM, Launcher
from utils.jobs.multinode import launcher_for
from utils.jobs.plan import JobPlan, plan_job
from utils.jobs.progress import ProgressLine
from utils.jobs.failure import FirstFailure, describe_death, describe_error, first_failure, tail
from utils.jobs.records import Failure, RankEnd
from utils.jobs.rundir import RunDir, RunState
from utils.jobs.runs import Run
from utils.jobs.spec import JobSpec
from utils.jobs.hangs import describe_hang, process_state

POLL_SECONDS = 0.2
FROZEN_AFTER = 10.0
"""Seconds a rank's process may stay stopped (SIGSTOP, ^Z) before the watch ends the job: its
peers would wait for it in a collective until the job's timeout (300 s by default)."""
LAUNCHER_GRACE = 30.0
"""Seconds the launcher gets to stop the other ranks and report exit codes after a failure
(it usually takes 1-2 s; the wait ends when it exits). On a busy machine its summary came
after 10 s: elastic's failure logging imports ``torch._dynamo`` in the agent."""

# Every job this process started and has not seen end: stopped when the process exits (a
# kernel restart, a script that ends after start_job), so no DeepSpeed process outlives it.
# Strong references: a job nobody holds any more must still be stopped.
_LIVE_JOBS: set[RunningJob] = set()


@atexit.register
def _stop_live_jobs() -> None:
    for job in list(_LIVE_JOBS):
        try:
            if job.poll() == "running":  # one that finished unobserved is recorded as such
                job.stop("the process that started it exited")
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class JobFailed(RuntimeError):
    """A job did not succeed; `.run` holds its record (logs, partial timeline)."""

    def __init__(self, message: str, run: Run):
        super().__init__(message)
        self.run = run


class JobStopped(KeyboardInterrupt):
    """Ctrl-C or the notebook's ■ stopped a job that `RunningJob.wait` was watching, and
    every process of it ended.

    A KeyboardInterrupt still (a script or a "run all" stops there, as the learner asked),
    but one line instead of a traceback into this module: the stop was asked for and
    worked, so there is nothing to debug. IPython shows exceptions through
    `_render_traceback_` when they have one.
    """

    def __init__(self, message: str, run_path: Path | None):
        super().__init__(message)
        self.run_path = run_path
        """The stopped job's run directory (None when it was stopped before it had one)."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


class RunningJob:
    """A started job: poll it, stop it, or wait for its `Run`."""

    def __init__(self, plan: JobPlan, run_dir: RunDir, launcher: Launcher, command: str):
        self.plan, self.run_dir, self.launcher, self.command = plan, run_dir, launcher, command
        self.spec, self.path, self.notes = plan.spec, run_dir.path, list(plan.notes)
        self.started = time.time()
        self.ended: float | None = None
        """When this object saw the job end (stopped, failed or finished)."""
        self.state: RunState = "running"
        self.error: str | None = None
        self.failure: Failure | None = None
        """How it failed or hung, as facts (`Failure`; recorded in ``status.json``)."""
        self._started_ranks: set[int] = set()
        self._status_unwritten = False
        self.restarts: list[int] = []
        """Steps before which a restart-mode job was relaunched (`repartition_mode="restart"`)."""
        self._stopped_since: dict[int, float] = {}
        """Rank -> when this watch first saw its process stopped (SIGSTOP, ^Z), while it stays so."""
        self._frozen_checked = 0.0

    # --- observation ---------------------------------------------------------------------------
    def progress(self) -> list[dict]:
        """Steps finished so far (step, loss, seconds), as rank 0 reports them."""
        return self.run_dir.progress(0)

    def poll(self) -> RunState:
        """Advance the state machine once; returns the state (``"running"`` until the end)."""
        if self.state != "running":
            return self.state
        if len(self._started_ranks) < self.spec.world_size:
            # Remembered so that a rank that died without a Python error can be told from one
            # that never started.
            self._started_ranks.update(self.launcher.workers())
        errors = self._errors()
        code = self.launcher.returncode()
        if errors or code is not None:
            if code is None:  # a rank failed: let the launcher stop the rest and report exit codes
                self.launcher.wait(LAUNCHER_GRACE)
                errors = self._errors()
            finished = [r for r in range(self.spec.world_size) if self.run_dir.result_file(r).exists()]
            if not errors and self.launcher.returncode() == 0 and self._relaunch_due(finished):
                self.launcher.stop()  # nothing runs any more; this clears its temporary files
                self.restarts.append(self._relaunch_due(finished))
                self._started_ranks.clear()
                self.launcher.start(self.plan, self.run_dir)
            elif not errors and self.launcher.returncode() == 0 and len(finished) == self.spec.world_size:
                self._finish("succeeded", None)
            else:
                self._finish("failed", *self._describe_failure(errors))
        elif time.time() - self.started > self.spec.timeout:
            self._finish("timeout", *describe_hang(self))
        elif (frozen := self._frozen_ranks()):
            self._finish("timeout", *describe_hang(self, f"rank(s) {frozen} stopped (process state 'stopped') "
                                                         f"for {FROZEN_AFTER:g} s or more: the job cannot go on",
                                                   frozen=frozen))
        return self.state

    def _frozen_ranks(self) -> list[int]:
        """Ranks whose process has been stopped (SIGSTOP, ^Z) for `FROZEN_AFTER` seconds: the
        others wait for them in a collective until the job's timeout, which this watch does not
        wait out. A rank that runs again within the window is forgotten."""
        now = time.time()
        if now - self._frozen_checked < 1.0:  # a process-table walk: once a second is enough
            return []
        self._frozen_checked = now
        for rank, process in self.launcher.workers().items():
            if process_state(process) == psutil.STATUS_STOPPED:
                self._stopped_since.setdefault(rank, now)
            else:
                self._stopped_since.pop(rank, None)
        return sorted(rank for rank, since in self._stopped_since.items() if now - since >= FROZEN_AFTER)

    def _relaunch_due(self, finished: list[int]) -> int | None:
        """The step a restart-mode job asked to be relaunched before, if it did and this
        launch has not relaunched it yet (its ranks exited cleanly without results)."""
        if finished or self.spec.repartition_mode != "restart":
            return None
        step = (self.run_dir.read_restart() or {}).get("step")
        return step if isinstance(step, int) and step not in self.restarts else None

    def _errors(self) -> list[dict]:
        return [e for r in range(self.spec.world_size) if (e := self.run_dir.error(r)) is not None]

    def stop(self, reason: str = "stopped by the user") -> None:
        """Stop every process of the job now."""
        if self.state == "running":
            self._finish("stopped", reason)

    def wait(self, *, on_progress: Callable[[list[dict]], None] | None = None,
             on_poll: Callable[[list[dict]], None] | None = None) -> Run:
        """Block until the job ends; raise `JobFailed` unless it succeeded.

        `on_progress` gets the progress rows whenever a step finished; `on_poll` gets them
        at every poll (5 times a second), for a display whose clock runs. Ctrl-C (the
        notebook's ■) stops every process of the job and raises `JobStopped`.
        """
        seen = -1
        try:
            while self.poll() == "running":
                rows = self.progress()
                if on_progress and len(rows) != seen:
                    seen = len(rows)
                    on_progress(rows)
                if on_poll:
                    on_poll(rows)
                self._pause()
        except KeyboardInterrupt:
            raise JobStopped(self._stop_on_interrupt(), self.path) from None
        except Exception:  # a callback failed: the job must not run on unwatched
            self.stop("the process watching it failed")
            raise
        rows = self.progress()
        if on_progress and len(rows) != seen:  # steps that finished after the last poll
            on_progress(rows)
        return self.result()

    def _pause(self) -> None:
        """Wait until the next poll: `POLL_SECONDS`, or less when the launcher exits first.

        Why: a job ends when its launcher exits, and sleeping a fixed interval would add half
        of it, on average, to every job (0.1 s; a few hundred jobs in the test suite). A
        launcher with nothing left to wait for returns at once, so the rest is slept.
        """
        started = time.monotonic()
        self.launcher.wait(POLL_SECONDS)
        if self.launcher.returncode() is None:
            time.sleep(max(0.0, POLL_SECONDS - (time.monotonic() - started)))

    def _stop_on_interrupt(self) -> str:
        """Stop the job after a KeyboardInterrupt, even through more of them (a learner
        pressing ■ twice must not leave ranks running), and say in one line what became
        of its processes."""
        while True:
            try:
                self.stop("stopped by you (KeyboardInterrupt)")
                left = sorted(p.pid for p in self.launcher.workers().values())
                break
            except KeyboardInterrupt:
                continue
        n = self.spec.world_size
        if left:
            return (f"已停止，但仍有 {len(left)} 个进程在运行 (stopped, but {len(left)} processes still run: "
                    f"pids {left}); run directory {self.path}")
        return f"已按你的要求停止：{n} 个进程全部结束 (stopped by you; all {n} processes ended)"

    def result(self) -> Run:
        run = Run.load(self.path)
        if self._status_unwritten:  # the record on disk is stale; this object knows better
            run.state, run.error, run.failure = self.state, self.error, self.failure
        if self.state != "succeeded":
            raise JobFailed(f"job {self.path.name} {self.state}: {self.error}\n"
                            f"(run directory: {self.path})", run)
        return run

    # --- ending ----------------------------------------------------------------------------------
    def _finish(self, state: RunState, error: str | None, failure: Failure | None = None) -> None:
        self.launcher.stop()
        _LIVE_JOBS.discard(self)
        self.state, self.error, self.failure, self.ended = state, error, failure, time.time()
        try:
            self.run_dir.write_status(state=state, error=error, started=self.started, finished=time.time(),
                                      command=self.command, notes=self.notes, failure=failure)
        except OSError as exc:  # the record cannot say it: the error must, and the job failed
            self._status_unwritten = True
            self.state = "failed" if state == "succeeded" else state
            self.error = (f"{error or 'the job itself finished'}\n(the run directory is not writable, so its "
                          f"record could not be updated: {exc}; its status.json still says 'running')")

    def _describe_failure(self, errors: list[dict]) -> tuple[str, Failure]:
        """Name the rank that failed first (`first_failure`: the others usually fail *because*
        of it, their peer connection closed), in words and as facts."""
        now = time.time()
        trouble = self.launcher.node_trouble(self.run_dir)
        if trouble:  # a lost node explains its peers' errors; a missing one, why nothing ran
            return trouble, Failure(kind="node", time=now)
        first = first_failure(errors, self._ended_alone(errors))
        if first is not None and first.error is not None and first.cause:
            return describe_error(first.error, errors), self._facts("error", first, errors, now)
        if not os.access(self.path, os.W_OK):
            return (f"the run directory {self.path} is not writable, so the ranks could not record their "
                    "steps; make it writable (or choose another folder: WORKBOOK_RUNS) and run again"), \
                Failure(kind="unwritable", time=now)
        code = self.launcher.returncode()
        # The launcher itself was killed: its ranks exit with it (any errors are only peers
        # losing each other, whichever rank noticed first), so name the launcher.
        if code is not None and code < 0:
            return (f"{self.launcher.name} (the launcher, pid {self.launcher.pid}) was killed by "
                    f"{signal.Signals(-code).name}; its ranks ended with it. Something outside the job "
                    "killed it: the out-of-memory killer, a `kill`, a job scheduler"), \
                Failure(kind="launcher", exit_code=code, time=now)
        if first is not None and first.died is not None:
            return (describe_death(self.run_dir, first.died, [e["rank"] for e in errors]),
                    self._facts("died", first, errors, now))
        if first is not None:
            return describe_error(first.error, errors), self._facts("error", first, errors, now)
        return (f"the launcher exited with code {code}; the end of "
                f"{RunDir.LAUNCHER_LOG}:\n{tail(self.run_dir.file(RunDir.LAUNCHER_LOG))}"), \
            Failure(kind="launcher", exit_code=code, time=now)

    def _ended_alone(self, errors: list[dict]) -> list[RankEnd]:
        """Ranks that ended without an error record or a result, and not because the launcher
        stopped them (it stops the survivors with SIGTERM: consequences, not causes), the one
        it saw fail first first."""
        report = self.launcher.exit_report(self.run_dir)
        reported = {e["rank"] for e in errors}
        ended = []
        for rank in dict.fromkeys([*report.first_failed, *sorted(self._started_ranks)]):
            if rank in reported or self.run_dir.result_file(rank).exists() or report.stopped_by_launcher(rank):
                continue
            code = report.exit_codes.get(rank)
            ended.append(RankEnd(rank=rank, stage=self.spec.stage_of_rank(rank), exit_code=code,
                                 signal=signal.Signals(-code).name if code is not None and code < 0 else None))
        return ended

    def _facts(self, kind: str, first: FirstFailure, errors: list[dict], now: float) -> Failure:
        return Failure(kind=kind, rank=first.rank, stage=self.spec.stage_of_rank(first.rank), died=first.died,
                       also=tuple(sorted(e["rank"] for e in errors if e["rank"] != first.rank)), time=now)


def start_job(spec: JobSpec, *, directory: str | Path | None = None,
              launcher: Launcher | None = None) -> RunningJob:
    """Plan `spec` (`plan_job`), create its run directory and start its processes."""
    plan = plan_job(spec, directory=directory)
    launcher = launcher or launcher_for(plan)
    launcher.check(plan)
    others = _other_jobs_running()
    if others:
        plan = replace(plan, notes=(*plan.notes, f"another workbook job is running on this machine "
                                                 f"({', '.join(others)}): both share the cores, so timings "
                                                 "include each other"))
    run_dir = RunDir.create(spec.name or spec.model, directory)
    run_dir.write_spec(spec.to_dict())
    run_dir.write_plan(plan.to_record())
    command = launcher.command(plan, run_dir)
    run_dir.write_command(command)
    plan = replace(plan, notes=(*plan.notes, *launcher.notes(plan, run_dir)))
    try:
        launcher.start(plan, run_dir)
        job = RunningJob(plan, run_dir, launcher, command)
        _LIVE_JOBS.add(job)
    except BaseException:  # Ctrl-C while starting: no job handle exists yet to stop them later
        if launcher.pid is not None:
            launcher.stop()
        raise
    run_dir.write_status(state="running", error=None, started=job.started, finished=None,
                         command=command, notes=job.notes, launcher_pid=os.getpid())
    return job


def run_job(spec: JobSpec | None = None, *, directory: str | Path | None = None,
            progress: bool | Callable[[list[dict]], None] = True, **fields) -> Run:
    """Run a real pipeline job to the end and return its `Run` (on DeepSpeed's engine, or on
    torch's pipelining for the schedules DeepSpeed cannot run: `JobSpec.runtime`).

    ``run_job(JobSpec(num_stages=4))`` or ``run_job(num_stages=4)``. `progress`: True shows
    the job's phase and elapsed time (starting N processes, compiling, step k/N with loss and
    s/step; `utils.jobs.progress.ProgressLine`: one updating line in a notebook or a
    terminal), False is silent, a callable receives the progress rows after every step.
    Raises `JobFailed` if the job fails, `JobStopped` (one line) when Ctrl-C / ■ stopped it.
    """
    if spec is None:
        spec = JobSpec(**fields)
    elif fields:
        raise TypeError("give either a JobSpec or its fields, not both")
    try:
        job = start_job(spec, directory=directory)
    except KeyboardInterrupt:  # while planning or profiling: start_job left nothing running
        raise JobStopped("已按你的要求停止：任务还没有启动，没有进程在运行 "
                         "(stopped by you before the job started; no process runs)", None) from None
    if callable(progress) or not progress:
        return job.wait(on_progress=progress or None)
    line = None
    try:
        line = ProgressLine(job)
        return job.wait(on_poll=line.update)
    except KeyboardInterrupt as exc:  # between start and wait: stopped the same way
        if isinstance(exc, JobStopped):
            raise
        raise JobStopped(job._stop_on_interrupt(), job.path) from None
    finally:
        if line is not None:
            line.close()  # the end state, whatever ended it


def _other_jobs_running() -> list[str]:
    """Run directories of workbook jobs whose ranks are running on this machine now."""
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if RANK_PROGRAM in cmdline and cmdline[-1] != RANK_PROGRAM:
            found.add(Path(cmdline[-1]).name)
    return sorted(found)
