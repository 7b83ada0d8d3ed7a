"""ipywidgets panels: launch real pipeline jobs from a notebook and look at what they did.

* `RunPanel()` — controls for a `JobSpec` (model preset, stages, micro-batches, partition,
  schedule, steps; `utils.ui.controls`), a Run and a Stop button, live progress, then the
  run's timeline, metrics and diagnosis; a history of the runs of this panel and a
  side-by-side comparison of two of them (`utils.ui.history`). A bare ``utils.RunPanel()``
  as the last line of a cell displays it.
* `TimelineExplorer` (`utils.ui.explorer`) shows each run's timeline inside the panel.

Three choices keep the notebook responsive, the pictures reliable and the learner in charge:

1. **The kernel is never blocked.** Run starts the job (`utils.start_job`, which returns at
   once) and a daemon thread polls it and updates the widgets; the cell that pressed Run is
   finished, so the learner can keep working while the job runs. Stop only sets an event:
   the same thread stops the job, so `RunningJob` (not thread-safe) is only ever driven from
   one thread.
2. **Jupyter's ■ stops the job too** (`utils.ui.interrupt`): the kernel interrupt sets the
   same event, whether the kernel is idle or running another cell. The panel says under
   its buttons which of the two reaches the job (only Stop, outside a kernel's main thread).
3. **Figures are plotly's own MIME bundle in an `ipywidgets.Output`** (`utils.ui.display`):
   reliable from the watcher thread, without plotly's anywidget-based FigureWidget.

Labels follow `utils.ui.labels` (``RunPanel(lang="zh")`` or ``set_language("zh")`` first).
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import ipywidgets as widgets

from utils.jobs.launch import JobFailed, RunningJob, start_job
from utils.jobs.progress import job_phase
from utils.jobs.runs import Run
from utils.jobs.spec import JobSpec
from utils.ui import interrupt
from utils.ui.controls import (BOUNDARIES, PROFILE, STYLE, JobControls, parse_boundaries,
                               parse_options)
from utils.ui.display import Displayable, error_html
from utils.ui.explorer import TimelineExplorer
from utils.ui.history import RunResults
from utils.ui.labels import resolve, text

__all__ = ["RunPanel", "parse_boundaries", "parse_options", "BOUNDARIES", "PROFILE"]

#: Progress-bar style of a panel whose job did not succeed, by state (anything else: danger).
_BAR_STYLE = {"failed": "danger", "timeout": "danger", "stopped": "warning", "error": "danger"}
_NOTE = "#8a6d00"


class RunPanel(JobControls, RunResults, Displayable):
    """Launch real pipeline jobs (on DeepSpeed's engine, or torch's pipelining for the schedules
    DeepSpeed cannot run) from controls and look at the results.

    ``RunPanel()`` starts from `JobSpec`'s defaults; ``RunPanel(JobSpec(...))`` from that spec
    (fields without a control — device, timeout, seed, lr, data_parallel, name — come from it).
    ``history=[run, ...]`` puts finished runs in the history (to compare new runs with).
    ``lang="zh"`` labels it in Chinese (default: `utils.ui.labels.get_language`).
    Programmatic use (tests, exercises): `spec()`, `run()`, `stop()`, `wait()`, `state`,
    `error`, `history`, `show()`, `compare()`, `widget`.

    States: ``"idle"``, ``"invalid"`` (the controls do not make a valid spec; nothing started),
    ``"running"``, then the job's end state ``"succeeded"``, ``"failed"``, ``"timeout"``,
    ``"stopped"``, or ``"error"`` (the panel itself failed; the job was stopped).
    `stopped_by` says who stopped the last job: ``"button"`` (Stop or `stop()`) or
    ``"interrupt"`` (Jupyter's ■).
    """

    def __init__(self, spec: JobSpec | None = None, *, directory: str | Path | None = None,
                 history: Iterable[Run] = (), poll_interval: float = 0.25, lang: str | None = None):
        base = spec if spec is not None else JobSpec()
        self.lang = resolve(lang)
        self._base = base
        self.directory = directory
        self.poll_interval = poll_interval
        self.history: list[Run] = [r for r in history if r.ok]
        self.job: RunningJob | None = None
        self.run_result: Run | None = None
        self.state = "idle"
        self.error: str | None = None
        self.stopped_by: str | None = None
        self.explorer: TimelineExplorer | None = None
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._running_spec: JobSpec | None = None
        self._build_controls(base)
        self._build_results()
        self._build_views()
        self._refresh_history()
        self.refresh_plan()

    # --- building ---------------------------------------------------------------------------
    def _t(self, key: str, **fields) -> str:
        return text(key, self.lang, **fields)

    def _build_views(self) -> None:
        self.run_button = widgets.Button(description=self._t("btn.run"), button_style="primary",
                                         icon="play", tooltip=self._t("tip.run"))
        self.stop_button = widgets.Button(description=self._t("btn.stop"), button_style="danger",
                                          icon="stop", disabled=True, tooltip=self._t("tip.stop"))
        self.run_button.on_click(lambda _b: self._on_run())
        self.stop_button.on_click(lambda _b: self.stop(wait=False))
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description=self._t("progress"),
                                            style=STYLE, layout={"width": "320px"})
        self.status = widgets.HTML(f"<i>{self._t('status.idle')}</i>")
        # How this job can be stopped; says more once a job runs (whether ■ reaches it).
        self.stop_hint = widgets.HTML(f"<small style='color:#555'>{html.escape(self._t('stop.how'))}</small>")
        self.message = widgets.HTML()  # errors and notes
        self.widget = widgets.VBox([
            widgets.HTML(f"<h3 style='margin:4px 0'>{html.escape(self._t('panel.title'))}</h3>"),
            self.controls_grid, self.dynamic.widget, self.plan,
            widgets.HBox([self.run_button, self.stop_button, self.progress, self.status],
                         layout={"align_items": "center", "flex_flow": "row wrap"}),
            self.stop_hint, self.message,
            self.result_title, self.diagnosis, self.result_box, self.metrics,
            self.decisions, self.partition_plot,
            self.history_box,
        ], layout={"border": "1px solid #ddd", "padding": "6px 10px"})

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
            self._set_error("invalid", self._t("error.start", why=exc))
            return None
        self._stop_requested.clear()
        self.stopped_by = None
        self.job, self.state, self._running_spec = None, "running", spec
        self.progress.value, self.progress.max, self.progress.bar_style = 0, spec.steps, "info"
        first = "status.profiling" if spec.partition == PROFILE else "status.launching"
        self.status.value = f"<i>{self._t(first)}</i>"
        self.run_button.disabled, self.stop_button.disabled = True, False
        # ■ sets the same event as Stop; where it cannot reach the job, the panel says so.
        how = interrupt.watch(id(self), self._on_interrupt)
        hint = self._t("stop.how") if how else self._t("stop.how_button")
        self.stop_hint.value = f"<small style='color:#555'>{html.escape(hint)}</small>"
        self._thread = threading.Thread(target=self._watch, args=(spec,), daemon=True,
                                        name="RunPanel-watcher")
        self._thread.start()
        if wait:
            self.wait(timeout)
            return self.run_result if self.state == "succeeded" else None
        return None

    def _on_interrupt(self) -> None:
        """Jupyter's ■ (SIGINT, main thread): only set flags; the watcher stops the job."""
        if self.stopped_by is None:
            self.stopped_by = "interrupt"
        self._stop_requested.set()

    def stop(self, *, wait: bool = True, timeout: float = 60.0) -> str:
        """Ask the watcher thread to stop the job (what Stop does); with `wait`, wait until
        every process is gone. Returns the state."""
        if self.running:
            if self.stopped_by is None:
                self.stopped_by = "button"
            self._stop_requested.set()
            self.status.value = f"<i>{self._t('status.stopping')}</i>"
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
                self._set_error("invalid" if isinstance(exc, ValueError) else "error",
                                self._t("error.start", why=why))
                return
            self.job = job
            if job.notes:
                self.message.value = error_html(self._t("note", text="\n".join(job.notes)), _NOTE)
            seen = -1
            while True:
                if self._stop_requested.is_set():
                    by = "stop.by_interrupt" if self.stopped_by == "interrupt" else "stop.by_button"
                    job.stop(text(by, "en"))  # the run record is English, like every record
                state = job.poll()
                rows = job.progress()
                if len(rows) != seen or not rows:
                    seen = len(rows)
                    self._show_progress(job, rows)
                if state != "running":
                    break
                self._stop_requested.wait(self.poll_interval)  # wakes at once on Stop and ■
            self._show_end(job)
        except Exception as exc:  # noqa: BLE001 - the panel must never be left spinning
            try:
                if job is not None:
                    job.stop(f"the panel failed: {exc!r}")
            finally:
                self._set_error("error", self._t("error.watch", why=f"{type(exc).__name__}: {exc}"))
        finally:
            interrupt.unwatch(id(self))
            self.run_button.disabled, self.stop_button.disabled = False, True

    def _show_progress(self, job: RunningJob, rows: list[dict]) -> None:
        spec = job.spec
        elapsed = f"{time.time() - job.started:.0f}"
        if not rows:
            name, ops = self._phase(job, rows)
            if name == "compiling":
                line = self._t("status.compiling", ops=", ".join(ops), elapsed=elapsed)
            elif name == "first step":
                line = self._t("status.first_step", steps=spec.steps, elapsed=elapsed)
            else:
                line = self._t("status.starting", n=spec.world_size, elapsed=elapsed)
            self.status.value = f"<i>{html.escape(line)}</i>"
            return
        last = rows[-1]
        self.progress.value = min(len(rows), spec.steps)
        line = self._t("status.step", step=last["step"] + 1, steps=spec.steps, loss=f"{last['loss']:.4f}",
                       sps=f"{last['seconds']:.2f}", elapsed=elapsed)
        moves = job.run_dir.partition_changes() if spec.rebalance is not None or spec.repartition_at else []
        if moves:  # a dynamic job: its last move, where the learner watching the line sees it
            line += self._t("status.move", step=moves[-1].step, parts=list(moves[-1].boundaries))
        self.status.value = html.escape(line)

    @staticmethod
    def _phase(job: RunningJob, rows: list[dict]) -> tuple[str, tuple[str, ...]]:
        """The phase before the first step, as `run_job`'s line names it (`job_phase`):
        starting, compiling (the first job in an environment builds DeepSpeed's comm op for
        1-2 minutes) or first step. A status line that cannot be read says "starting": it
        must never make the watcher stop the job."""
        try:
            phase = job_phase(job, rows)
        except Exception:  # noqa: BLE001 - only the status line's wording depends on it
            return "starting", ()
        return phase.name, phase.ops

    def _show_end(self, job: RunningJob) -> None:
        try:
            run = job.result()
        except JobFailed as exc:
            rows = job.progress()
            done = self._t("status.after", done=len(rows), steps=job.spec.steps) \
                if job.state == "stopped" else ""
            self.progress.bar_style = _BAR_STYLE.get(job.state, "danger")
            self.status.value = self._t("status.ended", state=html.escape(self._state_name(job.state)),
                                        done=done)
            self.state, self.error = job.state, str(exc)
            if job.state == "stopped":
                self.message.value = error_html(self._stopped_line(job), _NOTE)
            else:
                self.message.value = error_html(str(exc))
            return
        self.run_result = run
        self.history.append(run)
        self._refresh_history(select=len(self.history) - 1)
        self.progress.value, self.progress.bar_style = job.spec.steps, "success"
        self.show(run)
        seconds = (run.finished or time.time()) - run.started
        self.status.value = self._t("status.succeeded", seconds=f"{seconds:.1f}")
        self.state = "succeeded"

    def _stopped_line(self, job: RunningJob) -> str:
        """One line: who stopped the job and whether every process of it is gone."""
        launcher = getattr(job, "launcher", None)
        left = sorted(p.pid for p in launcher.workers().values()) if launcher is not None else []
        by = self._t("stop.by_interrupt" if self.stopped_by == "interrupt" else "stop.by_button")
        n = job.spec.world_size
        if self.lang == "zh":
            rest = f"仍有 {len(left)} 个进程在运行：pid {left}" if left else f"{n} 个进程全部结束"
            return f"{by}：{rest}（记录在 {job.path}）"
        rest = f"{len(left)} processes still run: pids {left}" if left else f"all {n} processes ended"
        return f"{by}: {rest} (record in {job.path})"

    def _state_name(self, state: str) -> str:
        key = f"state.{state}"
        return self._t(key) if key in _STATE_KEYS else state

    def _set_error(self, state: str, message: str) -> None:
        self.state, self.error = state, message
        self.message.value = error_html(message)
        self.status.value = f"<b>{html.escape(self._state_name(state))}</b>"
        self.progress.bar_style = _BAR_STYLE.get(state, "danger")


_STATE_KEYS = {"state.stopped", "state.failed", "state.timeout", "state.error", "state.invalid"}
