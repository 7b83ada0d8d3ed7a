"""ipywidgets panels: launch real pipeline jobs from a notebook and look at what they did.

* `RunPanel()` — controls for a `JobSpec` (model preset, stages, micro-batches, partition,
  schedule, steps), a Run and a Stop button, live progress, then the run's timeline,
  metrics and diagnosis; a history of the runs of this panel and a side-by-side comparison
  of two of them. A bare ``utils.RunPanel()`` as the last line of a cell displays it.
* `TimelineExplorer` (`utils.ui.explorer`) shows each run's timeline inside the panel.

Two choices keep the notebook responsive and the pictures reliable:

1. **The kernel is never blocked.** Run starts the job (`utils.start_job`, which returns at
   once) and a daemon thread polls it and updates the widgets; the cell that pressed Run is
   finished, so the learner can keep working while the job runs. Stop only sets an event:
   the same thread stops the job, so `RunningJob` (not thread-safe) is only ever driven from
   one thread.
2. **Figures are plotly's own MIME bundle in an `ipywidgets.Output`** (`utils.ui.display`):
   reliable from the watcher thread, without plotly's anywidget-based FigureWidget.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go

from utils.jobs.launch import JobFailed, RunningJob, start_job
from utils.workloads.models import PRESETS, get_model
from utils.ui.display import Displayable, error_html, figure_output
from utils.ui.explorer import TimelineExplorer
from utils.ui.plots import compare_timelines
from utils.jobs.runs import Run
from utils.jobs.plan import plan_boundaries
from utils.jobs.spec import JOB_SCHEDULES, PARTITION_METHODS, JobSpec

__all__ = ["RunPanel", "parse_boundaries", "parse_options"]

#: The partition choice that reads explicit boundaries from the text box.
BOUNDARIES = "boundaries"
#: The partition method that profiles the layers before the job starts (slow: never run on
#: the kernel's main thread).
PROFILE = "profile"
_STYLE = {"description_width": "initial"}
#: Progress-bar style of a panel whose job did not succeed, by state (anything else: danger).
_BAR_STYLE = {"failed": "danger", "timeout": "danger", "stopped": "warning", "error": "danger"}

# --- small pure helpers (unit-tested) ---------------------------------------------------------
def parse_boundaries(text: str) -> list[int]:
    """``"0,3,8"``, ``"0 3 8"`` or ``"[0, 3, 8]"`` -> ``[0, 3, 8]``; ValueError otherwise."""
    items = [t for t in text.replace("[", " ").replace("]", " ").replace(",", " ").split() if t]
    if not items:
        raise ValueError("partition boundaries are empty: type them as 0,b1,...,n_layers, e.g. 0,3,8")
    try:
        return [int(t) for t in items]
    except ValueError:
        raise ValueError(f"partition boundaries {text!r} must be whole numbers separated by commas, "
                         "e.g. 0,3,8") from None


def parse_options(text: str) -> dict[str, int]:
    """Model option overrides ``"blocks=2, hidden=64"`` -> ``{"blocks": 2, "hidden": 64}``."""
    options: dict[str, int] = {}
    for item in (t.strip() for t in text.replace(";", ",").split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"model option {item!r} must look like name=value, e.g. blocks=4")
        try:
            options[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"model option {key.strip()!r} needs a whole number, got {value.strip()!r}") from None
    return options


def _boundaries_without_profiling(spec: JobSpec) -> list[int]:
    """The boundaries a uniform, parameters or explicit partition gives (never measures)."""
    spec.check()
    return plan_boundaries(spec, get_model(spec.model, spec.model_options), profile=None)


class RunPanel(Displayable):
    """Launch real DeepSpeed pipeline jobs from controls and look at the results.

    ``RunPanel()`` starts from `JobSpec`'s defaults; ``RunPanel(JobSpec(...))`` from that spec
    (fields without a control — device, timeout, seed, lr, data_parallel, name — come from it).
    Programmatic use (tests, exercises): `spec()`, `run()`, `stop()`, `wait()`, `state`,
    `error`, `history`, `show()`, `compare()`, `widget`.

    States: ``"idle"``, ``"invalid"`` (the controls do not make a valid spec; nothing started),
    ``"running"``, then the job's end state ``"succeeded"``, ``"failed"``, ``"timeout"``,
    ``"stopped"``, or ``"error"`` (the panel itself failed; the job was stopped).
    """

    def __init__(self, spec: JobSpec | None = None, *, directory: str | Path | None = None,
                 history: Iterable[Run] = (), poll_interval: float = 0.25):
        base = spec if spec is not None else JobSpec()
        self._base = base
        self.directory = directory
        self.poll_interval = poll_interval
        self.history: list[Run] = [r for r in history if r.ok]
        self.job: RunningJob | None = None
        self.run_result: Run | None = None
        self.state = "idle"
        self.error: str | None = None
        self.explorer: TimelineExplorer | None = None
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._running_spec: JobSpec | None = None
        self._build_controls(base)
        self._build_views()
        self._refresh_history()
        self.refresh_plan()

    # --- building ---------------------------------------------------------------------------
    def _build_controls(self, base: JobSpec) -> None:
        explicit = not isinstance(base.partition, str)
        self.model = widgets.Dropdown(options=list(PRESETS), value=base.model, description="model",
                                      style=_STYLE)
        self.model_options = widgets.Text(
            value=", ".join(f"{k}={v}" for k, v in dict(base.model_options).items()),
            description="model options", placeholder="e.g. blocks=4, hidden=64", style=_STYLE,
            continuous_update=False)  # checked on Enter or leaving the box, not per keystroke
        self.stages = widgets.BoundedIntText(value=base.num_stages, min=1, max=64,
                                             description="stages", style=_STYLE)
        self.micro_batches = widgets.BoundedIntText(value=base.micro_batches, min=1, max=4096,
                                                    description="micro-batches", style=_STYLE)
        self.micro_batch_size = widgets.BoundedIntText(value=base.micro_batch_size, min=1, max=65536,
                                                       description="micro-batch size", style=_STYLE)
        self.steps = widgets.BoundedIntText(value=base.steps, min=1, max=1_000_000,
                                            description="steps", style=_STYLE)
        self.partition = widgets.Dropdown(
            options=[*PARTITION_METHODS, BOUNDARIES], value=BOUNDARIES if explicit else base.partition,
            description="partition", style=_STYLE)
        self.boundaries = widgets.Text(
            value=",".join(str(b) for b in base.partition) if explicit else "",
            description="boundaries", placeholder="e.g. 0,3,8", disabled=not explicit, style=_STYLE,
            continuous_update=False)
        self.schedule = widgets.ToggleButtons(options=list(JOB_SCHEDULES), value=base.schedule,
                                              description="schedule", style={**_STYLE, "button_width": "70px"})
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play",
                                         tooltip="start a real DeepSpeed pipeline job")
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop",
                                          disabled=True, tooltip="stop every process of the job")
        self.run_button.on_click(lambda _b: self._on_run())
        self.stop_button.on_click(lambda _b: self.stop(wait=False))
        self.controls = [self.model, self.model_options, self.stages, self.micro_batches,
                         self.micro_batch_size, self.steps, self.partition, self.boundaries,
                         self.schedule]
        for control in self.controls:
            control.observe(self._on_control, names="value")
            if not isinstance(control, widgets.ToggleButtons):
                control.layout.width = "96%"

    def _build_views(self) -> None:
        self.plan = widgets.HTML()
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="progress",
                                            style=_STYLE, layout={"width": "320px"})
        self.status = widgets.HTML("<i>idle: set the job up and press Run</i>")
        self.message = widgets.HTML()  # errors and notes
        self.result_title = widgets.HTML()
        self.result_box = widgets.VBox()
        self.metrics = widgets.HTML()
        self.diagnosis = widgets.HTML()
        self.history_select = widgets.Dropdown(options=[], description="runs", style=_STYLE,
                                               layout={"width": "520px"})
        self.show_button = widgets.Button(description="Show", icon="eye", tooltip="show the chosen run")
        self.compare_a = widgets.Dropdown(options=[], description="A", style=_STYLE, layout={"width": "360px"})
        self.compare_b = widgets.Dropdown(options=[], description="B", style=_STYLE, layout={"width": "360px"})
        self.compare_button = widgets.Button(description="Compare", icon="columns",
                                             tooltip="both timelines on one time axis")
        self.compare_output = widgets.Output()
        self.show_button.on_click(lambda _b: self._on_show())
        self.compare_button.on_click(lambda _b: self._on_compare())

        grid = widgets.GridBox(
            [self.model, self.model_options, self.schedule, self.stages, self.micro_batches,
             self.micro_batch_size, self.partition, self.boundaries, self.steps],
            layout={"grid_template_columns": "repeat(3, minmax(240px, 1fr))", "grid_gap": "4px 16px"})
        self.widget = widgets.VBox([
            widgets.HTML("<h3 style='margin:4px 0'>Pipeline run</h3>"),
            grid, self.plan,
            widgets.HBox([self.run_button, self.stop_button, self.progress, self.status],
                         layout={"align_items": "center", "flex_flow": "row wrap"}),
            self.message,
            self.result_title, self.diagnosis, self.result_box, self.metrics,
            widgets.HTML("<h4 style='margin:8px 0 2px'>History and comparison</h4>"),
            widgets.HBox([self.history_select, self.show_button]),
            widgets.HBox([self.compare_a, self.compare_b, self.compare_button]),
            self.compare_output,
        ], layout={"border": "1px solid #ddd", "padding": "6px 10px"})

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
                       train_batch_size=None)

    def _on_control(self, change=None) -> None:
        self.boundaries.disabled = self.partition.value != BOUNDARIES
        if change is not None and change["owner"] is self.partition and change["new"] == BOUNDARIES \
                and change["old"] != PROFILE and not self.boundaries.value.strip():
            try:  # start from the boundaries the previous method chose: easy to edit
                parts = _boundaries_without_profiling(self._spec_with(change["old"]))
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
            parts = None if spec.partition == PROFILE else _boundaries_without_profiling(spec)
        except (ValueError, TypeError) as exc:
            self.plan.value = f"<span style='color:#b00020'>✗ {html.escape(str(exc))}</span>"
            return None
        if parts is None:
            layers = "boundaries from measured layer costs, chosen when the job starts"
        else:
            layers = " · ".join(f"stage {s}: layers {a}–{b - 1}"
                                for s, (a, b) in enumerate(zip(parts, parts[1:])))
        dp = f" × {spec.data_parallel} replicas" if spec.data_parallel > 1 else ""
        self.plan.value = (f"<span style='color:#2e7d32'>✓</span> {spec.world_size} processes · global batch "
                           f"{spec.global_batch} = {spec.micro_batch_size} × {spec.micro_batches}{dp} · {layers}")
        return spec

    # --- running ---------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _on_run(self) -> None:
        try:
            self.run()
        except RuntimeError as exc:
            self.message.value = error_html(str(exc))

    def run(self, *, wait: bool = False, timeout: float | None = None) -> Run | None:
        """Start a job from the controls; a background thread starts and watches it (choosing
        the partition may take seconds: ``"profile"`` measures the layers first).

        Returns at once (``wait=False``, what the Run button does), or after the job ended
        (``wait=True``): the `Run` if it succeeded, else None (see `state` and `error`). An
        invalid spec is shown in the panel, state ``"invalid"``, and nothing starts.
        """
        if self.running:
            raise RuntimeError("a job is already running in this panel: press Stop first")
        self.error = None
        self.message.value = ""
        try:
            spec = self.spec()
        except (ValueError, TypeError) as exc:
            self._set_error("invalid", f"cannot start: {exc}")
            return None
        self._stop_requested.clear()
        self.job, self.state, self._running_spec = None, "running", spec
        self.progress.value, self.progress.max, self.progress.bar_style = 0, spec.steps, "info"
        first = " (profiling the layers first)" if spec.partition == PROFILE else ""
        self.status.value = f"<i>starting{first} ...</i>"
        self.run_button.disabled, self.stop_button.disabled = True, False
        self._thread = threading.Thread(target=self._watch, args=(spec,), daemon=True,
                                        name="RunPanel-watcher")
        self._thread.start()
        if wait:
            self.wait(timeout)
            return self.run_result if self.state == "succeeded" else None
        return None

    def stop(self, *, wait: bool = True, timeout: float = 60.0) -> str:
        """Ask the watcher thread to stop the job (what Stop does); with `wait`, wait until
        every process is gone. Returns the state."""
        if self.running:
            self._stop_requested.set()
            self.status.value = "<i>stopping ...</i>"
            self.stop_button.disabled = True
            if wait:
                self.wait(timeout)
        return self.state

    def wait(self, timeout: float | None = None) -> str:
        """Block until the watcher thread has finished (the job ended and the view is
        updated); returns the state. `timeout` defaults to the job's own timeout plus two
        minutes (start-up, profiling)."""
        thread = self._thread
        if thread is not None:
            spec = self._running_spec
            limit = timeout if timeout is not None else (spec.timeout if spec else 0) + 120
            thread.join(limit)
            if thread.is_alive():
                raise TimeoutError(f"the job did not end within {limit:g} s (state {self.state!r})")
        return self.state

    def _watch(self, spec: JobSpec) -> None:
        """Background thread: start the job, poll it, show progress, then the result or the
        error. The only place that drives the `RunningJob`."""
        job: RunningJob | None = None
        try:
            try:
                job = start_job(spec, directory=self.directory)
            except Exception as exc:  # noqa: BLE001 - shown in the panel, never a stuck "starting"
                why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
                self._set_error("invalid" if isinstance(exc, ValueError) else "error", f"cannot start: {why}")
                return
            self.job = job
            if job.notes:
                self.message.value = error_html("note: " + "\n".join(job.notes), "#8a6d00")
            seen = -1
            while True:
                if self._stop_requested.is_set():
                    job.stop("stopped from the panel")
                state = job.poll()
                rows = job.progress()
                if len(rows) != seen or not rows:
                    seen = len(rows)
                    self._show_progress(job, rows)
                if state != "running":
                    break
                self._stop_requested.wait(self.poll_interval)  # wakes at once on Stop
            self._show_end(job)
        except Exception as exc:  # noqa: BLE001 - the panel must never be left spinning
            try:
                if job is not None:
                    job.stop(f"the panel failed: {exc!r}")
            finally:
                self._set_error("error", f"the panel failed while watching the job: {type(exc).__name__}: {exc}")
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True

    def _show_progress(self, job: RunningJob, rows: list[dict]) -> None:
        spec = job.spec
        elapsed = time.time() - job.started
        if not rows:
            self.status.value = (f"<i>starting {spec.world_size} processes ... {elapsed:.0f} s "
                                 "(imports and DeepSpeed set-up take a few seconds)</i>")
            return
        last = rows[-1]
        self.progress.value = min(len(rows), spec.steps)
        self.status.value = (f"step {last['step'] + 1}/{spec.steps} · loss {last['loss']:.4f} · "
                             f"{last['seconds']:.2f} s/step · {elapsed:.0f} s")

    def _show_end(self, job: RunningJob) -> None:
        try:
            run = job.result()
        except JobFailed as exc:
            rows = job.progress()
            done = f" after {len(rows)}/{job.spec.steps} steps" if job.state == "stopped" else ""
            self.progress.bar_style = _BAR_STYLE.get(job.state, "danger")
            self.status.value = f"<b>{html.escape(job.state)}</b>{done}"
            self.state, self.error = job.state, str(exc)
            colour = "#8a6d00" if job.state == "stopped" else "#b00020"
            self.message.value = error_html(str(exc), colour)
            return
        self.run_result = run
        self.history.append(run)
        self._refresh_history(select=len(self.history) - 1)
        self.progress.value, self.progress.bar_style = job.spec.steps, "success"
        self.show(run)
        seconds = (run.finished or time.time()) - run.started
        self.status.value = f"<b>succeeded</b> in {seconds:.1f} s"
        self.state = "succeeded"

    def _set_error(self, state: str, text: str) -> None:
        self.state, self.error = state, text
        self.message.value = error_html(text)
        self.status.value = f"<b>{html.escape(state)}</b>"
        self.progress.bar_style = _BAR_STYLE.get(state, "danger")

    # --- results, history, comparison ----------------------------------------------------------
    @property
    def figure(self) -> go.Figure | None:
        """The timeline figure shown in the result view (None before any result)."""
        return self.explorer.figure if self.explorer is not None else None

    def show(self, run: Run | int) -> None:
        """Show a run (or the history entry with that index): timeline, metrics, diagnosis."""
        run = self.history[run] if isinstance(run, int) else run
        timeline = run.timeline
        losses = run.losses
        loss = f" · loss {losses[0]:.3f} → {losses[-1]:.3f}" if losses else ""
        self.result_title.value = (f"<b>{html.escape(run.name)}</b> · {run.spec.num_stages} stages × "
                                   f"{run.spec.micro_batches} micro-batches · {html.escape(run.spec.schedule)} · "
                                   f"partition {run.parts}{loss}")
        self.explorer = TimelineExplorer(timeline, diagnosis=False)  # the run's diagnosis is above
        self.result_box.children = (self.explorer.widget,)
        m = timeline.metrics()
        self.metrics.value = m._repr_html_()
        self.diagnosis.value = f"<b>diagnosis:</b> {html.escape(m.diagnosis)}"

    def _label(self, index: int) -> str:
        run = self.history[index]
        s = run.spec
        part = s.partition if isinstance(s.partition, str) else ",".join(map(str, s.partition))
        try:
            bubble = f" · bubble {run.timeline.metrics().bubble_ratio:.0%}"
        except ValueError:
            bubble = ""
        return f"#{index + 1} {s.model} {s.num_stages}st×{s.micro_batches}mb {s.schedule} {part}{bubble}"

    def _refresh_history(self, select: int | None = None) -> None:
        options = [(self._label(i), i) for i in range(len(self.history))]
        for dropdown in (self.history_select, self.compare_a, self.compare_b):
            dropdown.options = options
        if options:
            last = len(options) - 1
            self.history_select.value = last if select is None else select
            self.compare_b.value = last
            self.compare_a.value = max(0, last - 1)

    def _on_show(self) -> None:
        if self.history_select.value is not None:
            self.show(self.history_select.value)

    def _on_compare(self) -> None:
        try:
            self.compare(self.compare_a.value, self.compare_b.value)
        except (ValueError, IndexError, TypeError) as exc:
            self.compare_output.outputs = ()
            self.message.value = error_html(f"cannot compare: {exc}")

    def compare(self, a: int | Run, b: int | Run) -> go.Figure:
        """Both runs' timelines on one time axis (`utils.compare_timelines`), shown below."""
        if a is None or b is None:
            raise ValueError("run at least one job first: the history is empty")
        runs = [self.history[x] if isinstance(x, int) else x for x in (a, b)]
        labels = tuple(f"#{self.history.index(r) + 1}" if r in self.history else r.name for r in runs)
        fig = compare_timelines(runs[0].timeline, runs[1].timeline, labels=labels)
        figure_output(fig, self.compare_output)
        return fig
