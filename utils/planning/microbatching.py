"""Micro-batch plans for variable-length samples: which samples go into which micro-batch.

One step trains a fixed set of samples (the global batch). How they are cut into
micro-batches decides how much padding is computed and how evenly the micro-batches cost,
which a pipeline turns into bubbles. Three methods (`JobSpec.batching`):

- ``"pad-to-max"``: the naive baseline: `micro_batches` micro-batches of equal sample count in
  the order drawn, every sample padded to the longest of the *global* batch;
- ``"sorted"``: the samples sorted by length, cut into `micro_batches` micro-batches of equal
  count, each padded to its own longest;
- ``"token-budget"``: the samples sorted by length and cut into contiguous groups of any size
  and any number, each at most `token_budget` padded tokens, choosing the cut that minimises
  the predicted step time of a p-stage pipeline with balanced stages,
  ``T = sum_j c_j + (p - 1) * max_j c_j`` (all micro-batches pass every stage once, and the
  slowest one is paid once more for the fill and drain) where ``c_j`` is `MicroBatchCost` of
  micro-batch j. The search is exact for that model over contiguous groupings of the sorted
  samples: for every candidate bottleneck ``M`` (each possible group's cost) a dynamic
  programme finds the least ``sum c_j`` with every ``c_j <= M``; the best ``sum + (p-1) M``
  wins. O(n^2) candidates × O(n^2) each, for n samples per step (n <= 256 is checked);
- ``"packing"``: the production baseline. The samples, longest first, go into rows of exactly
  ``seq_len`` tokens, each into the first row with room (first-fit decreasing); a sample is
  never split. The rows are cut into the fewest micro-batches of at most `token_budget` tokens,
  equal in rows (a short last one is filled with empty rows: padding). Inside a row a
  block-diagonal causal mask keeps every token to its own sample and positions restart per
  sample (`utils.workloads.layers`), so each sample computes what it computes alone; the
  attention over the whole row is still computed and masked — the waste `masked_pairs` counts.

DeepSpeed's own dynamic batching (``"deepspeed"``) decides how many samples a step takes, not
only how to cut them, so it is planned over the sample stream, not per step
(`deepspeed_batches`, calling DeepSpeed's ``batch_by_seqlens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from utils.planning.schedules import build_schedule
from utils.planning.simulator import simulate

MicroBatchOrder = Literal["as-planned", "longest-first", "shortest-first", "random"]
"""The order a step's micro-batches enter the pipeline (`reorder`)."""
MICRO_BATCH_ORDERS: tuple[str, ...] = get_args(MicroBatchOrder)
Batching = Literal["fixed", "pad-to-max", "sorted", "token-budget", "packing", "deepspeed"]
"""``"fixed"``: every sample has the model's full length (no padding; the default)."""
BATCHING_METHODS: tuple[str, ...] = get_args(Batching)
MAX_SAMPLES_PER_STEP = 256
MICRO_BATCH_OUTCOMES: tuple[str, ...] = ("too-few-measurements", "already-fastest", "below-min-gain", "change")
"""What a look of a `MicroBatchPolicy` can decide (`MicroBatchDecision.outcome`)."""


@dataclass(frozen=True, kw_only=True)
class MicroBatchCost:
    """Predicted seconds one micro-batch of `n` samples padded to `length` tokens costs a
    stage (forward + backward): ``overhead + per_token * n * length + per_token_pair * n * length**2``.
    The quadratic term is attention; `overhead` is what every micro-batch pays whatever its
    size (the engine's instructions, the send and receive), which keeps the plan from
    cutting the batch into many tiny micro-batches."""

    overhead: float
    per_token: float
    per_token_pair: float = 0.0

    def __call__(self, n: int, length: int) -> float:
        return self.overhead + self.per_token * n * length + self.per_token_pair * n * length * length


