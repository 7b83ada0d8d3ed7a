"""The course glossary (../shared/COURSE.md) and where a notebook first uses each term.

A term's first use in a notebook's prose carries its English name, e.g. 气泡率 (bubble ratio);
`tests/unit/test_glossary.py` checks every chapter and lab source."""

from __future__ import annotations

import re

TERMS: dict[str, str] = {
    "流水线并行": "pipeline parallelism", "阶段": "stage", "微批": "micro-batch", "气泡率": "bubble ratio",
    "气泡": "bubble", "吞吐": "throughput", "利用率": "utilisation", "切分边界": "stage boundary",
    "切分": "partition", "调度": "schedule", "预热": "warm-up", "稳态": "steady state", "冷却": "cool-down",
    "前向": "forward", "反向": "backward", "激活": "activation", "梯度累积": "gradient accumulation",
    "流水线总时长": "makespan", "气泡开销": "bubble overhead", "输入梯度": "input gradient",
    "权重梯度": "weight gradient", "虚拟阶段": "virtual stage", "动态重切分": "dynamic re-partition",
    "重切分": "re-partition", "动态微批": "dynamic micro-batching", "冻结": "freezing", "掉队者": "straggler",
}
"""Chinese term -> its English name (the glossary of ../shared/COURSE.md)."""

NOT_THE_TERM = {"调度": ("器",)}
"""Uses of a term's characters that are another word: 调度器 is an LR scheduler, not a schedule."""

WINDOW = 40
"""How near (characters, either side) the English name must stand."""

# Prose only: headings, code spans, fenced code, math, link targets and HTML tags are skipped.
_SKIP = re.compile(r"^#[^\n]*$|```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|\]\([^)]*\)|<[^>\n]*>", re.M | re.S)


def _blanked(text: str) -> str:
    """`text` with everything that is not prose replaced by spaces (positions kept)."""
    return _SKIP.sub(lambda m: " " * len(m.group(0)), text)


def _inside_longer_term(text: str, start: int, term: str) -> bool:
    for longer in TERMS:
        if longer != term and term in longer:
            offset = longer.index(term)
            if text[max(0, start - offset):start - offset + len(longer)] == longer:
                return True
    return False


def first_uses(nb):
    """For each term: (term, english, cell index, position, carries_english) of its first prose
    use in the notebook's markdown cells, or (term, english, None, None, True) if unused."""
    cells = [(i, c.source, _blanked(c.source)) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]
    found = []
    for term, english in TERMS.items():
        hit = None
        for index, source, prose in cells:
            for m in re.finditer(re.escape(term), prose):
                after = prose[m.end():m.end() + 1]
                if after and after in NOT_THE_TERM.get(term, ()) or _inside_longer_term(prose, m.start(), term):
                    continue
                hit = (index, m.start(), source)
                break
            if hit:
                break
        if hit is None:
            found.append((term, english, None, None, True))
            continue
        index, start, source = hit
        near = source[max(0, start - WINDOW):start + len(term) + WINDOW].lower()
        found.append((term, english, index, start, english.lower() in near))
    return found
