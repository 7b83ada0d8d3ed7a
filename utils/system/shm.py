"""DeepSpeed's shared-memory all-reduce buffers in ``/dev/shm``: their size, which ones a job
owns, removing them, and whether a job's fit.

DeepSpeed's CPU communication op (``deepspeed_shm_comm``, ``csrc/cpu/comm/shm.cpp``) gives
each rank a POSIX shared-memory buffer when every rank of the job is on one machine — which
it decides from ``LOCAL_SIZE``, set by DeepSpeed's own launcher (``deepspeed.launcher.launch``)
and not by torchrun. The buffer is named
``deepspeed_allreduce_buffer_{uid}_{MASTER_ADDR}_{MASTER_PORT}_{rank}`` and holds one
``struct allreduce_workspace`` (about 66 MiB); the op never unlinks it, so every such job,
successful or not, would leave ``ranks x 66 MiB`` of RAM-backed files behind. With too small
a ``/dev/shm`` (a container's default is 64 MB) ``shared_create`` writes what fits and the
job runs on a buffer cut short. Hence: the launcher checks the space before it starts, and
removes the job's buffers when it stops (`remove_job_buffers`); buffers that no process maps
any more (a job whose notebook was killed) are removed by the next job (`remove_stale_buffers`).
"""

from __future__ import annotations

import ast
import importlib.util
import operator
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
BUFFER_PREFIX = "deepspeed_allreduce_buffer"
"""``SHM_BUFFER_NAME`` in DeepSpeed's ``shm.cpp``."""
WORKSPACE_BYTES_0_19_8 = 2 * 1048576 + 2 * 1048576 * 32 + 8
"""``sizeof(struct allreduce_workspace)`` in DeepSpeed 0.19.8 (two state enums, a buffer of
``2 * NAIVE_ALLREDUCE_THRESHOLD + 2 * MAX_BUF_SIZE``), used when the source is not installed."""


def _shm_source() -> Path | None:
    """The installed DeepSpeed's ``shm.cpp``, found without importing DeepSpeed."""
    spec = importlib.util.find_spec("deepspeed")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "ops" / "csrc" / "cpu" / "comm" / "shm.cpp"
        if path.exists():
            return path
    return None


def _arithmetic(expression: str) -> int:
    """An integer expression of literals, ``+`` and ``*`` (what the source's defines use)."""
    ops = {ast.Add: operator.add, ast.Mult: operator.mul}

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not a sum of products: {expression!r}")

    return value(ast.parse(expression, mode="eval").body)


def buffer_bytes() -> int:
    """The bytes of one rank's buffer: ``sizeof(struct allreduce_workspace)``, read from the
    installed DeepSpeed's ``shm.cpp`` (its ``#define``s and the struct's ``buffer`` array, plus
    the two 4-byte state enums)."""
    source = _shm_source()
    if source is None:
        return WORKSPACE_BYTES_0_19_8
    text = source.read_text(encoding="utf-8")
    defines = dict(re.findall(r"^#define\s+(\w+)\s+([0-9][0-9 *+]*)$", text, flags=re.M))
    array = re.search(r"struct allreduce_workspace\s*{.*?char buffer\[([^\]]+)\];", text, flags=re.S)
    if array is None:
        return WORKSPACE_BYTES_0_19_8
    expression = re.sub(r"\b[A-Z_]+\b", lambda m: f"({defines[m.group()]})", array.group(1))
    return _arithmetic(expression) + 2 * 4


def job_prefix(master_addr: str, master_port: int) -> str:
    """The name shared by the buffers of the job whose master is `master_addr`:`master_port`."""
    return f"{BUFFER_PREFIX}_{os.getuid()}_{master_addr}_{master_port}_"


def job_buffers(master_addr: str, master_port: int, *, shm_dir: Path = SHM_DIR) -> list[Path]:
    """That job's buffers present now (one per rank that created its own)."""
    prefix = job_prefix(master_addr, master_port)
    return sorted(p for p in _listing(shm_dir) if p.name.startswith(prefix))


def remove_job_buffers(master_addr: str, master_port: int, *, shm_dir: Path = SHM_DIR) -> int:
    """Remove that job's buffers (call once its ranks are gone); returns the bytes freed."""
    return _remove(job_buffers(master_addr, master_port, shm_dir=shm_dir))


def mapped_shm_files(shm_dir: Path = SHM_DIR, *, pids: Iterable[int] | None = None) -> set[str]:
    """Names of the files in `shm_dir` that a live process (of `pids`, or any) maps or holds
    open now."""
    held: set[str] = set()
    marker = f"{shm_dir}/"
    entries = [Path("/proc", str(pid)) for pid in pids] if pids is not None else Path("/proc").iterdir()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(entry / "maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    at = line.find(marker)
                    if at >= 0:
                        held.add(line[at + len(marker):].strip().removesuffix(" (deleted)"))
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(marker):
                    held.add(target[len(marker):].removesuffix(" (deleted)"))
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return held


def stale_buffers(*, shm_dir: Path = SHM_DIR) -> list[Path]:
    """This user's DeepSpeed buffers that no live process maps or holds: left by a job whose
    launcher could not remove them (a killed notebook, a command run by hand)."""
    mine = [p for p in _listing(shm_dir) if p.name.startswith(f"{BUFFER_PREFIX}_{os.getuid()}_")]
    if not mine:
        return []
    held = mapped_shm_files(shm_dir)
    return [p for p in mine if p.name not in held]


def remove_stale_buffers(*, shm_dir: Path = SHM_DIR) -> tuple[list[str], int]:
    """Remove `stale_buffers`; returns their names and the bytes freed."""
    stale = stale_buffers(shm_dir=shm_dir)
    return [p.name for p in stale], _remove(stale)


@dataclass(frozen=True)
class ShmSpace:
    """Free and needed bytes in ``/dev/shm`` for a job's buffers."""

    free: int
    needed: int

    @property
    def enough(self) -> bool:
        return self.free >= self.needed


def space_for(ranks: int, *, shm_dir: Path = SHM_DIR) -> ShmSpace:
    """Whether `ranks` buffers fit in `shm_dir`, counting the space of `stale_buffers` as free
    (the launcher removes them before it starts the ranks)."""
    stat = os.statvfs(shm_dir)
    stale = sum(p.stat().st_size for p in stale_buffers(shm_dir=shm_dir) if p.exists())
    return ShmSpace(free=stat.f_bavail * stat.f_frsize + stale, needed=ranks * buffer_bytes())


def _listing(shm_dir: Path) -> list[Path]:
    try:
        return list(shm_dir.iterdir())
    except OSError:
        return []


def _remove(paths: list[Path]) -> int:
    freed = 0
    for path in paths:
        try:
            size = path.stat().st_size
            path.unlink()
            freed += size
        except OSError:  # removed meanwhile
            continue
    return freed
