"""The metrics report as a reader sees it, in the chosen language.

`Metrics` and `MetricsSummary` render themselves in English (`utils.analysis.report`). Here
the same rows — ``m.table()``, ``m.stage_table()``, ``m.diagnosis`` — are drawn with Chinese
headers, metric names and meanings when the language is ``"zh"``; the numbers and the
decision behind the diagnosis are the analysis layer's, never recomputed. The identifiers
stay next to the translation (``气泡率 bubble_ratio``), so a reader finds them in code.

A diagnosis is translated by matching analysis' sentences; one the table does not know (a
new sentence there) shows in English rather than wrong.
"""

from __future__ import annotations

import html
import re

from utils.analysis.metrics import Metrics
from utils.analysis.summary import MetricsSummary
from utils.analysis.tables import html_table
from utils.ui.labels import resolve

__all__ = ["metrics_table", "metrics_html", "diagnosis_text", "METRIC_NAMES", "METRIC_MEANINGS"]

#: Chinese names of the scalar metrics (`utils.analysis.report.SCALARS`, plus slowest_stage).
METRIC_NAMES: dict[str, str] = {
    "bubble_ratio": "气泡率", "makespan": "流水线总时长", "step_time": "整步时间",
    "samples_per_s": "吞吐", "tokens_per_s": "吞吐", "slowest_stage": "最慢阶段",
    "imbalance": "不均衡度", "comm_share": "通信占比", "warmup": "预热", "steady": "稳态",
    "cooldown": "冷却", "padding_waste": "填充浪费",
}
#: Chinese meanings, one per metric analysis explains.
METRIC_MEANINGS: dict[str, str] = {
    "bubble_ratio": "流水线总时长里各阶段没在计算的时间占比",
    "makespan": "从第一个计算开始到最后一个计算结束",
    "step_time": "整步时间，含加载、归约和优化器步",
    "samples_per_s": "整步的每秒样本数（所有副本）",
    "tokens_per_s": "每秒 token 数（samples/s × 序列长度；变长样本时只计真实 token）",
    "padding_waste": "计算的 token 里填充所占的比例（变长样本）",
    "slowest_stage": "计算时间最多的阶段：它定节拍",
    "imbalance": "最大阶段计算时间 / 平均阶段计算时间",
    "comm_share": "暴露的 send/recv 时间 / (阶段数 × 流水线总时长)",
    "warmup": "填充：直到每个阶段都开始计算",
    "steady": "每个阶段都已开工、也都还有活",
    "cooldown": "排空：从第一个阶段做完全部计算起",
}
_COLUMNS = {"metric": "指标", "value": "值", "median": "中位数", "min": "最小", "max": "最大",
            "iqr": "IQR", "meaning": "含义", "stage": "阶段", "compute_ms": "计算 compute (ms)",
            "comm_ms": "通信 comm (ms)", "idle_ms": "空闲 idle (ms)", "utilisation": "利用率"}

# analysis' diagnosis sentences (utils.analysis.report.diagnose) and their Chinese form.
_NUM = r"([\d.]+)"
_PCT = r"([\d.]+%)"
_DIAGNOSES = [
    (re.compile(rf"stage (\d+) is the bottleneck: {_NUM}× the mean stage compute; "
                rf"move layers off it \(bubble {_PCT}\)"),
     "阶段 {0} 是瓶颈：计算时间是各阶段平均的 {1}×，把层从它上面移走（气泡率 {2}）"),
    (re.compile(rf"rank (\d+) of stage (\d+) is a straggler: {_NUM}× the fastest replica of "
                rf"its stage \(bubble {_PCT}\)"),
     "阶段 {1} 的 rank {0} 是掉队者：计算时间是本阶段最快副本的 {2}×（气泡率 {3}）"),
    (re.compile(rf"communication is not overlapped: {_PCT} of stage time goes to send/recv "
                rf"\(bubble {_PCT}\)"),
     "通信没有与计算重叠：{0} 的阶段时间花在 send/recv 上（气泡率 {1}）"),
    (re.compile(rf"the pipeline is well filled: bubble {_PCT}, stages balanced "
                rf"\(max/mean {_NUM}\)"),
     "流水线很满：气泡率 {0}，各阶段均衡（max/mean {1}）"),
    (re.compile(rf"stages are balanced \(max/mean {_NUM}\); the bubble \({_PCT}\) comes from "
                r"fill and drain: raise the micro-batch count"),
     "各阶段均衡（max/mean {0}）；气泡（{1}）来自填充和排空：增加微批数"),
]


