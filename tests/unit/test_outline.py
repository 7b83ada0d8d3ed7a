"""The course outline (docs/outline.md), README and chapter 1's map agree with what exists:
every chapter or lab marked 已完成 exists, every existing one is listed as 已完成 under the
title of its notebook's first heading, and nothing that does not exist is offered as done."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTLINE = ROOT / "docs" / "outline.md"
README = ROOT / "README.md"
DONE, PLANNED = "已完成", "编写中"


def _heading(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    return first.source.splitlines()[0].lstrip("# ").strip()


def existing_chapters() -> dict[int, tuple[str, Path]]:
    """Number -> (title, path) of every chapter notebook, from its first heading."""
    found = {}
    for path in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        match = re.fullmatch(r"第 (\d+) 章 (.+)", _heading(path))
        assert match, f"{path.name}: first heading {_heading(path)!r} is not '第 N 章 标题'"
        number = int(match.group(1))
        assert path.name.startswith(f"{number:02d}_"), f"{path.name} is headed chapter {number}"
        found[number] = (match.group(2), path)
    return found


def existing_labs() -> dict[int, tuple[str, Path]]:
    found = {}
    for path in sorted((ROOT / "labs").glob("lab[0-9][0-9]_*.ipynb")):
        match = re.fullmatch(r"实验 (\d+)：(.+)", _heading(path))
        assert match, f"{path.name}: first heading {_heading(path)!r} is not '实验 N：标题'"
        found[int(match.group(1))] = (match.group(2), path)
    return found


def table_rows(text: str, heading: str | None = None) -> list[list[str]]:
    """Cells of the Markdown table rows (after `heading`, up to the next heading) whose first
    cell is a number."""
    if heading is not None:
        text = text.split(heading, 1)[1]
        text = re.split(r"\n#+ ", text, maxsplit=1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.fullmatch(r"\d+", cells[0]):
            rows.append(cells)
    return rows


def _links(markdown: str, base: Path) -> list[Path]:
    return [(base / target).resolve() for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", markdown)]


def test_there_are_chapters_and_labs_to_check():
    assert len(existing_chapters()) >= 8 and len(existing_labs()) >= 3


def test_outline_lists_all_30_chapters_with_the_right_status_and_title():
    rows = table_rows(OUTLINE.read_text(encoding="utf-8"), "## 章节")
    assert [int(r[0]) for r in rows] == list(range(1, 31))
    chapters = existing_chapters()
    for number, part, title, status, notebook, _what in rows:
        number = int(number)
        assert status in (DONE, PLANNED), (number, status)
        if number in chapters:
            heading, path = chapters[number]
            assert status == DONE, f"chapter {number} exists but the outline says {status}"
            assert title == heading, f"chapter {number}: outline {title!r}, notebook {heading!r}"
            assert f"(../chapters/{path.name})" in notebook
        else:
            assert status == PLANNED and notebook == "—", f"chapter {number} is marked {status} but does not exist"


def test_outline_lists_the_labs_with_the_right_status_and_title():
    rows = table_rows(OUTLINE.read_text(encoding="utf-8"), "## 实验")
    assert [int(r[0]) for r in rows] == list(range(1, 11))
    labs = existing_labs()
    for number, title, status, notebook, _what in rows:
        number = int(number)
        if number in labs:
            heading, path = labs[number]
            assert status == DONE and title == heading and f"(../labs/{path.name})" in notebook, number
            assert (ROOT / "solutions" / path.name).exists()
        else:
            assert status == PLANNED and notebook == "—", number


def test_readme_lists_every_existing_chapter_under_its_heading():
    text = README.read_text(encoding="utf-8")
    rows = {int(r[0]): r for r in table_rows(text, "## 章节与实验")}
    chapters = existing_chapters()
    assert set(rows) == set(chapters), "README's chapter table must list exactly the chapters that exist"
    for number, (heading, path) in chapters.items():
        assert len(rows[number]) == 5, f"README's chapter table needs # | 标题 | 状态 | notebook | 内容: {rows[number]}"
        _, title, status, notebook, _what = rows[number]
        assert title == heading, f"chapter {number}: README {title!r}, notebook {heading!r}"
        assert status == DONE and notebook == f"`chapters/{path.name}`"
    if max(chapters) < 30:
        first_planned = max(chapters) + 1
        assert re.search(rf"\| {first_planned}–30 \|[^\n]*\| {PLANNED} \|", text), \
            f"README must say {first_planned}–30 are being written"
    assert "30 章 notebook" not in text
    assert "[course outline](docs/outline.md)" in text


def test_readme_lists_every_existing_lab():
    rows = {int(r[0]): r for r in table_rows(README.read_text(encoding="utf-8"), "### 实验 · Labs")}
    labs = existing_labs()
    assert set(rows) == set(labs), "README's lab table must list exactly the labs that exist"
    for number, (heading, path) in labs.items():
        _, title, status, notebook, _what = rows[number]
        assert (title, status, notebook) == (heading, DONE, f"`labs/{path.name}`"), rows[number]


def test_chapter_one_map_matches_what_exists():
    nb = nbformat.read(ROOT / "chapters" / "01_course_intro.ipynb", as_version=4)
    cell = next(c.source for c in nb.cells if c.source.startswith("## 1.2 课程地图"))
    chapters = existing_chapters()
    rows = [line.strip().strip("|").split("|") for line in cell.splitlines()
            if re.match(r"\| \S+篇 \|", line)]
    assert len(rows) == 5 and all(len(r) == 4 for r in rows), f"the map needs 篇 | 章 | 状态 | 问题: {rows}"
    covered = set()
    for part, numbers, status, _question in rows:
        first, last = map(int, numbers.strip().split("–"))
        covered |= set(range(first, last + 1))
        done = all(n in chapters for n in range(first, last + 1))
        assert status.strip() == (DONE if done else PLANNED), (part, numbers, status)
    assert covered == set(range(1, 31))
    assert "(../docs/outline.md)" in cell


def test_written_chapters_mark_references_to_unwritten_ones():
    """Chapter 1's prose names chapters 9-30 only with 编写中 (or † in its tables)."""
    chapters = existing_chapters()
    nb = nbformat.read(ROOT / "chapters" / "01_course_intro.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            for match in re.finditer(r"第 ([\d、–]+) 章(†)?", line):
                numbers = [int(n) for n in re.findall(r"\d+", match.group(1))]
                if any(n not in chapters for n in numbers):
                    assert match.group(2) or PLANNED in line, f"unmarked reference in chapter 1: {line[:120]!r}"


def _book_lines():
    """(file, line) of every cell line of the chapters and the lab sources, and of every line
    of the README and docs/ (they send learners to chapters and sections too)."""
    for path in sorted([*(ROOT / "chapters").glob("*.ipynb"), *(ROOT / "solutions").glob("*.ipynb")]):
        for cell in nbformat.read(path, as_version=4).cells:
            for line in cell.source.splitlines():
                yield path.name, line
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for line in path.read_text(encoding="utf-8").splitlines():
            yield path.name, line


def test_every_chapter_reference_in_the_book_resolves():
    """"第 N 章" names a chapter that exists, or says 编写中 (†) on its line; a line that says
    编写中 names at least one chapter that does not exist yet (no stale marks); "N.M 节"
    names a section heading that chapter N has."""
    chapters = existing_chapters()
    sections = {number: {m.group(1) for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "markdown"
                         for m in re.finditer(r"(?m)^#+ (\d+\.\d+)\b", cell.source)}
                for number, (_, path) in chapters.items()}
    wrong = []
    for name, line in _book_lines():
        named = [int(n) for m in re.finditer(r"第 ?([\d、–]+) ?章", line) for n in re.findall(r"\d+", m.group(1))]
        missing = [n for n in named if n not in chapters]
        if missing and PLANNED not in line and "†" not in line:
            wrong.append(f"{name}: chapter(s) {missing} do not exist and the line does not say {PLANNED}: {line[:100]!r}")
        if named and not missing and PLANNED in line:
            wrong.append(f"{name}: says {PLANNED} about chapters that exist: {line[:100]!r}")
        for m in re.finditer(r"(?<![\d.])(\d+)\.(\d+) ?节", line):
            number = int(m.group(1))
            if number in chapters and f"{number}.{m.group(2)}" not in sections[number]:
                wrong.append(f"{name}: section {m.group(0)} is not a heading of chapter {number}: {line[:100]!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("doc", [README, OUTLINE])
def test_links_resolve(doc):
    links = _links(doc.read_text(encoding="utf-8"), doc.parent)
    assert links
    missing = [str(p.relative_to(ROOT)) for p in links if not p.exists()]
    assert not missing, missing
