"""What a `RunPanel` adds for a dynamic job: the partition history, a diagnosis per phase,
the decision logs and the partition-history plot.

A job that re-partitions itself is two (or more) pipelines in one record: before the move
and after it. One median over all steps mixes them, so the panel splits the steps at every
re-partition (`Run.partition_history`) and diagnoses each phase on its own steps; the
decisions that led there are `utils.ui.decisions` tables, and `plot_partition_history`
draws the stage costs and boundaries over the steps.
"""

from __future__ import annotations

import html
from dataclasses import replace

from utils.jobs.runs import Run
from utils.timeline import Timeline
from utils.ui.decisions import decision_table
from utils.ui.labels import text
from utils.ui.tables import diagnosis_text

__all__ = ["history_text", "move_steps", "phases", "phase_diagnoses_html", "decisions_html"]


def history_text(run: Run) -> str:
    """``[0, 6, 12] → [0, 8, 12] @ 6``: the starting partition and every change with its step."""
    history = run.partition_history
    if not history:
        return ""
    return " → ".join([str(history[0][1]), *(f"{parts} @ {step}" for step, parts in history[1:])])


def move_steps(run: Run) -> list[int]:
    """The steps before which the job re-partitioned."""
    return [step for step, _ in run.partition_history[1:]]


def phases(run: Run) -> list[tuple[int, int, list[int]]]:
    """``(first step, last step, boundaries)`` of every phase between re-partitions that has
    steps in the timeline."""
    steps = run.timeline.steps
    history = run.partition_history or [(0, run.parts)]
    out = []
    for i, (start, parts) in enumerate(history):
        end = history[i + 1][0] if i + 1 < len(history) else max(steps) + 1
        inside = [s for s in steps if start <= s < end]
        if inside:
            out.append((inside[0], inside[-1], parts))
    return out


def _phase_timeline(timeline: Timeline, first: int, last: int) -> Timeline:
    return replace(timeline, events=tuple(e for e in timeline.events if first <= e.step <= last))


def phase_diagnoses_html(run: Run, lang: str) -> str:
    """One line per phase: its steps, its partition, the diagnosis of its steps alone (step 0
    left out as everywhere: it pays one-off costs)."""
    lines = []
    for first, last, parts in phases(run):
        try:
            m = _phase_timeline(run.timeline, first, last).metrics()
            lines.append(text("result.phase", lang, first=first, last=last, parts=parts,
                              diagnosis=diagnosis_text(m, lang)))
        except ValueError:
            lines.append(text("result.phase_empty", lang, first=first, last=last, parts=parts))
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f"<b>{html.escape(text('result.phases', lang))}</b><ul style='margin:2px 0'>{items}</ul>"


def decisions_html(run: Run, lang: str) -> str:
    """The run's decision logs as tables under a heading each (``""`` when it has none)."""
    parts = []
    for key, decisions in (("result.decisions", run.rebalance_decisions),
                           ("result.mb_decisions", run.micro_batch_decisions)):
        if decisions:
            parts.append(f"<h4 style='margin:8px 0 2px'>{html.escape(text(key, lang))}</h4>"
                         f"{decision_table(decisions, lang=lang).html}")
    return "".join(parts)
