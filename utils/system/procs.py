"""Ending process trees, and asking whether a process is alive.

Shared by the job launcher (torchrun and its ranks), the profiler's worker processes and
the grader (kernels and whatever a submission started), so it depends on psutil only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import psutil


def end_process_tree(root: int | Iterable[psutil.Process], *, grace: float = 3.0,
                     reap: float | None = None) -> None:
    """End a process and every process below it, found by parent links (so descendants that
    run in sessions of their own, which a process-group signal would miss, are ended too).

    `root` is a pid (that process and its descendants are listed now) or processes listed
    earlier (say a kernel's children, listed before the kernel shut down). Each gets
    SIGTERM, `grace` seconds to exit, then SIGKILL (at once, without SIGTERM, when `grace`
    is 0); then this waits up to `reap` seconds (default: `grace`) for the killed ones.
    That wait reaps this process's own children: for one whose exit code a `Popen` will be
    asked for, kill and wait through the Popen instead (it would record 0 for a child
    reaped elsewhere).
    """
    if isinstance(root, int):
        try:
            parent = psutil.Process(root)
            procs = [parent, *parent.children(recursive=True)]
        except psutil.Error:
            procs = []
    else:
        procs = list(root)
    alive = procs
    if grace > 0:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace if reap is None else reap)


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists (a process of another user counts)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_created(pid: int | None) -> float | None:
    """The start time of process `pid` (`psutil.Process.create_time`), None when there is
    none: with the pid, it names one process even after the pid is reused."""
    try:
        return psutil.Process(pid).create_time() if pid else None
    except psutil.Error:
        return None


def process_alive(pid: int | None, *, created: float | None = None) -> bool:
    """Whether process `pid` still runs: it exists, is not a zombie (killed, and not yet
    reaped by its parent) and, when `created` is given, started then (its `create_time`
    within a second of it: not another process that got the pid later). A process of
    another user counts as running unless that can be told otherwise."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) >= 1.0:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess is one
        return False
    except psutil.AccessDenied:
        return pid_alive(pid)
    except psutil.Error:
        return False


def job_processes(path: str | os.PathLike) -> list[psutil.Process]:
    """Live processes of the job whose run directory is `path`, or of every job below `path`
    (a runs folder): its launcher and its ranks, and what they started.

    A process started by exec names its run directory on its command line. A rank forked
    from a fork server (`utils.runtime.warm_agent`) shows the fork server's command line, but
    it inherits the launch environment, whose ``TMPDIR`` the launcher puts inside the run
    directory (`utils.jobs.launchers.LocalTorchrun.prepare`). Other environment variables are
    not looked at: a notebook server's ``WORKBOOK_RUNS`` names the runs folder too."""
    needle, found = str(path), []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            named = [*(proc.info["cmdline"] or []), (proc.info["environ"] or {}).get("TMPDIR", "")]
            if any(needle in part for part in named) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # it exited (or became unreadable) while being looked at
            pass
    return found
