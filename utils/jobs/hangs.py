"""What a job that stopped making progress was doing: each rank's instruction, for how long,
its process state and Python stack, who the stuck one is — or that the job was only too slow
for its timeout. `RunningJob` asks for it when the timeout runs out or a rank stays stopped."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import psutil

from utils.jobs.records import Failure, HungRank
from utils.jobs.stacks import main_stack, parse_stacks, request_stacks, stack_summary

if TYPE_CHECKING:
    from utils.jobs.launch import RunningJob


def describe_hang(job: RunningJob, why: str | None = None, *, frozen: list[int] | tuple[int, ...] = ()
                  ) -> tuple[str, Failure]:
    """What each rank was doing, its stacks, and who the stuck one is, in words and as facts
    (`Failure`: ``"hang"``, or ``"too-slow"`` / ``"node"``). `why`: the watch's reason to stop
    the job before its timeout (`frozen`: the ranks whose process stayed stopped), else the
    timeout ran out."""
    now = time.time()
    slow = None if why else describe_slow(job)
    if slow:
        return slow, Failure(kind="too-slow", time=now)
    trouble = None if why else job.launcher.node_trouble(job.run_dir)
    if trouble:
        return trouble, Failure(kind="node", time=now)
    workers = job.launcher.workers()
    # Every rank's Python stacks, asked for before the job is stopped (faulthandler, a
    # signal each rank handles even when blocked in a collective); saved in the run directory.
    stacks = request_stacks(job.run_dir, workers)
    lines = [f"{why or f'no progress within timeout={job.spec.timeout:g} s'}; what each rank was doing "
             "when it was stopped:"]
    ranks = []
    for rank in range(job.spec.world_size):
        status = job.run_dir.slot(rank)
        since = status.age(now) if status is not None else None
        done = len(job.run_dir.progress(rank))
        state = process_state(workers.get(rank))
        ranks.append(HungRank(rank=rank, stage=job.spec.stage_of_rank(rank), status=status, steps_done=done,
                              process_state=state,
                              stacks=job.run_dir.stacks_file(rank).name if rank in stacks else None))
        lines.append(f"  rank {rank} (stage {job.spec.stage_of_rank(rank)}): "
                     f"{status.describe() if status is not None else 'not started (still initialising)'}"
                     + (f" — for {since:.0f} s" if since is not None else "")
                     + f", {done} step(s) done" + (f", process {state}" if state else ""))
        if rank in stacks:
            main = main_stack(parse_stacks(stacks[rank]))
            lines.append("      stack: " + (stack_summary(main.frames) if main else "no answer (stopped?)"))
    facts = Failure(kind="hang", ranks=tuple(ranks), frozen=tuple(frozen), time=now)
    if stacks:
        lines.append("Every rank's Python stacks are saved in the run directory as stacks-rank<r>.txt; "
                     "utils.diagnose(run) reads them into a wait-for chain.")
    if facts.stopped_ranks:
        lines.append(f"Rank(s) {facts.stopped_ranks} are stopped (SIGSTOP, a debugger, or ^Z): they are the stuck "
                     "ones; the others wait for them inside send/recv.")
    else:
        lines.append("A rank blocked in recv_* waits for a neighbour; the rank that is not in a send/recv, or "
                     "has been in its instruction longest, is usually the one that hangs.")
    # A build lock blocks only ranks still setting up (no engine, so no status slot, yet):
    # once every rank has one, the ops are loaded and a lock is another job's business.
    setting_up = [r for r in range(job.spec.world_size) if not job.run_dir.status_slot(r).exists()]
    lock = job.launcher.blocking_build_locks() if setting_up else None
    if lock:
        lines.append(lock)
    return "\n".join(lines), facts


def describe_slow(job: RunningJob) -> str | None:
    """The timeout hit a job that was still finishing steps: too slow, not hung."""
    rows = job.progress()
    if not rows:
        return None
    per_step = statistics.median(row["seconds"] for row in rows)
    try:
        idle = time.time() - job.run_dir.progress_file(0).stat().st_mtime
    except OSError:
        return None
    if idle > max(3 * per_step, 5.0):
        return None  # it stopped making progress: a hang
    left = job.spec.steps - len(rows)
    need = left * per_step
    return (f"too slow for timeout={job.spec.timeout:g} s: {len(rows)} of {job.spec.steps} steps done "
            f"at {per_step:.2f} s/step; the remaining {left} steps need about {need:.0f} s more. The job "
            f"was still running, not hung: raise timeout to at least "
            f"{job.spec.timeout + need * 1.5:.0f} s, or run fewer steps")


def process_state(process: psutil.Process | None) -> str | None:
    """psutil's state of `process` (``"stopped"``, ``"sleeping"`` ...), None when it is gone."""
    try:
        return process.status() if process is not None else None
    except psutil.Error:
        return None
