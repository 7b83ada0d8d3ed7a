"""What a learner sees of a real job (issue 16, points 5, 6 and 9): the progress line in a
notebook and in a terminal, the one-line stop after ■, and the printed terminal command
run as pasted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import SMALL_GPT
from utils.system.procs import job_processes
from utils import Run

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
def _spec(steps: int) -> str:
    return f"JobSpec(**{SMALL_GPT!r}, num_stages=2, micro_batches=4, steps={steps})"

#: Seconds the interrupted cell runs before nbclient presses ■ (interrupts the kernel): enough for a
#: warm job (the first cell compiled DeepSpeed's op if it had to) to start and train some steps —
#: a few seconds on a quiet machine, so 45 s leaves room for a start-up 3x slower on shared cores.
INTERRUPT_AFTER = 45


def _notebook(runs_root: Path):
    import nbformat

    setup = (f"import os, sys\nos.chdir({str(ROOT)!r}); sys.path.insert(0, {str(ROOT)!r})\n"
             f"os.environ['WORKBOOK_RUNS'] = {str(runs_root)!r}\n"
             "from tests.helpers import SMALL_GPT\nfrom utils import JobSpec, run_job")
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(setup),
        nbformat.v4.new_code_cell(f"run = run_job({_spec(3)})"),
        nbformat.v4.new_code_cell(f"run_job({_spec(100000)})"),
    ])


def _run_dir(runs_root: Path, line: str) -> Path:
    name = line.split(":", 1)[0]
    assert (runs_root / name).is_dir(), line
    return runs_root / name


def test_a_notebook_shows_phases_and_stop_says_one_line(runs_root):
    from nbclient import NotebookClient

    nb = _notebook(runs_root)
    client = NotebookClient(nb, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                            record_timing=True, timeout_func=lambda cell: INTERRUPT_AFTER
                            if "100000" in cell.source else 600, resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    finished, stopped = nb.cells[1], nb.cells[2]

    for cell in (finished, stopped):
        # Notes (ranks sharing cores, another job) and progress are never stderr: Jupyter draws it red.
        assert not [o for o in cell.outputs if o.output_type == "stream" and o.name == "stderr"], cell.outputs
        shown = [o for o in cell.outputs if o.output_type == "display_data"]
        assert len(shown) == 1, cell.outputs  # one line updated in place, not one per step
        text = shown[0].data["text/plain"]
        assert not text.startswith(("'", '"')), text  # before: a quoted Python string
    line = [o for o in finished.outputs if o.output_type == "display_data"][0].data["text/plain"]
    assert re.search(r"完成 \(succeeded\) · 3/3 steps · 共 \d+ s \(total\)$", line), line
    assert "\n" not in line

    stop_line = [o for o in stopped.outputs if o.output_type == "display_data"][0].data["text/plain"]
    done = int(re.search(r"已停止 \(stopped\) · (\d+)/100000 steps", stop_line)[1])
    errors = [o for o in stopped.outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "JobStopped"
    # Before: a 20-line KeyboardInterrupt traceback into launch.py.
    assert errors[0].traceback == ["已按你的要求停止：2 个进程全部结束 (stopped by you; all 2 processes ended)"]
    path = _run_dir(runs_root, stop_line)
    assert job_processes(path) == [] and Run.load(path).state == "stopped"
    assert done == len(Run.load(path).losses)  # the final line counts what the record holds
    timing = stopped.metadata.execution
    ran = _seconds(timing["shell.execute_reply"]) - _seconds(timing["iopub.execute_input"])
    print(f"interrupted cell: {done} steps done, ended {ran - INTERRUPT_AFTER:.1f} s after ■")
    assert done >= 1, stop_line
    # timing-claim: margin — the stop ends two ranks and torchrun: a second or two on a quiet machine;
    # 60 s holds 3x slower and oversubscribed, while a job left training (100,000 steps) would not end
    assert ran - INTERRUPT_AFTER < 60, ran


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_the_printed_terminal_command_runs_as_pasted_and_shows_progress(runs_root):
    """run_job from a script (its progress on stdout, a line per phase), then its command
    pasted into a shell with no venv activated and no torchrun on the PATH."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.helpers import SMALL_GPT
        from utils import JobSpec, run_job
        run = run_job({_spec(3)}, directory={str(runs_root)!r})
        print("COMMAND", run.command)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    progress = [s for s in lines if " · " in s and not s.startswith("注意")]
    assert "正在启动 2 个进程" in progress[0] and "第 3/3 步 (step 3/3)" in progress[-2]
    assert "完成 (succeeded) · 3/3 steps" in progress[-1]
    assert "note" not in done.stderr and "step" not in done.stderr
    command = next(s for s in lines if s.startswith("COMMAND ")).removeprefix("COMMAND ")
    assert " torchrun " not in command and f" {sys.executable} -m torch.distributed.run " in command

    original = _run_dir(runs_root, progress[-1])
    started = time.time()
    pasted = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=600,
                            env={"HOME": os.environ.get("HOME", "/tmp"), "PATH": "/usr/bin:/bin"}, cwd="/")
    print(f"pasted command ran in {time.time() - started:.1f} s")
    assert pasted.returncode == 0, pasted.stdout[-3000:] + pasted.stderr[-3000:]
    said = pasted.stdout
    for expected in ("正在导入并构建 DeepSpeed 引擎", "第 1/3 步 (step 1/3) · loss", "第 3/3 步 (step 3/3) · loss",
                     "完成 (done): 3 steps"):
        assert expected in said, said
    rerun = Path(re.search(r"record in (\S+)", said)[1])
    assert rerun.parent == original.parent and rerun.name.startswith(f"{original.name}-rerun-")
    rows = [json.loads(s) for s in (rerun / "progress-rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert job_processes(rerun) == []
