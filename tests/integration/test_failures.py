"""Failure behaviour of real jobs: each path ends fast, explains itself, leaves no process."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import SMALL_GPT
from utils.system.procs import job_processes
from utils import Fault, JobFailed, JobSpec, Run, run_job, start_job
from utils.system.fileio import read_json

pytestmark = pytest.mark.integration


def _failing(kind, **extra):
    return JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, steps=3,
                   fault=Fault(kind=kind, stage=1, step=1, instruction="forward"), **extra)


def test_a_raising_rank_fails_the_job_within_seconds(runs_root):
    with pytest.raises(JobFailed) as caught:
        run_job(_failing("raise"), progress=False)
    noticed = time.time()
    run = caught.value.run
    message = str(caught.value)
    assert "rank 1 (stage 1) raised RuntimeError: injected fault" in message
    assert "--- end of its traceback ---" in message and "faults.py" in message
    raised_at = read_json(run.path / "error-rank1.json")["time"]
    print(f"the failure was reported {noticed - raised_at:.1f} s after the rank raised")
    # timing-claim: margin — the launcher polls and ends the other rank: 7 s measured with other jobs on
    # the 2 cores (the former 10 s bound nearly failed); 60 s is 8x that and 5x under the job's default timeout
    # (300 s), which is what would end it if the failure went unnoticed
    assert noticed - raised_at < 60
    assert run.state == "failed" and not run.ok
    assert job_processes(run.path) == []


def test_a_dying_rank_is_named(runs_root):
    with pytest.raises(JobFailed) as caught:
        run_job(_failing("exit"), progress=False)
    assert "rank 1 (stage 1) died with exit code 3" in str(caught.value)
    assert job_processes(caught.value.run.path) == []


def test_a_rank_killed_by_a_signal_is_named(runs_root):
    """As the kernel's out-of-memory killer does: SIGKILL, no Python error, no error file."""
    with pytest.raises(JobFailed) as caught:
        run_job(_failing("killed"), progress=False)
    assert "rank 1 (stage 1) was killed by SIGKILL (exit code -9)" in str(caught.value)
    assert job_processes(caught.value.run.path) == []


def test_stop_ends_every_process(runs_root):
    job = start_job(JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, steps=1000))
    deadline = time.time() + 240  # a guard: start-up takes seconds on a quiet machine
    while not job.progress() and time.time() < deadline:
        assert job.poll() == "running"
        time.sleep(0.2)
    assert job.progress(), "the job never reached its first step"
    assert len(job_processes(job.path)) >= 3  # torchrun + 2 ranks
    job.stop()
    assert job_processes(job.path) == []
    assert Run.load(job.path).state == "stopped"


def test_ctrl_c_stops_the_whole_job(runs_root):
    """What a notebook's stop button does: SIGINT to the process running run_job."""
    script = textwrap.dedent(f"""
        import signal, sys
        # As in a notebook's kernel: Ctrl-C raises KeyboardInterrupt. Python leaves SIGINT ignored
        # when its parent ignored it (the suite run as a background job of a script: acceptance
        # runs 8 and 9 had the job train all its steps through the signal).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.helpers import SMALL_GPT
        from utils import JobSpec, run_job
        run_job(JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, steps=1000), directory={str(runs_root)!r})
    """)
    before = set(runs_root.iterdir())
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240  # a guard: start-up takes seconds on a quiet machine
    run_path = None
    while time.time() < deadline:
        new = set(runs_root.iterdir()) - before
        if new and (run_path := new.pop()) and (run_path / "progress-rank0.jsonl").exists():
            break
        time.sleep(0.2)
    assert run_path is not None, "the job never started"
    proc.send_signal(signal.SIGINT)
    # A bound, not a claim: stopping takes a few seconds on a quiet machine (the launcher's grace is
    # 3 s per process tree); 120 s holds on a machine 3x slower with every core taken.
    _, err = proc.communicate(timeout=120)
    # A KeyboardInterrupt still (the script stops there), saying what became of the job.
    assert "JobStopped: 已按你的要求停止：2 个进程全部结束 (stopped by you; all 2 processes ended)" in err
    assert "During handling of the above exception" not in err  # not the interrupt's own traceback too
    assert proc.returncode != 0
    assert job_processes(run_path) == []
    assert Run.load(run_path).state == "stopped"


def test_bad_specs_fail_before_any_process_starts(runs_root):
    before = set(runs_root.iterdir())
    with pytest.raises(ValueError, match="every stage needs at least one layer"):
        run_job(JobSpec(**SMALL_GPT, num_stages=5))
    with pytest.raises(ValueError, match="DeepSpeed asserts they are equal"):
        run_job(JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, train_batch_size=12))
    with pytest.raises(ValueError, match="unknown model preset"):
        run_job(JobSpec(model="gpt3"))
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "":
        import torch

        if not torch.cuda.is_available():
            with pytest.raises(ValueError, match="GPUs"):
                run_job(JobSpec(**SMALL_GPT, device="cuda"))
    assert set(runs_root.iterdir()) == before
