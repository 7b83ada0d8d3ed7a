"""The one renderer of a table given as a list of dicts: as plain text and as HTML.

Each dict is a row, its keys the column names (taken from the first row unless `columns` is
given). A cell shows as ``str(value)``: format numbers before rendering to choose how they
read. `align` is ``"left"`` or ``"right"`` for every column, or a mapping from column name
to alignment (columns not named are right-aligned).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = ["html_table", "text_table"]

Align = Literal["left", "right"]


def text_table(rows: Sequence[Mapping[str, Any]], *, columns: Sequence[str] | None = None,
               align: Align | Mapping[str, Align] = "right", min_width: int = 0,
               indent: str = "", sep: str = "  ") -> str:
    """The table as lines of text: a header line, then one line per row.

    Every column is as wide as its header or its widest cell, and at least `min_width`;
    each line starts with `indent`. Without rows and columns the result is ``""``.
    """
    cols = _columns(rows, columns)
    if not cols:
        return ""
    cells = [[str(r[c]) for c in cols] for r in rows]
    widths = [max(min_width, len(c), *(len(line[i]) for line in cells))
              for i, c in enumerate(cols)]
    lefts = [_align(align, c) == "left" for c in cols]

    def line(values: Sequence[str]) -> str:
        return indent + sep.join(v.ljust(w) if left else v.rjust(w)
                                 for v, w, left in zip(values, widths, lefts))

    return "\n".join([line(cols), *(line(values) for values in cells)])


def html_table(rows: Sequence[Mapping[str, Any]], *, columns: Sequence[str] | None = None,
               align: Align | Mapping[str, Align] = "right") -> str:
    """The table as an HTML ``<table>`` with a header row; every cell is escaped.

    Without rows and columns the result is ``""``.
    """
    cols = _columns(rows, columns)
    if not cols:
        return ""

    def cell(tag: str, column: str, value: Any) -> str:
        return (f"<{tag} style='text-align:{_align(align, column)}'>"
                f"{html.escape(str(value))}</{tag}>")

    head = "".join(cell("th", c, c) for c in cols)
    body = "".join("<tr>" + "".join(cell("td", c, r[c]) for c in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _columns(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None) -> list[str]:
    if columns is not None:
        return list(columns)
    return list(rows[0]) if rows else []


def _align(align: Align | Mapping[str, Align], column: str) -> Align:
    if isinstance(align, str):
        return align
    return align.get(column, "right")
