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
  wins. O(n^2) candidates × O(n^2) each, for n samples per step (n <= 256 is checked).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

MicroBatchOrder = Literal["as-planned", "longest-first", "shortest-first", "random"]
"""The order a step's micro-batches enter the pipeline (`reorder`)."""
MICRO_BATCH_ORDERS: tuple[str, ...] = get_args(MicroBatchOrder)
Batching = Literal["fixed", "pad-to-max", "sorted", "token-budget"]
"""``"fixed"``: every sample has the model's full length (no padding; the default)."""
BATCHING_METHODS: tuple[str, ...] = get_args(Batching)
MAX_SAMPLES_PER_STEP = 256


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

    @property
    def micro_batches(self) -> int:
        return len(self.groups)

    def padded_tokens(self) -> int:
        return sum(len(g) * length for g, length in zip(self.groups, self.padded))

    def predicted_step(self, cost: MicroBatchCost, num_stages: int) -> float:
        """``sum c_j + (p - 1) max c_j`` (see the module docstring)."""
        costs = [cost(len(g), length) for g, length in zip(self.groups, self.padded)]
        return sum(costs) + (num_stages - 1) * max(costs)


def plan_micro_batches(lengths: Sequence[int], *, method: str, micro_batches: int, num_stages: int,
                       cost: MicroBatchCost | None = None, token_budget: int | None = None) -> MicroBatchPlan:
    """Cut the samples of one step (their `lengths`) into micro-batches by `method`."""
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
    if method != "token-budget":
        raise ValueError(f"unknown batching {method!r}; choose one of {BATCHING_METHODS}")
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
    costs = [cost(len(g), length) for g, length in zip(plan.groups, plan.padded)]
    if order == "longest-first":
        index.sort(key=lambda j: -costs[j])
    elif order == "shortest-first":
        index.sort(key=lambda j: costs[j])
    elif order == "random":
        import random

        random.Random(seed).shuffle(index)
    return MicroBatchPlan(tuple(plan.groups[j] for j in index), tuple(plan.padded[j] for j in index))
