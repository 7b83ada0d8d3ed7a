"""V-shaped placement and the DualPipeV and ZB-V orders, as plain tuples.

DualPipeV (the "cut-in-half" variant of DeepSeek-V3's DualPipe, see the DualPipe README)
runs ``2 * p`` virtual stages on ``p`` ranks in a **V**: rank ``r`` holds virtual stage ``r``
(chunk 0, activations flow towards the last rank) and virtual stage ``2p - 1 - r`` (chunk 1,
flowing back), so rank 0 holds both the first and the last virtual stage, and the hand-over
from virtual stage ``p - 1`` to ``p`` stays on the last rank.

`dualpipev_order` gives every rank's compute order: the same actions, in the same order, as
torch's ``ScheduleDualPipeV.pipeline_order`` (torch 2.13, itself after DeepSeek's reference
code), with each overlapped forward+backward pair (torch's ``OVERLAP_F_B``) written as its
two actions, forward first, which is how torch's runtime executes them unless a custom
overlap function is registered. Most backwards are full (``"backward"``); the first warm-up
ones and the last ones of the drain are split into an input pass and a later weight pass.

This module imports nothing from `utils.planning.schedules` (which imports it): it speaks
in ``(virtual_stage, kind, micro_batch)`` tuples (`utils.planning.orders.Op`);
`build_schedule("dualpipev", ...)` and `build_schedule("zbv", ...)` turn them into a `Schedule`.
"""

from __future__ import annotations

from utils.planning.orders import Op

__all__ = ["v_rank", "dualpipev_order", "zbv_order"]


def v_rank(virtual_stage: int, num_stages: int) -> int:
    """The rank that holds `virtual_stage` in the V placement: ``k`` for ``k < p``, else ``2p - 1 - k``."""
    k, p = virtual_stage, num_stages
    if not 0 <= k < 2 * p:
        raise ValueError(f"virtual stage {k} is outside 0..{2 * p - 1} (V placement on {p} ranks)")
    return k if k < p else 2 * p - 1 - k


def dualpipev_order(num_stages: int, num_micro_batches: int) -> tuple[tuple[Op, ...], ...]:
    """Every rank's DualPipeV compute order; needs ``num_micro_batches >= 2 * num_stages``
    (torch and DeepSpeed refuse fewer)."""
    p, m = num_stages, num_micro_batches
    if m < 2 * p:
        raise ValueError(f"dualpipev needs at least 2 * {p} = {2 * p} micro-batches (one per "
                         f"virtual stage, as torch and DeepSpeed require), got {m}")
    return tuple(_rank_order(p, m, r) for r in range(p))


def _rank_order(p: int, m: int, r: int) -> tuple[Op, ...]:
    """Rank `r`'s order, in the eight phases of the reference schedule."""
    down, up = r, 2 * p - 1 - r  # chunk 0 (towards the last rank) and chunk 1 (back to rank 0)
    ops: list[Op] = []
    next_forward = {down: 0, up: 0}
    next_backward = {down: 0, up: 0}  # the next micro-batch whose backward (B or I) runs
    pending_weight: list[tuple[int, int]] = []  # (stage, micro-batch) whose I ran, W not yet

    def forward(stage: int) -> None:
        ops.append((stage, "forward", next_forward[stage]))
        next_forward[stage] += 1

    def backward(stage: int, split: bool = False) -> None:
        mb = next_backward[stage]
        next_backward[stage] += 1
        ops.append((stage, "backward_input" if split else "backward", mb))
        if split:
            pending_weight.append((stage, mb))

    def weight() -> None:  # the oldest pending weight pass, if any
        if pending_weight:
            stage, mb = pending_weight.pop(0)
            ops.append((stage, "backward_weight", mb))

    for _ in range(2 * (p - r - 1)):  # 1: forwards of chunk 0 only
        forward(down)
    for _ in range(r + 1):  # 2: both chunks forward
        forward(down)
        forward(up)
    for _ in range(p - r - 1):  # 3: split backward of chunk 1, its weight at once, a forward
        backward(up, split=True)
        weight()
        forward(up)
    for _ in range(m - 2 * p + r + 1):  # 4: steady state, forward of one chunk + backward of the other
        forward(down)  # (torch's rank p - 1 does not overlap the first pair; same order here)
        backward(up)
        forward(up)
        backward(down)
    for _ in range(p - r - 1):  # 5
        backward(up)
        forward(up)
        backward(down)
    split = False  # 6: both chunks backward; the second half of them split (zero bubble)
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        backward(up, split)
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        backward(down, split)
    for _ in range(p - r - 1):  # 7: weight passes fill the drain between chunk-0 backwards
        weight()
        backward(down, split)
    for _ in range(r + 1):  # 8: the remaining weight passes
        weight()
    return tuple(ops)


