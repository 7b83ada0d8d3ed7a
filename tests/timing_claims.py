"""Inventory of the asserts that compare measured times, rates or process-exit orders.

A real job on a shared 2-core machine can run every rank 3x slower, with ranks oversubscribed
2:1, and then the order of two measured stage times, a measured speed-up or which rank exited
first can flip. Such a claim must not be an `assert` unless it holds anyway. This module finds
every `assert` in ``chapters/``, ``solutions/`` and ``tests/`` whose test *compares* (``<``,
``>``, ``max``/``min``/``sorted``, an index of the slowest, an exit order) something whose name
says time, rate, cost or bubble, and requires a tag on it — on one of its lines or in the comment
block directly above it::

    # timing-claim: construction — the simulator's output: the same numbers on any machine
    assert sim.makespan > base.makespan

The kinds:

- ``construction``: holds whatever the machine's speed: counts, orders fixed by the schedule,
  bit-identical losses, events the test made itself, a model fitted and checked on the same data;
- ``simulated``: a simulator's or a formula's output from given (not measured) costs;
- ``margin``: compares measured figures, with a margin stated in the tag that still holds when
  every rank runs 3x slower and ranks are oversubscribed 2:1 (why, in words).

A measured order that is only an observation is printed, not asserted; a timing target lives in
a benchmark script (``benchmarks/``). ``python -m tests.timing_claims`` prints the inventory;
``tests/unit/test_timing_claims.py`` fails on an untagged entry.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("chapters", "solutions", "tests")
TAG = "timing-claim:"
KINDS = ("construction", "simulated", "margin")

#: A name that says "measured time, rate or cost": matched against each identifier, attribute,
#: keyword and string subscript of an assert's test, split at underscores.
TIMING_WORDS = frozenset({
    "ms", "us", "sec", "secs", "seconds", "time", "times", "timing", "timings", "elapsed", "wall",
    "duration", "durations", "rate", "rates", "throughput", "speedup", "bubble", "bubbles",
    "slowest", "fastest", "slower", "faster", "latency", "busy", "idle", "utilisation",
    "utilization", "makespan", "cost", "costs", "gbps", "bandwidth", "overhead", "compute",
    "tokens", "clock", "span",
})
#: Names that say "which process ended first" (an exit order).
EXIT_ORDER = frozenset({"first_failed", "stopped_by_launcher", "exit_order", "first_exit"})
_ORDERING_CALLS = frozenset({"max", "min", "sorted", "argmax", "argmin", "index", "sort"})
_ORDERING_OPS = (ast.Lt, ast.Gt, ast.LtE, ast.GtE)


@dataclass(frozen=True)
class Claim:
    """One assert that compares timing-like names."""

    path: str
    """File, relative to the project root."""
    cell: int | None
    """Code cell index (0-based, code cells only) for a notebook; None for a ``.py`` file."""
    line: int
    """Line of the assert within the file or the cell (1-based)."""
    source: str
    """The assert's first line."""
    tag: str | None
    """The ``timing-claim:`` text found on or above it, or None."""

    @property
    def where(self) -> str:
        cell = f" code cell {self.cell}" if self.cell is not None else ""
        return f"{self.path}{cell} line {self.line}"

    @property
    def kind(self) -> str | None:
        if self.tag is None:
            return None
        word = re.match(r"\s*(\w+)", self.tag)
        return word.group(1) if word else None

    @property
    def problem(self) -> str | None:
        """What is wrong with this entry, or None when it is tagged properly."""
        if self.tag is None:
            return "no `# timing-claim: <kind> — <why>` tag"
        if self.kind not in KINDS:
            return f"tag kind {self.kind!r} is not one of {KINDS}"
        reason = self.tag.strip()[len(self.kind):].strip(" -—:")
        if len(reason) < 8:
            return "the tag gives no reason (say why it holds on a 3x slower, oversubscribed machine)"
        return None


def _words(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.keyword) and sub.arg:
            names.add(sub.arg)
        elif isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) \
                and isinstance(sub.slice.value, str):
            names.add(sub.slice.value)
    return names


def _is_timing(names: set[str]) -> bool:
    for name in names:
        low = name.lower()
        if low in EXIT_ORDER:
            return True
        parts = {p for p in re.split(r"[_\W]+", low) if p}
        if parts & TIMING_WORDS or low.endswith(("_s", "_ms")):
            return True
    return False


def _compares(test: ast.AST) -> bool:
    for sub in ast.walk(test):
        if isinstance(sub, ast.Compare) and any(isinstance(op, _ORDERING_OPS) for op in sub.ops):
            return True
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in _ORDERING_CALLS:
                return True
    return False


def _is_exit_order(test: ast.AST) -> bool:
    return any(name.lower() in EXIT_ORDER for name in _words(test))


def _tag_for(lines: list[str], first: int, last: int) -> str | None:
    """The tag on lines first..last (1-based) or in the comment block right above `first`."""
    for number in range(first, last + 1):
        text = lines[number - 1]
        if TAG in text:
            return text.split(TAG, 1)[1].strip()
    number = first - 1
    while number >= 1 and lines[number - 1].lstrip().startswith("#"):
        text = lines[number - 1]
        if TAG in text:
            return text.split(TAG, 1)[1].strip()
        number -= 1
    return None


def _without_magics(source: str) -> str:
    """IPython's ``%magic`` and ``!shell`` lines as ``pass`` (same line numbers)."""
    return "\n".join(re.sub(r"^(\s*)[%!].*$", r"\1pass", line) for line in source.splitlines())


def claims_in(source: str, *, path: str, cell: int | None = None) -> Iterator[Claim]:
    """Every timing-like comparison asserted in one Python source (a file or a code cell)."""
    tree = ast.parse(_without_magics(source))
    lines = source.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        test = node.test
        if not ((_compares(test) and _is_timing(_words(test))) or _is_exit_order(test)):
            continue
        yield Claim(path=path, cell=cell, line=node.lineno, source=lines[node.lineno - 1].strip(),
                    tag=_tag_for(lines, node.lineno, node.end_lineno or node.lineno))


def _sources(path: Path) -> Iterator[tuple[int | None, str]]:
    if path.suffix == ".ipynb":
        cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
        for index, cell in enumerate(cells):
            source = cell["source"]
            yield index, "".join(source) if isinstance(source, list) else source
    else:
        yield None, path.read_text(encoding="utf-8")


def inventory(root: Path = ROOT) -> list[Claim]:
    """Every timing-like assert in chapters/, solutions/ and tests/, tagged or not."""
    found = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".py", ".ipynb") or ".ipynb_checkpoints" in path.parts:
                continue
            for cell, source in _sources(path):
                found.extend(claims_in(source, path=str(path.relative_to(root)), cell=cell))
    return found


def main() -> int:
    claims = inventory()
    for claim in claims:
        status = claim.problem or claim.kind
        print(f"{claim.where}: [{status}] {claim.source}")
    bad = sum(1 for c in claims if c.problem)
    kinds = {k: sum(1 for c in claims if c.kind == k and not c.problem) for k in KINDS}
    print(f"{len(claims)} timing-like asserts: {kinds}, {bad} to fix", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
