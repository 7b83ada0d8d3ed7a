"""The controls of a `RunPanel`: widgets for the fields of a `JobSpec`, and the plan line.

`JobControls` is the part of the panel that turns controls into a checked `JobSpec` and
shows, while the learner types, what the job would be (processes, batch arithmetic, which
layers each stage holds) or what is wrong. It never starts anything and never profiles:
``partition="profile"`` is measured when the job starts, in the panel's thread.
"""

from __future__ import annotations

import html
from dataclasses import replace

import ipywidgets as widgets

from utils.jobs.plan import plan_boundaries
from utils.jobs.spec import JOB_SCHEDULES, PARTITION_METHODS, JobSpec
from utils.ui.dynamic_controls import DynamicControls, dynamic_plan
from utils.ui.labels import text
from utils.workloads.models import PRESETS, get_model

__all__ = ["JobControls", "BOUNDARIES", "PROFILE", "parse_boundaries", "parse_options"]

#: The partition choice that reads explicit boundaries from the text box.
BOUNDARIES = "boundaries"
#: The partition method that profiles the layers before the job starts (slow: never run on
#: the kernel's main thread).
PROFILE = "profile"
STYLE = {"description_width": "initial"}


def parse_boundaries(value: str) -> list[int]:
    """``"0,3,8"``, ``"0 3 8"`` or ``"[0, 3, 8]"`` -> ``[0, 3, 8]``; ValueError otherwise."""
    items = [t for t in value.replace("[", " ").replace("]", " ").replace(",", " ").split() if t]
    if not items:
        raise ValueError("partition boundaries are empty: type them as 0,b1,...,n_layers, e.g. 0,3,8")
    try:
        return [int(t) for t in items]
    except ValueError:
        raise ValueError(f"partition boundaries {value!r} must be whole numbers separated by commas, "
                         "e.g. 0,3,8") from None


def parse_options(value: str) -> dict[str, int]:
    """Model option overrides ``"blocks=2, hidden=64"`` -> ``{"blocks": 2, "hidden": 64}``."""
    options: dict[str, int] = {}
    for item in (t.strip() for t in value.replace(";", ",").split(",")):
        if not item:
            continue
        key, sep, number = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"model option {item!r} must look like name=value, e.g. blocks=4")
        try:
            options[key.strip()] = int(number)
        except ValueError:
            raise ValueError(f"model option {key.strip()!r} needs a whole number, got {number.strip()!r}") from None
    return options


def boundaries_without_profiling(spec: JobSpec) -> list[int]:
    """The boundaries a uniform, parameters or explicit partition gives (never measures)."""
    spec.check()
    return plan_boundaries(spec, get_model(spec.model, spec.model_options), profile=None)


