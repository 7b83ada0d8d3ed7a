"""What `run_job` shows while a job runs (issue 16, points 5 and 9), without starting processes.

A `RunningJob` over a real run directory and a real, unstarted `LocalTorchrun`: the phase is
read from the files a job leaves (build locks, status slots, progress rows), so writing
those files walks it through every phase.
"""

import html
import io
import json
import os
import pty
import shlex
import subprocess
import sys
import time

import pytest

from utils import JobSpec, plan_job
from utils.jobs.launch import JobStopped, RunningJob
from utils.jobs.launchers import LocalTorchrun
from utils.jobs.progress import ProgressLine, job_phase, phase_text
from utils.jobs.rundir import RunDir, StatusSlot
from utils.system.paths import PROJECT_ROOT

SPEC = JobSpec(num_stages=2, micro_batches=4, steps=3, device="cpu", model_options={"blocks": 2})


@pytest.fixture
def job(tmp_path):
    launcher = LocalTorchrun()
    launcher.extensions_dir = tmp_path / "extensions"
    launcher.extensions_dir.mkdir()
    run_dir = RunDir.create("progress", tmp_path / "runs")
    plan = plan_job(SPEC)
    return RunningJob(plan, run_dir, launcher, launcher.command(plan, run_dir))


def _add_step(job, step, loss=2.5, seconds=0.25):
    with open(job.run_dir.progress_file(0), "a") as f:
        f.write(json.dumps({"step": step, "loss": loss, "seconds": seconds}) + "\n")


def test_the_phase_walks_from_starting_to_the_last_step(job):
    phase = job_phase(job)
    assert phase.name == "starting" and phase.done == 0
    assert "正在启动 2 个进程 (starting 2 processes" in phase_text(job, phase)

    op = job.launcher.extensions_dir / "deepspeed_shm_comm"
    op.mkdir()
    (op / "lock").write_text("")  # a first build: a lock and no library yet
    phase = job_phase(job)
    assert phase.name == "compiling" and phase.ops == ("deepspeed_shm_comm",)
    assert "正在编译 DeepSpeed 通信算子 deepspeed_shm_comm" in phase_text(job, phase)
    (op / "lock").unlink()

    StatusSlot(job.run_dir.status_slot(0))  # the tracer creates it once the engine exists
    assert job_phase(job).name == "first step"
    assert "第 1/3 步进行中 (step 1/3 running)" in phase_text(job, job_phase(job))

    _add_step(job, 0, loss=2.71828, seconds=0.5)
    _add_step(job, 1, loss=2.5, seconds=0.25)
    phase = job_phase(job)
    assert (phase.name, phase.done, phase.loss, phase.seconds_per_step) == ("training", 2, 2.5, 0.25)
    assert "第 2/3 步 (step 2/3) · loss 2.5000 · 0.25 s/step" in phase_text(job, phase)


def test_the_line_carries_elapsed_seconds_and_the_end_state(job):
    job.started = time.time() - 42
    assert phase_text(job, job_phase(job)).endswith(" · 42 s")
    _add_step(job, 0)
    job.state, job.ended = "stopped", job.started + 50
    text = phase_text(job, job_phase(job))
    assert "已停止 (stopped) · 1/3 steps" in text and text.endswith("共 50 s (total)")


def test_a_warm_load_is_not_called_compiling(job):
    op = job.launcher.extensions_dir / "deepspeed_shm_comm"
    op.mkdir()
    (op / "deepspeed_shm_comm.so").write_bytes(b"")
    (op / "lock").write_text("")  # every load takes the lock for a moment
    assert job.launcher.building_ops() == []
    old = time.time() - 30  # held for 30 s: a rebuild (or a wait for one), worth saying
    os.utime(op / "lock", (old, old))
    assert job.launcher.building_ops() == ["deepspeed_shm_comm"]


