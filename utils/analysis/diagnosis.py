"""What `utils.diagnose` hands back: a `Diagnosis` made of `Symptom`s, readable in a notebook
and checkable by a test or a grader.

A symptom says *what* is wrong (or worth knowing), *where* (rank, stage, instruction, step,
micro-batch: `Where`), the *evidence* it rests on (numbers and texts from the run's record),
the likely *cause* and the *fix*. ``code`` is a short stable name (``"batch-arithmetic"``,
``"straggler"``, ``"hang"`` ...) for programs; everything else is for people.

The symptoms themselves come from `utils.analysis.slowness` (a successful run's timeline)
and `utils.jobs.diagnose` (a failed or hung run's record).
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Diagnosis", "Symptom", "Where"]

DiagnosisKind = Literal["failed", "hung", "ok"]
Severity = Literal["error", "warning", "info"]
_MARK = {"error": "✗", "warning": "!", "info": "·"}


@dataclass(frozen=True)
class Where:
    """Where a symptom is: any part may be unknown (None)."""

    rank: int | None = None
    stage: int | None = None
    instruction: str | None = None
    """An instruction kind (``"forward"``, ``"recv_act"`` ...), ``"setup"`` (building the
    engine, before training), or None."""
    step: int | None = None
    micro_batch: int | None = None

    def __str__(self) -> str:
        parts = [f"rank {self.rank}" if self.rank is not None else None,
                 f"stage {self.stage}" if self.stage is not None else None,
                 self.instruction,
                 f"step {self.step}" if self.step is not None else None,
                 f"micro-batch {self.micro_batch}" if self.micro_batch is not None else None]
        return " · ".join(p for p in parts if p) or "the whole job"


@dataclass(frozen=True)
class Symptom:
    """One thing the diagnosis found."""

    code: str
    """Short, stable name of the kind of symptom (see `utils.jobs.errors.PATTERNS` and
    `utils.analysis.slowness`)."""
    what: str
    """One line: what happened."""
    where: Where = field(default_factory=Where)
    evidence: dict[str, Any] = field(default_factory=dict)
    """The numbers and texts it rests on (times in ms, memory in MB, the error line ...)."""
    cause: str = ""
    fix: str = ""
    severity: Severity = "error"
    """``"error"``: why the run failed or hung; ``"warning"``: it ran, but slower than it
    could; ``"info"``: worth knowing (memory per stage, a fill-and-drain bubble)."""

    def lines(self) -> list[str]:
        out = [f"{_MARK[self.severity]} [{self.code}] {self.what}", f"    where:    {self.where}"]
        if self.evidence:
            out.append("    evidence: " + "; ".join(f"{k} = {_show(v)}" for k, v in self.evidence.items()))
        if self.cause:
            out.append(f"    cause:    {self.cause}")
        if self.fix:
            out.append(f"    fix:      {self.fix}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


@dataclass(frozen=True)
class Diagnosis:
    """A run's diagnosis: `kind` (``"failed"``, ``"hung"`` or ``"ok"``), a one-line
    `headline` and the `findings`, the most important first."""

    kind: DiagnosisKind
    run: str
    """The run's name (its directory)."""
    headline: str
    findings: tuple[Symptom, ...] = ()

    @property
    def primary(self) -> Symptom | None:
        """The first finding: the cause of a failure or hang, the worst slowdown of a run."""
        return self.findings[0] if self.findings else None

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def find(self, code: str) -> Symptom | None:
        """The first finding with `code`, or None."""
        return next((f for f in self.findings if f.code == code), None)

    def __str__(self) -> str:
        head = f"诊断 (diagnosis) of {self.run}: {self.kind} — {self.headline}"
        body = [line for f in self.findings for line in f.lines()]
        return "\n".join([head, *body] if body else [head, "  nothing to report"])

    def _repr_markdown_(self) -> str:
        out = [f"**诊断 (diagnosis)** `{self.run}`: **{self.kind}** — {_md(self.headline)}", ""]
        for f in self.findings:
            out.append(f"- {_MARK[f.severity]} **{_md(f.what)}** `{f.code}`  ")
            out.append(f"  *where*: {_md(str(f.where))}  ")
            if f.evidence:
                out.append("  *evidence*: " + "; ".join(f"{_md(k)} = `{_show(v)}`" for k, v in f.evidence.items())
                           + "  ")
            if f.cause:
                out.append(f"  *cause*: {_md(f.cause)}  ")
            if f.fix:
                out.append(f"  *fix*: {_md(f.fix)}")
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "run": self.run, "headline": self.headline,
                "findings": [{"code": f.code, "what": f.what, "where": asdict(f.where), "evidence": dict(f.evidence),
                              "cause": f.cause, "fix": f.fix, "severity": f.severity} for f in self.findings]}


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    text = str(value)
    return text if len(text) <= 240 else text[:237] + "..."


def _md(text: str) -> str:
    """Plain text safe inside Markdown (no stray emphasis, no HTML)."""
    return html.escape(text, quote=False).replace("*", r"\*").replace("_", r"\_")