class JobControls:
    """Mixin of `RunPanel`: the controls (``model``, ``model_options``, ``stages``,
    ``micro_batches``, ``micro_batch_size``, ``steps``, ``partition``, ``boundaries``,
    ``schedule``; ``dynamic``, the `DynamicControls` of the dynamic half), `spec()` and the
    plan line ``plan``. Needs ``self.lang`` and ``self._base`` (the spec the fields without a
    control come from)."""

    lang: str
    _base: JobSpec

    def _build_controls(self, base: JobSpec) -> None:
        t = lambda key: text(key, self.lang)  # noqa: E731
        explicit = not isinstance(base.partition, str)
        # the presets, and a learner's own model (an import path) when the panel starts from one
        self.model = widgets.Dropdown(options=[*PRESETS, *([base.model] if base.model not in PRESETS else [])],
                                      value=base.model,
                                      description=t("ctl.model"), style=STYLE)
        self.model_options = widgets.Text(
            value=", ".join(f"{k}={v}" for k, v in dict(base.model_options).items()),
            description=t("ctl.model_options"), placeholder=t("ctl.options_hint"), style=STYLE,
            continuous_update=False)  # checked on Enter or leaving the box, not per keystroke
        self.stages = widgets.BoundedIntText(value=base.num_stages, min=1, max=64,
                                             description=t("ctl.stages"), style=STYLE)
        self.micro_batches = widgets.BoundedIntText(value=base.micro_batches, min=1, max=4096,
                                                    description=t("ctl.micro_batches"), style=STYLE)
        self.micro_batch_size = widgets.BoundedIntText(value=base.micro_batch_size, min=1, max=65536,
                                                       description=t("ctl.micro_batch_size"), style=STYLE)
        self.steps = widgets.BoundedIntText(value=base.steps, min=1, max=1_000_000,
                                            description=t("ctl.steps"), style=STYLE)
        self.partition = widgets.Dropdown(
            options=[(t(f"partition.{m}"), m) for m in [*PARTITION_METHODS, BOUNDARIES]],
            value=BOUNDARIES if explicit else base.partition, description=t("ctl.partition"),
            style=STYLE)
        self.boundaries = widgets.Text(
            value=",".join(str(b) for b in base.partition) if explicit else "",
            description=t("ctl.boundaries"), placeholder=t("ctl.boundaries_hint"),
            disabled=not explicit, style=STYLE, continuous_update=False)
        self.schedule = widgets.ToggleButtons(options=list(JOB_SCHEDULES), value=base.schedule,
                                              description=t("ctl.schedule"),
                                              style={**STYLE, "button_width": "70px"})
        self.controls = [self.model, self.model_options, self.stages, self.micro_batches,
                         self.micro_batch_size, self.steps, self.partition, self.boundaries,
                         self.schedule]
        for control in self.controls:
            control.observe(self._on_control, names="value")
            if not isinstance(control, widgets.ToggleButtons):
                control.layout.width = "96%"
        self.dynamic = DynamicControls(base, lang=self.lang, on_change=self._on_control)
        self.plan = widgets.HTML()
        self.controls_grid = widgets.GridBox(
            [self.model, self.model_options, self.schedule, self.stages, self.micro_batches,
             self.micro_batch_size, self.partition, self.boundaries, self.steps],
            layout={"grid_template_columns": "repeat(3, minmax(240px, 1fr))", "grid_gap": "4px 16px"})

    # --- the spec from the controls ------------------------------------------------------------
    def spec(self) -> JobSpec:
        """The `JobSpec` the controls describe, checked (ValueError saying what to change).

        Fields without a control come from the panel's base spec; ``train_batch_size`` is
        dropped (derived), since the controls set the micro-batch arithmetic."""
        partition: str | list[int] = self.partition.value
        if partition == BOUNDARIES:
            partition = parse_boundaries(self.boundaries.value)
        spec = self._spec_with(partition)
        spec.check()
        return spec

    def _spec_with(self, partition: str | list[int]) -> JobSpec:
        return replace(self._base, model=self.model.value,
                       model_options=parse_options(self.model_options.value),
                       num_stages=self.stages.value, micro_batches=self.micro_batches.value,
                       micro_batch_size=self.micro_batch_size.value, partition=partition,
                       schedule=self.schedule.value, steps=self.steps.value,
                       train_batch_size=None, **self.dynamic.fields())

    def _on_control(self, change=None) -> None:
        self.boundaries.disabled = self.partition.value != BOUNDARIES
        if change is not None and change["owner"] is self.partition and change["new"] == BOUNDARIES \
                and change["old"] != PROFILE and not self.boundaries.value.strip():
            try:  # start from the boundaries the previous method chose: easy to edit
                parts = boundaries_without_profiling(self._spec_with(change["old"]))
                self.boundaries.value = ",".join(map(str, parts))  # refreshes the plan
                return
            except ValueError:
                pass
        self.refresh_plan()

    def refresh_plan(self) -> JobSpec | None:
        """Check the controls and show the plan (or what is wrong). Returns the spec or None."""
        try:
            spec = self.spec()
            # "profile" measures every layer first: that belongs to the job's start (in the
            # watcher thread), not to every change of a control on the kernel's main thread.
            parts = None if spec.partition == PROFILE else boundaries_without_profiling(spec)
        except (ValueError, TypeError) as exc:
            self.plan.value = f"<span style='color:#b00020'>✗ {html.escape(str(exc))}</span>"
            return None
        if parts is None:
            layers = text("plan.profile", self.lang)
        else:
            layers = " · ".join(text("plan.layers", self.lang, stage=s, first=a, last=b - 1)
                                for s, (a, b) in enumerate(zip(parts, parts[1:])))
        dp = text("plan.replicas", self.lang, n=spec.data_parallel) if spec.data_parallel > 1 else ""
        line = text("plan.ok", self.lang, processes=spec.world_size, batch=spec.global_batch,
                    size=spec.micro_batch_size, count=spec.micro_batches, dp=dp, layers=layers)
        dynamic = dynamic_plan(spec, self.lang)
        line = html.escape(line) + (f"<br>{html.escape(dynamic)}" if dynamic else "")
        self.plan.value = f"<span style='color:#2e7d32'>✓</span> {line}"
        return spec
