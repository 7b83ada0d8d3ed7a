"""The language of what a learner reads in figures and panels: English (the default) or Chinese.

The workbook's chapters are Chinese, its API English. Figures and panels therefore take their
words from one table per language, chosen by

* ``set_language("zh")`` (or ``"en"``) — for the whole kernel, e.g. at the top of a chapter;
* ``use_language("zh")`` — a ``with`` block, for one figure or a test;
* ``lang="zh"`` — one call: every figure function of `utils.ui.plots`, `RunPanel`,
  `TimelineExplorer` and `metrics_table` accept it.

Without any of these the language is ``$WORKBOOK_LANG`` if it names one, else English. A
panel keeps the language it was built with (its controls are built once); figures use the
language in force when they are drawn, unless given ``lang``. Identifiers stay as they are
in every language (``recv_grad``, ``1f1b``, ``bubble_ratio``): Chinese labels carry them
next to the translation, so what a learner reads matches what they type.
"""

from __future__ import annotations

import os
import string
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LANGUAGES", "set_language", "get_language", "use_language", "resolve", "text",
           "kind_label", "KIND_NAMES"]

LANGUAGES = ("en", "zh")
_ENV = "WORKBOOK_LANG"


def _from_env() -> str:
    value = os.environ.get(_ENV, "").strip().lower()
    return value if value in LANGUAGES else "en"


_current = _from_env()


def _check(lang: str) -> str:
    if lang not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {lang!r}")
    return lang


def set_language(lang: str) -> None:
    """Use `lang` (``"en"`` or ``"zh"``) for every figure and panel made from now on."""
    global _current
    _current = _check(lang)


def get_language() -> str:
    """The language figures and panels use when not given ``lang``."""
    return _current


@contextmanager
def use_language(lang: str) -> Iterator[str]:
    """``with use_language("zh"): ...`` — the language inside the block, restored after."""
    global _current
    before, _current = _current, _check(lang)
    try:
        yield lang
    finally:
        _current = before


def resolve(lang: str | None) -> str:
    """`lang` checked, or the current language when it is None."""
    return _current if lang is None else _check(lang)


#: What each instruction kind is called in Chinese (the identifier follows it in labels).
KIND_NAMES: dict[str, str] = {
    "forward": "前向", "backward": "反向", "backward_input": "反向·输入梯度",
    "backward_weight": "反向·权重梯度", "load": "加载微批", "send_act": "发送激活",
    "recv_act": "接收激活", "send_grad": "发送梯度", "recv_grad": "接收梯度",
    "reduce_tied_grads": "归约共享权重梯度", "reduce_grads": "梯度归约", "optimizer_step": "优化器步",
    "repartition": "重切分",
}


def kind_label(kind: str, lang: str | None = None) -> str:
    """``"forward"`` in English; ``"前向 forward"`` in Chinese (unknown kinds as they are)."""
    if resolve(lang) == "en" or kind not in KIND_NAMES:
        return kind
    return f"{KIND_NAMES[kind]} {kind}"


