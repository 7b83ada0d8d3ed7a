"""The life of a rank process: it records where it runs, its output goes to its own log, and
it ends itself when the process that launched it (the notebook) or its parent (torchrun) is
gone, so no orphan outlives a killed job. Used by `utils.runtime.rank.main` before anything
else runs."""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time

import psutil

from utils.jobs.rundir import LAUNCHER_CREATED_ENV, LAUNCHER_PID_ENV, NODE_HOST_ENV, STACK_SIGNAL, RunDir
from utils.system.procs import same_process


def own_rank() -> int:
    """This process's global rank, from the launcher's ``RANK`` (0 without one).

    Read when asked, not at import: a rank forked from a warm fork server
    (`utils.runtime.warm_agent`) imported this module before it knew its rank."""
    return int(os.environ.get("RANK", "0"))


class RankExit(BaseException):
    """Ends this rank early and cleanly: raised where the rank has finished its part (restart
    mode's checkpoint, `utils.runtime.restart`) and caught by `utils.runtime.rank.main`, which
    ends the rank as after its last step. An exception, not ``os._exit`` on the spot: a rank
    forked by the warm agent must return to elastic's agent, which waits for every rank's
    return value."""


def record_placement(run_dir: RunDir) -> None:
    """Write where this rank runs: its node as the launcher numbered it (torchrun's
    ``GROUP_RANK``, DeepSpeed's ``CROSS_RANK``; 0 under neither), the host the launcher
    named for that node, this machine's name, its local rank and pid. A run's placement is
    read from these, so it is what happened, not what was planned."""
    node = os.environ.get("GROUP_RANK") or os.environ.get("CROSS_RANK") or "0"
    rank = own_rank()
    run_dir.write_placement(rank, {
        "rank": rank, "node": int(node), "host": os.environ.get(NODE_HOST_ENV) or socket.gethostname(),
        "hostname": socket.gethostname(), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "pid": os.getpid()})


def redirect_output(run_dir: RunDir) -> None:
    """Send this rank's stdout and stderr to its own log before anything can print."""
    log = open(run_dir.rank_log(own_rank()), "ab", buffering=0)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def dump_stacks_on_signal(run_dir: RunDir) -> None:
    """Write every thread's Python stack into this rank's stacks file whenever `STACK_SIGNAL`
    arrives: ``faulthandler`` does it from a C signal handler, so it works while the rank is
    blocked inside a collective where no Python code runs. The file appears only once the
    handler is in place (written under a temporary name, then renamed), so the launcher never
    sends the signal to a rank it would kill."""
    final = run_dir.stacks_file(own_rank())
    pending = final.with_name(final.name + ".new")
    stream = open(pending, "w", encoding="utf-8")  # kept open for the life of the process
    faulthandler.register(STACK_SIGNAL, file=stream, all_threads=True)
    os.replace(pending, final)
    _KEPT.append(stream)


_KEPT: list = []


def exit_with_parent() -> None:
    """End this rank if its parent (torchrun, or the warm agent's fork server, which exits
    with its agent) or the process that launched the job (the notebook, named by the
    launcher) disappears, so no orphan outlives a killed job.

    torchrun runs in a session of its own, so a killed notebook or a script that returned
    after `start_job` leaves it running; once its ranks exit, torchrun sees failed ranks
    and exits by itself.
    """
    parent, rank = os.getppid(), own_rank()
    launcher_alive = launcher_watch()

    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(1)
            if not launcher_alive():
                print(f"rank {rank}: the process that launched this job "
                      f"(pid {os.environ.get(LAUNCHER_PID_ENV)}) is gone; exiting", file=sys.stderr, flush=True)
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def launcher_watch():
    """A function telling whether the launching process still runs (always True when no
    launcher was named, as when ``command.txt`` is run by hand)."""
    try:
        pid = int(os.environ[LAUNCHER_PID_ENV])
        created = float(os.environ[LAUNCHER_CREATED_ENV])
    except (KeyError, ValueError):
        return lambda: True
    try:
        launcher = psutil.Process(pid)
        # Gone before this rank started, and its pid reused since: not our launcher.
        same = same_process(pid, created)
    except psutil.Error:
        same = False
    if not same:
        return lambda: False

    def alive() -> bool:
        try:
            # A killed process whose parent has not reaped it yet is a zombie: gone too.
            return launcher.is_running() and launcher.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    return alive
