"""What the launcher leaves behind or trips over, on real jobs: a stale JIT build lock, a
launching process that dies, ``command.txt`` run again, torchrun's temporary folders."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import SMALL_GPT
from utils.system.procs import job_processes
from utils import JobSpec, Run, run_job, start_job
from utils.system.extensions import extensions_dir
from utils.system.procs import end_process_tree

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _small(**extra):
    return JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, **{"steps": 3, **extra})


def test_a_stale_build_lock_does_not_hang_the_job(runs_root, tmp_path, monkeypatch):
    """A job stopped while its ranks JIT-built DeepSpeed's op leaves the build lock behind;
    every later rank would wait for it forever."""
    built = extensions_dir() / "deepspeed_shm_comm"
    if not (built / "deepspeed_shm_comm.so").exists():  # a fresh environment: build it once
        run_job(_small(steps=1), progress=False)
    extensions = tmp_path / "torch_extensions"
    # copy2 keeps the modification times, so ninja finds the op up to date: no rebuild.
    shutil.copytree(built, extensions / "deepspeed_shm_comm", ignore=shutil.ignore_patterns("lock"))
    lock = extensions / "deepspeed_shm_comm" / "lock"
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))  # as FileBaton does, by a process gone since
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))

    job = start_job(_small(timeout=90))
    run = job.wait()
    assert run.ok and len(run.losses) == 3
    assert not lock.exists()
    assert f"removed stale JIT build lock(s) that no live process held (left by a build that was " \
           f"stopped midway): {lock}" in (run.path / "launcher.log").read_text()

    # What the hang report will append: no lock now; a lock held open names its holder; an
    # unheld one is called stale.
    assert job.launcher.blocking_build_locks() is None
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)
    try:
        held = job.launcher.blocking_build_locks()
        assert str(lock) in held and f"held by pid {os.getpid()}:" in held
    finally:
        os.close(fd)
    stale = job.launcher.blocking_build_locks()
    assert str(lock) in stale and "held by no live process" in stale
    lock.unlink()


@pytest.mark.parametrize("ending", ["killed", "exited"])
def test_ranks_end_when_the_launching_process_is_gone(runs_root, ending):
    """torchrun runs in a session of its own: a notebook killed with SIGKILL, or a script
    that exits after start_job, would leave it and the ranks training for the whole job."""
    end = "os.kill(os.getpid(), signal.SIGKILL)" if ending == "killed" else "os._exit(0)"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.helpers import SMALL_GPT
        from utils import JobSpec, start_job
        job = start_job(JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, steps=100_000, timeout=900),
                        directory={str(runs_root)!r})
        print(job.path, flush=True)
        deadline = time.time() + 200  # a guard: the ranks start in seconds on a quiet machine
        while time.time() < deadline and not all(job.run_dir.status_slot(r).exists() for r in range(2)):
            time.sleep(0.1)
        {end}
    """)
    # os._exit skips atexit hooks: what this test checks is that the ranks notice by themselves.
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line, "the script did not start the job"
    run_path = Path(line)
    try:
        proc.wait(timeout=300)
        gone = time.time()
        assert proc.returncode == (-signal.SIGKILL if ending == "killed" else 0)
        assert (run_path / "status-rank0").exists() and (run_path / "status-rank1").exists(), \
            "the ranks never started"
        # Each rank checks for its launcher every 0.5 s, then torchrun sees its ranks fail: a few
        # seconds on a quiet machine; 60 s leaves room for 3x slower, oversubscribed ranks, and
        # without the check the job (timeout 900 s) would run on.
        while job_processes(run_path) and time.time() - gone < 60:
            time.sleep(0.2)
        print(f"the job's processes were gone {time.time() - gone:.1f} s after the launching process")
        assert job_processes(run_path) == []
        # The first rank to notice says why; the other may fail first on the lost connection.
        logs = (run_path / "rank0.log").read_text() + (run_path / "rank1.log").read_text()
        assert "the process that launched this job" in logs
    finally:
        end_process_tree(job_processes(run_path), grace=0)
        proc.kill()
        proc.wait()


def test_running_command_txt_again_records_a_new_run(runs_root, tmp_path):
    """The README invites running ``run.command`` in a terminal; it must not append a second
    copy of every step to the run it came from. (Both runs also show that torchrun, which
    makes a torchelastic_* folder per job and never removes it, leaves nothing in the
    temporary directory.)"""
    tmp = Path(tempfile.gettempdir())
    before_tmp = set(tmp.glob("torchelastic_*"))
    run = run_job(_small(), progress=False)
    assert set(tmp.glob("torchelastic_*")) - before_tmp == set()
    assert not (run.path / "tmp").exists()
    records = sorted(p.name for p in run.path.iterdir() if p.name.startswith(("progress-", "events-")))
    before = {name: (run.path / name).read_bytes() for name in records}
    assert len(records) == 4

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TMPDIR=str(tmp_path), TORCH_EXTENSIONS_DIR=str(extensions_dir()))
    done = subprocess.run(["bash", "-c", run.command], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # by hand too: torchrun's torchelastic_* folder went into the command's own temporary folder, removed
    assert list(tmp_path.iterdir()) == []

    assert {name: (run.path / name).read_bytes() for name in records} == before
    assert len(Run.load(run.path).losses) == 3
    (rerun_path,) = [p for p in runs_root.iterdir() if p.name.startswith(f"{run.path.name}-rerun-")]
    assert f"this run is recorded in {rerun_path}, not in {run.path}" in done.stdout
    rerun = Run.load(rerun_path)
    assert len(rerun.progress(0)) == len(rerun.progress(1)) == 3
    assert rerun.losses == run.losses  # the same seed: bit-identical
    assert (rerun_path / "spec.json").read_text() == (run.path / "spec.json").read_text()
