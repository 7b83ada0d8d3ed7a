"""How a CPU process is set up so that the time a layer takes is steady and the same in a
profile as in a job rank: its torch thread count and its memory allocator.

Both `utils.runtime.rank` (every rank of a CPU job) and `utils.profiling` (before measuring layers)
apply the same rules, so a profile predicts the ranks it is used for.

Why the allocator: glibc's ``malloc`` serves blocks above a (dynamic) threshold with fresh
``mmap`` pages and hands freed heap memory back to the kernel (``trim``). A training step
allocates and frees the same large buffers every micro-batch (the LM head's logits are
several MB), so with the defaults each of them page-faults in again: measured on the
``gpt`` preset with a 16k vocabulary, the head + loss took 66–96 ms per micro-batch
with the defaults against 59–66 ms with the tuning below, across interleaved runs. The
same cost hits a job rank, but differently, because its pattern of allocations differs, so
a default-allocator profile mispredicts the job. PyTorch's CPU performance guides recommend
jemalloc or tcmalloc for the same reason; glibc's own settings do it without an install.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["keep_freed_memory", "prepare_cpu_rank", "rank_threads"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def rank_threads(world_size: int) -> int:
    """torch threads one rank of a CPU job gets: the cores this process may use, shared
    evenly, at least one (what the launcher sets as ``OMP_NUM_THREADS``)."""
    return max(1, len(os.sched_getaffinity(0)) // world_size)


def keep_freed_memory() -> bool:
    """Make this process's glibc allocator serve every block from its heap and keep freed
    memory instead of returning it to the kernel, so that steady-state steps stop paying
    page faults for buffers they freed one micro-batch earlier.

    Lasts for the rest of the process. Returns False, changing nothing, where the C library
    is not glibc (macOS, musl): there the defaults stay and timings are merely noisier.
    """
    # The C library is already loaded: look mallopt up among this process's own symbols
    # (ctypes.util.find_library would run ldconfig in a subprocess at every rank's start).
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # No mmap-served blocks, and never trim the heap top (2**31 - 1 bytes is the largest
    # threshold an int can carry; the steady working set of a rank is far below it).
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def prepare_cpu_rank() -> None:
    """Set up this process as a CPU job rank: the torch thread count the launcher chose
    (``OMP_NUM_THREADS``, see `rank_threads`) and the allocator the profiler measures with."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    keep_freed_memory()

