"""Free disk space, and a write that failed told so that a user can act on it: which folder,
full or not writable, how much was needed, what to do.

Restart mode (`utils.runtime.restart`) writes a DeepSpeed checkpoint into the run directory;
`utils.jobs.plan` checks the disk before launch, the ranks again before the save. A failed
``torch.save`` rarely says why on its own: on a full disk torch's zip writer raises
``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 2752 vs 2640`` (a
short write), on a folder it may not write ``RuntimeError: File ... cannot be opened.``;
`write_problem` reads both, and ``OSError``'s numbers, as "full" or "unwritable".
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Literal

Problem = Literal["full", "unwritable"]

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
UNWRITABLE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST})
#: What torch's zip writer (``PyTorchStreamWriter``, inline_container.cc) says when a write
#: comes up short or fails: the errno is lost on the way, the text is all there is.
FULL_TEXTS = ("No space left", "Disk quota exceeded", "unexpected pos", "file write failed",
              "PytorchStreamWriter failed writing")
UNWRITABLE_TEXTS = ("Permission denied", "Read-only file system", "cannot be opened", "open file failed")

#: What to do, said once for every message about the checkpoint folder.
CHOOSE_ANOTHER = ("choose another folder for the run: WORKBOOK_RUNS or run_job(..., directory=...); or use "
                  "repartition_mode='live', which moves the layers between ranks without a checkpoint")
FULL_FIX = f"请腾出空间、换一个目录，或改用 live 模式 (free space on that disk, or {CHOOSE_ANOTHER}), and run again"
UNWRITABLE_FIX = f"请让它可写、换一个目录，或改用 live 模式 (make it writable, or {CHOOSE_ANOTHER}), and run again"


class CheckpointDiskError(OSError):
    """A checkpoint that does not fit or cannot be written where the run keeps it; the
    message names the folder and what to do. `reason`: ``"full"`` or ``"unwritable"``."""

    def __init__(self, message: str, *, path: str | Path = "", reason: Problem = "unwritable"):
        super().__init__(message)
        self.path, self.reason = str(path), reason

    def __reduce__(self):  # pickled whole (keyword arguments are not in `args`)
        return _rebuild, (str(self), self.path, self.reason)


def _rebuild(message: str, path: str, reason: Problem) -> CheckpointDiskError:
    return CheckpointDiskError(message, path=path, reason=reason)


def existing_ancestor(path: str | Path) -> Path:
    """`path`, or the nearest folder above it that exists (where it would be created)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int:
    """Bytes an ordinary user may still write on the disk of `path` (``shutil.disk_usage``'s
    ``free``: the blocks reserved for root do not count, so root sees a little less than it has)."""
    return shutil.disk_usage(existing_ancestor(path)).free


def human(n: float) -> str:
    """``1.5 GB``, ``340 MB``, ``12 KB``, ``80 B`` (powers of 1000, as ``df -H`` shows them)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def write_problem(exc: BaseException) -> Problem | None:
    """``"full"`` or ``"unwritable"`` when `exc` is a write refused for one of those reasons
    (its errno, or the text torch's writer puts in a RuntimeError), else None."""
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno in FULL_ERRNOS:
            return "full"
        if exc.errno in UNWRITABLE_ERRNOS:
            return "unwritable"
    text = str(exc)
    if isinstance(exc, (OSError, RuntimeError)):
        if any(t in text for t in FULL_TEXTS):
            return "full"
        if any(t in text for t in UNWRITABLE_TEXTS):
            return "unwritable"
    return None


def reason_text(exc: BaseException) -> str:
    """What the system or torch said, on one line (kept whole: it is what a search finds)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def probe_writable(folder: str | Path) -> None:
    """Create `folder` (and its parents) and write and remove a small file in it: raises the
    OSError a real write would get (read-only, no permission, a file in the way, full). A
    test of ``os.access`` would not do: root passes it on any folder that is not on a
    read-only mount."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".writable-{os.getpid()}"  # one per process: ranks probe the same folder at once
    try:
        probe.write_bytes(b"probe\n")
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass


def folder_bytes(path: str | Path) -> int:
    """Disk space the regular files under `path` take (allocated blocks: a sparse file counts
    what it occupies, not its length); links are not followed, files that vanish while it
    walks are skipped."""
    total, stack = 0, [str(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                pass
    return total
