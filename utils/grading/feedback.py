"""What students and instructors read: failure messages, Markdown feedback, grades.csv.

Feedback never contains test code or tracebacks. For a failed check it gives the check's
description and one message:

* the student's function raised: its type and message for a public check (the student can
  run it anyway), only the type for a hidden one (its message could carry the hidden
  check's inputs);
* the check's ``assert`` failed: the message the instructor wrote (public or hidden) — so
  hidden tests should say what was expected in words;
* a timeout, a dead kernel, ``NotImplementedError`` or ``NameError``: a fixed explanation;
* any other exception of the check: type and message for a public check, only the type
  for a hidden one.

Text in a message that a student's code chose is cut to `MESSAGE_LIMIT` characters and, in
the Markdown, escaped so that it renders as plain text on one line (`_md`).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported for annotations only (grade imports this module)
    from .execute import CellOutcome
    from .grade import SubmissionResult
    from .notebook_source import Check, LabSource

MESSAGE_LIMIT = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_MARKDOWN = re.compile(r"([\\`*_\[\]<>()#|&!~])")


def _short(text: str | None) -> str:
    text = _CONTROL.sub("", _ANSI.sub("", text or "")).strip()
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + " …"


def _md(text: str) -> str:
    """`text` (which may hold what a student's code chose) as inert Markdown on one line:
    no HTML, links, images, emphasis or extra list items; every character still shows."""
    return _MARKDOWN.sub(r"\\\1", text.replace("\r", "")).replace("\n", " ⏎ ")


def _common(outcome: CellOutcome, timeout: float) -> str | None:
    if outcome.status == "timeout":
        return f"超时：{timeout:g} 秒内没有结束，已被中断。检查是否有死循环或过慢的算法。"
    if outcome.status == "dead":
        return "内核在这里崩溃了（可能超出了内存或 CPU 限制，或代码调用了 exit），已重启内核继续评分。"
    if outcome.status == "not_run":
        return "没有运行：之前内核已多次重启。"
    if outcome.status == "memory":
        return _short(outcome.evalue) or "内存超限：这份提交的所有进程合计超过了内存上限，已被终止。"
    if outcome.ename == "NotImplementedError":
        what = _short(outcome.evalue)
        return f"尚未完成：{what + ' ' if what else ''}仍然抛出 NotImplementedError。"
    if outcome.ename == "NameError":
        return f"找不到名字：{_short(outcome.evalue)}（函数是否被删除、改名，或定义它的单元出错了？）"
    return None


def explain_check(check: Check, outcome: CellOutcome, timeout: float) -> str:
    """The student-safe reason a check failed."""
    common = _common(outcome, timeout)
    if common is not None:
        return common
    if outcome.tampered:
        return ("评分器在你的 kernel 里的部分被改动，或它的回复被伪造：这项检查不计分，提交已交给教师复查"
                "（the grader's side of your kernel was altered or its reply forged）。")
    if outcome.student:  # the student's own function raised
        if not check.hidden:
            return f"你的函数抛出了 {outcome.ename}: {_short(outcome.evalue)}"
        return (f"你的函数在这项隐藏检查中抛出了 {outcome.ename}。隐藏检查不显示细节："
                "请用公开自检和你自己构造的例子复现。")
    if outcome.ename == "AssertionError":
        return _short(outcome.evalue) or "断言不成立（这项检查没有附带说明）。"
    if not check.hidden:
        return f"{outcome.ename}: {_short(outcome.evalue)}"
    return (f"这项隐藏检查在处理你的结果时出错（{outcome.ename}）：返回值的类型或结构可能不对。"
            "隐藏检查不显示细节：请用公开自检和你自己构造的例子复现。")


def explain_cell(outcome: CellOutcome, timeout: float) -> str:
    """Why one of the student's own cells failed (their own code: type and message)."""
    return _common(outcome, timeout) or f"{outcome.ename}: {_short(outcome.evalue)}"


def fmt(points: float) -> str:
    """Points as ``3`` or ``2.5``."""
    return f"{points:g}"


def markdown(result: SubmissionResult, lab: LabSource) -> str:
    """The feedback a student gets, in Markdown."""
    lines = [f"# {lab.name} 评分反馈 · {result.student}", ""]
    if result.error:
        lines += [f"**评分没有完成：{result.error}**", ""]
    lines += [f"**总分：{fmt(result.total)} / {fmt(lab.max_points)}**", "",
              "| 任务 (task) | 得分 | 满分 |", "|---|---:|---:|"]
    per_task = result.per_task(lab)
    for name, task in lab.tasks.items():
        lines.append(f"| `{name}` | {fmt(per_task.get(name, 0))} | {fmt(task.points)} |")
    lines += ["", "## 各项检查", ""]
    for name in lab.tasks:
        lines.append(f"### `{name}`")
        for c in (c for c in result.checks if c.task == name):
            kind = "隐藏检查" if c.hidden else "公开自检"
            what = f"{kind}：{c.description}" if c.description else kind
            if c.status == "passed":
                lines.append(f"- ✅ {what}（{fmt(c.points)} 分）")
            else:
                lines.append(f"- ❌ {what}（0 / {fmt(c.points)} 分）：{_md(c.message)}")
        lines.append("")
    if result.issues:
        lines += ["## 你的代码单元中出现的问题", ""]
        lines += [f"- 第 {i.number} 个代码单元（{_md(i.excerpt)}）：{_md(i.message)}" if i.excerpt
                  else f"- 第 {i.number} 个代码单元：{_md(i.message)}" for i in result.issues]
        lines.append("")
    if result.notes:
        lines += ["## 说明", ""] + [f"- {note}" for note in result.notes] + [""]
    return "\n".join(lines)


def write_csv(path: Path, results: Sequence[SubmissionResult], lab: LabSource) -> None:
    """``grades.csv``: one row per student, points per task, total, maximum, seconds, notes."""
    tasks = list(lab.tasks)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", *tasks, "total", "max", "seconds", "notes"])
        for r in sorted(results, key=lambda r: r.student):
            per_task = r.per_task(lab)
            notes = []
            if r.error:
                notes.append(f"error: {r.error}")
            timeouts = sum(1 for c in r.checks if c.status == "timeout") + \
                sum(1 for i in r.issues if i.status == "timeout")
            if timeouts:
                notes.append(f"timeouts: {timeouts}")
            if r.review:
                notes.append("review: " + "; ".join(r.review))
            writer.writerow([r.student, *(fmt(per_task.get(t, 0)) for t in tasks), fmt(r.total),
                             fmt(lab.max_points), f"{r.seconds:.1f}", "; ".join(notes)])
