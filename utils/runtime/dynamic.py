"""The dynamic half of a job, as `StepHook`s around the training loop of a rank.

- `Freezer`: progressive layer freezing (`JobSpec.freeze_at`);
- `Curriculum`: a sequence-length curriculum (`JobSpec.seq_len_at`);
- `MicroBatching`: variable-length samples cut into micro-batches by a plan, and a micro-batch
  count that changes between steps (`JobSpec.batching`, `JobSpec.micro_batches_at`);
- `Repartitioner`: forced re-partitions (`JobSpec.repartition_at`) and the re-balancing
  policy (`JobSpec.rebalance`): it collects the per-layer costs the `LayerCostMeter`
  measures, lets rank 0 decide with `utils.planning.rebalance.decide`, records every
  decision, and moves the job live (`utils.runtime.migrate.repartition_live`) or asks the
  launcher for a restart (`utils.runtime.restart`).

Every hook runs on every rank at the same step, so the collectives inside them line up.
"""

from __future__ import annotations

import json
import time
from collections import deque
from statistics import median

import torch.distributed as dist

from utils.jobs.rundir import PartitionChange
from utils.planning.microbatching import MicroBatchDecision, choose_micro_batches, deepspeed_lr
from utils.planning.rebalance import Decision, LayerCosts, decide, estimate_migration_seconds, moved_layers
from utils.runtime.assembly import shapes_vary_in_a_step
from utils.runtime.migrate import repartition_live, torch_optimizer
from utils.timeline import Event
from utils.workloads.varlen import policy_overhead

ASSUMED_BYTES_PER_SECOND = {"cpu": 1e9, "cuda": 1e10}
"""How fast moved state is assumed to travel before a migration was measured: a first guess
(gloo over loopback, NCCL between two GPUs of a node), replaced by the measured cost."""
FLOAT_BYTES = 4


class Freezer:
    """Freezes the first n layers before the steps `JobSpec.freeze_at` names."""

    def before_step(self, state, step: int) -> None:
        count = state.spec.freeze_at.get(step)
        if count is not None:
            state.frozen.freeze(state.engine, count)
            state.status("freezing", step=step, detail=f"layers 0..{count - 1}")

    def after_step(self, state, step, loss, seconds) -> None:
        pass


class Curriculum:
    """Switches the data to shorter or longer samples before the steps `JobSpec.seq_len_at`
    names; DeepSpeed re-learns the activation shapes it sends (``reset_activation_shape``)."""

    def before_step(self, state, step: int) -> None:
        tokens = state.spec.seq_len_at.get(step)
        if tokens is not None and tokens != state.data.tokens:
            state.data.tokens = tokens
            state.engine.reset_activation_shape()

    def after_step(self, state, step, loss, seconds) -> None:
        pass


