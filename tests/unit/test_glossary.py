"""Every chapter and lab source names each glossary term (../shared/COURSE.md) with its
English name at its first use in the prose, e.g. 气泡率 (bubble ratio)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from tests.unit.glossary import first_uses

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted([*(ROOT / "chapters").glob("*.ipynb"), *(ROOT / "solutions").glob("*.ipynb")])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_first_use_of_each_term_carries_its_english_name(path):
    nb = nbformat.read(path, as_version=4)
    missing = [f"{term} ({english}) in cell {cell}: …{nb.cells[cell].source[max(0, at - 20):at + 20]}…"
               for term, english, cell, at, ok in first_uses(nb) if not ok]
    assert not missing, "first use without its English name:\n" + "\n".join(missing)


def test_a_term_inside_a_longer_one_or_another_word_is_not_its_first_use():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "动态微批 (dynamic micro-batching) 与学习率调度器。" + "这一句只是为了把距离拉开，" * 4 + "之后的微批没有英文。")])
    uses = {term: (cell, ok) for term, _, cell, _, ok in first_uses(nb)}
    assert uses["动态微批"] == (0, True)
    assert uses["微批"] == (0, False)       # its first use is the second, standalone one
    assert uses["调度"] == (None, True)     # 调度器 is an LR scheduler
