"""Metrics over several training steps: the median and spread of each scalar.

`utils.analysis.metrics.compute_metrics` builds a `MetricsSummary` when a timeline holds
several steps; `Spread` is the median/quartile summary of any list of numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import median
from typing import TYPE_CHECKING

from utils.analysis.report import (SCALARS, diagnose, format_value, report_html, report_text,
                                   stage_rows, with_notes)

if TYPE_CHECKING:
    from utils.analysis.metrics import Metrics

__all__ = ["MetricsSummary", "Spread"]


@dataclass(frozen=True)
class Spread:
    """Median and spread of one metric across steps."""

    median: float
    min: float
    max: float
    q1: float
    """First quartile (linear interpolation)."""
    q3: float
    """Third quartile (linear interpolation)."""
    n: int
    """Number of steps summarised."""

    @property
    def iqr(self) -> float:
        """Interquartile range ``q3 - q1``: the spread of the middle half of the steps."""
        return self.q3 - self.q1

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        xs = sorted(values)
        return cls(median=median(xs), min=xs[0], max=xs[-1], q1=_quantile(xs, 0.25),
                   q3=_quantile(xs, 0.75), n=len(xs))


def _quantile(xs: list[float], q: float) -> float:
    """Quantile `q` (0..1) of the **sorted** list `xs`, interpolating linearly between ranks."""
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class MetricsSummary:
    """Metrics over several steps: the median and spread of each scalar, per-step details.

    Attribute names match `Metrics` (``summary.bubble_ratio`` is the median bubble ratio,
    ``summary.stage_compute`` the per-stage medians), so code and plots accept either.
    """

    per_step: tuple[Metrics, ...]
    """`Metrics` of every step in the timeline, including a skipped step 0."""
    used_steps: tuple[int, ...]
    """Steps that enter the statistics (see `utils.analysis.steps.steady_steps`)."""
    skip_first: bool = True
    """Whether step 0 was left out (it carries one-off warm-up costs)."""

    def __post_init__(self) -> None:
        if not self.used_steps:
            raise ValueError("a summary needs at least one step")

    @property
    def used(self) -> list[Metrics]:
        return [m for m in self.per_step if m.step in self.used_steps]

    def for_step(self, step: int) -> Metrics:
        """`Metrics` of one step (also a skipped one)."""
        for m in self.per_step:
            if m.step == step:
                return m
        raise ValueError(f"step {step} is not in this summary; steps present: "
                         f"{[m.step for m in self.per_step]}")

    def spread(self, name: str) -> Spread | None:
        """Median, min, max and quartiles of scalar `name` over the used steps."""
        if name not in SCALARS:
            raise ValueError(f"unknown metric {name!r}; summarised metrics: {list(SCALARS)}")
        values = [getattr(m, name) for m in self.used]
        if any(v is None for v in values):
            return None
        return Spread.of(values)

    @property
    def stats(self) -> dict[str, Spread | None]:
        return {name: self.spread(name) for name in SCALARS}

    def _median(self, name: str) -> float | None:
        s = self.spread(name)
        return None if s is None else s.median

    def _stage_median(self, name: str) -> tuple[float, ...]:
        rows = [getattr(m, name) for m in self.used]
        return tuple(median(r[s] for r in rows) for s in range(self.num_stages))

    # Medians under the names `Metrics` uses.
    bubble_ratio = property(lambda self: self._median("bubble_ratio"))
    makespan = property(lambda self: self._median("makespan"))
    step_time = property(lambda self: self._median("step_time"))
    samples_per_s = property(lambda self: self._median("samples_per_s"))
    tokens_per_s = property(lambda self: self._median("tokens_per_s"))
    padding_waste = property(lambda self: self._median("padding_waste"))
    imbalance = property(lambda self: self._median("imbalance"))
    comm_share = property(lambda self: self._median("comm_share"))
    warmup = property(lambda self: self._median("warmup"))
    steady = property(lambda self: self._median("steady"))
    cooldown = property(lambda self: self._median("cooldown"))
    stage_compute = property(lambda self: self._stage_median("stage_compute"))
    stage_comm = property(lambda self: self._stage_median("stage_comm"))
    stage_idle = property(lambda self: self._stage_median("stage_idle"))
    stage_utilisation = property(lambda self: self._stage_median("stage_utilisation"))

    @property
    def num_stages(self) -> int:
        return self.per_step[0].num_stages

    @property
    def source(self) -> str:
        return self.per_step[0].source

    @property
    def notes(self) -> tuple[str, ...]:
        """What a reader must know about the figures (a partial record: `Metrics.notes`)."""
        return self.per_step[0].notes

    @property
    def slowest_stage(self) -> int:
        """Stage with the largest median compute."""
        comp = self.stage_compute
        return max(range(len(comp)), key=lambda s: comp[s])

    @property
    def diagnosis(self) -> str:
        """The diagnosis of the median values (see `Metrics.diagnosis`)."""
        stragglers = [m.straggler for m in self.used if m.straggler is not None]
        # A straggler counts only when it shows up in most steps, not in one noisy step.
        straggler = (max(stragglers, key=lambda x: x[2])
                     if len(stragglers) * 2 > len(self.used) else None)
        return with_notes(diagnose(bubble=self.bubble_ratio, imbalance=self.imbalance,
                                   slowest=self.slowest_stage, comm_share=self.comm_share,
                                   straggler=straggler), self.notes)

    def table(self) -> list[dict]:
        """Rows ``{"metric", "median", "min", "max", "iqr", "meaning"}`` (values formatted)."""
        rows = []
        for name, meaning in SCALARS.items():
            s = self.spread(name)
            if s is None:
                continue
            rows.append({"metric": name, "median": format_value(name, s.median),
                         "min": format_value(name, s.min), "max": format_value(name, s.max),
                         "iqr": format_value(name, s.iqr), "meaning": meaning})
        return rows

    def stage_table(self) -> list[dict]:
        """One row per stage with median compute, comm and idle (ms) and utilisation."""
        return stage_rows(self)

    def to_dict(self) -> dict:
        return {"used_steps": list(self.used_steps), "skip_first": self.skip_first, "notes": list(self.notes),
                "stats": {k: (None if v is None else {**asdict(v), "iqr": v.iqr})
                          for k, v in self.stats.items()},
                "diagnosis": self.diagnosis,
                "per_step": [m.to_dict() for m in self.per_step]}

    def _head(self) -> str:
        skipped = [m.step for m in self.per_step if m.step not in self.used_steps]
        note = f", step {skipped[0]} left out (warm-up costs)" if skipped else ""
        return (f"{self.source} pipeline, median over {len(self.used_steps)} step(s) "
                f"{list(self.used_steps)}{note}")

    def __str__(self) -> str:
        return report_text(self._head(), self.table(), self.stage_table(), self.diagnosis, self.notes)

    def _repr_html_(self) -> str:
        return report_html(self._head(), self.table(), self.stage_table(), self.diagnosis, self.notes)
