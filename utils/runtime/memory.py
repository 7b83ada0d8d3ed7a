"""`MemoryMeter`: the memory a rank holds at every instruction boundary of a step.

What a pipeline schedule costs in memory is what a stage holds *between* instructions: the
activations of every micro-batch whose forward ran and whose backward has not, the
gradients, the received tensors. The meter reads the allocator's bytes in use after each
traced instruction and once as the step starts, so a step gives

- ``base``: bytes in use when the step starts (weights, optimizer state, buffers kept across
  steps);
- ``after``: bytes in use after each instruction, in the order the events of the step were
  recorded (so sample i belongs to event i);
- ``peak``: the largest of those (on CUDA: ``torch.cuda.max_memory_allocated`` since the step
  started, which also sees peaks *inside* an instruction).

``peak - base`` is the memory the step adds: activations in flight, gradients, the
recomputation of a checkpointed segment. On CPU it is sampled at instruction boundaries, so
a transient inside one instruction (a backward's temporaries) is not in it.

Readers: on CUDA ``torch.cuda.memory_allocated``; on CPU glibc's ``mallinfo2`` (bytes handed
out by malloc, which serves torch's CPU tensors: exact, unlike the process's RSS, which keeps
freed pages and counts the Python and library code). Where neither exists (macOS, musl), the
meter records nothing and says so. Its kinds (``self.kind``) are among `MEMORY_KINDS`
(`utils.jobs.records`), the one vocabulary of a run's memory figures.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from utils.jobs.records import MemoryRecord


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (malloc.h, glibc >= 2.33): ten size_t fields.
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def cpu_bytes_in_use() -> Callable[[], int] | None:
    """A function returning the bytes malloc has handed out and not taken back (heap blocks
    in use plus mmap-served blocks), or None where the C library has no ``mallinfo2``."""
    mallinfo2 = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2

    def read() -> int:
        info = mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return read


class MemoryMeter:
    """Bytes in use at every instruction boundary of each step, for one rank."""

    def __init__(self, device: str):
        self.device = device
        if device == "cuda":
            import torch

            self._torch = torch
            self.kind = "cuda_memory_allocated"
            self._read: Callable[[], int] | None = torch.cuda.memory_allocated
        else:
            self._torch = None
            self._read = cpu_bytes_in_use()
            self.kind = "cpu_malloc_in_use" if self._read is not None else "unavailable"
        self._base = 0
        self._after: list[int] = []

    def begin_step(self) -> None:
        if self._read is None:
            return
        if self._torch is not None:
            self._torch.cuda.reset_peak_memory_stats()
        self._base = self._read()
        self._after = []

    def sample(self) -> None:
        """Called after every traced instruction."""
        if self._read is not None:
            self._after.append(self._read())

    def end_step(self, step: int) -> dict | None:
        """This step's record (`MemoryRecord.to_dict`: ``step, kind, base, peak, after``), or
        None without a reader."""
        if self._read is None:
            return None
        peak = max([self._base, *self._after])
        if self._torch is not None:
            peak = max(peak, self._torch.cuda.max_memory_allocated())
        return MemoryRecord(kind=self.kind, peak=peak, step=step, base=self._base, after=tuple(self._after)).to_dict()
