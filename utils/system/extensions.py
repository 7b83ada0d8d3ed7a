"""Build locks of torch's JIT-compiled extensions, and the stale ones a stopped build leaves.

On CPU, DeepSpeed JIT-builds its communication op (``deepspeed_shm_comm``) under
``$TORCH_EXTENSIONS_DIR`` the first time a rank loads it, and every later load still takes
the build lock. torch's ``FileBaton`` (``torch/utils/file_baton.py``) is that lock: it
creates ``<extensions dir>/<op>/lock`` with ``O_EXCL``, keeps the file descriptor open while
it builds, and deletes the file when done; every other process spins while the file
exists. A process killed mid-build (a job stopped while its ranks start) never deletes it,
so every later job waits forever. A lock is therefore *stale* when no live process holds it
open: that is what this module finds and removes.

It sees the open files of the processes it can read (this user's), so a lock held by
another user's process reads as stale; an extensions directory is per environment, and
shared by one user in practice.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

def extensions_dir() -> Path:
    """Where jobs JIT-build DeepSpeed's ops: ``$TORCH_EXTENSIONS_DIR``, else a folder inside this
    environment (a cache per environment keeps two environments, say a checkout and its CI
    clone, from rebuilding the op for each other)."""
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path(sys.prefix) / "torch_extensions")


LOCK_NAME = "lock"
"""The file name torch's JIT build gives its lock, in each op's build directory."""


@dataclass(frozen=True)
class BuildLock:
    """One op's build lock and the live processes that hold it open."""

    path: Path
    holders: tuple[int, ...] = ()
    """Pids of live processes with the lock file open (the one building it)."""

    @property
    def stale(self) -> bool:
        """No live process holds it: whoever created it is gone without deleting it."""
        return not self.holders


def build_locks(extensions_dir: str | Path) -> list[BuildLock]:
    """Every build lock under `extensions_dir` (``<dir>/<op>/lock``), with its holders.

    Processes are scanned only when a lock exists, so the common case costs one directory
    listing.
    """
    locks = sorted(Path(extensions_dir).glob(f"*/{LOCK_NAME}"))
    if not locks:
        return []
    wanted = {os.path.realpath(p): p for p in locks}
    holders: dict[Path, set[int]] = {p: set() for p in locks}
    for proc in psutil.process_iter():
        try:
            # /proc/<pid>/fd links resolve to real paths, hence realpath on our side too.
            for opened in proc.open_files():
                if opened.path in wanted:
                    holders[wanted[opened.path]].add(proc.pid)
        except psutil.Error:  # gone meanwhile, a zombie, or another user's process
            continue
    return [BuildLock(path=p, holders=tuple(sorted(holders[p]))) for p in locks]


def remove_stale_build_locks(extensions_dir: str | Path, *, settle: float = 0.2) -> list[Path]:
    """Delete the build locks under `extensions_dir` that no live process holds; returns
    the paths removed.

    A lock looks unheld for an instant in normal use too: ``FileBaton.release`` closes its
    descriptor and only then deletes the file (and fails if it is already gone). So a lock
    is removed only if it is still there, the same file and still unheld, `settle` seconds
    after it was first seen unheld; a release in progress has deleted it by then.
    """
    first = [lock.path for lock in build_locks(extensions_dir) if lock.stale]
    if not first:
        return []
    seen = {p: _identity(p) for p in first}
    time.sleep(settle)
    removed = []
    for lock in build_locks(extensions_dir):
        if lock.stale and lock.path in seen and seen[lock.path] is not None \
                and _identity(lock.path) == seen[lock.path]:
            try:
                lock.path.unlink()
            except OSError:  # gone meanwhile, or not ours to delete (a hang report names it)
                continue
            removed.append(lock.path)
    return removed


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Which file this is (a lock deleted and created again is another one)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns
