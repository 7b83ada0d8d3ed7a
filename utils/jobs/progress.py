"""What `run_job` shows while a job runs: its phase and elapsed time on one live line, and
its notes as plain information.

A job spends its first seconds with nothing to count: on this course's CPU machines the
ranks take 5-10 s to import torch and DeepSpeed and build their engines, and the first job
in an environment also JIT-compiles DeepSpeed's CPU communication op (``deepspeed_shm_comm``),
which took 116 s on 2 shared cores. A line stuck on "starting ..." for that long looks
hung, so the line names the phase, as `utils.ui.widgets.RunPanel` does, with the seconds
since launch:

- ``starting N processes``   the ranks import and set up DeepSpeed (no engine yet);
- ``compiling``              a build lock of a DeepSpeed op is held (`Launcher.building_ops`);
- ``step 1/N running``       an engine exists (its status slot does) and trains its first step;
- ``step k/N · loss · s/step``  after each step, from rank 0's progress file;
- the end state              ``succeeded``, ``stopped``, ``failed``, ``timeout``;

and, for a dynamic job, its last re-partition (``@ step k → boundaries``) once it happened.

`job_phase` reads the phase from the run directory and the launcher (any viewer can use
it); `ProgressLine` shows it: one display updated in place in Jupyter (plain text, not a
quoted string), a line rewritten with ``\\r`` in a terminal, one line per phase or step when
the output is a file or a pipe. Notes (ranks sharing cores, another job running) go to
stdout: they explain timings, they are not errors, so they are not printed to stderr
(Jupyter draws stderr in a red box).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from utils.jobs.launch import RunningJob

PHASES = ("starting", "compiling", "first step", "training", "succeeded", "stopped", "failed", "timeout",
          "incomplete")
"""Phase names, in the order a job goes through them (the last five are end states)."""

_END_WORDS = {"succeeded": "完成 (succeeded)", "stopped": "已停止 (stopped)", "failed": "失败 (failed)",
              "timeout": "超时 (timeout)", "incomplete": "未完成 (incomplete)"}


@dataclass(frozen=True)
class Phase:
    """Where a job is: `name` (one of `PHASES`), seconds since launch, steps done of all."""

    name: str
    elapsed: float
    done: int
    steps: int
    loss: float | None = None
    """The last finished step's loss (rank 0), once a step finished."""
    seconds_per_step: float | None = None
    """The last finished step's wall time."""
    ops: tuple[str, ...] = ()
    """The ops being compiled (phase ``compiling``)."""
    moves: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """The re-partitions so far, ``(step, boundaries)`` each (a dynamic job's moves)."""


def job_phase(job: RunningJob, rows: list[dict] | None = None) -> Phase:
    """The phase of `job` now (see the module docstring); `rows` are its progress rows if
    the caller already read them."""
    rows = job.progress() if rows is None else rows
    spec = job.spec
    elapsed = (job.ended or time.time()) - job.started
    last = rows[-1] if rows else None
    moves = tuple((c.step, tuple(c.boundaries)) for c in job.run_dir.partition_changes()) \
        if spec.repartition_at or spec.rebalance is not None else ()
    common = {"elapsed": elapsed, "done": len(rows), "steps": spec.steps, "moves": moves,
              "loss": last["loss"] if last else None, "seconds_per_step": last["seconds"] if last else None}
    if job.state != "running":
        return Phase(job.state, **common)
    if rows:
        return Phase("training", **common)
    if job.run_dir.status_slot(0).exists():  # the tracer creates it once the engine exists
        return Phase("first step", **common)
    ops = tuple(job.launcher.building_ops())
    return Phase("compiling" if ops else "starting", ops=ops, **common)