def test_a_file_gets_one_line_per_phase_and_step_and_notes_are_not_errors(job):
    job.notes = ["4 ranks share 2 CPU cores: timings include contention between stages, not only their work"]
    out = io.StringIO()
    line = ProgressLine(job, stream=out)
    assert line.mode == "lines"
    for _ in range(3):
        line.update()
    job.started -= 5  # the clock moved: no new line in a file, only phases and steps make one
    line.update()
    _add_step(job, 0)
    line.update()
    job.state, job.ended = "succeeded", time.time()
    line.close()
    line.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("注意 (note): 4 ranks share 2 CPU cores")
    assert [("正在启动" in s, "第 1/3 步 (step 1/3)" in s, "完成 (succeeded)" in s) for s in lines[1:]] == [
        (True, False, False), (False, True, False), (False, False, True)]


def test_a_file_gets_every_step_also_those_between_two_polls(job):
    """A slow poller (a loaded machine) may first look again after three steps, or after the
    job ended: the file still gets one line per step, in order, before the end state."""
    out = io.StringIO()
    line = ProgressLine(job, stream=out)
    line.update()
    _add_step(job, 0, loss=3.0)
    _add_step(job, 1, loss=2.0)
    line.update()
    _add_step(job, 2, loss=1.0)
    job.state, job.ended = "succeeded", time.time()
    line.close()
    lines = out.getvalue().splitlines()
    assert ["正在启动" in lines[0]] + [f"第 {k}/3 步 (step {k}/3) · loss {loss:.4f}" in s
                                     for k, loss, s in zip((1, 2, 3), (3.0, 2.0, 1.0), lines[1:4])] == [True] * 4
    assert len(lines) == 5 and "完成 (succeeded) · 3/3 steps" in lines[4]


def test_the_line_names_a_dynamic_jobs_last_move(tmp_path):
    """Issue 42: a learner watching a dynamic job sees the re-partition when it happens."""
    from dataclasses import replace

    from utils.jobs.rundir import PartitionChange

    launcher = LocalTorchrun()
    run_dir = RunDir.create("moving", tmp_path / "runs")
    plan = plan_job(replace(SPEC, steps=6, repartition_at={2: (0, 1, 4)}))
    job = RunningJob(plan, run_dir, launcher, launcher.command(plan, run_dir))
    _add_step(job, 0)
    assert "重切分" not in phase_text(job, job_phase(job))
    run_dir.record_partition_change(PartitionChange(step=2, boundaries=(0, 1, 4), reason="repartition_at"))
    _add_step(job, 1)
    assert "· 重切分 (re-partition) @ step 2 → [0, 1, 4] · " in phase_text(job, job_phase(job))
    run_dir.record_partition_change(PartitionChange(step=4, boundaries=(0, 3, 4), reason="repartition_at"))
    assert "重切分（第 2 次） (re-partition) @ step 4 → [0, 3, 4]" in phase_text(job, job_phase(job))