@dataclass(frozen=True)
class MicroBatchPlan:
    """Sample indices per micro-batch, and the length each micro-batch is padded to."""

    groups: tuple[tuple[int, ...], ...]
    padded: tuple[int, ...]
    rows: tuple[tuple[tuple[int, ...], ...], ...] | None = None
    """Packing only: per micro-batch, the samples of each row (``padded`` is the row length;
    an empty tuple is a row of padding)."""

    @property
    def micro_batches(self) -> int:
        return len(self.groups)

    def shapes(self) -> list[tuple[int, int]]:
        """Each micro-batch's activation shape ``(rows, tokens per row)``: one row per sample,
        or the packed rows."""
        counts = [len(r) for r in self.rows] if self.rows is not None else [len(g) for g in self.groups]
        return list(zip(counts, self.padded))

    def padded_tokens(self) -> int:
        return sum(n * length for n, length in self.shapes())

    def masked_pairs(self, lengths: Sequence[int]) -> int:
        """Attention pairs computed and thrown away by a block-diagonal mask: per packed row of
        length L, ``L (L + 1) / 2`` causal pairs minus each sample's own ``l (l + 1) / 2``. Zero
        without packing (a padded row's pads are counted as padding, not here)."""
        if self.rows is None:
            return 0
        return sum(length * (length + 1) // 2 - sum(lengths[i] * (lengths[i] + 1) // 2 for i in row)
                   for rows, length in zip(self.rows, self.padded) for row in rows)

    def predicted_step(self, cost: MicroBatchCost, num_stages: int) -> float:
        """``sum c_j + (p - 1) max c_j`` (see the module docstring)."""
        costs = [cost(n, length) for n, length in self.shapes()]
        return sum(costs) + (num_stages - 1) * max(costs)


def plan_micro_batches(lengths: Sequence[int], *, method: str, micro_batches: int, num_stages: int,
                       cost: MicroBatchCost | None = None, token_budget: int | None = None,
                       row_length: int | None = None) -> MicroBatchPlan:
    """Cut the samples of one step (their `lengths`) into micro-batches by `method`
    (`row_length`: packing's row, the model's ``seq_len``)."""
    n = len(lengths)
    if n == 0:
        raise ValueError("an empty batch: a step needs at least one sample")
    if any(not isinstance(x, int) or x < 1 for x in lengths):
        raise ValueError(f"sample lengths must be positive integers, got {list(lengths)[:8]}...")
    if method in ("fixed", "pad-to-max", "sorted"):
        if n % micro_batches:
            raise ValueError(f"{n} samples do not split into {micro_batches} micro-batches of equal count")
        size = n // micro_batches
        order = list(range(n)) if method != "sorted" else sorted(range(n), key=lambda i: (lengths[i], i))
        groups = tuple(tuple(order[k * size:(k + 1) * size]) for k in range(micro_batches))
        longest = max(lengths)
        padded = tuple(longest if method != "sorted" else max(lengths[i] for i in g) for g in groups)
        return MicroBatchPlan(groups, padded)
    if method == "packing":
        if row_length is None or token_budget is None:
            raise ValueError("packing needs row_length (the model's seq_len) and token_budget")
        return pack(lengths, row_length=row_length, token_budget=token_budget)
    if method != "token-budget":
        raise ValueError(f"unknown batching {method!r}; choose one of {BATCHING_METHODS} "
                         "('deepspeed' plans over the sample stream: deepspeed_batches)")
    if cost is None or token_budget is None:
        raise ValueError("token-budget batching needs a cost model and a token_budget")
    if max(lengths) > token_budget:
        raise ValueError(f"token_budget={token_budget} is smaller than the longest sample ({max(lengths)} tokens): "
                         "no micro-batch could hold it; raise the budget to at least the longest sample")
    if n > MAX_SAMPLES_PER_STEP:
        raise ValueError(f"{n} samples per step: token-budget planning searches exactly and allows at most "
                         f"{MAX_SAMPLES_PER_STEP}")
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    sorted_lengths = [lengths[i] for i in order]
    # group (i, j) = sorted samples i..j-1, padded to sorted_lengths[j-1] (the longest)
    group_cost = {(i, j): cost(j - i, sorted_lengths[j - 1])
                  for i in range(n) for j in range(i + 1, n + 1) if (j - i) * sorted_lengths[j - 1] <= token_budget}
    best_total, best_cuts = float("inf"), None
    for bottleneck in sorted(set(group_cost.values())):
        if (num_stages - 1) * bottleneck >= best_total:
            break  # every later candidate pays at least this much for the fill alone
        least = [0.0] + [float("inf")] * n
        back = [0] * (n + 1)
        for j in range(1, n + 1):
            for i in range(j):
                c = group_cost.get((i, j))
                if c is not None and c <= bottleneck and least[i] + c < least[j]:
                    least[j], back[j] = least[i] + c, i
        total = least[n] + (num_stages - 1) * bottleneck
        if total < best_total:
            cuts, j = [], n
            while j > 0:
                cuts.append((back[j], j))
                j = back[j]
            best_total, best_cuts = total, cuts[::-1]
    groups = tuple(tuple(order[i:j]) for i, j in best_cuts)
    return MicroBatchPlan(groups, tuple(sorted_lengths[j - 1] for _, j in best_cuts))


