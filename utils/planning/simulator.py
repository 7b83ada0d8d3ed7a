"""Discrete-event simulation of a pipeline schedule into the workbook's `Timeline`.

Every rank runs its `Schedule` list in order. An action starts as soon as (a) its rank has
finished the previous action and (b) its input has arrived:

* forward F(k, m) needs F(k-1, m) of the previous virtual stage;
* backward B(k, m) (or input backward I(k, m)) needs its own F(k, m) and the gradient from
  B(k+1, m) (or I(k+1, m)); the last virtual stage needs only its own forward;
* weight backward W(k, m) needs I(k, m) (same rank).

A dependency produced on another rank arrives `comm` seconds after it ended: communication
is modelled as pure latency, never as time a rank is busy, so the timeline holds compute
events only. Chunks on the same rank hand over for free. Per-step work (gradient reduce,
optimizer step) and data loading are not simulated.

The result is a plain `Timeline` (``source="simulated"``), so every metric and plot that
takes a measured run takes a simulation as is. Activation memory over time rides along in
``timeline.meta`` (see `simulate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real

from utils.planning.schedules import Schedule
from utils.timeline import Event, Timeline

__all__ = ["simulate", "cost_table"]

Costs = float | Sequence[float] | Sequence[Sequence[float]]


def cost_table(costs: Costs, *, name: str, num_virtual_stages: int, num_micro_batches: int,
               chunks: int = 1) -> list[list[float]]:
    """Expand a cost given as a scalar, per virtual stage, or per virtual stage x micro-batch
    into a full ``[stage][micro_batch]`` table of non-negative floats (seconds)."""
    vs, m = num_virtual_stages, num_micro_batches
    if isinstance(costs, Real):
        table = [[float(costs)] * m for _ in range(vs)]
    else:
        try:
            rows = list(costs)
        except TypeError:
            raise TypeError(f"{name} must be a number or a sequence, got {costs!r}") from None
        if len(rows) != vs:
            what = (f"{vs} values, one per virtual stage in model order"
                    if chunks > 1 else f"{vs} values, one per stage")
            raise ValueError(f"{name} needs {what}; got {len(rows)}")
        table = []
        for k, row in enumerate(rows):
            if isinstance(row, Real) or getattr(row, "ndim", None) == 0:
                table.append([float(row)] * m)
                continue
            values = [float(x) for x in row]
            if len(values) != m:
                raise ValueError(f"{name}[{k}] needs {m} values (one per micro-batch); "
                                 f"got {len(values)}")
            table.append(values)
    if any(c < 0 or c != c for row in table for c in row):
        raise ValueError(f"{name} must be non-negative numbers")
    return table


def _bytes_per_stage(activation_bytes: float | Sequence[float] | None,
                     vs: int) -> tuple[list[float], str]:
    if activation_bytes is None:
        return [1.0] * vs, "micro-batches"
    if isinstance(activation_bytes, Real):
        return [float(activation_bytes)] * vs, "bytes"
    values = [float(b) for b in activation_bytes]
    if len(values) != vs:
        raise ValueError(f"activation_bytes needs one value per virtual stage ({vs}); "
                         f"got {len(values)}")
    return values, "bytes"


def simulate(schedule: Schedule, forward: Costs, backward: Costs, *,
             weight: Costs | None = None, comm: float = 0.0,
             activation_bytes: float | Sequence[float] | None = None,
             label: str | None = None) -> Timeline:
    """Simulate `schedule` with the given costs (seconds) and return its `Timeline`.

    Costs (`forward`, `backward`, `weight`) are each a scalar, a sequence with one value per
    virtual stage (``num_stages * chunks`` values in model order; virtual stage ``k`` runs on
    rank ``schedule.rank_of(k)``), or a nested ``[stage][micro_batch]`` sequence.

    Backward: for a split schedule (zb-h1, dualpipev), `backward` is the input-gradient pass
    I and `weight` the weight-gradient pass W (required). A full backward B costs
    ``backward + weight`` (weight defaults to 0), in every schedule, so the same three
    numbers compare a split and an unsplit schedule fairly (dualpipev mixes both).

    `comm` is the latency (seconds) of handing an activation or a gradient to another rank.

    The timeline has one event per action: ``stage = rank = rank`` that ran it (its row),
    ``step = 0``, `kind` and `micro_batch` as in the action, ``chunk`` = local model chunk.
    ``timeline.meta`` holds:

    * ``"schedule"``, ``"chunks"``, ``"placement"``, ``"comm"``: what was simulated;
    * ``"activation_memory"``: per rank, a list of ``(time, held)`` step points, the first
      at time 0.0; `held` stays until the next point (changes at the same instant are
      netted). A micro-batch's activations on a virtual stage are taken at the start of its
      forward and freed at the end of its B (or its W when that backward is split),
      counting `activation_bytes` for that virtual stage (a scalar or one value per virtual
      stage); with ``activation_bytes=None`` each counts 1, so the unit is micro-batches.
      ``"activation_memory_unit"`` says which.
    * ``"peak_activation_memory"``: per rank, the maximum of the above.
    """
    plan = schedule._plan  # validates (ValueError on an incomplete or deadlocking schedule)
    p, m, v = schedule.num_stages, schedule.num_micro_batches, schedule.chunks
    vs = p * v
    dims = dict(num_virtual_stages=vs, num_micro_batches=m, chunks=v)
    fwd = cost_table(forward, name="forward", **dims)
    bwd = cost_table(backward, name="backward", **dims)
    split = schedule.split_backward
    if split and weight is None:
        raise ValueError(f"{schedule.name} splits the backward: give backward= (input-gradient "
                         "pass I) and weight= (weight-gradient pass W)")
    wgt = cost_table(weight, name="weight", **dims) if weight is not None else None
    comm = float(comm)
    if comm < 0:
        raise ValueError(f"comm must be >= 0 seconds, got {comm}")

    def duration(kind: str, k: int, mb: int) -> float:
        if kind == "forward":
            return fwd[k][mb]
        if kind == "backward_weight":
            return wgt[k][mb]  # type: ignore[index]
        if kind == "backward" and wgt is not None:
            return bwd[k][mb] + wgt[k][mb]
        return bwd[k][mb]

    durations = [duration(a.kind, a.virtual_stage, a.micro_batch) for a in plan.actions]
    start, end = plan.times(durations, comm, p)
    events = [Event(stage=r, rank=r, step=0, kind=a.kind, micro_batch=a.micro_batch,
                    start=s, end=e, chunk=a.chunk)
              for a, r, s, e in zip(plan.actions, plan.rank, start, end)]

    per_stage_bytes, unit = _bytes_per_stage(activation_bytes, vs)
    # freed by the pass that last reads them: a full backward B, or W after a split I
    # (dualpipev mixes both, so the kind of each action decides, not the schedule's)
    freeing = ("backward", "backward_weight")
    changes: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    for a, r, s, e in zip(plan.actions, plan.rank, start, end):
        if a.kind == "forward":
            changes[r].append((s, per_stage_bytes[a.virtual_stage]))
        elif a.kind in freeing:
            changes[r].append((e, -per_stage_bytes[a.virtual_stage]))
    memory, peaks = [], []
    for rank_changes in changes:
        points: list[tuple[float, float]] = [(0.0, 0)]
        level = 0.0
        for t, delta in sorted(rank_changes):
            level += delta
            # A free and an allocation at the same instant computed along two paths (0.15 vs
            # 0.15000000000000002) are one change, not a spike of one extra micro-batch.
            if abs(points[-1][0] - t) <= 1e-9 * max(1.0, abs(t)):
                points[-1] = (t, level)
            else:
                points.append((t, level))
        memory.append(points)
        peaks.append(max(level for _, level in points))
    meta = {"schedule": schedule.name, "chunks": v, "placement": schedule.placement, "comm": comm,
            "activation_memory": memory, "activation_memory_unit": unit,
            "peak_activation_memory": peaks}
    return Timeline(events=tuple(events), num_stages=p, num_micro_batches=m,
                    source="simulated", label=label or schedule.name, meta=meta)
