"""Closed-form pipeline formulas, to hold measured and simulated timelines against.

All formulas assume what textbooks assume: every stage costs the same per micro-batch
(unless a function takes per-stage costs), communication is free and the step is one
pipeline flush (fill, steady state, drain). Real runs deviate; the workbook's point is to
measure how much and why.

Two ways to express the bubble appear in the literature and they are easy to confuse:

* **bubble ratio** (what `utils.analysis.metrics` measures): idle share of the whole pipeline phase,
  ``1 - busy / (p * makespan)``. For GPipe and 1F1B with equal costs this is
  ``(p - 1) / (m + p - 1)``; it is always below 1.
* **bubble overhead** (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", section 2.2): bubble time divided by the *ideal*
  compute time ``m * t``. For GPipe and 1F1B this is ``(p - 1) / m``; interleaving ``v``
  model chunks per device divides it by ``v``: ``(p - 1) / (v * m)``, **for m >= p** (see
  `bubble_overhead_interleaved`). It can exceed 1.

They describe the same bubble: ``ratio = overhead / (1 + overhead)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from utils import validation

__all__ = [
    "bubble_ratio_1f1b",
    "bubble_ratio_gpipe",
    "bubble_overhead",
    "bubble_overhead_interleaved",
    "bubble_ratio_interleaved",
    "bubble_time_zb_h1",
    "overhead_to_ratio",
    "makespan_uniform",
    "makespan_gpipe",
    "makespan_estimate",
    "bubble_ratio_estimate",
]


def _check_costs(name: str, costs: Sequence[float]) -> list[float]:
    values = [float(c) for c in costs]
    if not values:
        raise ValueError(f"{name} must list one cost per stage; got an empty sequence")
    if any(c < 0 for c in values):
        raise ValueError(f"{name} must be non-negative, got {values}")
    return values


# --- bubble ratio and overhead ----------------------------------------------------------------
def bubble_ratio_1f1b(p: int, m: int) -> float:
    """Idle share of the pipeline phase for 1F1B with equal stage costs: ``(p-1)/(m+p-1)``.

    `p` is the number of stages, `m` the number of micro-batches per step. Each stage is
    busy for ``m`` slots of a ``m + p - 1`` slot makespan: ``p - 1`` slots go to filling
    and draining the pipeline. Comparable with `Metrics.bubble_ratio`.
    """
    p = validation.count("p", p, meaning="number of pipeline stages")
    m = validation.count("m", m, meaning="number of micro-batches")
    return (p - 1) / (m + p - 1)


def bubble_ratio_gpipe(p: int, m: int) -> float:
    """Same value as `bubble_ratio_1f1b`: with equal costs GPipe and 1F1B have the same bubble.

    Both fill the pipeline with ``p - 1`` forward slots and drain it with ``p - 1``
    backward slots. What differs is memory: GPipe keeps the activations of all ``m``
    micro-batches alive until the backward phase, 1F1B at most ``p - s`` on stage ``s``.
    """
    return bubble_ratio_1f1b(p, m)


def bubble_overhead(p: int, m: int) -> float:
    """Bubble time over ideal compute time for GPipe/1F1B: ``(p-1)/m`` (Megatron's measure)."""
    p = validation.count("p", p, meaning="number of pipeline stages")
    m = validation.count("m", m, meaning="number of micro-batches")
    return (p - 1) / m


def bubble_overhead_interleaved(p: int, m: int, v: int) -> float:
    """Bubble time over ideal compute time for interleaved 1F1B: ``(p-1)/(v*m)`` when ``m >= p``.

    Narayanan et al. 2021: each of the ``p`` devices holds ``v`` model chunks (virtual
    stages), so one fill/drain slot costs ``1/v`` of a non-interleaved slot: the bubble time
    is ``(p-1) * t / v`` with ``t = t_f + t_b`` per micro-batch and device. The price is
    ``v`` times more point-to-point messages.

    That holds only for ``m >= p``: a micro-batch that comes back to rank 0 for its next
    chunk must find the rank free, and with fewer than ``p`` micro-batches in flight the
    rank has run out of work first. Megatron-LM therefore refuses ``m < p`` (its original code
    needs ``m % p == 0``); torch (and `build_schedule`) run it as one round of ``m``, and for
    that order the bubble is ``((p-1) + (v-1)*(p-m)) * t / v``: each of the ``v - 1`` returns to
    rank 0 waits ``p - m`` slots. This function returns that exact value for ``m < p`` (it
    equals the simulator's). E.g. ``p=4, m=3, v=2, t=3``: the bubble is 6.0 time units
    (overhead 6/9), not ``(p-1)*t/v = 4.5``; one micro-batch alone needs ``p * t``. For
    ``v = 1`` both cases are ``(p-1)/m``.
    """
    p = validation.count("p", p, meaning="number of pipeline stages (devices)")
    m = validation.count("m", m, meaning="number of micro-batches")
    v = validation.count("v", v, meaning="model chunks per device")
    slots = (p - 1) + (v - 1) * max(0, p - m)  # fill/drain slots of t/v each
    return slots / (v * m)


def bubble_ratio_interleaved(p: int, m: int, v: int) -> float:
    """Idle share of the makespan for interleaved 1F1B: ``(p-1)/(v*m + p - 1)`` when ``m >= p``.

    The same bubble as `bubble_overhead_interleaved` (including its exact value for
    ``m < p``), expressed as a fraction of the total makespan, so it can be compared with a
    measured `Metrics.bubble_ratio`. With ``v = 1`` it equals `bubble_ratio_1f1b`.
    """
    return overhead_to_ratio(bubble_overhead_interleaved(p, m, v))


def bubble_time_zb_h1(p: int, m: int, forward: float, backward_input: float,
                      backward_weight: float) -> float:
    """Idle time per stage of ZB-H1 with equal stage costs: ``(p-1) * max(F+I-W, F, I)``.

    The zero-bubble paper (Qi et al., ICLR 2024) introduces ZB-H1 with ``F = I = W``
    (bubble one third of 1F1B's ``(p-1)(F+I+W)``); DeepSeek's DualPipe README lists ZB1P as
    ``(p-1)(F+B-2W)`` with ``B = I + W``, i.e. ``(p-1)(F+I-W)``. That form holds only when
    ``W <= min(F, I)``: a postponed W fills a gap no longer than the shorter of F and I. In
    general the bubble is ``(p-1) * (F + I - min(F, I, W))`` = ``(p-1) * max(F+I-W, F, I)``,
    e.g. p=2, F=1, I=2, W=2 gives 2.0, not 1.0. This general form is the workbook's finding
    from the simulator (checked for p <= 6, p <= m <= 12 over a grid of costs in
    tests/unit/test_theory.py), not a formula from the paper.

    Requires ``m >= p``; with fewer micro-batches the warm-up never reaches a steady state
    and the bubble is larger (simulate it), so ValueError.
    """
    p = validation.count("p", p, meaning="number of pipeline stages")
    m = validation.count("m", m, meaning="number of micro-batches")
    f, i, w = _check_costs("forward, backward_input, backward_weight",
                           [forward, backward_input, backward_weight])
    if m < p:
        raise ValueError(f"the ZB-H1 bubble formula needs m >= p (got m={m}, p={p}): with fewer "
                         "micro-batches than stages the bubble is larger; use utils.simulate")
    return (p - 1) * max(f + i - w, f, i)


def overhead_to_ratio(overhead: float) -> float:
    """Convert a bubble overhead (bubble / ideal compute) to a bubble ratio (bubble / makespan)."""
    if overhead < 0:
        raise ValueError(f"overhead must be non-negative, got {overhead}")
    return overhead / (1.0 + overhead)


# --- makespan ---------------------------------------------------------------------------------
def makespan_uniform(p: int, m: int, t: float) -> float:
    """Pipeline-phase time with equal stage costs: ``(m + p - 1) * t``.

    `t` is one stage's forward plus backward time for one micro-batch. Exact for GPipe and
    1F1B when communication is free.
    """
    p = validation.count("p", p, meaning="number of pipeline stages")
    m = validation.count("m", m, meaning="number of micro-batches")
    if t < 0:
        raise ValueError(f"t (forward+backward time per micro-batch) must be >= 0, got {t}")
    return (m + p - 1) * t


def makespan_gpipe(forward: Sequence[float], backward: Sequence[float], m: int) -> float:
    """Exact GPipe makespan with per-stage costs and free communication.

    ``sum_s (f_s + b_s) + (m - 1) * (max_s f_s + max_s b_s)``: the forward phase is a flow
    shop of identical jobs (the first micro-batch crosses every stage, the other ``m - 1``
    follow at the pace of the slowest forward stage), then the backward phase is the same
    in reverse. Assumes unlimited activation memory, as GPipe does.
    """
    f = _check_costs("forward", forward)
    b = _check_costs("backward", backward)
    if len(f) != len(b):
        raise ValueError(f"forward and backward need one cost per stage: {len(f)} vs {len(b)}")
    m = validation.count("m", m, meaning="number of micro-batches")
    return sum(f) + sum(b) + (m - 1) * (max(f) + max(b))


def makespan_estimate(stage_costs: Sequence[float], m: int) -> float:
    """Approximate makespan when stages cost differently: ``(m-1) * max_s t_s + sum_s t_s``.

    `stage_costs` holds each stage's forward+backward time per micro-batch. The slowest
    stage sets the beat: after the first micro-batch has crossed every stage, each further
    one costs the slowest stage's time. This is an approximation:

    * exact for GPipe when the same stage is the slowest in forward and in backward (see
      `makespan_gpipe`), and exact for 1F1B with equal costs;
    * for 1F1B with unequal costs the real makespan is usually a little *shorter*, because
      warm-up forwards fill some of the slowest stage's waiting.

    Communication time is ignored; add it to the stage costs if it is not overlapped.
    """
    t = _check_costs("stage_costs", stage_costs)
    m = validation.count("m", m, meaning="number of micro-batches")
    return (m - 1) * max(t) + sum(t)


def bubble_ratio_estimate(stage_costs: Sequence[float], m: int) -> float:
    """Bubble ratio implied by `makespan_estimate`: ``1 - m * sum(t) / (p * makespan)``.

    With equal costs it reduces to ``(p-1)/(m+p-1)``; imbalance raises it, because every
    stage but the slowest waits for the slowest one in every steady-state slot.
    """
    t = _check_costs("stage_costs", stage_costs)
    makespan = makespan_estimate(t, m)
    if makespan == 0:
        raise ValueError("all stage costs are zero: the bubble ratio is undefined")
    return 1.0 - m * sum(t) / (len(t) * makespan)
