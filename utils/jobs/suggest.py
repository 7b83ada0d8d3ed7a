"""A better partition for a run, from the per-layer costs it measured, and how to use it.

`suggest_partition(run)` reads the per-layer forward and backward costs a run measured while it
trained (`Run.layer_costs`: a re-balancing job's, or any job recorded with `utils.record` from a
script of its own) and takes their medians over the steps after the first. Four candidate
partitions — the run's own, the exact min-max partition of those costs
(`utils.planning.partitioning.partition_layers`, ``"balanced"``) and DeepSpeed's own
``partition_method`` choices ``"uniform"`` and ``"parameters"`` — are each fed the same
measured layer costs and run through the simulator calibrated on the run
(`utils.planning.whatif.predict_from_timeline`), so the predictions differ only in the
boundaries. The suggestion is the one predicted fastest (the run's own on a tie), with the code
to paste: nothing, DeepSpeed's method by name (a script that can keep DeepSpeed's method
should), or a ``PipelineModule`` subclass that imposes the boundaries (the override the
workbook's own jobs use, `utils.runtime.assembly.build_module`). The min-max partition minimises
the slowest stage's forward + backward; 1F1B's step also depends on how the two split, which
only the simulation sees.

A prediction, not a measurement: confirm it by running the script again with the suggestion.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from utils.jobs.runs import Run
from utils.planning.partitioning import bottleneck, partition_layers

__all__ = ["PartitionSuggestion", "suggest_partition"]

SNIPPET = '''from deepspeed.pipe import PipelineModule


class FixedPartition(PipelineModule):
    """PipelineModule with the stage boundaries imposed (utils.suggest_partition)."""

    def _partition_layers(self, method="uniform"):
        self.parts = {parts}
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])


# then: FixedPartition(layers=..., num_stages={stages}, ...) in place of PipelineModule(...)'''


@dataclass(frozen=True)
class PartitionSuggestion:
    """What `suggest_partition` found (times in seconds per micro-batch unless said)."""

    current: tuple[int, ...]
    """The run's own boundaries."""
    candidates: dict[str, tuple[tuple[int, ...], float, float]]
    """By name — ``"current"``, ``"balanced"`` (the exact min-max partition of the measured layer
    costs), DeepSpeed's ``"uniform"`` and ``"parameters"`` — the boundaries, their slowest stage
    (forward + backward of its layers) and the step the simulator predicts for them."""
    layer_costs: tuple[float, ...]
    """Median forward + backward of each layer over the steps after the first."""
    untimed: tuple[int, ...]
    """Layers nothing timed (a plain function in the layer list is no module), counted as free."""

    @property
    def best(self) -> str:
        """The candidate with the shortest predicted step (the run's own on a tie)."""
        return min(self.candidates, key=lambda name: (self.candidates[name][2], name != "current"))

    @property
    def suggested(self) -> tuple[int, ...]:
        return self.candidates[self.best][0]

    @property
    def predicted_speedup(self) -> float:
        """Predicted step now / with the suggestion (>= 1 by construction: the run's own is a candidate)."""
        return self.candidates["current"][2] / self.candidates[self.best][2]

    @property
    def code(self) -> str:
        """What to change in the script: nothing, DeepSpeed's own ``partition_method``, or the
        subclass that imposes the boundaries."""
        if self.best == "current" or self.suggested == self.current:
            return "# keep the partition: no candidate is predicted to be faster"
        for method in ("uniform", "parameters"):
            if self.candidates[method][0] == self.suggested:
                return f'PipelineModule(..., partition_method="{method}")'
        return SNIPPET.format(parts=list(self.suggested), stages=len(self.suggested) - 1)

    def __str__(self) -> str:
        lines = [f"{name:>10}: {list(parts)}  slowest stage {slowest * 1e3:.2f} ms/micro-batch, predicted step "
                 f"{step * 1e3:.1f} ms" for name, (parts, slowest, step) in self.candidates.items()]
        if self.untimed:
            lines.append(f"layers {list(self.untimed)} are plain functions (no module to time): counted as free")
        lines.append(f"suggested: {self.best} {list(self.suggested)}, predicted x{self.predicted_speedup:.2f} "
                     "(the simulator calibrated on this run: a prediction, run it to confirm)")
        return "\n".join(lines) + "\n\n" + self.code


def suggest_partition(run: Run) -> PartitionSuggestion:
    """The partition `run`'s measured layer costs call for (see the module docstring);
    ValueError when the run measured none (a job needs ``rebalance=``, a script `utils.record`)."""
    from utils.planning.whatif import predict_from_timeline

    measured = run.layer_costs
    steps = [s for s in sorted(measured) if s >= 1] or sorted(measured)  # step 0 is warm-up
    n = run.spec.shape.num_layers
    if not steps:
        raise ValueError(f"run {run.name} measured no per-layer costs: record it with utils.record(engine) "
                         "(layer_costs=True; it times the layers from step 1 on), or run the job with rebalance=utils.Rebalance()")
    timed = set.intersection(*(set(measured[s]) for s in steps))
    # A layer that is a plain function (PipelineModule runs callables too) is no module: no hook times it.
    untimed = tuple(i for i in range(n) if i not in timed)
    forward = [median(measured[s][i][0] for s in steps) if i in timed else 0.0 for i in range(n)]
    backward = [median(measured[s][i][1] for s in steps) if i in timed else 0.0 for i in range(n)]
    total = [f + b for f, b in zip(forward, backward)]
    p = run.spec.num_stages
    params = list(run.spec.shape.options.get("params") or []) if run.spec.model == "recorded" else None
    if not params:
        from utils.workloads.models import get_model

        params = get_model(run.spec.model, run.spec.model_options).param_counts()
    boundaries = {"current": tuple(run.parts), "balanced": tuple(partition_layers(total, p)),
                  "uniform": tuple(partition_layers(total, p, method="uniform")),
                  "parameters": tuple(partition_layers(total, p, method="parameters", params=params))}

    def step_time(parts) -> float:
        f = [sum(forward[parts[s]:parts[s + 1]]) for s in range(p)]
        b = [sum(backward[parts[s]:parts[s + 1]]) for s in range(p)]
        return predict_from_timeline(run.timeline, forward=f, backward=b).metrics().makespan

    return PartitionSuggestion(current=tuple(run.parts), layer_costs=tuple(total), untimed=untimed,
                               candidates={name: (parts, bottleneck(total, parts), step_time(parts))
                                           for name, parts in boundaries.items()})
