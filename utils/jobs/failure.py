"""Which rank failed first, and why: the one decision the launcher's watch and `utils.diagnose`
share.

When one rank of a pipeline fails, its neighbours fail soon after *because* of it (their
connection closed, their receive timed out). `first_failure` picks the cause from the ranks'
error records (`utils.jobs.errors.explain` tells a consequence from a cause) and the ranks
that ended without a Python error (`RankEnd`): the earliest error that is a cause, else a rank
that died without an error record, else the earliest error. `RunningJob` asks it when a job
fails and records the facts (`utils.jobs.records.Failure`) with the words for people
(`describe_error`, `describe_death`); `utils.diagnose` asks it again on the record, with the
facts the watch saved, so both name the same rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from utils.jobs.errors import Explanation, explain
from utils.jobs.records import RankEnd
from utils.jobs.rundir import RunDir

__all__ = ["FirstFailure", "describe_death", "describe_error", "error_text", "first_failure"]


@dataclass(frozen=True)
class FirstFailure:
    """The rank that failed first: its error record (`error`), or how it ended without one (`died`)."""

    error: dict | None = None
    explanation: Explanation | None = None
    """What `explain` knows of `error` (None: nothing)."""
    died: RankEnd | None = None
    cause: bool = True
    """False when every error is a consequence and no rank died without one: `error` is then
    only the earliest of them (the cause left no trace)."""
    also: tuple[int, ...] = ()
    """Other ranks whose error is a cause too (the same mistake on several ranks)."""
    explained: tuple[tuple[dict, Explanation | None], ...] = field(default=(), repr=False)
    """Every error record with its explanation, in rank order."""

    @property
    def rank(self) -> int:
        return int(self.error["rank"]) if self.error is not None else self.died.rank


def error_text(error: dict) -> str:
    """An error record as the text `explain` reads: ``type: message`` and the traceback."""
    return f"{error.get('type')}: {error.get('message')}\n{error.get('traceback', '')}"


def first_failure(errors: list[dict], died: list[RankEnd] | tuple[RankEnd, ...] = ()) -> FirstFailure | None:
    """The rank that failed first among the ranks' `errors` (their error records) and the ranks
    that `died` without one (in the order the launcher saw them fail); None when there is neither."""
    explained = tuple((e, explain(error_text(e))) for e in errors)
    causes = sorted(((e, x) for e, x in explained if x is None or not x.consequence), key=lambda ex: ex[0]["time"])
    if causes:
        (error, explanation), rest = causes[0], causes[1:]
        return FirstFailure(error=error, explanation=explanation, also=tuple(e["rank"] for e, _ in rest),
                            explained=explained)
    reported = {e["rank"] for e in errors}
    dead = [end for end in died if end.rank not in reported]
    if dead:
        return FirstFailure(died=dead[0], explained=explained)
    if explained:
        error, explanation = min(explained, key=lambda ex: ex[0]["time"])
        return FirstFailure(error=error, explanation=explanation, cause=False, explained=explained)
    return None


def describe_error(first: dict, errors: list[dict]) -> str:
    """The words for a rank that raised first: its error, who failed after it, its traceback's end."""
    tail = "\n".join(first["traceback"].strip().splitlines()[-12:])
    others = sorted(e["rank"] for e in errors if e is not first)
    also = f" (then rank(s) {others} failed too)" if others else ""
    return (f"rank {first['rank']} (stage {first['stage']}) raised {first['type']}: {first['message']}{also}\n"
            f"--- end of its traceback ---\n{tail}")


def describe_death(run_dir: RunDir, end: RankEnd, reported: list[int]) -> str:
    """The words for a rank that ended without a Python error: how (exit code, signal), what its
    status slot says it was doing, the ranks that then lost it (`reported`), its log's end."""
    after = f" (rank(s) {sorted(reported)} then lost their connection to it)" if reported else ""
    status = run_dir.slot(end.rank)
    where = f" while in: {status.describe()}" if status is not None else ""
    return (f"rank {end.rank} (stage {end.stage}{_node_of(run_dir, end.rank)}) {end.how}{where}, "
            f"and no Python error{after}; the end of its log:\n{tail(run_dir.rank_log(end.rank))}")


def _node_of(run_dir: RunDir, rank: int) -> str:
    """``", node 1 (127.0.0.2)"`` for a rank of a multi-node job that recorded its placement."""
    placed, plan = run_dir.placement(rank), run_dir.read_plan() or {}
    if placed is None or len(plan.get("nodes", ())) < 2:
        return ""
    return f", node {placed['node']} ({placed['host']})"


def tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a log ("(no log)" when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