# Every text, by key, in each language; the same keys and the same {fields} in both (tested).
TEXTS: dict[str, dict[str, str]] = {
    "en": {
        # figures
        "pipeline": "Pipeline",
        "source.simulated": "simulated (not measured)",
        "source.measured": "measured",
        "timeline.title": "{name}: {source} timeline, step {step}",
        "timeline.bubble": " · bubble ratio {bubble}",
        "axis.time_in_step": "time in step (ms)",
        "axis.time": "time (ms)",
        "legend.kind": "kind",
        "legend.part": "part",
        "row.stage": "stage {stage}",
        "row.stage_rank": "stage {stage} · rank {rank}",
        "row.node": " · node {node}",
        "hover.bar": ("<b>%{{customdata[0]}}</b> micro-batch %{{customdata[1]}}<br>"
                      "stage %{{customdata[5]}} · rank %{{customdata[6]}} · chunk %{{customdata[7]}}<br>"
                      "start %{{customdata[2]:.3f}} ms · end %{{customdata[3]:.3f}} ms<br>"
                      "duration %{{customdata[4]:.3f}} ms%{{customdata[8]}}<extra></extra>"),
        "hover.tokens": "<br>{samples} samples · {real} real / {padded} computed tokens",
        "tiny": "too short to see at this scale (hover or zoom in): {kinds}",
        "summary.head": "{label} ({source}, step {step})",
        "summary.line": "{head}: bubble {bubble} · makespan {makespan} ms · {samples} samples/s",
        "compare.title": "{a} vs {b}",
        "compare.delta": ": makespan ×{ratio}, bubble {bubble_a} → {bubble_b}",
        "part.compute": "compute", "part.comm": "comm", "part.idle": "idle",
        "breakdown.title": "Per-stage time · {diagnosis}",
        "breakdown.makespan": "makespan {ms} ms",
        "breakdown.slowest": "slowest",
        "sweep.measured": "measured", "sweep.theory": "theory",
        "sweep.title": "{y} vs {x}",
        "rebalance.title": "{name}: stage costs and boundaries over the steps (measured)",
        "rebalance.stage": "stage {stage}",
        "rebalance.cut": "stage boundary",
        "rebalance.cut_hover": "boundary {cut}: first layer %{{y}} · step %{{x}}<extra></extra>",
        "rebalance.move": "→ {boundaries} (move took {ms} ms, measured)",
        "rebalance.cost_axis": "compute per micro-batch (ms)",
        "rebalance.cut_axis": "first layer of the stage",
        "rebalance.step_axis": "step",
        "grid.title": "{p} stages × {d} replicas = {n} processes (DeepSpeed's PipeDataParallelTopology)",
        "grid.rank": "rank {rank}",
        "grid.p2p": "p2p: activations →, gradients ←",
        "grid.allreduce": "all-reduce of stage {stage}'s gradients",
        "grid.stage_axis": "pipeline stage",
        "grid.replica_axis": "data-parallel replica",
        "memory.title": "Activation memory over time",
        "memory.axis": "memory ({unit})",
        "memory.count_axis": "activations ({unit})",
        "memory.budget": "budget",
        # the run panel
        "panel.title": "Pipeline run",
        "panel.history": "History and comparison",
        "ctl.model": "model", "ctl.model_options": "model options", "ctl.stages": "stages",
        "ctl.micro_batches": "micro-batches", "ctl.micro_batch_size": "micro-batch size",
        "ctl.steps": "steps", "ctl.partition": "partition", "ctl.boundaries": "boundaries",
        "ctl.schedule": "schedule", "ctl.options_hint": "e.g. blocks=4, hidden=64",
        "ctl.boundaries_hint": "e.g. 0,3,8",
        "partition.parameters": "parameters", "partition.uniform": "uniform",
        "partition.profile": "profile", "partition.boundaries": "boundaries",
        "btn.run": "Run", "btn.stop": "Stop", "btn.show": "Show", "btn.compare": "Compare",
        "tip.run": "start a real DeepSpeed pipeline job",
        "tip.stop": "stop every process of the job",
        "tip.show": "show the chosen run", "tip.compare": "both timelines on one time axis",
        "progress": "progress", "runs": "runs",
        "plan.ok": "{processes} processes · global batch {batch} = {size} × {count}{dp} · {layers}",
        "plan.replicas": " × {n} replicas",
        "plan.layers": "stage {stage}: layers {first}–{last}",
        "plan.profile": "boundaries from measured layer costs, chosen when the job starts",
        "status.idle": "idle: set the job up and press Run",
        "status.starting": "starting {n} processes ... {elapsed} s (imports and DeepSpeed set-up take a few seconds)",
        "status.step": "step {step}/{steps} · loss {loss} · {sps} s/step · {elapsed} s",
        "status.compiling": ("compiling DeepSpeed's communication op {ops} (first time only in this "
                             "environment, about 1-2 minutes) ... {elapsed} s"),
        "status.first_step": "step 1/{steps} running ... {elapsed} s",
        "status.stopping": "stopping ...",
        "status.launching": "starting ...",
        "status.profiling": "starting (profiling the layers first) ...",
        "status.succeeded": "<b>succeeded</b> in {seconds} s",
        "status.ended": "<b>{state}</b>{done}",
        "status.after": " after {done}/{steps} steps",
        "state.stopped": "stopped", "state.failed": "failed", "state.timeout": "timeout",
        "state.error": "error", "state.invalid": "invalid",
        "stop.how": "Stop or Jupyter's ■ (interrupt the kernel) ends this job and all its processes.",
        "stop.how_button": "Only Stop ends this job: ■ cannot reach it from here (no Jupyter kernel on this thread).",
        "stop.by_interrupt": "stopped by the kernel interrupt (■)",
        "stop.by_button": "stopped from the panel",
        "note": "note: {text}",
        "error.start": "cannot start: {why}",
        "error.watch": "the panel failed while watching the job: {why}",
        "error.compare": "cannot compare: {why}",
        "error.empty": "run at least one job first: the history is empty",
        "result.title": ("<b>{name}</b> · {stages} stages × {mbs} micro-batches · {schedule} · "
                         "partition {parts}{loss}"),
        "result.loss": " · loss {first} → {last}",
        "diagnosis": "diagnosis:",
        "history.label": "#{i} {model} {stages}st×{mbs}mb {schedule} {part}",
        "history.bubble": " · median bubble {bubble} over {n} step(s)",
        # the timeline explorer
        "explorer.step": "step", "explorer.kinds": "kinds",
        "explorer.summary": "step {step}: bubble {bubble} · makespan {makespan} ms",
        "explorer.mark": "{step} ⇄ re-partition",
        "explorer.marks": "re-partitions at step {steps} (marked ⇄ on the slider); show:",
        # the dynamic half of the run panel
        "panel.dynamic": "Dynamic: freezing, re-balancing, batching, micro-batch policy",
        "ctl.freeze": "freeze_at (step:layers)", "ctl.freeze_hint": "e.g. 6:4 = from step 6 freeze layers 0-3",
        "ctl.rebalance": "re-balance (Rebalance policy)", "ctl.every": "every (steps)",
        "ctl.window": "window (steps)", "ctl.min_gain": "min_gain", "ctl.payback": "payback (×)",
        "ctl.batching": "batching", "ctl.token_budget": "token_budget",
        "ctl.mb_policy": "micro-batch policy (MicroBatchPolicy)", "ctl.memory_samples": "memory_samples",
        "plan.freeze": "freezing: {what}", "plan.freeze_one": "from step {step} the first {n} layers",
        "plan.forced": "forced re-partition {what}",
        "plan.rebalance": ("re-balancing: look every {every} steps at the last {window}, move when the "
                           "saving ≥ {min_gain} and pays back {payback}×"),
        "plan.batching": "batching {method}{budget}",
        "plan.mb_policy": "micro-batch policy: every {every} steps, memory ≤ {memory} samples, min_gain {min_gain}",
        "status.move": " · re-partition @ step {step} → {parts}",
        "result.history": " · partition {history}",
        "result.phases": "diagnosis per phase:",
        "result.phase": "steps {first}–{last} at {parts}: {diagnosis}",
        "result.phase_empty": "steps {first}–{last} at {parts}: no step to measure",
        "result.decisions": "Re-balancing decisions (run.rebalance_decisions)",
        "result.mb_decisions": "Micro-batch decisions (run.micro_batch_decisions)",
    },
    "zh": {
        "pipeline": "流水线",
        "source.simulated": "模拟（不是测量）",
        "source.measured": "实测",
        "timeline.title": "{name}：{source}时间线，step {step}",
        "timeline.bubble": " · 气泡率 {bubble}",
        "axis.time_in_step": "步内时间 (ms)",
        "axis.time": "时间 (ms)",
        "legend.kind": "指令类型",
        "legend.part": "组成",
        "row.stage": "阶段 {stage}",
        "row.stage_rank": "阶段 {stage} · rank {rank}",
        "row.node": " · 节点 {node}",
        "hover.bar": ("<b>%{{customdata[0]}}</b> 微批 %{{customdata[1]}}<br>"
                      "阶段 %{{customdata[5]}} · rank %{{customdata[6]}} · chunk %{{customdata[7]}}<br>"
                      "开始 %{{customdata[2]:.3f}} ms · 结束 %{{customdata[3]:.3f}} ms<br>"
                      "时长 %{{customdata[4]:.3f}} ms%{{customdata[8]}}<extra></extra>"),
        "hover.tokens": "<br>{samples} 个样本 · 真实 {real} / 计算 {padded} 个 token",
        "tiny": "在这个比例下太短、看不见（悬停或放大查看）：{kinds}",
        "summary.head": "{label}（{source}，step {step}）",
        "summary.line": "{head}：气泡率 {bubble} · 流水线总时长 {makespan} ms · {samples} samples/s",
        "compare.title": "{a} 对比 {b}",
        "compare.delta": "：流水线总时长 ×{ratio}，气泡率 {bubble_a} → {bubble_b}",
        "part.compute": "计算 compute", "part.comm": "通信 comm", "part.idle": "空闲 idle",
        "breakdown.title": "各阶段时间 · {diagnosis}",
        "breakdown.makespan": "流水线总时长 {ms} ms",
        "breakdown.slowest": "最慢",
        "sweep.measured": "实测", "sweep.theory": "理论",
        "sweep.title": "{y} 随 {x} 的变化",
        "rebalance.title": "{name}：各阶段开销与边界随训练步的变化（实测）",
        "rebalance.stage": "阶段 {stage}",
        "rebalance.cut": "阶段边界",
        "rebalance.cut_hover": "边界 {cut}：该阶段第一层 %{{y}} · step %{{x}}<extra></extra>",
        "rebalance.move": "→ {boundaries}（搬动实测 {ms} ms）",
        "rebalance.cost_axis": "每个微批的计算时间 (ms)",
        "rebalance.cut_axis": "阶段的第一层",
        "rebalance.step_axis": "训练步 step",
        "grid.title": "{p} 个阶段 × {d} 个副本 = {n} 个进程（DeepSpeed 的 PipeDataParallelTopology）",
        "grid.rank": "rank {rank}",
        "grid.p2p": "点对点 (p2p)：激活 →，梯度 ←",
        "grid.allreduce": "阶段 {stage} 的梯度 all-reduce",
        "grid.stage_axis": "流水线阶段 (stage)",
        "grid.replica_axis": "数据并行副本 (replica)",
        "memory.title": "激活显存随时间的变化",
        "memory.axis": "内存 ({unit})",
        "memory.count_axis": "激活 ({unit})",
        "memory.budget": "预算",
        "panel.title": "流水线任务",
        "panel.history": "历史与对比",
        "ctl.model": "模型", "ctl.model_options": "模型参数", "ctl.stages": "阶段数",
        "ctl.micro_batches": "微批数", "ctl.micro_batch_size": "微批大小",
        "ctl.steps": "训练步数", "ctl.partition": "切分", "ctl.boundaries": "切分边界",
        "ctl.schedule": "调度", "ctl.options_hint": "例如 blocks=4, hidden=64",
        "ctl.boundaries_hint": "例如 0,3,8",
        "partition.parameters": "parameters（按参数量）", "partition.uniform": "uniform（按层数）",
        "partition.profile": "profile（按实测耗时）", "partition.boundaries": "boundaries（手填边界）",
        "btn.run": "运行", "btn.stop": "停止", "btn.show": "显示", "btn.compare": "对比",
        "tip.run": "启动一个真实的 DeepSpeed 流水线任务",
        "tip.stop": "结束任务的所有进程",
        "tip.show": "显示选中的运行", "tip.compare": "两条时间线画在同一个时间轴上",
        "progress": "进度", "runs": "历史",
        "plan.ok": "{processes} 个进程 · global batch {batch} = {size} × {count}{dp} · {layers}",
        "plan.replicas": " × {n} 个副本",
        "plan.layers": "阶段 {stage}：第 {first}–{last} 层",
        "plan.profile": "任务启动时按实测的逐层耗时决定切分边界",
        "status.idle": "空闲：设置好任务后按「运行」",
        "status.starting": "正在启动 {n} 个进程 ... {elapsed} s（导入和 DeepSpeed 初始化要几秒）",
        "status.step": "step {step}/{steps} · loss {loss} · {sps} s/步 · 已用 {elapsed} s",
        "status.compiling": "正在编译 DeepSpeed 通信算子 {ops}（本环境只在第一次编译，约 1–2 分钟）... 已用 {elapsed} s",
        "status.first_step": "第 1/{steps} 步进行中 ... 已用 {elapsed} s",
        "status.stopping": "正在停止 ...",
        "status.launching": "正在启动 ...",
        "status.profiling": "正在启动（先逐层测量耗时）...",
        "status.succeeded": "<b>完成</b>，用时 {seconds} s",
        "status.ended": "<b>{state}</b>{done}",
        "status.after": "（完成 {done}/{steps} 步）",
        "state.stopped": "已停止 stopped", "state.failed": "失败 failed", "state.timeout": "超时 timeout",
        "state.error": "出错 error", "state.invalid": "设置无效 invalid",
        "stop.how": "按「停止」或 Jupyter 的 ■（中断内核）都会结束这个任务的全部进程。",
        "stop.how_button": "只有「停止」能结束这个任务：这里没有 Jupyter 内核，■ 管不到它。",
        "stop.by_interrupt": "被内核中断 (■) 停止",
        "stop.by_button": "在面板上停止",
        "note": "提示：{text}",
        "error.start": "无法启动：{why}",
        "error.watch": "面板在监视任务时出错：{why}",
        "error.compare": "无法对比：{why}",
        "error.empty": "先运行至少一个任务：历史是空的",
        "result.title": ("<b>{name}</b> · {stages} 个阶段 × {mbs} 个微批 · {schedule} · "
                         "切分 {parts}{loss}"),
        "result.loss": " · loss {first} → {last}",
        "diagnosis": "诊断：",
        "history.label": "#{i} {model} {stages} 阶段×{mbs} 微批 {schedule} {part}",
        "history.bubble": " · 气泡率中位数 {bubble}（{n} 步）",
        "explorer.step": "step", "explorer.kinds": "指令类型",
        "explorer.summary": "step {step}：气泡率 {bubble} · 流水线总时长 {makespan} ms",
        "explorer.mark": "{step} ⇄ 重切分",
        "explorer.marks": "重切分发生在 step {steps}（滑块上标 ⇄）；查看：",
        "panel.dynamic": "动态调度：冻结、重新均衡、分批方式、微批策略",
        "ctl.freeze": "冻结 freeze_at（步:层数）", "ctl.freeze_hint": "例如 6:4 = 第 6 步起冻结第 0–3 层",
        "ctl.rebalance": "重新均衡（Rebalance 策略）", "ctl.every": "every（每几步看一次）",
        "ctl.window": "window（看最近几步）", "ctl.min_gain": "min_gain（最小收益）", "ctl.payback": "payback（回本倍数）",
        "ctl.batching": "分批方式 batching", "ctl.token_budget": "token_budget（每个微批的 token 上限）",
        "ctl.mb_policy": "微批策略（MicroBatchPolicy）", "ctl.memory_samples": "memory_samples（激活预算，样本数）",
        "plan.freeze": "冻结：{what}", "plan.freeze_one": "第 {step} 步起前 {n} 层",
        "plan.forced": "指定重切分 {what}",
        "plan.rebalance": "重新均衡：每 {every} 步看最近 {window} 步，省下 ≥ {min_gain} 且回本 {payback} 倍才搬",
        "plan.batching": "分批 {method}{budget}",
        "plan.mb_policy": "微批策略：每 {every} 步决定一次，激活 ≤ {memory} 个样本，min_gain {min_gain}",
        "status.move": " · 重切分 @ step {step} → {parts}",
        "result.history": " · 切分历史 {history}",
        "result.phases": "分阶段诊断（每次重切分前后各算一次）：",
        "result.phase": "step {first}–{last}，切分 {parts}：{diagnosis}",
        "result.phase_empty": "step {first}–{last}，切分 {parts}：没有可测量的步",
        "result.decisions": "重新均衡的决策日志（run.rebalance_decisions）",
        "result.mb_decisions": "微批策略的决策日志（run.micro_batch_decisions）",
    },
}


def text(key: str, lang: str | None = None, /, **fields) -> str:
    """The text `key` in `lang` (default: the current language), with `fields` filled in."""
    template = TEXTS[resolve(lang)][key]
    return template.format(**fields) if fields else template.format()


def fields_of(template: str) -> set[str]:
    """The ``{names}`` a template fills in (for the consistency test)."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}
