"""How pipeline metrics read: what each scalar means, its format, the diagnosis, the report.

Shared by `utils.analysis.metrics.Metrics` (one step) and
`utils.analysis.summary.MetricsSummary` (several steps), so both name, format and explain
their numbers the same way. Tables are drawn by `utils.analysis.tables`.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from utils.analysis.tables import html_table, text_table

if TYPE_CHECKING:
    from utils.analysis.metrics import Metrics
    from utils.analysis.summary import MetricsSummary

__all__ = ["PARTIAL", "SCALARS", "diagnose", "format_value", "partial_notes", "report_html", "report_text",
           "stage_rows", "with_notes"]

#: What the metrics of a timeline read from a partial record say first.
PARTIAL = "本次运行的数据不完整 (this run's figures are partial)"

#: A stage whose compute exceeds the mean stage compute by this factor is called the bottleneck.
IMBALANCE_THRESHOLD = 1.10
#: Exposed communication above this share of stage time is worth a diagnosis of its own.
COMM_THRESHOLD = 0.10

#: Scalar metrics summarised across steps, with the meaning shown in tables.
SCALARS: dict[str, str] = {
    "bubble_ratio": "share of stage time in the pipeline phase not spent computing",
    "makespan": "first compute start to last compute end",
    "step_time": "whole step, including load, reduce and optimizer step",
    "samples_per_s": "samples per second over the whole step, all replicas",
    "tokens_per_s": "tokens per second (samples/s × sequence length; real tokens with variable lengths)",
    "padding_waste": "share of the computed tokens that were padding (variable lengths)",
    "imbalance": "largest stage compute / mean stage compute",
    "comm_share": "exposed send/recv time / (stages × makespan)",
    "warmup": "fill: until every stage has started computing",
    "steady": "every stage has work started and work left",
    "cooldown": "drain: after the first stage has finished all its compute",
}
_TIME_SCALARS = {"makespan", "step_time", "warmup", "steady", "cooldown"}
_SHARE_SCALARS = {"bubble_ratio", "comm_share", "padding_waste"}
_STAGE_COLUMNS = ("stage", "compute_ms", "comm_ms", "idle_ms", "utilisation")


def diagnose(*, bubble: float, imbalance: float, slowest: int, comm_share: float,
             straggler: tuple[int, int, float] | None) -> str:
    """One line naming the main cause of the bubble, the worst cause first."""
    if imbalance >= IMBALANCE_THRESHOLD:
        return (f"stage {slowest} is the bottleneck: {imbalance:.2f}× the mean stage compute; "
                f"move layers off it (bubble {bubble:.0%})")
    if straggler is not None:
        stage, rank, ratio = straggler
        return (f"rank {rank} of stage {stage} is a straggler: {ratio:.2f}× the fastest "
                f"replica of its stage (bubble {bubble:.0%})")
    if comm_share >= COMM_THRESHOLD:
        return (f"communication is not overlapped: {comm_share:.0%} of stage time goes to "
                f"send/recv (bubble {bubble:.0%})")
    if bubble < 0.05:
        return (f"the pipeline is well filled: bubble {bubble:.1%}, stages balanced "
                f"(max/mean {imbalance:.2f})")
    return (f"stages are balanced (max/mean {imbalance:.2f}); the bubble ({bubble:.0%}) comes "
            "from fill and drain: raise the micro-batch count")


def partial_notes(meta: dict) -> tuple[str, ...]:
    """The notes metrics carry for a timeline read from a partial record: its
    ``meta["record_problems"]`` (one line per file cut short or damaged, put there by the
    reader of a run's record, `utils.jobs.runs.Run.timeline`), headed by `PARTIAL`; empty
    for a complete record or a simulation."""
    problems = [str(p) for p in meta.get("record_problems") or ()]
    return (f"{PARTIAL}: {problems[0]}", *problems[1:]) if problems else ()


def with_notes(diagnosis: str, notes: tuple[str, ...]) -> str:
    """The one-line diagnosis, marked when it rests on a partial record."""
    return f"[{PARTIAL}] {diagnosis}" if notes else diagnosis


def format_value(name: str, value: float | None) -> str:
    """Scalar `name` as tables show it: times in ms, shares in %, imbalance as a factor."""
    if value is None:
        return "n/a"
    if name in _TIME_SCALARS:
        return f"{value * 1e3:.2f} ms"
    if name in _SHARE_SCALARS:
        return f"{value:.1%}"
    if name == "imbalance":
        return f"{value:.2f}×"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def stage_rows(m: Metrics | MetricsSummary) -> list[dict]:
    """One row per stage: compute, exposed comm and idle in ms, utilisation."""
    return [{"stage": s,
             "compute_ms": round(m.stage_compute[s] * 1e3, 3),
             "comm_ms": round(m.stage_comm[s] * 1e3, 3),
             "idle_ms": round(m.stage_idle[s] * 1e3, 3),
             "utilisation": round(m.stage_utilisation[s], 4)}
            for s in range(m.num_stages)]


def report_text(head: str, rows: list[dict], stages: list[dict], diagnosis: str,
                notes: tuple[str, ...] = ()) -> str:
    """`head`, its `notes` (a partial record), the scalar table (without its meanings), the
    stage table and the diagnosis."""
    columns = [k for k in rows[0] if k != "meaning"] if rows else []
    stages = [{**r, "compute_ms": f"{r['compute_ms']:.3f}", "comm_ms": f"{r['comm_ms']:.3f}",
               "idle_ms": f"{r['idle_ms']:.3f}", "utilisation": f"{r['utilisation']:.1%}"}
              for r in stages]
    parts = [head, *(f"  ! {note}" for note in notes),
             text_table(rows, columns=columns, align={"metric": "left"}, min_width=14,
                        indent="  "),
             text_table(stages, columns=_STAGE_COLUMNS, indent="  "),
             f"  diagnosis: {diagnosis}"]
    return "\n".join(p for p in parts if p)


def report_html(head: str, rows: list[dict], stages: list[dict], diagnosis: str,
                notes: tuple[str, ...] = ()) -> str:
    """The same report as `report_text` as HTML; the scalar table keeps its meanings."""
    stages = [{**r, "utilisation": f"{r['utilisation']:.1%}"} for r in stages]
    shown = "".join(f"<p><b>! {html.escape(note)}</b></p>" for note in notes)
    return (f"<div><b>{html.escape(head)}</b>{shown}{html_table(rows, align='left')}"
            f"{html_table(stages, align='left')}"
            f"<p><b>diagnosis:</b> {html.escape(diagnosis)}</p></div>")
