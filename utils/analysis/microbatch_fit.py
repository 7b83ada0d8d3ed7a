"""The fixed cost of a micro-batch, fitted on a run of variable-length micro-batches.

A token-budget plan (`utils.planning.microbatching`) prices a micro-batch of n samples of
padded length L as ``a + n·L + β·n·L²`` token units: `a` (``MicroBatchCost.overhead``) is what
a micro-batch costs a stage whatever its size — DeepSpeed's instructions around it, its load
and the transfer part of its send. The workbook's value, ``varlen.OVERHEAD_TOKENS``, was
fitted on a 2-core CPU; on another device it differs (on a GPU, kernel launches and the host
side of every instruction weigh more against the compute). `fit_micro_batch_costs` measures it
on any run whose micro-batches vary in size: per stage and pass, least squares of
``seconds = fixed + per_unit × units`` over the steps after the first, where ``units`` is the
plan's cost without its fixed part and ``seconds`` is the instruction plus what the rank does
for the same micro-batch and cannot compute meanwhile (its load, the transfer part of its
blocking send). ``fixed / per_unit`` is `a` in token units on that device.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

#: What a rank does for one micro-batch besides computing it, and cannot compute meanwhile:
#: loading it and the transfer part of its blocking send (as `measured_stage_costs` counts).
BUSY_WITH = {"forward": ("load", "send_act"), "backward": ("send_grad",)}


@dataclass(frozen=True)
class MicroBatchFit:
    """``seconds = fixed_s + per_unit_s × units`` for one stage's forwards or backwards."""

    stage: int
    kind: str
    """``"forward"`` or ``"backward"``."""
    fixed_s: float
    """Seconds a micro-batch costs whatever its size (the intercept)."""
    per_unit_s: float
    """Seconds per token unit of the plan's cost model (the slope)."""
    points: int
    """Micro-batches the fit rests on."""

    @property
    def fixed_tokens(self) -> float:
        """The fixed cost in token units: what ``MicroBatchCost.overhead`` should be here."""
        return self.fixed_s / self.per_unit_s


def fit_micro_batch_costs(run, cost) -> dict[tuple[int, str], MicroBatchFit]:
    """Per (stage, kind) the `MicroBatchFit` of `run` (variable micro-batching: its
    ``micro_batch_tokens``), in the units of `cost` (a ``MicroBatchCost``: the job's own is
    ``utils.workloads.varlen.default_cost(model)``). Raises ValueError when the run's
    micro-batches do not vary in size after its first step (nothing to fit a slope to)."""
    from utils.analysis.intervals import transfer_intervals

    table = run.micro_batch_tokens
    if not table:
        raise ValueError(f"{run.name} has fixed micro-batches: fit on a run with batching='sorted' or "
                         "'token-budget' (the sizes must vary)")
    fitted = {}
    for stage in range(run.spec.num_stages):
        for kind in BUSY_WITH:
            xs, ys = [], []
            for step, micro_batches in sorted(table.items()):
                if step == 0:  # the first step warms up
                    continue
                everyone = list(run.timeline.select(step=step))
                transfer = transfer_intervals(everyone)  # a send's transfer part needs both ends' events
                events = [e for e in everyone if e.stage == stage]
                extra: dict[int, float] = {}
                for e in events:
                    if e.kind in BUSY_WITH[kind]:
                        start, end = transfer.get(id(e), (e.start, e.end))
                        extra[e.micro_batch] = extra.get(e.micro_batch, 0.0) + end - start
                computed = sorted((e for e in events if e.kind == kind), key=lambda e: e.micro_batch)
                for e, (samples, _real, padded) in zip(computed, micro_batches):
                    xs.append(cost(samples, padded / samples) - cost.overhead)
                    ys.append(e.duration + extra.get(e.micro_batch, 0.0))
            if len(set(xs)) < 2:
                raise ValueError(f"{run.name}: stage {stage}'s {kind} micro-batches all have the same size after "
                                 "step 0; fit on a run whose micro-batch sizes vary")
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            fitted[stage, kind] = MicroBatchFit(stage=stage, kind=kind, fixed_s=my - slope * mx, per_unit_s=slope,
                                                points=len(xs))
    return fitted