def pack(lengths: Sequence[int], *, row_length: int, token_budget: int) -> MicroBatchPlan:
    """Packing (see the module docstring): first-fit decreasing into rows of `row_length`
    tokens, the rows cut into the fewest equal micro-batches of at most `token_budget` tokens."""
    if max(lengths) > row_length:
        raise ValueError(f"a sample of {max(lengths)} tokens does not fit a row of {row_length}")
    if token_budget < row_length:
        raise ValueError(f"token_budget={token_budget} holds no packed row of {row_length} tokens: "
                         f"use token_budget >= {row_length}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        slot = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            rows.append([]), room.append(row_length)
            slot = len(rows) - 1
        rows[slot].append(i)
        room[slot] -= lengths[i]
    most = token_budget // row_length
    m = -(-len(rows) // most)
    per = -(-len(rows) // m)
    cut = [tuple(tuple(r) for r in rows[j * per:(j + 1) * per]) for j in range(m)]
    cut = [c + ((),) * (per - len(c)) for c in cut]  # equal shapes: a short last one gets empty rows
    return MicroBatchPlan(tuple(tuple(i for row in c for i in row) for c in cut), (row_length,) * m, tuple(cut))


def deepspeed_batches(lengths: Sequence[int], *, micro_batches: int, max_tokens: int
                      ) -> tuple[list[MicroBatchPlan], list[int]]:
    """DeepSpeed's own dynamic batching over a stream of samples (their `lengths`, indices into
    the stream), through its own ``batch_by_seqlens`` with the settings its
    ``get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed`` uses for a
    ``PipelineEngine``: samples in stream order, `micro_batches` micro-batches per step of the
    same sample count (``required_microbatches_of_same_size``), each holding at most
    `max_tokens` *real* tokens, and every micro-batch of a step padded to that step's longest
    sample (``required_microbatches_of_same_seqlen``). The number of samples per step varies;
    DeepSpeed scales the learning rate with it (`deepspeed_lr`).

    Returns one plan per step (sample indices into the stream) and each step's sample count.
    """
    from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import batch_by_seqlens

    ids, sizes, longest = batch_by_seqlens(list(lengths), max_tokens, effective_batch_size=micro_batches,
                                           required_microbatches_of_same_size=True)
    plans = []
    for step in range(len(sizes)):
        groups = tuple(tuple(samples) for _, samples in ids[step * micro_batches:(step + 1) * micro_batches])
        plans.append(MicroBatchPlan(groups, (longest[step],) * micro_batches))
    return plans, list(sizes)


def deepspeed_lr(base_lr: float, *, base_samples: int, samples: int) -> float:
    """The learning rate DeepSpeed's dynamic batching trains a step of `samples` samples with:
    its ``scale_lr`` (linear, its default: Goyal et al. 2017) from `base_lr` at `base_samples`."""
    from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import scale_lr

    return scale_lr(base_samples, samples, base_lr=base_lr, method="linear")


def reorder(plan: MicroBatchPlan, order: str, *, cost: MicroBatchCost, seed: int = 0) -> MicroBatchPlan:
    """`plan` with its micro-batches in `order`: ``"as-planned"`` (as cut: sorted ascending for
    ``sorted`` and ``token-budget``), ``"longest-first"`` / ``"shortest-first"`` by predicted
    cost, or ``"random"`` (seeded). Which samples go together does not change, so neither does
    the gradient; what changes is the fill and drain of the pipeline: the first micro-batch
    fills it and the last drains it, and a costly one there is paid by every stage in turn.
    """
    if order not in MICRO_BATCH_ORDERS:
        raise ValueError(f"unknown micro-batch order {order!r}; choose one of {MICRO_BATCH_ORDERS}")
    index = list(range(plan.micro_batches))
    costs = [cost(n, length) for n, length in plan.shapes()]
    if order == "longest-first":
        index.sort(key=lambda j: -costs[j])
    elif order == "shortest-first":
        index.sort(key=lambda j: costs[j])
    elif order == "random":
        import random

        random.Random(seed).shuffle(index)
    return MicroBatchPlan(tuple(plan.groups[j] for j in index), tuple(plan.padded[j] for j in index),
                          None if plan.rows is None else tuple(plan.rows[j] for j in index))


# --- choosing the micro-batch count while a job runs --------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MicroBatchPolicy:
    """`JobSpec(micro_batch_policy=...)`: let a running job choose how many micro-batches it
    cuts each step's samples into, under an activation-memory budget, and change it when the
    measured stage costs change (after a freeze, a re-partition)."""

    memory_samples: int
    """The most samples whose activations one stage may hold at once. Under 1F1B stage 0
    holds ``min(p, m)`` micro-batches of ``S / m`` samples; under GPipe all ``S``."""
    every: int = 4
    """Look before every step that is a multiple of `every` (not step 0)."""
    min_gain: float = 0.03
    """Change only for a predicted saving of at least this share of the step (noise)."""
    overhead_samples: float | None = None
    """The cost model's fixed part: what one micro-batch costs a stage whatever its size, in
    samples (``t(n) = k (overhead_samples + n)``). None: the workbook's language-model presets'
    fixed cost measured on the CPU VM (`utils.workloads.varlen.OVERHEAD_TOKENS` / ``seq_len``);
    a model of your own must give it — time one micro-batch of n and one of 2n samples, then
    ``overhead_samples = n (2 t_n - t_2n) / (t_2n - t_n)``."""

    def check(self) -> None:
        for name in ("memory_samples", "every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MicroBatchPolicy.{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.min_gain, (int, float)) or not 0 <= self.min_gain < 1:
            raise ValueError(f"MicroBatchPolicy.min_gain must be in [0, 1), got {self.min_gain!r}")
        fixed = self.overhead_samples
        if fixed is not None and (isinstance(fixed, bool) or not isinstance(fixed, (int, float)) or not fixed >= 0):
            raise ValueError(f"MicroBatchPolicy.overhead_samples must be a number >= 0 (samples) or None, got {fixed!r}")

    def to_dict(self) -> dict:
        return {"memory_samples": self.memory_samples, "every": self.every, "min_gain": self.min_gain,
                "overhead_samples": self.overhead_samples}

    @classmethod
    def from_dict(cls, data) -> MicroBatchPolicy:
        return cls(**data)


@dataclass(frozen=True)
class MicroBatchDecision:
    """One look of a `MicroBatchPolicy` (recorded with the re-balancing decisions, kind
    ``"micro-batches"``)."""

    step: int
    current: int
    chosen: int
    predicted: dict[int, float]
    """Predicted step seconds of every count that fits the memory budget."""
    measured_step_seconds: float
    reason: str
    kind: str = "micro-batches"

    @property
    def change(self) -> bool:
        return self.chosen != self.current

    @property
    def fastest(self) -> int | None:
        """The count predicted fastest (ties: the smaller); None without predictions."""
        return min(self.predicted, key=lambda m: (self.predicted[m], m)) if self.predicted else None

    @property
    def outcome(self) -> str:
        """Which rule of `choose_micro_batches` decided, one of `MICRO_BATCH_OUTCOMES`."""
        if not self.predicted:
            return "too-few-measurements"
        if self.change:
            return "change"
        return "already-fastest" if self.fastest == self.current else "below-min-gain"

    @classmethod
    def too_few_measurements(cls, step: int, current: int) -> MicroBatchDecision:
        """The look before `step` when no step at `current` micro-batches was measured since
        the costs or the count last changed: stay."""
        return cls(step, current, current, {}, 0.0,
                   f"not enough measurements at {current} micro-batches since the last change of costs "
                   "(a freeze, a new engine) or count: stay")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "step": self.step, "current": self.current, "chosen": self.chosen,
                "predicted": {str(m): t for m, t in self.predicted.items()},
                "measured_step_seconds": self.measured_step_seconds, "reason": self.reason}

    @classmethod
    def from_dict(cls, data) -> MicroBatchDecision:
        return cls(step=data["step"], current=data["current"], chosen=data["chosen"],
                   predicted={int(m): t for m, t in data["predicted"].items()},
                   measured_step_seconds=data["measured_step_seconds"], reason=data["reason"])


def in_flight_samples(m: int, samples: int, num_stages: int, schedule: str) -> int:
    """Samples whose activations stage 0 holds at its peak: 1F1B keeps ``min(p, m)``
    micro-batches in flight, GPipe all of them."""
    return samples if schedule == "gpipe" else min(num_stages, m) * (samples // m)


def choose_micro_batches(*, step: int, samples: int, num_stages: int, schedule: str, current: int,
                         observed: dict[int, tuple[Sequence[float], Sequence[float]]],
                         measured_step_seconds: float, policy: MicroBatchPolicy,
                         overhead_samples: float) -> MicroBatchDecision:
    """The micro-batch count for the coming steps.

    `observed` maps a micro-batch count the job ran with to the measured seconds of one
    micro-batch's forward and backward per stage. Each stage's cost of a micro-batch of n
    samples is modelled as ``k (overhead_samples + n)``: the cost model's fixed part
    (`overhead_samples`, what a micro-batch costs whatever its size, in samples; measured by
    `benchmarks/dynamic_microbatch.py`) and a scale `k` per stage and pass fitted by least
    squares on every size observed, so the stages' measured imbalance carries over. Every count
    dividing `samples` whose in-flight activations fit `policy.memory_samples` is simulated;
    the fastest wins if it saves at least `policy.min_gain` of the step (predictions are
    scaled by measured / predicted of the current count).
    """
    sizes = {samples // m: costs for m, costs in observed.items()}

    def model(stage: int, which: int):
        # t(n) = k (overhead + n): the cost model's shape, its scale k fitted by least squares
        # on every size observed (two free parameters from two noisy sizes extrapolate badly).
        points = [(overhead_samples + n, costs[which][stage]) for n, costs in sizes.items()]
        k = sum(x * t for x, t in points) / sum(x * x for x, _ in points)
        return lambda n: k * (overhead_samples + n)

    models = [[model(s, k) for s in range(num_stages)] for k in (0, 1)]

    def predict(m: int) -> float:
        n = samples // m
        timeline = simulate(build_schedule(schedule, num_stages, m), [f(n) for f in models[0]],
                            [b(n) for b in models[1]])
        return max(e.end for e in timeline.events) - min(e.start for e in timeline.events)

    fitting = [m for m in range(1, samples + 1) if samples % m == 0
               and in_flight_samples(m, samples, num_stages, schedule) <= policy.memory_samples]
    if not fitting:
        raise ValueError(f"no micro-batch count fits memory_samples={policy.memory_samples}: even one sample per "
                         f"micro-batch keeps {in_flight_samples(samples, samples, num_stages, schedule)} in flight")
    scale = measured_step_seconds / predict(current)
    predicted = {m: predict(m) * scale for m in fitting}
    best = min(fitting, key=lambda m: (predicted[m], m))
    now = measured_step_seconds
    if best == current:
        return MicroBatchDecision(step, current, current, predicted, now,
                                  f"{current} micro-batches is already the fastest count that fits the memory budget")
    saving = (now - predicted[best]) / now
    if current in predicted and saving < policy.min_gain:
        return MicroBatchDecision(step, current, current, predicted, now,
                                  f"{best} micro-batches would save {saving:.1%} per step, under min_gain "
                                  f"{policy.min_gain:.0%}: stay at {current}")
    why = "" if current in predicted else f" ({current} no longer fits the memory budget)"
    return MicroBatchDecision(step, current, best, predicted, now,
                              f"{best} micro-batches: predicted {predicted[best] * 1e3:.1f} ms per step against "
                              f"{now * 1e3:.1f} ms measured at {current} ({saving:+.1%}){why}")