class MicroBatching:
    """Plans each step's micro-batches (`utils.workloads.varlen`) and sets the engine's
    micro-batch count to the plan's (``set_train_batch_size``: DeepSpeed's gradient
    accumulation steps) before the step; runs after any hook that may replace the engine.

    With a `MicroBatchPolicy` it also measures what one micro-batch costs each stage (its
    forward and backward events) at every count it runs, and every `every` steps lets rank 0
    choose the count for the steps ahead (`choose_micro_batches`), recorded with the
    re-balancing decisions. A freeze or a new engine makes it measure afresh.
    """

    def __init__(self, state):
        self.policy = state.spec.micro_batch_policy
        self.count = state.spec.micro_batches
        self.observed: dict[int, list[tuple[float, float]]] = {}  # count -> this rank's (f, b) per step
        self.step_seconds: dict[int, list[float]] = {}  # count -> measured step seconds
        self._engine = None
        self._warming = True  # the first step, and the first at a new count, warm up: not measured
        self._shape: tuple | None = None  # (the engine's id, the last step's micro-batch shape)

    def before_step(self, state, step: int) -> None:
        spec = state.spec
        if state.engine is not self._engine or step in spec.freeze_at:
            self.observed, self.step_seconds, self._engine = {}, {}, state.engine  # costs changed
        if self.policy is not None and step > 0 and step % self.policy.every == 0:
            chosen = self._decide(state, step)
            self._warming = self._warming or chosen != self.count
            self.count = chosen
        changes = [m for at, m in sorted(spec.micro_batches_at.items()) if at <= step]
        state.data.micro_batches = changes[-1] if changes else self.count
        count = state.data.begin_step(step)
        plan, lengths = state.data.plan, state.data.step_lengths
        shape = plan.shapes()[0]
        if not shapes_vary_in_a_step(spec) and self._shape is not None and self._shape != (id(state.engine), shape):
            # One shape per step, another than the last step's: every rank resets before the same step, so each
            # boundary exchanges one metadata message now instead of one per micro-batch (dynamic_shape=True).
            state.engine.reset_activation_shape()
        self._shape = (id(state.engine), shape)  # a new engine starts with its shapes unknown: no reset needed
        record = {"step": step, "samples": [len(g) for g in plan.groups],
                  "real": [sum(lengths[i] for i in g) for g in plan.groups],
                  "padded": [n * length for n, length in plan.shapes()]}
        if plan.rows is not None:
            record["masked_pairs"] = plan.masked_pairs(lengths)
        if spec.batching == "deepspeed":  # DeepSpeed's scale_lr of this step's sample count
            record["lr"] = deepspeed_lr(spec.lr, base_samples=spec.micro_batch_size * spec.micro_batches,
                                        samples=state.data.step_samples)
            for group in torch_optimizer(state.engine).param_groups:
                group["lr"] = record["lr"]
        if state.rank == 0:
            state.run_dir.record_micro_batches(record)
        if count != state.engine.micro_batches:
            state.engine.set_train_batch_size(count * spec.micro_batch_size * spec.data_parallel)

    def after_step(self, state, step, loss, seconds) -> None:
        if self.policy is None:
            return
        if self._warming:
            self._warming = False
            return
        mine = [e for e in state.last_events if e.kind in ("forward", "backward")]
        per_kind = [[e.duration for e in mine if e.kind == kind] for kind in ("forward", "backward")]
        if all(per_kind):
            self.observed.setdefault(self.count, []).append((median(per_kind[0]), median(per_kind[1])))
            self.step_seconds.setdefault(self.count, []).append(seconds)

    def _decide(self, state, step: int) -> int:
        gathered = [None] * dist.get_world_size()
        mine = {m: values for m, values in self.observed.items() if values}
        dist.all_gather_object(gathered, (state.stage, mine, self.step_seconds.get(self.count, [])[-3:]))
        chosen = [self.count]
        if state.rank == 0:
            p = state.spec.num_stages
            counts = set.intersection(*(set(g[1]) for g in gathered)) if gathered else set()
            observed = {}
            for m in counts:
                per_stage = [[v for stage, table, _ in gathered if stage == s for v in table[m]] for s in range(p)]
                observed[m] = ([median(v[0] for v in rows) for rows in per_stage],
                               [median(v[1] for v in rows) for rows in per_stage])
            seconds = gathered[0][2]
            if self.count in observed and seconds:
                decision = choose_micro_batches(
                    step=step, samples=state.spec.micro_batch_size * state.spec.micro_batches, num_stages=p,
                    schedule=state.spec.schedule, current=self.count, observed=observed,
                    measured_step_seconds=median(seconds), policy=self.policy,
                    overhead_samples=policy_overhead(self.policy, state.model.seq_len))
            else:
                decision = MicroBatchDecision.too_few_measurements(step, self.count)
            state.run_dir.record_decision(decision.to_dict())
            chosen = [decision.chosen]
        dist.broadcast_object_list(chosen, src=0)
        return chosen[0]