def phase_text(job: RunningJob, phase: Phase) -> str:
    """One line: the run's name and shape, what it is doing, and the seconds since launch."""
    spec = job.spec
    head = f"{job.path.name}: {spec.num_stages} stages × {spec.micro_batches} micro-batches"
    clock = f"{phase.elapsed:.0f} s"
    if phase.name == "starting":
        what = (f"正在启动 {spec.world_size} 个进程 (starting {spec.world_size} processes: imports and "
                "DeepSpeed set-up take a few seconds)")
    elif phase.name == "compiling":
        what = (f"正在编译 DeepSpeed 通信算子 {', '.join(phase.ops)}：本环境只在第一次编译，约 1–2 分钟 "
                "(compiling DeepSpeed's communication op, first time only)")
    elif phase.name == "first step":
        what = f"第 1/{phase.steps} 步进行中 (step 1/{phase.steps} running)"
    elif phase.name == "training":
        what = (f"第 {phase.done}/{phase.steps} 步 (step {phase.done}/{phase.steps}) · loss {phase.loss:.4f} · "
                f"{phase.seconds_per_step:.2f} s/step")
    else:
        what = f"{_END_WORDS.get(phase.name, phase.name)} · {phase.done}/{phase.steps} steps"
        clock = f"共 {clock} (total)"
    if phase.moves:  # a dynamic job: its last move, where a learner watching the line sees it
        step, boundaries = phase.moves[-1]
        count = f"（第 {len(phase.moves)} 次）" if len(phase.moves) > 1 else ""
        what += f" · 重切分{count} (re-partition) @ step {step} → {list(boundaries)}"
    return f"{head} · {what} · {clock}"


class ProgressLine:
    """The live line `run_job` shows (see the module docstring): call `update` at every poll
    and `close` once the job ended, whatever ended it."""

    def __init__(self, job: RunningJob, *, stream: TextIO | None = None):
        self.job = job
        self.stream = stream or sys.stdout
        self.handle = None
        self._shown = ""
        self._last_key: tuple | None = None
        self._steps_shown = 0
        self._closed = False
        for note in job.notes:
            print(f"注意 (note): {note}", file=self.stream, flush=True)
        self.mode = "jupyter" if _in_jupyter() else ("tty" if _is_tty(self.stream) else "lines")

    def update(self, rows: list[dict] | None = None) -> None:
        """Show the job's phase now; redraws only when the text changed (about once a second
        while the clock runs). In ``lines`` mode a line is printed only when the phase or step
        changed, and every finished step has its line, also one that ended between two polls."""
        rows = self.job.progress() if rows is None else rows
        phase = job_phase(self.job, rows)
        text = phase_text(self.job, phase)
        if text == self._shown:
            return
        if self.mode == "jupyter":
            bundle = {"text/plain": text}
            if self.handle is None:
                from IPython.display import display

                self.handle = display(bundle, raw=True, display_id=True)
            else:
                self.handle.update(bundle, raw=True)
        elif self.mode == "tty":
            self.stream.write(f"\r{text}\x1b[K")
            self.stream.flush()
        else:
            key = (phase.name, phase.done)
            if key == self._last_key:
                return
            self._last_key = key
            # every finished step gets its line, also the ones finished between two polls
            missed_until = phase.done - 1 if phase.name == "training" else phase.done
            for done in range(self._steps_shown + 1, missed_until + 1):
                row = rows[done - 1]
                missed = Phase("training", phase.elapsed, done, phase.steps, row["loss"], row["seconds"])
                print(phase_text(self.job, missed), file=self.stream, flush=True)
            self._steps_shown = max(self._steps_shown, phase.done)
            print(text, file=self.stream, flush=True)
        self._shown = text

    def __call__(self, rows: list[dict]) -> None:
        """As an ``on_progress`` callback of `RunningJob.wait`."""
        self.update(rows)

    def close(self) -> None:
        """Show the final state (the job has ended) and end the terminal line."""
        if self._closed:
            return
        self._closed = True
        self.update()
        if self.mode == "tty":
            self.stream.write("\n")
            self.stream.flush()


def _in_jupyter() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