def translate_diagnosis(sentence: str, lang: str | None = None) -> str:
    """Analysis' English diagnosis in `lang`; unknown sentences stay English."""
    if resolve(lang) == "en":
        return sentence
    for pattern, template in _DIAGNOSES:
        match = pattern.fullmatch(sentence)
        if match:
            return template.format(*match.groups())
    return sentence


def diagnosis_text(m: Metrics | MetricsSummary, lang: str | None = None) -> str:
    """``m.diagnosis`` in `lang`."""
    return translate_diagnosis(m.diagnosis, lang)


def _head(m: Metrics | MetricsSummary, lang: str) -> str:
    if isinstance(m, Metrics):
        source = {"measured": "实测", "simulated": "模拟"}.get(m.source, m.source)
        return f"{m.source} pipeline, step {m.step}" if lang == "en" else f"{source}流水线，step {m.step}"
    steps = list(m.used_steps)
    skipped = [x.step for x in m.per_step if x.step not in m.used_steps]
    if lang == "en":
        note = f", step {skipped[0]} left out (warm-up costs)" if skipped else ""
        return f"{m.source} pipeline, median over {len(steps)} step(s) {steps}{note}"
    source = {"measured": "实测", "simulated": "模拟"}.get(m.source, m.source)
    note = f"，去掉了带一次性开销的 step {skipped[0]}" if skipped else ""
    return f"{source}流水线：{len(steps)} 步 {steps} 的中位数{note}"


def _translated(rows: list[dict], lang: str) -> list[dict]:
    if lang == "en":
        return rows
    out = []
    for row in rows:
        row = dict(row)
        name = row.get("metric")
        if name is not None:
            row["metric"] = f"{METRIC_NAMES[name]} {name}" if name in METRIC_NAMES else name
            if "meaning" in row and name in METRIC_MEANINGS:
                row["meaning"] = METRIC_MEANINGS[name]
        out.append({_COLUMNS.get(k, k): v for k, v in row.items()})
    return out


def metrics_html(m: Metrics | MetricsSummary, lang: str | None = None, *,
                 diagnosis: bool = True) -> str:
    """The report of `m` as HTML: head, scalar table, per-stage table and (unless
    ``diagnosis=False``, for a view that shows it elsewhere) the diagnosis."""
    lang = resolve(lang)
    stages = [{**r, "utilisation": f"{r['utilisation']:.1%}"} for r in m.stage_table()]
    label = "diagnosis:" if lang == "en" else "诊断："
    why = f"<p><b>{label}</b> {html.escape(diagnosis_text(m, lang))}</p>" if diagnosis else ""
    return (f"<div><b>{html.escape(_head(m, lang))}</b>"
            f"{html_table(_translated(m.table(), lang), align='left')}"
            f"{html_table(_translated(stages, lang), align='left')}{why}</div>")


class MetricsTable:
    """What `metrics_table` returns: shows as its HTML in a notebook; ``.html`` is the text."""

    def __init__(self, html_text: str):
        self.html = html_text

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.html


def metrics_table(m: Metrics | MetricsSummary, *, lang: str | None = None) -> MetricsTable:
    """The metrics report of a step or a summary, for a notebook cell, in `lang`
    (default: the current language). ``metrics_table(run.timeline.metrics())``."""
    return MetricsTable(metrics_html(m, lang))
