"""When a running pipeline job should re-partition itself: the decision, without processes.

A partition chosen before launch rests on costs measured (or guessed) before training. They
drift while it runs: layers get frozen and lose their backward, sequence lengths change, a
device slows down. A job that measures every layer's cost in every step can move layers
between stages, but a move costs time (weights and optimizer state travel, the engine is
rebuilt) and measurements are noisy, so a naive "re-balance whenever the balance is off"
thrashes. This module is the policy, a pure function of numbers, so that it is unit-tested on
hand-built traces and the job only carries out what `decide` says:

1. look only at the last ``window`` measured steps, per-layer medians (one slow step is
   not a trend);
2. the candidate is the exact min-max partition of those medians
   (`utils.planning.partitioning.partition_layers`, ``method="balanced"``);
3. the step time it would give is predicted by the simulator as a ratio applied to the
   measured step time, so what the simulator leaves out (optimizer step, data loading)
   cancels;
4. hysteresis: a predicted saving below ``min_gain`` of the step is treated as noise;
5. payback: the saving over the remaining steps must cover ``payback`` times the cost of
   migrating.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from utils import validation
from utils.planning.catalogue import schedules_on
from utils.planning.partitioning import partition_layers, stage_costs
from utils.planning.schedules import build_schedule
from utils.planning.simulator import simulate

__all__ = ["Rebalance", "LayerCosts", "Decision", "decide", "moved_layers",
           "estimate_migration_seconds", "REBALANCE_SCHEDULES", "OUTCOMES", "MIGRATION_SOURCES"]

REBALANCE_SCHEDULES: tuple[str, ...] = schedules_on("deepspeed")
"""Schedules a re-balancing job runs: the ones DeepSpeed's engine runs (`utils.planning.catalogue`)."""

OUTCOMES: tuple[str, ...] = ("too-few-measurements", "already-balanced", "below-min-gain", "no-payback", "move")
"""What a look can decide, one per rule of `decide`, in the order the rules are tried."""

MIGRATION_SOURCES: tuple[str, ...] = ("measured", "assumed", "estimated")
"""Where a decision's migration cost came from: the job's last move, measured; a figure given
(``Rebalance.migration_seconds``, or a caller of `decide`); `estimate_migration_seconds`."""


