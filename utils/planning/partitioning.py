"""Stage boundaries for a pipeline from per-layer costs.

A partition is given in DeepSpeed's form ``parts = [0, b1, ..., n_layers]``: stage ``s``
owns layers ``parts[s] .. parts[s+1]-1`` and every stage owns at least one layer. This is
the list ``PipelineModule`` keeps in ``self.parts``, so a result of `partition` can be
imposed on a real job unchanged.

Three methods, so a learner can compare them on the same model:

- ``"uniform"``: the same number of layers per stage (DeepSpeed's ``partition_uniform``).
- ``"parameters"``: DeepSpeed's default, ``partition_balanced`` over parameter counts.
- ``"balanced"``: the exact minimum of the slowest stage's cost (the pipeline's
  throughput limit), optionally with the cost of sending activations across each cut
  and a per-stage memory cap.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from utils import validation
from utils.planning.catalogue import schedule_info
from utils.planning.schedules import build_schedule

PartitionAlgorithm = Literal["uniform", "parameters", "balanced"]
"""The methods `partition_layers` knows."""
METHODS: tuple[str, ...] = get_args(PartitionAlgorithm)


@dataclass(frozen=True)
class LayerMemory:
    """Per-layer memory whose activation part depends on the stage a layer lands on.

    A stage over layers ``a..b-1`` at index ``s`` of ``p`` needs
    ``sum(static[a:b]) + in_flight(s, p) * sum(activation[a:b])`` bytes. Activations of a
    micro-batch stay alive from its forward to its backward, so the number of micro-batches
    in flight sets the activation term: with 1F1B stage ``s`` holds ``min(p - s, m)``
    (DeepSpeed's ``TrainSchedule.num_pipe_buffers`` before its floor of 2 buffers), so the
    first stage holds the most; with GPipe every stage holds all ``m``.
    """

    static: Sequence[float]
    """Bytes that do not depend on the schedule: parameters, gradients, optimizer state."""
    activation: Sequence[float]
    """Bytes of activations one micro-batch keeps alive in this layer until its backward."""
    schedule: str = "1f1b"
    """A one-chunk schedule of `utils.planning.catalogue` (``"1f1b"``, ``"gpipe"``, ``"zb-h1"``);
    ignored when `in_flight_per_stage` is given."""
    micro_batches: int = 1
    """Micro-batches per step (``gradient_accumulation_steps`` in DeepSpeed)."""
    in_flight_per_stage: Sequence[int] | None = None
    """Explicit micro-batches in flight per stage, for other schedules."""

    def in_flight(self, stage: int, num_stages: int) -> int:
        """Micro-batches whose activations stage `stage` of `num_stages` holds at peak."""
        if self.in_flight_per_stage is not None:
            if len(self.in_flight_per_stage) != num_stages:
                raise ValueError(
                    f"in_flight_per_stage has {len(self.in_flight_per_stage)} entries "
                    f"but the pipeline has {num_stages} stages")
            return int(self.in_flight_per_stage[stage])
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {self.micro_batches}")
        if schedule_info(self.schedule).default_chunks != 1:
            raise ValueError(f"{self.schedule} runs several model chunks per rank; this model counts "
                             "whole stages: give in_flight_per_stage")
        return build_schedule(self.schedule, num_stages, self.micro_batches).in_flight(stage)


Memory = Sequence[float] | LayerMemory


def partition_layers(costs: Sequence[float], num_stages: int, *, method: PartitionAlgorithm = "balanced",
              params: Sequence[float] | None = None,
              link_cost: Sequence[float] | None = None,
              memory: Memory | None = None,
              memory_cap: float | None = None) -> list[int]:
    """Split ``len(costs)`` layers into `num_stages` contiguous stages.

    Args:
        costs: per-layer compute cost (e.g. forward + backward seconds), all >= 0.
        num_stages: number of pipeline stages, 1 <= num_stages <= len(costs).
        method: ``"uniform"``, ``"parameters"`` or ``"balanced"`` (see the module doc).
        params: per-layer trainable parameter counts; required by ``"parameters"``.
        link_cost: ``balanced`` only. ``n_layers - 1`` values; ``link_cost[i]`` is the cost
            of cutting between layer ``i`` and ``i + 1`` (activation bytes / bandwidth). A
            cut adds it to both stages at the cut, the sender and the receiver.
        memory: ``balanced`` only. Per-layer bytes (a stage needs their sum) or a
            `LayerMemory` whose activation bytes scale with the stage's micro-batches in
            flight.
        memory_cap: ``balanced`` only, required with `memory`: bytes available per stage.

    Returns:
        ``[0, b1, ..., n_layers]``. For ``balanced`` the slowest stage is as fast as any
        contiguous partition allows (within the memory cap). Among the partitions that reach
        that optimum it returns the one with the smallest sum of squared stage costs (the
        most even spread of the rest), and among those the lexicographically smallest
        boundaries (the first stages as short as possible). The primary optimum is exact;
        the tie-breaks are exact for integer costs and up to rounding for float costs.

    Raises:
        ValueError: bad arguments, or no partition fits under `memory_cap` (the message
            names the stage and the shortfall of the least memory-hungry partition).
    """
    n = _check_costs(costs, "costs")
    num_stages = validation.count("num_stages", num_stages)
    if num_stages > n:
        raise ValueError(f"cannot give every one of {num_stages} stages a layer: the model "
                         f"has {n} layers; use at most {n} stages")
    if method not in METHODS:
        raise ValueError(f"unknown partition method {method!r}; valid methods: {METHODS}")
    if method != "balanced":
        extras = [name for name, value in (("link_cost", link_cost), ("memory", memory),
                                            ("memory_cap", memory_cap)) if value is not None]
        if extras:
            raise ValueError(f"{', '.join(extras)} only apply to method='balanced'; "
                             f"method={method!r} does not look at them")
    if method == "parameters":
        if params is None:
            raise ValueError("method='parameters' needs params: the per-layer parameter "
                             "counts that DeepSpeed balances")
        if _check_costs(params, "params") != n:
            raise ValueError(f"params has {len(params)} entries but costs has {n}: "
                             "give one parameter count per layer")
    elif params is not None:
        raise ValueError(f"params is only used by method='parameters', not {method!r}")

    if method == "uniform":
        return _uniform(n, num_stages)
    if method == "parameters":
        return _deepspeed_balanced(params, num_stages)
    return _balanced(costs, num_stages, link_cost, memory, memory_cap)


def stage_costs(costs: Sequence[float], parts: Sequence[int], *,
                link_cost: Sequence[float] | None = None) -> list[float]:
    """Cost of every stage: its layers' costs plus the link cost of each cut it touches."""
    n = _check_costs(costs, "costs")
    parts = validation.boundaries(parts, n_layers=n, num_stages=len(parts) - 1)
    seg = _segment_cost(costs, link_cost)
    return [seg(parts[s], parts[s + 1]) for s in range(len(parts) - 1)]


def bottleneck(costs: Sequence[float], parts: Sequence[int], *,
               link_cost: Sequence[float] | None = None) -> float:
    """Cost of the slowest stage, which bounds the steady-state rate of the pipeline."""
    return max(stage_costs(costs, parts, link_cost=link_cost))


def stage_memory(memory: Memory, parts: Sequence[int]) -> list[float]:
    """Bytes each stage of `parts` needs under `memory` (see `LayerMemory`)."""
    n = _check_memory(memory)
    parts = validation.boundaries(parts, n_layers=n, num_stages=len(parts) - 1)
    mem = _stage_memory_fn(memory, len(parts) - 1)
    return [mem(s, parts[s], parts[s + 1]) for s in range(len(parts) - 1)]


# --- the methods -------------------------------------------------------------------------

def _uniform(n: int, p: int) -> list[int]:
    """DeepSpeed's ``partition_uniform`` for n >= p: ``n // p`` layers per stage and one
    extra layer for each of the first ``n % p`` stages."""
    size, extra = divmod(n, p)
    return [s * size + min(s, extra) for s in range(p + 1)]


def _deepspeed_balanced(weights: Sequence[float], p: int) -> list[int]:
    """DeepSpeed's ``partition_balanced(weights, num_parts)`` (runtime/utils.py), rewritten.

    What it does, precisely: a dynamic program over (first ``i`` layers, ``j`` parts) that
    stores ONE split per state, the one whose parts have the smallest spread
    ``max(part sums) - min(part sums)``; it extends that stored split with a last part
    ``k..i-1`` and, on ties, keeps the last ``k`` tried (the largest). So the objective is
    the max - min spread of parameter counts, never the slowest stage, and since the spread
    of a prefix does not decide the spread of the whole, even that objective is only
    approximated: for weights ``[15, 15, 44, 10, 52]`` in 4 parts it returns
    ``[0, 2, 3, 4, 5]`` (sums 30, 44, 10, 52, spread 42) although ``[0, 1, 2, 4, 5]``
    (15, 15, 54, 52) has spread 39. With ``partition_method="parameters"`` (the default) the weights are
    trainable parameter counts, which say nothing about compute time: an embedding has many
    parameters and costs little, a loss head can cost much more than its parameters say.
    """
    n = len(weights)
    if n <= p:
        return _uniform(n, p)
    inf = math.inf
    prefix = [0.0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + float(w)
    hi = [[inf] * (p + 1) for _ in range(n + 1)]   # largest part of the stored split
    lo = [[inf] * (p + 1) for _ in range(n + 1)]   # smallest part of the stored split
    spread = [[inf] * (p + 1) for _ in range(n + 1)]
    where = [[0] * (p + 1) for _ in range(n + 1)]  # start of the last part
    hi[0][0] = 0.0
    spread[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, p) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                top, bottom = max(hi[k][j - 1], part), min(lo[k][j - 1], part)
                cost = top - bottom
                if spread[i][j] >= cost:
                    spread[i][j], hi[i][j], lo[i][j], where[i][j] = cost, top, bottom, k
    parts = [n]
    for j in range(p, 0, -1):
        parts.append(where[parts[-1]][j])
    return parts[::-1]


def _balanced(costs: Sequence[float], p: int, link_cost: Sequence[float] | None,
              memory: Memory | None, memory_cap: float | None) -> list[int]:
    n = len(costs)
    seg = _segment_cost(costs, link_cost)
    if (memory is None) != (memory_cap is None):
        raise ValueError("memory and memory_cap go together: memory says what each layer "
                         "needs, memory_cap what each stage has")
    if memory is None:
        return _minmax(n, p, lambda s, a, b: seg(a, b))[1]
    if _check_memory(memory) != n:
        raise ValueError(f"memory describes {_check_memory(memory)} layers but costs has {n}")
    if isinstance(memory_cap, bool) or not isinstance(memory_cap, numbers.Real) \
            or not 0 < memory_cap < math.inf:
        raise ValueError(f"memory_cap must be a positive number of bytes, got {memory_cap!r}")
    mem = _stage_memory_fn(memory, p)
    found = _minmax(n, p, lambda s, a, b: seg(a, b),
                    fits=lambda s, a, b: mem(s, a, b) <= memory_cap)
    if found is not None:
        return found[1]
    need, parts = _minmax(n, p, mem)  # the partition that needs the least memory
    stage = max(range(p), key=lambda s: mem(s, parts[s], parts[s + 1]))
    first, last = parts[stage], parts[stage + 1] - 1
    layers = f"layer {first}" if first == last else f"layers {first}..{last}"
    fixes = ["raise memory_cap"]
    if p < n:
        fixes.append("use more stages")
    if isinstance(memory, LayerMemory):
        fixes.append("keep fewer micro-batches in flight")
    fmt = _bytes_formatter(memory_cap)
    raise ValueError(
        f"no partition of {n} layers fits {p} stages under {fmt(memory_cap)} per stage: "
        f"the least memory-hungry partition {parts} still needs {fmt(need)} on stage "
        f"{stage} ({layers}), {fmt(need - memory_cap)} over; "
        + (", ".join(fixes[:-1]) + " or " + fixes[-1] if len(fixes) > 1 else fixes[0]))


def _minmax(n: int, p: int, cost: Callable[[int, int, int], float],
            fits: Callable[[int, int, int], bool] | None = None
            ) -> tuple[float, list[int]] | None:
    """Exact min over contiguous partitions of max stage cost, None if nothing fits.

    ``cost(s, a, b)`` is the cost of stage ``s`` owning layers ``a..b-1``; ``fits`` may
    forbid a stage. Pass 1 finds the optimum ``best`` with a suffix DP, O(n^2 p). Pass 2,
    among partitions whose stages all cost <= best, minimises the sum of squared stage
    costs; scanning ends ascending and keeping the first strict improvement makes the
    forward reconstruction pick the smallest boundaries among equal sums.
    """
    inf = math.inf

    def allowed(s: int, a: int, b: int) -> bool:
        return fits is None or fits(s, a, b)

    def solve(value: Callable[[float, float], float | None]) -> tuple[list, list]:
        # table[s][a]: best value of stages s..p-1 covering layers a..n-1
        table = [[inf] * (n + 1) for _ in range(p + 1)]
        choice = [[-1] * (n + 1) for _ in range(p + 1)]
        table[p][n] = 0.0
        for s in range(p - 1, -1, -1):
            for a in range(s, n - (p - s) + 1):
                for b in range(a + 1, n - (p - s - 1) + 1):
                    rest = table[s + 1][b]
                    if rest == inf or not allowed(s, a, b):
                        continue
                    v = value(cost(s, a, b), rest)
                    if v is not None and v < table[s][a]:
                        table[s][a], choice[s][a] = v, b
        return table, choice

    table, _ = solve(lambda c, rest: max(c, rest))
    best = table[0][0]
    if best == inf:
        return None
    _, choice = solve(lambda c, rest: None if c > best else c * c + rest)
    parts = [0]
    for s in range(p):
        parts.append(choice[s][parts[-1]])
    return best, parts


# --- helpers -----------------------------------------------------------------------------

def _segment_cost(costs: Sequence[float], link_cost: Sequence[float] | None
                  ) -> Callable[[int, int], float]:
    """Cost of one stage owning layers a..b-1; the same arithmetic everywhere, so the
    optimum `partition` finds and `bottleneck` of its result are the same float."""
    n = len(costs)
    total = _range_sums(costs)
    if link_cost is None:
        return lambda a, b: total[a][b]
    if _check_costs(link_cost, "link_cost", allow_empty=True) != n - 1:
        raise ValueError(f"link_cost needs one value per cut between neighbouring layers, "
                         f"{n - 1} for {n} layers; got {len(link_cost)}")
    link = [float(x) for x in link_cost]

    def seg(a: int, b: int) -> float:
        c = total[a][b]
        if a > 0:
            c += link[a - 1]  # receive from the previous stage
        if b < n:
            c += link[b - 1]  # send to the next stage
        return c
    return seg


def _stage_memory_fn(memory: Memory, p: int) -> Callable[[int, int, int], float]:
    if isinstance(memory, LayerMemory):
        static = _range_sums(memory.static)
        act = _range_sums(memory.activation)
        flight = [memory.in_flight(s, p) for s in range(p)]
        return lambda s, a, b: static[a][b] + flight[s] * act[a][b]
    total = _range_sums(memory)
    return lambda s, a, b: total[a][b]


def _range_sums(values: Sequence[float]) -> list[list[float]]:
    """``out[a][b] == sum(values[a:b])`` summed left to right as `sum` does, so results
    print as a learner expects (prefix-sum differences would give 7.999999999999999)."""
    n = len(values)
    out = []
    for a in range(n + 1):
        row = [0.0] * (n + 1)
        acc = 0.0
        for b in range(a + 1, n + 1):
            acc += float(values[b - 1])
            row[b] = acc
        out.append(row)
    return out


def _check_memory(memory: Memory) -> int:
    """Validate `memory`; return the number of layers it describes."""
    if isinstance(memory, LayerMemory):
        n = _check_costs(memory.static, "memory.static")
        if _check_costs(memory.activation, "memory.activation") != n:
            raise ValueError(f"memory.static has {n} entries but memory.activation has "
                             f"{len(memory.activation)}: give one of each per layer")
        return n
    return _check_costs(memory, "memory")


def _check_costs(values: Sequence[float], name: str, allow_empty: bool = False) -> int:
    """Check a per-layer sequence of finite numbers >= 0; return its length."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"{name} must be a sequence of numbers, got {values!r}")
    if len(values) == 0 and not allow_empty:
        raise ValueError(f"{name} is empty: the model needs at least one layer")
    for i, v in enumerate(values):
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{name}[{i}] = {v!r} is not a number") from None
        if not math.isfinite(x) or x < 0:
            raise ValueError(f"{name}[{i}] = {v!r}; per-layer values must be finite "
                             "and >= 0")
    return len(values)


def _bytes_formatter(reference: float) -> Callable[[float], str]:
    """Format byte counts in the unit that suits `reference`, so that the numbers of one
    message compare at a glance."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if reference >= size:
            return lambda x: f"{x / size:.2f} {unit}"
    return lambda x: f"{x:g} B"
