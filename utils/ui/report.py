"""A run on one standalone HTML page: its settings, metrics, per-stage time and every step.

``run_page(run)`` is what ``python -m utils.ui.demo`` (``make demo``) writes, so that a run
on a GPU node read over SSH shows as much as the notebook would: what was run (model,
device, stages, micro-batches, batch arithmetic, schedule, partition, steps, loss), the
metrics over the steps after step 0 with the per-stage table and diagnosis, the per-stage
breakdown, and the timeline of **every** step (step 0 marked as warm-up). plotly.js is
embedded once, so the page opens offline.
"""

from __future__ import annotations

import html
from pathlib import Path

from utils.analysis.tables import html_table
from utils.jobs.runs import Run
from utils.ui.labels import resolve
from utils.ui.plots import plot_stage_breakdown, plot_timeline
from utils.ui.tables import metrics_html

__all__ = ["run_settings", "run_page", "write_run_page"]

_WORDS = {
    "en": {"run": "Run", "settings": "Run settings", "metrics": "Metrics", "stages": "Per-stage time",
           "steps": "Every step", "warmup": " (warm-up: one-off costs, left out of the medians)",
           "setting": "setting", "value": "value"},
    "zh": {"run": "运行", "settings": "运行设置", "metrics": "指标", "stages": "各阶段时间",
           "steps": "每一步", "warmup": "（预热：带一次性开销，不计入中位数）",
           "setting": "设置", "value": "值"},
}


_SETTING_NAMES_ZH = {
    "model": "模型", "device": "设备", "stages × data parallel": "阶段数 × 数据并行度",
    "micro-batches per step": "每步微批数", "micro-batch size": "微批大小", "global batch": "global batch",
    "schedule": "调度", "partition": "切分", "steps": "训练步数", "loss": "loss", "state": "状态",
    "wall time": "总用时", "run directory": "运行目录",
}


def run_settings(run: Run) -> list[dict]:
    """What was run, as rows ``{"setting", "value"}``."""
    s = run.spec
    losses = run.losses
    seconds = (run.finished - run.started) if run.finished else None
    options = ", ".join(f"{k}={v}" for k, v in dict(s.model_options).items()) or "preset defaults"
    rows = [
        ("model", f"{s.model} ({options})"),
        ("device", run.device or s.device),
        ("stages × data parallel", f"{s.num_stages} × {s.data_parallel} = {s.world_size} processes"),
        ("micro-batches per step", s.micro_batches),
        ("micro-batch size", s.micro_batch_size),
        ("global batch", f"{s.global_batch} = {s.micro_batch_size} × {s.micro_batches} × {s.data_parallel}"),
        ("schedule", s.schedule),
        ("partition", f"{s.partition if isinstance(s.partition, str) else 'explicit'} → boundaries {run.parts}"),
        ("steps", s.steps),
        ("loss", f"{losses[0]:.4f} → {losses[-1]:.4f}" if losses else "n/a"),
        ("state", run.state),
        ("wall time", f"{seconds:.1f} s" if seconds is not None else "n/a"),
        ("run directory", str(run.path)),
    ]
    return [{"setting": k, "value": str(v)} for k, v in rows]


def run_page(run: Run, *, lang: str | None = None) -> str:
    """The whole page as HTML text (see the module docstring)."""
    lang = resolve(lang)
    w = _WORDS[lang]
    timeline = run.timeline
    summary = timeline.metrics()
    names = _SETTING_NAMES_ZH if lang == "zh" else {}
    settings = [{w["setting"]: names.get(r["setting"], r["setting"]), w["value"]: r["value"]}
                for r in run_settings(run)]
    parts = [f"<h1>{html.escape(w['run'])} {html.escape(run.name)}</h1>",
             f"<h2>{w['settings']}</h2>", html_table(settings, align="left"),
             f"<h2>{w['metrics']}</h2>", metrics_html(summary, lang),
             f"<h2>{w['stages']}</h2>"]
    figures = [plot_stage_breakdown(summary, lang=lang)]
    parts.append(_figure(figures[0], first=True))
    parts.append(f"<h2>{w['steps']}</h2>")
    for step in timeline.steps:
        note = w["warmup"] if step == 0 and len(timeline.steps) > 1 else ""
        parts.append(f"<h3>step {step}{html.escape(note)}</h3>")
        parts.append(_figure(plot_timeline(timeline, step, lang=lang), first=False))
    style = ("body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px}"
             "table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px}")
    return (f"<!DOCTYPE html><html lang='{lang}'><head><meta charset='utf-8'>"
            f"<title>{html.escape(run.name)}</title><style>{style}</style></head><body>"
            + "\n".join(parts) + "</body></html>")


def _figure(fig, *, first: bool) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=True if first else False)


def write_run_page(run: Run, path: str | Path, *, lang: str | None = None) -> Path:
    """Write `run_page` to `path`; returns the path."""
    path = Path(path)
    path.write_text(run_page(run, lang=lang), encoding="utf-8")
    return path
