"""The per-rank orders of the loop-placed schedules (GPipe, 1F1B, ZB-H1, interleaved 1F1B) and
their building blocks: the 1F1B pattern and the round size of interleaved 1F1B.

Each order function takes ``(p, m, v)`` (ranks, micro-batches, chunks per rank) and returns
every rank's ``(virtual stage, kind, micro-batch)`` tuples; the schedule catalogue
(`utils.planning.catalogue`) names which function builds which schedule, and
`utils.planning.schedules.build_schedule` turns the tuples into a `Schedule`. Free of imports
from `schedules`, so the rules stay small enough to read next to the sources they follow
(DeepSpeed's ``TrainSchedule``, torch's ``ScheduleInterleaved1F1B`` and
``ScheduleInterleavedZeroBubble``). The V-placed orders live in `utils.planning.vshaped`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["Op", "gpipe_order", "interleaved_group_size", "interleaved_order", "one_f_one_b", "one_f_one_b_order",
           "zb_h1_order"]

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


# --- per-schedule orders, as (virtual stage, kind, micro-batch) tuples per rank ----------------
Op = tuple[int, str, int]
"""``(virtual stage, kind, micro-batch)``, kind one of forward/backward/backward_input/backward_weight."""


def _single_chunk(name: str, v: int) -> None:
    if v != 1:
        raise ValueError(f"{name} runs one model chunk per rank (chunks=1), got chunks={v}; "
                         "use 'interleaved-1f1b', 'dualpipev' or 'zbv' for several")


def gpipe_order(p: int, m: int, v: int = 1) -> tuple[tuple[Op, ...], ...]:
    """GPipe: every rank runs all ``m`` forwards, then all backwards in micro-batch order."""
    _single_chunk("gpipe", v)
    return tuple(tuple((r, "forward", i) for i in range(m)) + tuple((r, "backward", j) for j in range(m))
                 for r in range(p))


def one_f_one_b_order(p: int, m: int, v: int = 1) -> tuple[tuple[Op, ...], ...]:
    """1F1B: rank ``r`` runs ``min(p - r - 1, m)`` warm-up forwards, then alternates; DeepSpeed's
    ``TrainSchedule`` order."""
    _single_chunk("1f1b", v)
    return tuple(one_f_one_b(lambda i, r=r: (r, "forward", i), lambda j, r=r: (r, "backward", j),
                             min(p - r - 1, m), m) for r in range(p))


def zb_h1_order(p: int, m: int, v: int = 1) -> tuple[tuple[Op, ...], ...]:
    """ZB-H1: 1F1B's forward/input-backward order, rank ``r`` postponing its first ``r`` weight
    passes into the drain; torch's ``ScheduleInterleavedZeroBubble`` with one chunk per rank."""
    _single_chunk("zb-h1", v)
    return tuple(one_f_one_b(lambda i, r=r: (r, "forward", i), lambda j, r=r: (r, "backward_input", j),
                             min(p - r - 1, m), m, weight=lambda j, r=r: (r, "backward_weight", j), delay=r)
                 for r in range(p))


def interleaved_order(p: int, m: int, v: int) -> tuple[tuple[Op, ...], ...]:
    """Interleaved 1F1B with ``v >= 2`` chunks per rank in the loop placement, depth first in
    rounds of `interleaved_group_size` micro-batches; torch's ``ScheduleInterleaved1F1B``."""
    if v < 2:
        raise ValueError("interleaved-1f1b needs chunks >= 2 model chunks per rank; "
                         "with one chunk per rank use '1f1b'")
    group = interleaved_group_size(p, m)

    def place(i: int, reverse: bool) -> tuple[int, int]:  # op i of a kind -> (chunk, micro-batch)
        c = (i // group) % v
        return (v - 1 - c if reverse else c), (i // (group * v)) * group + i % group

    def row(r: int) -> tuple[Op, ...]:
        def fwd(i: int) -> Op:
            c, mb = place(i, False)
            return (c * p + r, "forward", mb)

        def bwd(j: int) -> Op:
            c, mb = place(j, True)
            return (c * p + r, "backward", mb)
        return one_f_one_b(fwd, bwd, min((v - 1) * group + 2 * (p - 1 - r), v * m), v * m)
    return tuple(row(r) for r in range(p))