def zbv_order(num_stages: int, num_micro_batches: int) -> tuple[tuple[Op, ...], ...]:
    """Every rank's ZB-V compute order (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024,
    section 6): the V placement of DualPipeV with every backward split into an input pass (I)
    and a weight pass (W). The same actions in the same order as torch's
    ``ScheduleZBVZeroBubble.pipeline_order`` (torch 2.13).

    Rank ``r`` warms up with ``2(p - r) - 1`` forwards of chunk 0, ``r`` pairs of chunk-1 and
    chunk-0 forwards and ``p - r`` rounds of a chunk-1 forward followed at once by its I and
    W; the steady state alternates F/I/W of chunk 0 with F/I/W of chunk 1; the drain runs the
    remaining input passes first and the weight passes after them. Like torch, the order is
    built for ``max(m, 2p - 1)`` micro-batches and the actions of micro-batches ``>= m`` are
    then dropped, so any ``m >= 1`` runs (below ``2p - 1`` the pipeline is never full).
    """
    p, m = num_stages, num_micro_batches
    if p < 1 or m < 1:
        raise ValueError(f"zbv needs at least one rank and one micro-batch, got {p} and {m}")
    return tuple(tuple(op for op in _zbv_rank(p, max(m, 2 * p - 1), r) if op[2] < m) for r in range(p))


def _zbv_rank(p: int, n: int, r: int) -> list[Op]:
    down, up = r, 2 * p - 1 - r  # chunk 0 (towards the last rank) and chunk 1 (back to rank 0)
    ops: list[Op] = []
    forwards = {down: 0, up: 0}
    inputs = {down: 0, up: 0}
    weights = {down: 0, up: 0}

    def run(stage: int, kind: str) -> None:
        counter = {"forward": forwards, "backward_input": inputs, "backward_weight": weights}[kind]
        ops.append((stage, kind, counter[stage]))
        counter[stage] += 1

    for _ in range(2 * (p - r) - 1):  # warm-up 1: chunk-0 forwards
        run(down, "forward")
    for _ in range(r):  # warm-up 2: chunk-1 and chunk-0 forwards in pairs
        run(up, "forward")
        run(down, "forward")
    for _ in range(p - r):  # warm-up 3: chunk-1 forward, its input and weight passes at once
        run(up, "forward")
        run(up, "backward_input")
        run(up, "backward_weight")
    while forwards[up] < forwards[down] or forwards[down] < n:  # steady state
        if forwards[down] < n:
            run(down, "forward")
        run(down, "backward_input")
        run(down, "backward_weight")
        run(up, "forward")
        run(up, "backward_input")
        run(up, "backward_weight")
    for _ in range(r):  # drain 1: input passes of both chunks
        run(down, "backward_input")
        run(up, "backward_input")
    for _ in range(p - r):  # drain 2: chunk-0 input passes, each with a weight pass
        run(down, "backward_input")
        run(down, "backward_weight")
    while weights[up] < inputs[up]:  # drain 3: the weight passes left, chunk 1 first
        run(up, "backward_weight")
    while weights[down] < inputs[down]:
        run(down, "backward_weight")
    return ops
