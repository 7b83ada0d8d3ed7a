"""No job leaves anything in ``/dev/shm`` (issue 38, point 1): real CPU jobs on both
launchers, ending every way a job ends — succeeded, failed, stopped — and a DeepSpeed-runner
job whose launching process was killed, whose buffers the next job removes.

DeepSpeed's CPU communication op gives each rank a ~66 MiB shared-memory buffer when
DeepSpeed's own launcher starts the ranks (``LOCAL_SIZE``) and never removes it
(`utils.system.shm`); torchrun's ranks make none.
"""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import SMALL_GPT
from utils import Fault, JobSpec, run_job, start_job
from utils.system import shm
from utils.system.procs import end_process_tree, job_processes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _spec(launcher: str, **extra) -> JobSpec:
    return JobSpec(**SMALL_GPT, num_stages=2, micro_batches=2, device="cpu", launcher=launcher,
                   **{"steps": 2, **extra})


def _ended_watching(job, *, stop: bool = False) -> set[str]:
    """Wait for `job` to end (or, with `stop`, stop it once both engines exist), collecting the
    names of the /dev/shm files its processes hold along the way: what belongs to this job,
    told apart from other programs' files on a shared machine."""
    held: set[str] = set()
    deadline = time.time() + 300  # a guard; these jobs take seconds on a quiet machine
    while job.poll() == "running" and time.time() < deadline:
        held |= shm.mapped_shm_files(pids=[p.pid for p in job_processes(job.path)])
        if stop and all(job.run_dir.status_slot(r).exists() for r in range(2)):
            job.stop()
        time.sleep(0.1)
    return held


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_no_job_leaves_shared_memory_however_it_ends(runs_root, launcher):
    endings = {"succeeded": {}, "failed": {"fault": Fault(kind="raise", stage=1, step=1)},
               "stopped": {"steps": 100_000, "timeout": 600}}
    for ending, extra in endings.items():
        job = start_job(_spec(launcher, name=f"shm-{launcher}-{ending}", **extra), directory=runs_root)
        held = _ended_watching(job, stop=ending == "stopped")
        assert job.state == ending
        buffers = {p.name for p in shm.SHM_DIR.glob(f"{shm.BUFFER_PREFIX}_*")}
        mine = shm.job_prefix("127.0.0.1", getattr(job.launcher, "port", -1))
        if launcher == "deepspeed" and ending == "stopped":  # the buffers this test is about existed
            assert {f"{mine}0", f"{mine}1"} <= held, held
        left = sorted({n for n in held if (shm.SHM_DIR / n).exists()} | {n for n in buffers if n.startswith(mine)})
        size = sum((shm.SHM_DIR / n).stat().st_size for n in left if (shm.SHM_DIR / n).exists())
        print(f"{launcher} {ending}: its processes held {len(held)} files in /dev/shm, left {len(left)} ({size} bytes)")
        assert left == [], ending


def test_buffers_of_a_killed_notebooks_job_are_removed_by_the_next_job(runs_root):
    """The launching process killed with SIGKILL: nothing of it can clean up. Its ranks end by
    themselves (they watch the launcher); the next job finds the buffers that no process holds
    and removes them, and says so in its launcher log."""
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.helpers import SMALL_GPT
        from utils import JobSpec, start_job
        job = start_job(JobSpec(**SMALL_GPT, num_stages=2, micro_batches=2, steps=100_000, timeout=600,
                                device="cpu", launcher="deepspeed", name="shm-killed"), directory={str(runs_root)!r})
        print(job.path, job.launcher.port, flush=True)
        deadline = time.time() + 240
        while time.time() < deadline and not all(job.run_dir.status_slot(r).exists() for r in range(2)):
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    path, port = proc.stdout.readline().split()
    try:
        proc.wait(timeout=300)
        gone = time.time()
        while job_processes(Path(path)) and time.time() - gone < 60:  # the ranks notice in seconds
            time.sleep(0.2)
        assert job_processes(Path(path)) == []
        left = [p.name for p in shm.job_buffers("127.0.0.1", int(port))]
        assert len(left) == 2, left  # what DeepSpeed leaves when no launcher cleans up
    finally:
        end_process_tree(job_processes(Path(path)), grace=0)
        proc.kill()
        proc.wait()

    run = run_job(_spec("torchrun", name="shm-next"), directory=runs_root, progress=False)
    assert shm.job_buffers("127.0.0.1", int(port)) == []
    log = (run.path / "launcher.log").read_text()
    assert "removed 2 DeepSpeed shared-memory buffer(s)" in log and left[0] in log

