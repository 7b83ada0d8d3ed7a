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
    """When process `pid` started, as a stamp that names one process even after its pid is
    reused; None when there is none. On Linux: seconds since boot, from the ``starttime``
    field of ``/proc/<pid>/stat``, which no clock adjustment moves. psutil's `create_time`
    adds ``/proc/stat``'s boot time, a whole second that the kernel derives from the wall
    clock: once the clock had been adjusted, a rank read its notebook's create_time one
    second off the one recorded at launch, took the notebook for gone and exited, and so did
    every later job of that kernel (a CI run). Elsewhere: `create_time`."""
    if not pid:
        return None
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()  # the name may hold spaces and ")"
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of the file, in clock ticks
    except (OSError, ValueError, IndexError):
        pass
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def same_process(pid: int | None, created: float | None) -> bool:
    """Whether `pid` is still the process whose `process_created` stamp was `created`."""
    now = process_created(pid)
    return now is not None and created is not None and abs(now - created) < 0.5


def process_alive(pid: int | None, *, created: float | None = None) -> bool:
    """Whether process `pid` still runs: it exists, is not a zombie (killed, and not yet
    reaped by its parent) and, when `created` is given, is the process of that
    `process_created` stamp (not another one that got the pid later). A process of another
    user counts as running unless that can be told otherwise."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if created is not None and not same_process(pid, created):
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