@dataclass(frozen=True, kw_only=True)
class Rebalance:
    """Policy of ``JobSpec(rebalance=Rebalance(...))``: when a running job re-partitions itself."""

    every: int = 4
    """Look every `every` steps: the job calls `decide` before step ``s`` when
    ``s > 0 and s % every == 0`` (see `due`), so the first look is before step `every`."""
    window: int = 3
    """How many of the most recent measured steps a look uses (per-layer medians);
    ``1 <= window <= every``, so a look after a migration sees only steps measured after it."""
    min_gain: float = 0.05
    """Hysteresis: never move for a predicted saving per step below this fraction of the
    measured step time (measurement noise); ``0 <= min_gain < 1``."""
    payback: float = 2.0
    """Move only when the predicted saving per step × remaining steps is at least
    ``payback`` × the migration cost; ``> 0``."""
    migration_seconds: float | None = None
    """The migration cost to assume before one was measured (seconds, ``>= 0``); None: the
    job uses `estimate_migration_seconds`. After a migration the measured cost replaces it."""

    def due(self, step: int) -> bool:
        """Whether the job looks before step `step`."""
        return step > 0 and step % self.every == 0

    def check(self) -> None:
        """Raise TypeError (wrong type) or ValueError (out of range) naming the field and
        saying what to change."""
        for name in ("every", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Rebalance.{name} must be an integer number of steps, got {value!r}")
            if value < 1:
                raise ValueError(f"Rebalance.{name} must be at least 1 step, got {value}")
        if self.window > self.every:
            raise ValueError(f"Rebalance.window={self.window} is more than every={self.every}: a look "
                             "would use steps measured before the previous look's migration; use "
                             f"window <= {self.every} or a larger every")
        _real("Rebalance.min_gain", self.min_gain)
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"Rebalance.min_gain must be a fraction of the step time in [0, 1), such as "
                             f"0.05 for 5%, got {self.min_gain!r}")
        _real("Rebalance.payback", self.payback)
        if not self.payback > 0:
            raise ValueError(f"Rebalance.payback must be > 0 (2.0: the saving must pay the migration "
                             f"back twice), got {self.payback!r}")
        if self.migration_seconds is not None:
            _real("Rebalance.migration_seconds", self.migration_seconds)
            if self.migration_seconds < 0:
                raise ValueError(f"Rebalance.migration_seconds must be >= 0 seconds or None (estimate "
                                 f"it), got {self.migration_seconds!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rebalance:
        policy = cls(**_known(cls, data))
        policy.check()
        return policy


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer cost measured inside a running job in one training step: seconds per
    micro-batch (mean over the step's micro-batches), indexed by global layer index."""

    step: int
    """The training step measured."""
    forward: tuple[float, ...]
    """Forward seconds per micro-batch of every layer."""
    backward: tuple[float, ...]
    """Backward seconds per micro-batch of every layer."""

    def __post_init__(self) -> None:
        validation.count("LayerCosts.step", self.step, minimum=0)
        for name in ("forward", "backward"):
            values = tuple(float(_real(f"LayerCosts.{name}", v)) for v in getattr(self, name))
            if any(v < 0 for v in values):
                raise ValueError(f"LayerCosts.{name} of step {self.step} has a negative time: {values}")
            object.__setattr__(self, name, values)
        if len(self.forward) != len(self.backward) or not self.forward:
            raise ValueError(f"LayerCosts of step {self.step}: forward has {len(self.forward)} layers and "
                             f"backward {len(self.backward)}; give one value per layer in both (at least one)")

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "forward": list(self.forward), "backward": list(self.backward)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerCosts:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Decision:
    """What one look decided, with every figure it used (the job records it with the move)."""

    step: int
    """The step before which it was decided."""
    boundaries: tuple[int, ...]
    """The partition in force."""
    candidate: tuple[int, ...]
    """The exact min-max partition of the measured costs (`boundaries` when there were too
    few measurements)."""
    layer_forward: tuple[float, ...]
    """Median forward seconds per micro-batch of every layer (empty: too few measurements)."""
    layer_backward: tuple[float, ...]
    """Median backward seconds per micro-batch of every layer (empty: too few measurements)."""
    stage_costs: tuple[float, ...]
    """Forward + backward seconds per micro-batch of every stage of `boundaries`."""
    candidate_stage_costs: tuple[float, ...]
    """The same for `candidate`."""
    measured_step_seconds: float
    """Median of the measured step times in the window (0.0 when none)."""
    predicted_step_seconds: float
    """The candidate's step time: measured × simulated(candidate) / simulated(current)."""
    saving_per_step: float
    """``measured_step_seconds - predicted_step_seconds`` (negative: the candidate is slower)."""
    remaining_steps: int
    """Steps left after this look."""
    migration_seconds: float
    """The migration cost the look weighed the saving against (seconds)."""
    migrate: bool
    """Whether to move to `candidate` now."""
    reason: str
    """One English sentence with the figures that decided (`utils.ui.decisions` shows it in
    the chosen language)."""
    num_micro_batches: int | None = None
    """The micro-batch count the simulator compared the two partitions at: the count the
    measured steps ran (None in records made before it was kept)."""
    outcome: str | None = None
    """Which rule decided, one of `OUTCOMES` (read from `reason` in records made before it
    was kept)."""
    migration_source: str | None = None
    """Where `migration_seconds` came from, one of `MIGRATION_SOURCES` (None in records made
    before it was kept)."""

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        data = _known(cls, data)
        if data.get("outcome") is None:
            data["outcome"] = _outcome_of(data["reason"], data["migrate"])
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def decide(observations: Sequence[LayerCosts], *, step: int, boundaries: Sequence[int],
           policy: Rebalance, schedule: str, num_micro_batches: int, step_seconds: Sequence[float],
           remaining_steps: int, migration_seconds: float, migration_source: str = "assumed",
           comm: float = 0.0) -> Decision:
    """Decide, before step `step`, whether to move from `boundaries` to the exact balance.

    `observations` are the per-layer costs of measured steps in step order, all before `step`;
    `step_seconds` the measured wall times of recent steps under `boundaries`, oldest first.
    The last ``policy.window`` of each are used. `migration_seconds` is the cost of a move
    (`Rebalance.migration_seconds`, `estimate_migration_seconds` or the last one measured),
    `migration_source` which of those it is (one of `MIGRATION_SOURCES`, kept with the
    decision so that a table can label it); `comm` the simulator's activation hand-over latency. The rules, in order, each "stay"
    with its own reason: fewer than ``window`` measurements; the candidate is `boundaries`;
    the predicted saving is below ``min_gain`` of the step; the saving over
    `remaining_steps` is below ``payback`` × `migration_seconds`. Otherwise migrate.
    """
    policy.check()
    step = validation.count("step", step, minimum=0)
    m = validation.count("num_micro_batches", num_micro_batches)
    remaining = validation.count("remaining_steps", remaining_steps, minimum=0)
    migration = _non_negative("migration_seconds", migration_seconds)
    comm = _non_negative("comm", comm)
    if migration_source not in MIGRATION_SOURCES:
        raise ValueError(f"migration_source must be one of {MIGRATION_SOURCES}, got {migration_source!r}")
    if schedule not in REBALANCE_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; a re-balancing job runs one of {REBALANCE_SCHEDULES}")
    times = [_non_negative("step_seconds", t) for t in step_seconds]
    obs = list(observations)
    for i, o in enumerate(obs):
        if not isinstance(o, LayerCosts):
            raise TypeError(f"observations[{i}] must be a LayerCosts, got {type(o).__name__}")
        if o.step >= step:
            raise ValueError(f"observations[{i}] measured step {o.step}, not before step {step}")
        if i and o.step <= obs[i - 1].step:
            raise ValueError(f"observations must be in increasing step order: step {o.step} "
                             f"follows step {obs[i - 1].step}")
        if len(o.forward) != len(obs[0].forward):
            raise ValueError(f"layer counts disagree: step {o.step} measured {len(o.forward)} layers, "
                             f"step {obs[0].step} measured {len(obs[0].forward)}")
    if isinstance(boundaries, (str, bytes)) or not hasattr(boundaries, "__len__") or len(boundaries) < 2:
        raise ValueError(f"boundaries must be a list [0, b1, ..., n_layers], got {boundaries!r}")
    p = len(boundaries) - 1
    current = tuple(validation.boundaries(boundaries, num_stages=p,
                                          n_layers=len(obs[0].forward) if obs else boundaries[-1]))
    measured = statistics.median(times[-policy.window:]) if times else 0.0
    base = dict(step=step, boundaries=current, remaining_steps=remaining, migration_seconds=migration,
                migration_source=migration_source, num_micro_batches=m)

    if len(obs) < policy.window or len(times) < policy.window:
        return Decision(**base, candidate=current, layer_forward=(), layer_backward=(), stage_costs=(),
                        candidate_stage_costs=(), measured_step_seconds=measured,
                        predicted_step_seconds=measured, saving_per_step=0.0, migrate=False,
                        outcome="too-few-measurements", reason=f"not enough measurements: {len(obs)} per-layer costs and {len(times)} step "
                               f"times of the {policy.window} the look uses")

    recent = obs[-policy.window:]
    fwd = tuple(statistics.median(o.forward[i] for o in recent) for i in range(len(recent[0].forward)))
    bwd = tuple(statistics.median(o.backward[i] for o in recent) for i in range(len(recent[0].backward)))
    total = [f + b for f, b in zip(fwd, bwd)]
    candidate = tuple(partition_layers(total, p, method="balanced"))
    base.update(candidate=candidate, layer_forward=fwd, layer_backward=bwd,
                stage_costs=tuple(stage_costs(total, current)),
                candidate_stage_costs=tuple(stage_costs(total, candidate)), measured_step_seconds=measured)
    if candidate == current:
        return Decision(**base, predicted_step_seconds=measured, saving_per_step=0.0, migrate=False,
                        outcome="already-balanced", reason=f"already balanced: the exact min-max partition of the measured costs is "
                               f"the one in force {list(current)} (slowest stage "
                               f"{_time(max(base['stage_costs']))} per micro-batch)")

    plan = build_schedule(schedule, p, m)
    simulated_now = _makespan(plan, fwd, bwd, current, comm)
    ratio = _makespan(plan, fwd, bwd, candidate, comm) / simulated_now if simulated_now > 0 else 1.0
    predicted = measured * ratio
    saving = measured - predicted
    gain = 1.0 - ratio
    base.update(predicted_step_seconds=predicted, saving_per_step=saving)
    said = f"predicted saving {gain:.1%} per step ({_time(saving)})"
    if gain < policy.min_gain:
        return Decision(**base, migrate=False, outcome="below-min-gain",
                        reason=f"{said} is below min_gain {policy.min_gain:.1%}: within measurement noise, "
                               f"stay at {list(current)}")
    payoff, cost = saving * remaining, policy.payback * migration
    sums = f"{said} × {remaining} steps = {_time(payoff)}"
    if payoff <= 0 or payoff < cost:
        return Decision(**base, migrate=False, outcome="no-payback",
                        reason=f"would not pay back: {sums} < {policy.payback} × migration {_time(migration)}")
    return Decision(**base, migrate=True, outcome="move",
                    reason=f"{sums} ≥ {policy.payback} × migration {_time(migration)}: move "
                           f"{list(current)} -> {list(candidate)}")


def moved_layers(old: Sequence[int], new: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(layer, from_stage, to_stage)`` for every layer whose stage differs between two
    partitions of the same layers into the same number of stages, ascending layer."""
    if len(old) != len(new) or len(old) < 2:
        raise ValueError(f"partitions {list(old)} and {list(new)} must have the same number of stages")
    n = old[-1]
    old = validation.boundaries(old, n_layers=n, num_stages=len(old) - 1)
    new = validation.boundaries(new, n_layers=n, num_stages=len(new) - 1)
    owner_old, owner_new = _owners(old), _owners(new)
    return [(layer, a, b) for layer, (a, b) in enumerate(zip(owner_old, owner_new)) if a != b]


def estimate_migration_seconds(*, moved_bytes: float, rebuild_seconds: float, bytes_per_second: float) -> float:
    """A first estimate of a migration's cost: ``rebuild_seconds + moved_bytes / bytes_per_second``
    (rebuilding the engine, then sending the moved layers' weights and optimizer state).

    It serves only until the first migration: the job then measures what a migration really
    cost and passes that to `decide` instead."""
    moved = _non_negative("moved_bytes", moved_bytes)
    rebuild = _non_negative("rebuild_seconds", rebuild_seconds)
    rate = _non_negative("bytes_per_second", bytes_per_second)
    if rate == 0:
        raise ValueError("bytes_per_second must be > 0 (the bandwidth between stages)")
    return rebuild + moved / rate


# --- helpers -----------------------------------------------------------------------------

def _makespan(plan, fwd: Sequence[float], bwd: Sequence[float], parts: Sequence[int], comm: float) -> float:
    stages = range(len(parts) - 1)
    timeline = simulate(plan, [sum(fwd[parts[s]:parts[s + 1]]) for s in stages],
                        [sum(bwd[parts[s]:parts[s + 1]]) for s in stages], comm=comm)
    return max(e.end for e in timeline.events) - min(e.start for e in timeline.events)


def _owners(parts: Sequence[int]) -> list[int]:
    return [s for s in range(len(parts) - 1) for _ in range(parts[s], parts[s + 1])]


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _non_negative(name: str, value: object) -> float:
    value = _real(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def _outcome_of(reason: str, migrate: bool) -> str:
    """The rule behind a recorded `reason` (records made before `Decision.outcome` was kept)."""
    if migrate:
        return "move"
    for prefix, outcome in (("not enough measurements", "too-few-measurements"),
                            ("already balanced", "already-balanced"), ("would not pay back", "no-payback")):
        if reason.startswith(prefix):
            return outcome
    return "below-min-gain"


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(data) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}")
    return dict(data)


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if abs(seconds) < 1 else f"{seconds:.2f} s"
