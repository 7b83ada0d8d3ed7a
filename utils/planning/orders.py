"""Building blocks of the per-rank orders `utils.planning.schedules.build_schedule` writes:
the 1F1B pattern and the round size of interleaved 1F1B.

Generic in the action type and free of imports from `schedules` (which imports this), so
the rules stay small enough to read next to the sources they follow (DeepSpeed's
``TrainSchedule``, torch's ``ScheduleInterleaved1F1B`` and ``ScheduleInterleavedZeroBubble``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["interleaved_group_size", "one_f_one_b"]

T = TypeVar("T")


def interleaved_group_size(num_stages: int, num_micro_batches: int) -> int:
    """Micro-batches per round of interleaved 1F1B, as torch computes it.

    torch 2.13 (``ScheduleInterleaved1F1B``) runs ``rounds = max(1, m // p)`` rounds of
    ``m // rounds`` micro-batches, which needs ``m % rounds == 0`` (e.g. p=4 allows m=3, 4,
    6, 8, 10 but not 9). We follow torch. Megatron-LM's original interleaved schedule (the
    2021 paper's code) required ``m % p == 0`` (rounds of exactly ``p``); later Megatron-Core
    makes the round size a setting (``microbatch_group_size_per_vp_stage``, default ``p``,
    between ``p`` and ``m``), so it still refuses ``m < p``.

    With ``m < p`` torch runs one round of ``m``: allowed, but the closed-form bubble
    ``(p-1)/(v*m)`` no longer holds (see `utils.analysis.theory.bubble_overhead_interleaved`).
    """
    rounds = max(1, num_micro_batches // num_stages)
    if num_micro_batches % rounds:
        raise ValueError(
            f"interleaved-1f1b with {num_stages} ranks cannot run {num_micro_batches} "
            f"micro-batches: they must split into {rounds} equal rounds (torch's rule, "
            f"rounds = max(1, m // p); Megatron's original code needs a multiple of {num_stages})")
    return num_micro_batches // rounds


def one_f_one_b(fwd: Callable[[int], T], bwd: Callable[[int], T], warmup: int, total: int,
                weight: Callable[[int], T] | None = None, delay: int = 0) -> tuple[T, ...]:
    """Warm-up forwards, then forward/backward pairs, then the remaining backwards.

    With `weight` (split backward), the weight pass of backward ``j - delay`` follows
    backward ``j``; the `delay` passes left over run at the very end.
    """
    ops: list[T] = [fwd(i) for i in range(warmup)]
    for j in range(total):
        if warmup + j < total:
            ops.append(fwd(warmup + j))
        ops.append(bwd(j))
        if weight is not None and j >= delay:
            ops.append(weight(j - delay))
    if weight is not None:
        ops.extend(weight(j) for j in range(max(0, total - delay), total))
    return tuple(ops)
