"""How a job's ranks ended, as its launcher tells it: the exit codes and first failure from
torchrun's closing summary, the ranks it stopped itself, for a running job (`Launcher.exit_report`)
or from the logs a finished run keeps (`recorded_exit_report`)."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from pathlib import Path

from utils.jobs.rundir import RunDir

#: One failed rank in torchrun's closing summary: "  rank      : 1 (local_rank: 1)" and
#: on the next line "  exitcode  : 3 (pid: 123)" (negative: killed by that signal).
TORCHRUN_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+)\b.*\n\s*exitcode\s*:\s*(-?\d+)", re.M)
#: Where torchrun's summary names the failure it observed first.
TORCHRUN_ROOT_CAUSE = "Root Cause (first observed failure)"
#: The warning logged as a rank that still runs is stopped after another failed: "Terminating
#: process 123 via signal SIGTERM" (torch.multiprocessing's join, under elastic's function entry
#: points: the warm agent), "Closing process 123 via signal SIGTERM" (elastic's close of the
#: same), "Sending process 123 closing signal SIGTERM" (torchrun's command).
TORCHRUN_CLOSED = re.compile(r"(?:(?:Terminating|Closing) process (\d+) via signal|Sending process (\d+) closing signal) "
                             r"SIGTERM\b")


@dataclass(frozen=True)
class ExitReport:
    """What the launcher knows about how the ranks ended."""

    exit_codes: dict[int, int] = field(default_factory=dict)
    """Rank -> exit code for the ranks that failed (negative: killed by that signal)."""
    first_failed: tuple[int, ...] = ()
    """The rank(s) the launcher saw fail first (the likely cause)."""
    closed: tuple[int, ...] = ()
    """Ranks the launcher's log says it sent SIGTERM to while they still ran, after another
    rank failed (`TORCHRUN_CLOSED`). torchrun's command also lists such a rank with exit code
    -15; elastic's function context (the warm agent's) lists failures only, so there that log
    line is the agent's one word on the ranks it stopped."""

    def stopped_by_launcher(self, rank: int) -> bool:
        """True when the launcher itself ended this rank (SIGTERM after another failed): exit
        code -15 in its summary, or no exit code of its own and closed by the launcher."""
        code = self.exit_codes.get(rank)
        return code == -signal.SIGTERM or (code is None and rank in self.closed)


def torchrun_report(log: str, pids: dict[int, int] | None = None) -> ExitReport:
    """The failed ranks' exit codes and the root cause, from torchrun's closing summary, and
    the ranks it closed with SIGTERM (`ExitReport.closed`; `pids`: pid -> rank, from the
    ranks' placement files, since that line names a pid)."""
    _, _, root_cause = log.partition(TORCHRUN_ROOT_CAUSE)
    closed = {int(a or b) for a, b in TORCHRUN_CLOSED.findall(log)}
    return ExitReport(exit_codes={int(r): int(c) for r, c in TORCHRUN_FAILURE.findall(log)},
                      first_failed=tuple(int(r) for r, _ in TORCHRUN_FAILURE.findall(root_cause)),
                      closed=tuple(sorted(pids[pid] for pid in closed if pid in (pids or {}))))


def placed_pids(run_dir: RunDir, node: int | None = None) -> dict[int, int]:
    """Pid -> rank, as the ranks recorded themselves in their placement files (those of node
    `node` only, when given: pids repeat across hosts)."""
    placed = {}
    for path in run_dir.path.glob("node-rank*.json"):
        rank = path.stem.removeprefix("node-rank")
        info = run_dir.placement(int(rank)) if rank.isdigit() else None
        if info and isinstance(info.get("pid"), int) and (node is None or info.get("node") == node):
            placed[info["pid"]] = int(rank)
    return placed


def recorded_exit_report(run_dir: RunDir) -> ExitReport:
    """The launcher's report as the run directory keeps it, for a reader of a finished run
    (`utils.jobs.diagnose`): every torchrun log in it (``launcher.log``, or one
    ``launcher-node{i}.log`` per node of a multi-node job), merged."""
    nodes = (path.stem.removeprefix("launcher-node") for path in run_dir.path.glob("launcher-node*.log"))
    logs = [(run_dir.launcher_log(), None)]
    logs += [(run_dir.launcher_log(int(n)), int(n)) for n in sorted(nodes) if n.isdigit()]
    reports = [torchrun_report(read_log(path), placed_pids(run_dir, node)) for path, node in logs if path.exists()]
    return ExitReport(exit_codes={r: c for rep in reports for r, c in rep.exit_codes.items()},
                      first_failed=tuple(r for rep in reports for r in rep.first_failed),
                      closed=tuple(sorted({r for rep in reports for r in rep.closed})))


def read_log(path: Path) -> str:
    """A launcher log's text so far ("" while it does not exist yet)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
