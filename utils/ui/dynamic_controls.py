"""The dynamic part of a `RunPanel`'s controls: freezing, re-balancing, batching, micro-batch policy.

`DynamicControls` holds the widgets for the `JobSpec` fields of the dynamic half —
``freeze_at``, ``rebalance`` (on/off, ``every``, ``window``, ``min_gain``, ``payback``),
``batching`` with ``token_budget``, and ``micro_batch_policy`` (on/off, ``memory_samples``,
``every``, ``min_gain``) — and turns them into those fields. It checks nothing itself: the
panel puts the fields into a spec and `JobSpec.check` (with `Rebalance.check` and
`MicroBatchPolicy.check`) says what is wrong, live, like every other control. The knobs
are plain number boxes, not bounded ones, so that an out-of-range value is named by the
spec's own error instead of being silently clamped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from utils.jobs.spec import JobSpec
from utils.jobs.spec_checks import BUDGETED
from utils.planning.microbatching import BATCHING_METHODS, MicroBatchPolicy
from utils.planning.rebalance import Rebalance
from utils.ui.labels import text

__all__ = ["DynamicControls", "parse_freeze", "is_dynamic", "dynamic_plan"]

_STYLE = {"description_width": "initial"}
_DEFAULT_MEMORY_SAMPLES = 8


def parse_freeze(value: str) -> dict[int, int]:
    """``"6:4, 10:8"`` -> ``{6: 4, 10: 8}`` (from step 6 freeze the first 4 layers, ...);
    ``""`` -> ``{}``. ValueError saying what to type otherwise."""
    out: dict[int, int] = {}
    for item in (t.strip() for t in value.replace(";", ",").split(",")):
        if not item:
            continue
        step, sep, layers = item.partition(":")
        try:
            if not sep:
                raise ValueError
            out[int(step)] = int(layers)
        except ValueError:
            raise ValueError(f"freezing {item!r} must look like step:layers, e.g. 6:4 (from step 6 on, "
                             "freeze the first 4 layers); several separated by commas") from None
    return out


def is_dynamic(spec: JobSpec) -> bool:
    """Whether the job changes its partition, frozen layers or micro-batches while it runs."""
    return bool(spec.rebalance is not None or spec.repartition_at or spec.freeze_at
                or spec.micro_batch_policy is not None or spec.micro_batches_at)


def dynamic_plan(spec: JobSpec, lang: str) -> str:
    """What the dynamic fields of `spec` will do, one clause each (``""`` for a static job)."""
    parts = []
    if spec.freeze_at:
        parts.append(text("plan.freeze", lang, what=", ".join(
            text("plan.freeze_one", lang, step=s, n=n) for s, n in sorted(spec.freeze_at.items()))))
    if spec.repartition_at:
        parts.append(text("plan.forced", lang, what=", ".join(
            f"@{s} → {list(b)}" for s, b in sorted(spec.repartition_at.items()))))
    if spec.rebalance is not None:
        r = spec.rebalance
        parts.append(text("plan.rebalance", lang, every=r.every, window=r.window, min_gain=f"{r.min_gain:.0%}",
                          payback=f"{r.payback:g}"))
    if spec.batching != "fixed":
        budget = f" ≤ {spec.token_budget} tokens" if spec.token_budget else ""
        parts.append(text("plan.batching", lang, method=spec.batching, budget=budget))
    if spec.micro_batch_policy is not None:
        p = spec.micro_batch_policy
        parts.append(text("plan.mb_policy", lang, memory=p.memory_samples, every=p.every,
                          min_gain=f"{p.min_gain:.0%}"))
    return " · ".join(parts)


class DynamicControls:
    """The widgets of the dynamic fields, starting from `base`; ``on_change()`` is called
    whenever one changes. `fields()` gives the `JobSpec` fields they describe; `widget` is
    the box to lay out."""

    def __init__(self, base: JobSpec, *, lang: str, on_change: Callable[[], None]):
        t = lambda key: text(key, lang)  # noqa: E731
        self._base = base
        r = base.rebalance or Rebalance()
        p = base.micro_batch_policy
        self.freeze = widgets.Text(value=", ".join(f"{s}:{n}" for s, n in sorted(base.freeze_at.items())),
                                   description=t("ctl.freeze"), placeholder=t("ctl.freeze_hint"), style=_STYLE,
                                   continuous_update=False)
        self.rebalance = widgets.Checkbox(value=base.rebalance is not None, description=t("ctl.rebalance"),
                                          indent=False)
        self.rebalance_every = widgets.IntText(value=r.every, description=t("ctl.every"), style=_STYLE)
        self.rebalance_window = widgets.IntText(value=r.window, description=t("ctl.window"), style=_STYLE)
        self.rebalance_min_gain = widgets.FloatText(value=r.min_gain, step=0.01, description=t("ctl.min_gain"),
                                                    style=_STYLE)
        self.rebalance_payback = widgets.FloatText(value=r.payback, step=0.5, description=t("ctl.payback"),
                                                   style=_STYLE)
        self.batching = widgets.Dropdown(options=list(BATCHING_METHODS), value=base.batching,
                                         description=t("ctl.batching"), style=_STYLE)
        self.token_budget = widgets.IntText(value=base.token_budget or 0, description=t("ctl.token_budget"),
                                            style=_STYLE)
        self.mb_policy = widgets.Checkbox(value=p is not None, description=t("ctl.mb_policy"), indent=False)
        self.mb_memory = widgets.IntText(value=p.memory_samples if p else _DEFAULT_MEMORY_SAMPLES,
                                         description=t("ctl.memory_samples"), style=_STYLE)
        self.mb_every = widgets.IntText(value=p.every if p else MicroBatchPolicy.every, description=t("ctl.every"),
                                        style=_STYLE)
        self.mb_min_gain = widgets.FloatText(value=p.min_gain if p else MicroBatchPolicy.min_gain, step=0.01,
                                             description=t("ctl.min_gain"), style=_STYLE)
        self.rebalance_knobs = [self.rebalance_every, self.rebalance_window, self.rebalance_min_gain,
                                self.rebalance_payback]
        self.mb_knobs = [self.mb_memory, self.mb_every, self.mb_min_gain]
        self.controls = [self.freeze, self.rebalance, *self.rebalance_knobs, self.batching, self.token_budget,
                         self.mb_policy, *self.mb_knobs]
        for control in self.controls:
            control.observe(lambda _c: (self._enable(), on_change()), names="value")
            control.layout.width = "96%"
        self._enable()
        grid = widgets.GridBox(
            [self.freeze, self.batching, self.token_budget,
             self.rebalance, self.rebalance_every, self.rebalance_window,
             widgets.HTML(), self.rebalance_min_gain, self.rebalance_payback,
             self.mb_policy, self.mb_memory, self.mb_every,
             widgets.HTML(), self.mb_min_gain],
            layout={"grid_template_columns": "repeat(3, minmax(240px, 1fr))", "grid_gap": "4px 16px"})
        self.widget = widgets.Accordion(children=[grid], titles=(t("panel.dynamic"),),
                                        selected_index=0 if is_dynamic(base) or base.batching != "fixed" else None)

    def _enable(self) -> None:
        for knob in self.rebalance_knobs:
            knob.disabled = not self.rebalance.value
        for knob in self.mb_knobs:
            knob.disabled = not self.mb_policy.value
        self.token_budget.disabled = self.batching.value not in BUDGETED

    def fields(self) -> dict[str, Any]:
        """The `JobSpec` fields the controls describe (unchecked: `JobSpec.check` does that).
        ValueError for a freezing entry that does not parse."""
        rebalance = None
        if self.rebalance.value:
            rebalance = Rebalance(every=self.rebalance_every.value, window=self.rebalance_window.value,
                                  min_gain=self.rebalance_min_gain.value, payback=self.rebalance_payback.value,
                                  migration_seconds=(self._base.rebalance or Rebalance()).migration_seconds)
        policy = None
        if self.mb_policy.value:
            policy = MicroBatchPolicy(memory_samples=self.mb_memory.value, every=self.mb_every.value,
                                      min_gain=self.mb_min_gain.value)
        budget = self.token_budget.value if self.batching.value in BUDGETED else None
        return {"freeze_at": parse_freeze(self.freeze.value), "rebalance": rebalance,
                "batching": self.batching.value, "token_budget": budget, "micro_batch_policy": policy}