def _read_all(fd: int) -> bytes:
    """Everything a pty's leader received. The kernel hands a terminal's output over in chunks
    as it moves it, so one read can return only the first writes; read until the closed
    follower's end (EIO on Linux)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_terminal_gets_one_line_rewritten_in_place(job):
    leader, follower = pty.openpty()
    with open(follower, "w", closefd=True) as terminal:
        line = ProgressLine(job, stream=terminal)
        assert line.mode == "tty"
        job.started = time.time()  # "0 s" even when the machine is slow to get here
        line.update()
        job.started -= 3
        line.update()
        line.update()  # nothing changed: nothing written
        job.state, job.ended = "stopped", time.time()
        line.close()
    shown = _read_all(leader).decode().replace("\r\n", "\n")  # the terminal's own newline
    os.close(leader)
    frames = shown.split("\r")[1:]
    assert len(frames) == 3 and shown.endswith("\n")
    assert "正在启动" in frames[0] and frames[0].endswith(" 0 s\x1b[K")
    assert frames[1].endswith(" 3 s\x1b[K") and "已停止 (stopped)" in frames[2]


def test_the_stop_message_is_one_line_for_ipython(tmp_path):
    stopped = JobStopped("已按你的要求停止：2 个进程全部结束 (stopped by you; all 2 processes ended)", tmp_path)
    assert isinstance(stopped, KeyboardInterrupt)
    assert stopped._render_traceback_() == [str(stopped)]


def test_the_terminal_command_works_as_pasted(job):
    """Before: ``... torchrun --standalone ...``, "command not found" outside an activated venv."""
    command = job.command
    # a subshell with a temporary folder of its own, removed on exit (torchrun never removes its torchelastic_*)
    assert command.startswith("(") and command.endswith(")")
    cd, made, trap, rest = command[1:-1].split(" && ", 3)
    assert cd == f"cd {shlex.quote(str(PROJECT_ROOT))}"
    assert made == 't="$(mktemp -d)"' and trap == """trap 'rm -rf "$t"' EXIT INT TERM"""
    argv = shlex.split(rest)
    assert argv[0] == "env"
    settings = dict(a.split("=", 1) for a in argv[1:] if "=" in a and not a.startswith("-"))
    program = argv[1 + len(settings):]
    assert settings["TMPDIR"] == "$t"
    assert settings["DS_ACCELERATOR"] == "cpu" and settings["CUDA_VISIBLE_DEVICES"] == ""
    # The folder holding the compiled communication op: without it a terminal run compiles it again.
    assert settings["TORCH_EXTENSIONS_DIR"] == os.environ.get("TORCH_EXTENSIONS_DIR",
                                                              os.path.join(sys.prefix, "torch_extensions"))
    # The venv's bin first, as the job itself ran: its ninja built the op (Debian's would rebuild it).
    assert settings["PATH"] == f"{os.path.dirname(sys.executable)}:$PATH" and '"$PATH"' in rest
    assert program[:3] == [sys.executable, "-m", "torch.distributed.run"] and os.path.isabs(program[0])
    assert program[3:] == ["--standalone", "--local-addr=127.0.0.1", "--nproc-per-node=2", "-m", "utils.runtime.rank",
                           str(job.path)]
    # The interpreter it names runs torchrun's module with nothing on the PATH.
    shown = subprocess.run(["env", "-i", *program[:3], "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--nproc-per-node" in shown.stdout


def test_the_run_panel_names_the_same_phases(job):
    """RunPanel's status line reads `job_phase` too: a first job's minutes of compiling are
    named, not shown as "starting" (issue 16, point 5)."""
    from utils.ui.widgets import RunPanel

    job.started = time.time() - 42
    panel, zh = RunPanel(SPEC), RunPanel(SPEC, lang="zh")
    panel._show_progress(job, [])
    assert "starting 2 processes ... 42 s" in panel.status.value
    op = job.launcher.extensions_dir / "deepspeed_shm_comm"
    op.mkdir()
    (op / "lock").write_text("")
    for p, words in ((panel, "compiling DeepSpeed's communication op deepspeed_shm_comm (first time only"),
                     (zh, "正在编译 DeepSpeed 通信算子 deepspeed_shm_comm（本环境只在第一次编译")):
        p._show_progress(job, [])
        assert words in html.unescape(p.status.value) and "42 s" in p.status.value
    (op / "lock").unlink()
    StatusSlot(job.run_dir.status_slot(0))
    zh._show_progress(job, [])
    assert "第 1/3 步进行中" in zh.status.value
    job.launcher = None  # a phase that cannot be read: the line says "starting", nothing raises
    job.run_dir = None
    panel._show_progress(job, [])
    assert "starting 2 processes" in panel.status.value


BIN = os.path.dirname(sys.executable)


@pytest.mark.parametrize(("path", "ranks_path"), [("/usr/bin:/bin", f"{BIN}:/usr/bin:/bin"),
                                                  (f"{BIN}:/usr/bin", f"{BIN}:/usr/bin")])
def test_the_ranks_build_ops_with_this_interpreters_ninja(monkeypatch, path, ranks_path):
    """Jobs from a plain shell and from a kernel with the venv first on its PATH took Debian's
    and pip's ninja in turn, and each rebuilt DeepSpeed's comm op (~35 s a job)."""
    monkeypatch.setenv("PATH", path)
    env = LocalTorchrun().environment(plan_job(JobSpec(num_stages=2, device="cpu", partition="uniform")))
    assert env["PATH"] == ranks_path