class Repartitioner:
    """Moves the running job to new boundaries: forced, or when the policy says it pays."""

    def __init__(self, state):
        spec = state.spec
        self.policy = spec.rebalance
        window = self.policy.window if self.policy else 1
        self.costs: deque[tuple[int, dict[int, tuple[float, float]]]] = deque(maxlen=window)
        self.step_seconds: deque[float] = deque(maxlen=window)
        self.step_counts: deque[int] = deque(maxlen=window)
        """The micro-batch count each measured step ran: it varies with token-budget batching."""
        self.rebuild_seconds: float | None = None
        self.measured_migration: float | None = None
        self._fresh_engine = True  # the first step of an engine warms up: not measured
        self._param_bytes = [FLOAT_BYTES * n for n in state.model.param_counts()]

    # --- measuring --------------------------------------------------------------------------
    def after_step(self, state, step: int, loss: float, seconds: float) -> None:
        if state.meter is None:
            return
        costs = state.meter.take_step()
        if costs is None:
            return
        state.record_layer_costs(step, costs)
        if self._fresh_engine:
            self._fresh_engine = False
            return
        self.costs.append((step, costs))
        self.step_seconds.append(seconds)
        self.step_counts.append(state.engine.micro_batches)

    def forget(self) -> None:
        """Costs changed (a move, a freeze): measure afresh before the next decision."""
        self.costs.clear()
        self.step_seconds.clear()
        self.step_counts.clear()
        self._fresh_engine = True

    # --- deciding -----------------------------------------------------------------------------
    def before_step(self, state, step: int) -> None:
        spec = state.spec
        if self.policy is not None and self.rebuild_seconds is None:
            self._calibrate(state)
        if step in spec.freeze_at or step in spec.seq_len_at:
            self.forget()
        target, reason = spec.repartition_at.get(step), "repartition_at"
        if target is None and self.policy is not None and step % self.policy.every == 0 and 0 < step:
            decision = self._decide(state, step)
            if decision.migrate:
                target, reason = decision.candidate, decision.reason
        if target is None or tuple(target) == tuple(state.boundaries):
            return
        if spec.repartition_mode == "restart":
            from utils.runtime.restart import request_restart

            request_restart(state, step, target)  # raises RankExit: the launcher relaunches
        self._move(state, step, tuple(target), reason)

    def _calibrate(self, state) -> None:
        """Time a move that moves nothing (the same boundaries): the rebuild and the ranks'
        agreement a real move costs besides the bytes it sends. The engine's first build
        cannot tell it: it also pays one-time imports and set-up (about 4× more on CPU)."""
        started = time.perf_counter()
        engine = repartition_live(state.engine, old=state.boundaries, new=state.boundaries,
                                  build=state.build_engine,
                                  carry_optimizer=state.spec.repartition_optimizer == "remap")
        state.adopt(engine, state.boundaries)
        state.sync_device()
        self.rebuild_seconds = time.perf_counter() - started
        self._fresh_engine = True

    def _decide(self, state, step: int) -> Decision:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (list(self.costs), list(self.step_seconds), self.measured_migration,
                                          self.rebuild_seconds))
        decision = None
        if state.rank == 0:
            # The steps the window measured ran this many micro-batches (all ranks run the
            # same count); the spec's count is only the starting one under token-budget batching.
            count = round(median(self.step_counts)) if self.step_counts else state.spec.micro_batches

            def look(migration_seconds: float, source: str = "assumed") -> Decision:
                return decide(_merge(gathered, state.model.num_layers), step=step,
                              boundaries=state.boundaries, policy=self.policy, schedule=state.spec.schedule,
                              num_micro_batches=count,
                              step_seconds=[max(times) for times in zip(*(g[1] for g in gathered))],
                              remaining_steps=state.spec.steps - step, migration_seconds=migration_seconds,
                              migration_source=source)

            # The cost of a move depends on what moves: find the candidate first, then price it.
            decision = look(*self._migration_cost(state, gathered, look(0.0).candidate))
            state.run_dir.record_decision(decision.to_dict())
        shared = [decision.to_dict() if decision else None]
        dist.broadcast_object_list(shared, src=0)
        return Decision.from_dict(shared[0])

    def _migration_cost(self, state, gathered, candidate) -> tuple[float, str]:
        """The cost of moving to `candidate` and where it comes from (`MIGRATION_SOURCES`)."""
        measured = [g[2] for g in gathered if g[2] is not None]
        if measured:
            return max(measured), "measured"
        if self.policy.migration_seconds is not None:
            return self.policy.migration_seconds, "assumed"
        # Before any move: the measured rebuild (`_calibrate`), plus the state that would
        # travel (parameters and, carried, two Adam moments each) at an assumed speed.
        share = 3 if state.spec.repartition_optimizer == "remap" else 1
        moved = sum(self._param_bytes[layer] * share for layer, _, _ in moved_layers(state.boundaries, candidate))
        return estimate_migration_seconds(moved_bytes=moved, rebuild_seconds=max(g[3] for g in gathered),
                                          bytes_per_second=ASSUMED_BYTES_PER_SECOND[state.device]), "estimated"

    # --- moving -------------------------------------------------------------------------------
    def _move(self, state, step: int, target: tuple[int, ...], reason: str) -> None:
        started = time.perf_counter()
        state.status("repartition", step=step, detail=f"{list(state.boundaries)} -> {list(target)}")
        engine = repartition_live(
            state.engine, old=state.boundaries, new=target, build=state.build_engine,
            carry_optimizer=state.spec.repartition_optimizer == "remap",
            between=lambda: state.fault_point(step, "repartition"),
            phase=lambda name: state.status("repartition", step=step, detail=name))
        state.adopt(engine, target)
        state.sync_device()
        ended = time.perf_counter()
        self.measured_migration = ended - started
        origin = state.tracer.origin
        state.pending_events.append(Event(stage=state.stage, rank=state.rank, step=step, kind="repartition",
                                          micro_batch=None, start=started - origin, end=ended - origin))
        if state.rank == 0:
            state.run_dir.record_partition_change(PartitionChange(step=step, boundaries=target, reason=reason))
        self.forget()


def _merge(gathered, num_layers: int) -> list[LayerCosts]:
    """Per-layer costs of the whole model for each step every rank measured: each rank knows
    its own layers; data-parallel replicas of a layer are averaged."""
    per_step: dict[int, dict[int, list[tuple[float, float]]]] = {}
    for costs, *_ in gathered:
        for step, layers in costs:
            for layer, value in layers.items():
                per_step.setdefault(step, {}).setdefault(int(layer), []).append(value)
    merged = []
    for step in sorted(per_step):
        layers = per_step[step]
        if len(layers) != num_layers:
            continue  # a step some rank did not measure
        mean = {i: (sum(v[0] for v in values) / len(values), sum(v[1] for v in values) / len(values))
                for i, values in layers.items()}
        merged.append(LayerCosts(step=step, forward=tuple(mean[i][0] for i in range(num_layers)),
                                 backward=tuple(mean[i][1] for i in range(num_layers))))
    return merged


def layer_costs_line(step: int, costs: dict[int, tuple[float, float]]) -> str:
    return json.dumps({"step": step, "layers": {str(i): list(v) for i, v in sorted(costs.items())}})

