"""The decision logs of a dynamic job as a reader sees them, in the chosen language.

A re-balancing job (`JobSpec.rebalance`) and a micro-batch policy (`JobSpec.micro_batch_policy`)
record every look they take: `Run.rebalance_decisions` (`Decision`) and
`Run.micro_batch_decisions` (`MicroBatchDecision`). Each carries an English `reason` with the
figures that decided, written by the planning layer. Here the same decisions become a table:
which rule decided (``outcome``), the figures it used, "—" where a look had none (too few
measurements: no candidate, no prediction), the migration cost labelled with where it came
from (measured on this job's last move, assumed, or estimated before any move), and the
reason in Chinese when the language is ``"zh"``.

A reason is translated by matching the planning layer's sentences, like the diagnosis in
`utils.ui.tables`; one the table does not know (a new sentence there) shows in English
rather than wrong, and tests/unit/test_decisions_ui.py makes every rule's sentence known.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from utils.analysis.tables import html_table
from utils.planning.microbatching import MicroBatchDecision
from utils.planning.rebalance import Decision
from utils.ui.labels import resolve
from utils.ui.tables import MetricsTable

__all__ = ["reason_text", "outcome_text", "decision_rows", "decision_table", "OUTCOME_NAMES", "SOURCE_NAMES"]

MISSING = "—"

#: The rule behind a decision, as a reader calls it (both policies' `outcome` values).
OUTCOME_NAMES: dict[str, dict[str, str]] = {
    "en": {"too-few-measurements": "too few measurements", "already-balanced": "already balanced",
           "below-min-gain": "gain below min_gain", "no-payback": "does not pay back", "move": "move",
           "already-fastest": "already the fastest", "change": "change"},
    "zh": {"too-few-measurements": "测量不够", "already-balanced": "已经均衡", "below-min-gain": "收益低于 min_gain",
           "no-payback": "不回本", "move": "迁移", "already-fastest": "已是最快", "change": "换"},
}
#: Where a migration cost came from (`Decision.migration_source`).
SOURCE_NAMES: dict[str, dict[str, str]] = {
    "en": {"measured": "measured", "assumed": "assumed", "estimated": "estimated"},
    "zh": {"measured": "实测", "assumed": "假设", "estimated": "估计"},
}

_N = r"(-?[\d.]+)"
_T = r"(-?[\d.]+ m?s)"             # rebalance._time: "12.3 ms" or "1.23 s"
_P = r"(-?[\d.]+%)"
_L = r"(\[[\d, ]*\])"
# The planning layer's sentences (utils.planning.rebalance.decide,
# utils.planning.microbatching.choose_micro_batches, utils.runtime.dynamic.MicroBatching).
_REASONS = [
    (re.compile(rf"not enough measurements: {_N} per-layer costs and {_N} step times of the {_N} the look uses"),
     "测量不够：这次查看要用最近 {2} 步，只有 {0} 步的逐层开销和 {1} 个步时：不动"),
    (re.compile(rf"already balanced: the exact min-max partition of the measured costs is the one in force "
                rf"{_L} \(slowest stage {_T} per micro-batch\)"),
     "已经均衡：按实测开销求出的精确最小最大切分就是当前的 {0}（最慢阶段每个微批 {1}）：不动"),
    (re.compile(rf"predicted saving {_P} per step \({_T}\) is below min_gain {_P}: within measurement noise, "
                rf"stay at {_L}"),
     "预计每步省 {0}（{1}），低于 min_gain {2}：在测量噪声之内，留在 {3}"),
    (re.compile(rf"would not pay back: predicted saving {_P} per step \({_T}\) × {_N} steps = {_T} < {_N} × "
                rf"migration {_T}"),
     "不回本：预计每步省 {0}（{1}）× 剩余 {2} 步 = {3}，小于 {4} × 迁移代价 {5}：不动"),
    (re.compile(rf"predicted saving {_P} per step \({_T}\) × {_N} steps = {_T} ≥ {_N} × migration {_T}: "
                rf"move {_L} -> {_L}"),
     "回本：预计每步省 {0}（{1}）× 剩余 {2} 步 = {3}，不小于 {4} × 迁移代价 {5}：从 {6} 搬到 {7}"),
    (re.compile(rf"not enough measurements at {_N} micro-batches since the last change of costs "
                r"\(a freeze, a new engine\) or count: stay"),
     "测量不够：自上次代价（冻结、换引擎）或微批数改变以来，还没有在 {0} 个微批下量到一步：不变"),
    (re.compile(rf"{_N} micro-batches is already the fastest count that fits the memory budget"),
     "{0} 个微批已是显存预算内预测最快的：不变"),
    (re.compile(rf"{_N} micro-batches would save {_P} per step, under min_gain {_P}: stay at {_N}"),
     "{0} 个微批预计每步省 {1}，低于 min_gain {2}：留在 {3} 个"),
    (re.compile(rf"{_N} micro-batches: predicted {_N} ms per step against {_N} ms measured at {_N} "
                rf"\(([+-][\d.]+%)\) \({_N} no longer fits the memory budget\)"),
     "换成 {0} 个微批：预测每步 {1} ms，{3} 个时实测 {2} ms（{4}；{5} 个已超出显存预算）"),
    (re.compile(rf"{_N} micro-batches: predicted {_N} ms per step against {_N} ms measured at {_N} "
                rf"\(([+-][\d.]+%)\)"),
     "换成 {0} 个微批：预测每步 {1} ms，{3} 个时实测 {2} ms（{4}）"),
]

_COLUMNS = {
    "en": {"step": "step", "boundaries": "partition", "candidate": "candidate", "measured": "measured step (ms)",
           "predicted": "predicted step (ms)", "saving": "saving per step (ms)", "remaining": "steps left",
           "migration": "migration cost (ms)", "current": "micro-batches", "fastest": "predicted fastest",
           "chosen": "chosen", "outcome": "decision", "reason": "reason"},
    "zh": {"step": "步 step", "boundaries": "当时的切分", "candidate": "候选切分", "measured": "实测步时 (ms)",
           "predicted": "预测步时 (ms)", "saving": "每步节省 (ms)", "remaining": "剩余步数",
           "migration": "迁移代价 (ms)", "current": "当时的微批数", "fastest": "预测最快的微批数",
           "chosen": "选择", "outcome": "决定", "reason": "原因"},
}


def reason_text(decision: Decision | MicroBatchDecision, lang: str | None = None) -> str:
    """The decision's reason in `lang` (default: the current language); a sentence the
    table does not know stays English."""
    if resolve(lang) == "en":
        return decision.reason
    for pattern, template in _REASONS:
        match = pattern.fullmatch(decision.reason)
        if match:
            return template.format(*match.groups())
    return decision.reason


def outcome_text(decision: Decision | MicroBatchDecision, lang: str | None = None) -> str:
    """The rule that decided, in `lang`."""
    return OUTCOME_NAMES[resolve(lang)].get(decision.outcome, str(decision.outcome))


def decision_rows(decisions: Sequence[Decision | MicroBatchDecision], lang: str | None = None) -> list[dict]:
    """One row per decision, in `lang`, numbers formatted, "—" where the look had none.

    All decisions must be of one kind: `Run.rebalance_decisions` or `Run.micro_batch_decisions`."""
    lang = resolve(lang)
    kinds = {type(d) for d in decisions}
    if len(kinds) > 1 or not kinds <= {Decision, MicroBatchDecision}:
        raise TypeError("decisions must all be Decision (run.rebalance_decisions) or all "
                        f"MicroBatchDecision (run.micro_batch_decisions), got {sorted(k.__name__ for k in kinds)}")
    names = _COLUMNS[lang]
    rows = [_rebalance_row(d, lang) if isinstance(d, Decision) else _micro_batch_row(d, lang) for d in decisions]
    return [{names[k]: v for k, v in row.items()} for row in rows]


def decision_table(decisions: Sequence[Decision | MicroBatchDecision], *, lang: str | None = None) -> MetricsTable:
    """The decision log as an HTML table for a notebook cell:
    ``decision_table(run.rebalance_decisions)`` or ``decision_table(run.micro_batch_decisions)``."""
    lang = resolve(lang)
    rows = decision_rows(decisions, lang)
    if not rows:
        return MetricsTable("<p>no decisions recorded</p>" if lang == "en" else "<p>没有记录任何决定</p>")
    reason = _COLUMNS[lang]["reason"]
    return MetricsTable(html_table(rows, align={reason: "left", _COLUMNS[lang]["outcome"]: "left"}))


def _ms(seconds: float | None) -> str:
    return MISSING if seconds is None else f"{seconds * 1e3:.1f}"


def _rebalance_row(d: Decision, lang: str) -> dict:
    looked = bool(d.layer_forward)             # too few measurements: no candidate, no prediction
    proposed = looked and d.candidate != d.boundaries
    source = SOURCE_NAMES[lang].get(d.migration_source) if d.migration_source else None
    return {"step": d.step, "boundaries": str(list(d.boundaries)),
            "candidate": str(list(d.candidate)) if looked else MISSING,
            "measured": _ms(d.measured_step_seconds) if d.measured_step_seconds > 0 else MISSING,
            "predicted": _ms(d.predicted_step_seconds) if proposed else MISSING,
            "saving": _ms(d.saving_per_step) if proposed else MISSING,
            "remaining": d.remaining_steps,
            "migration": _ms(d.migration_seconds) + (f" ({source})" if source else ""),
            "outcome": outcome_text(d, lang), "reason": reason_text(d, lang)}


def _micro_batch_row(d: MicroBatchDecision, lang: str) -> dict:
    looked = bool(d.predicted)
    return {"step": d.step, "current": d.current,
            "measured": _ms(d.measured_step_seconds) if looked else MISSING,
            "fastest": d.fastest if looked else MISSING, "chosen": d.chosen,
            "outcome": outcome_text(d, lang), "reason": reason_text(d, lang)}
