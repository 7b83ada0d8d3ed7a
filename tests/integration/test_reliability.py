"""Real jobs hurt from outside: each case used to hang, leak or explain itself badly."""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import SMALL_GPT
from utils.system.procs import job_processes
from utils import JobFailed, JobSpec, Run, run_job, start_job
from utils.jobs.rundir import RunDir

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LONG = {**SMALL_GPT, "num_stages": 2, "micro_batches": 4, "steps": 100_000}  # ~10 ms a step


def _wait_for_steps(job, steps: int = 1, limit: float = 240.0) -> None:
    deadline = time.time() + limit
    while len(job.progress()) < steps:
        # timing-claim: margin — a guard, not a measurement: the job's start-up and first ~10 ms steps
        # take seconds on a quiet machine; 240 s holds 3x slower and oversubscribed
        assert job.poll() == "running" and time.time() < deadline, "the job never reached its steps"
        time.sleep(0.1)


def test_a_script_that_exits_after_start_job_stops_its_job(runs_root):
    # Before, only RunPanel's jobs were stopped at exit: this job trained on, orphaned.
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.helpers import SMALL_GPT
        from utils import JobSpec, start_job
        job = start_job(JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, steps=1000), directory={str(runs_root)!r})
        while not job.progress():
            time.sleep(0.1)
        print(job.path, flush=True)
    """)  # ... and the interpreter exits here, with the job running
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    run_path = Path(done.stdout.strip())
    assert done.returncode == 0 and run_path.exists(), done.stderr
    assert job_processes(run_path) == []
    run = Run.load(run_path)
    assert run.state == "stopped" and "the process that started it exited" in run.error


def test_an_unwritable_record_fails_the_job_with_the_reason(runs_root, monkeypatch):
    # Before, wait() raised a raw PermissionError on status.json.<pid>.tmp and the run
    # directory kept saying "running".
    real = RunDir.write_status

    def refused(self, **status):
        if status["state"] != "running":
            raise PermissionError(13, "Permission denied", str(self.file(RunDir.STATUS)))
        real(self, **status)

    monkeypatch.setattr(RunDir, "write_status", refused)
    with pytest.raises(JobFailed, match=r"not writable, so its record could not be updated: .*Permission denied"):
        run_job(JobSpec(**SMALL_GPT, num_stages=2, micro_batches=2, steps=1), progress=False)


def test_a_job_too_slow_for_its_timeout_is_not_called_hung(runs_root):
    # Before: "no progress to the end ..." and the hint about ranks blocked in recv.
    # The timeout counts from the start, so the job must be past its start-up (seconds on a quiet
    # machine) and training when it strikes: 45 s leaves room for a start-up 3x slower on shared
    # cores, and 100,000 steps of ~10 ms stay far beyond it on any machine.
    with pytest.raises(JobFailed) as caught:
        run_job(JobSpec(**{**LONG, "timeout": 45.0}), progress=False)
    message = str(caught.value)
    assert "too slow for timeout=45 s" in message and "s/step" in message, message
    assert "recv" not in message
    assert caught.value.run.state == "timeout" and job_processes(caught.value.run.path) == []


def test_a_killed_torchrun_is_named(runs_root):
    # Before, SIGKILL of torchrun itself was reported as "rank 0 died".
    job = start_job(JobSpec(**LONG))
    _wait_for_steps(job)
    job.launcher.agents[0].send_signal(signal.SIGKILL)
    with pytest.raises(JobFailed) as caught:
        job.wait()
    message = str(caught.value)
    assert "torchrun (the launcher, pid" in message and "killed by SIGKILL" in message, message
    assert job_processes(job.path) == []


def test_a_frozen_rank_is_named_in_the_hang_report(runs_root):
    # Before, the report showed rank 1 in recv_* and rank 0 in send_*, and could not say which
    # one was stuck.
    job = start_job(JobSpec(**{**LONG, "timeout": 45.0}))  # past start-up (see above) before it strikes
    _wait_for_steps(job, 2)
    job.launcher.workers()[1].send_signal(signal.SIGSTOP)
    with pytest.raises(JobFailed) as caught:
        job.wait()
    message = str(caught.value)
    assert "Rank(s) [1] are stopped" in message and "process stopped" in message, message
    assert "too slow" not in message
    assert job_processes(job.path) == []  # SIGKILL ends a stopped process too


def test_a_second_job_at_once_is_noted(runs_root):
    first = start_job(JobSpec(**LONG))
    try:
        _wait_for_steps(first)
        second = start_job(JobSpec(**{**SMALL_GPT, "num_stages": 2, "steps": 1}))
        second.wait()
        assert any("another workbook job is running" in n and first.path.name in n for n in second.notes)
        assert not any("another workbook job" in n for n in first.notes)
    finally:
        first.stop()
    assert job_processes(first.path) == []


def test_an_unusable_runs_folder_says_what_to_do(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "runs-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("WORKBOOK_RUNS", str(not_a_folder))
    # Before: a raw NotADirectoryError / PermissionError from mkdir.
    with pytest.raises(OSError, match=r"cannot create a run directory under .*runs-file .*set WORKBOOK_RUNS"):
        run_job(JobSpec(**SMALL_GPT, num_stages=2, steps=1), progress=False)
