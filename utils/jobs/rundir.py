"""The run directory: the contract between the launcher, the ranks and every later reader.

One class owns every file name, so no other module spells one out. Layout of
``runs/<time>-<name>-<id>/`` (the parent folder is `runs_dir()`):

- ``spec.json``                 the `JobSpec` (what was asked)
- ``plan.json``                 the `JobPlan` record (what was decided before launch: device,
                                boundaries and how they were chosen, predicted stage costs)
- ``partitions.jsonl``          partition changes made while the job ran, one per line
                                (``step``, ``boundaries``, ``reason``); the plan's boundaries
                                hold from step 0 until the first change
- ``rebalance.jsonl``           every decision of a job's re-balancing policy, one per line
                                (`utils.planning.rebalance.Decision`: the costs it saw, the
                                prediction, move or not and why)
- ``micro-batches.jsonl``       variable micro-batching: per step, each micro-batch's samples,
                                real tokens and padded tokens (written by rank 0)
- ``checkpoints/``              restart mode: the checkpoint a restart resumes from, and
                                ``restart.json`` (from which step, at which boundaries)
- ``command.txt``               the command that runs the job by hand
- ``status.json``               state, error, start and end, notes, and while it runs the
                                launcher's pid and start time (``launcher_created``: a pid
                                reused by another process is not taken for the launcher);
                                for a job that failed or hung, ``failure``: the facts the
                                watch saw (`utils.jobs.records.Failure`)
- ``launcher.log``              what the launcher (torchrun, DeepSpeed's runner) printed;
                                a multi-node torchrun job has one ``launcher-node{i}.log`` per
                                node started here (that node's agent)
- ``hostfile``                  DeepSpeed-launcher jobs: the hostfile its runner reads
- ``launch-token``              the token of the launch that owns this directory: ranks record
                                here only when they carry the same token (``command.txt`` run by
                                hand records into a new ``<name>-rerun-<id>`` sibling instead)
- ``tmp/``                      the job's TMPDIR while it runs (torchrun's ``torchelastic_*``
                                folders), removed when the launcher stops
- per rank ``r``: ``rank{r}.log`` (everything it printed), ``status-rank{r}`` (the
  instruction it executes now, `utils.jobs.records.StatusSlot`), ``events-rank{r}.jsonl`` (traced instructions),
  ``progress-rank{r}.jsonl`` (step, loss, seconds), ``layer-costs-rank{r}.jsonl`` (per-layer
  forward and backward seconds a re-balancing job measured in each step),
  ``memory-rank{r}.jsonl`` (per step: bytes in use as it started, after every traced
  instruction, and the peak: `utils.jobs.records.MemoryRecord`, written by
  `utils.runtime.memory`),
  ``node-rank{r}.json`` (where it ran: node index, host, local rank, pid; written at start),
  ``result-rank{r}.json`` on success (`utils.jobs.records.RankResult`, with ``record_lines``:
  how many lines each of the rank's JSON-lines files above holds, so that a reader tells a
  complete record from one cut short later; `RunDir.record_problems`),
  ``error-rank{r}.json`` on failure,
  ``stacks-rank{r}.txt`` (every thread's Python stack, written by the rank's ``faulthandler``
  each time it gets `STACK_SIGNAL`: the launcher asks for them when a job hangs)

Only the launcher writes ``state: "succeeded"``, and only after every rank wrote its result
and the launcher process exited 0; a run whose launcher vanished reads back as
``"incomplete"``, so a crashed or killed run never looks successful. A finished run's
JSON-lines files are complete or say they are not: `RunDir.record_problems` names a file cut
short (fewer lines than its rank wrote, a last line cut mid-write) or a damaged line.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from utils.analysis.report import PARTIAL  # what every reader says of a run with a RecordProblem
from utils.jobs.records import (STATUS_BYTES, Failure, MemoryRecord, RankResult, SlotStatus,  # noqa: F401 (re-exported)
                                StatusSlot)
from utils.system.fileio import JsonLines, read_json, read_jsonl, scan_jsonl, write_json
from utils.system.paths import PROJECT_ROOT
from utils.system.procs import process_alive, process_created

RunState = Literal["running", "succeeded", "failed", "timeout", "stopped", "incomplete"]

# The rest of the launcher-rank contract: what a launch hands every rank in its environment.
LAUNCHER_PID_ENV = "WORKBOOK_LAUNCHER_PID"
"""Pid of the process that launched the job (the notebook); ranks exit when it is gone."""
LAUNCHER_CREATED_ENV = "WORKBOOK_LAUNCHER_CREATED"
"""Its start stamp (`utils.system.procs.process_created`), so that a reused pid is not taken for it."""
NODE_HOST_ENV = "WORKBOOK_NODE_HOST"
"""The host name the launcher gave the rank's node (a loopback address when two "nodes" share
one machine, whose host name is then the same for both)."""
RUN_TOKEN_ENV = "WORKBOOK_RUN_TOKEN"
"""This launch's token; the run directory belongs to the launch whose token it holds."""
STACK_SIGNAL = signal.SIGUSR1
"""The signal that makes a rank write its stacks (``faulthandler``) into its stacks file; a
rank whose stacks file does not exist yet has no handler, and the signal would end it."""


def runs_dir() -> Path:
    """Where runs are kept: ``$WORKBOOK_RUNS`` if set, else ``runs/`` at the project root."""
    configured = os.environ.get("WORKBOOK_RUNS")
    return Path(configured) if configured else PROJECT_ROOT / "runs"


@dataclass(frozen=True)
class PartitionChange:
    """Stage boundaries in force from training step `step` on."""

    step: int
    boundaries: tuple[int, ...]
    reason: str = ""


# What one line of each JSON-lines record is (Chinese, English), for the messages.
_LINE_NOUNS = {"events": ("个事件", "events"), "progress": ("步", "steps"), "memory": ("步", "steps"),
               "layer_costs": ("步", "steps"), None: ("行", "lines")}


@dataclass(frozen=True)
class RecordProblem:
    """One JSON-lines file of a run's record that is not as its writer left it.

    ``kind`` is ``"truncated"`` (its last line is cut mid-write in a run that is no longer
    running), ``"missing"`` (it holds fewer lines than its rank recorded writing: cut at a
    line's end, or gone) or ``"damaged"`` (complete lines that are not JSON: skipped, the
    rest of the file is read). A reader that finds one says the run's figures are partial
    (`PARTIAL`) instead of computing them from what is left as if it were all.
    """

    path: Path
    """The file."""
    rank: int | None
    """The rank that wrote it; None for a job-wide file (``partitions.jsonl`` ...)."""
    kind: Literal["truncated", "missing", "damaged"]
    record: str | None = None
    """``"events"``, ``"progress"``, ``"memory"``, ``"layer_costs"`` (`RunDir.rank_records`);
    None for a job-wide file."""
    found: int = 0
    """Complete lines in the file (damaged ones included)."""
    expected: int | None = None
    """Lines its rank recorded writing (``record_lines`` in its result); None when unknown
    (no result: the rank failed or was killed, or a record older than this check)."""
    lines: tuple[int, ...] = ()
    """``"damaged"``: the 1-based numbers of the damaged lines."""
    exists: bool = True
    """Whether the file is there at all (a ``"missing"`` file may be gone entirely)."""

    @property
    def file(self) -> str:
        return self.path.name

    @property
    def brief(self) -> str:
        """A few words for one-line listings (a run's repr): ``events-rank1.jsonl: 103 of 138
        events, last line cut mid-write``."""
        noun = _LINE_NOUNS[self.record][1]
        if self.kind == "damaged":
            return f"{self.file}: damaged line(s) {_numbers(self.lines)}"
        count = f"{self.found} of {self.expected} {noun}" if self.expected is not None else f"{self.found} {noun}"
        if self.kind == "truncated":
            return f"{self.file}: {count}, last line cut mid-write"
        return f"{self.file}: {count}" + ("" if self.exists else " (the file is gone)")

    def __str__(self) -> str:
        zh_noun, noun = _LINE_NOUNS[self.record]
        zh, en = ((f"rank {self.rank} 的 {self.file}", f"rank {self.rank}'s {self.file}") if self.rank is not None
                  else (self.file, self.file))
        numbers = _numbers(self.lines)
        if self.kind == "damaged":
            several = len(self.lines) > 1
            return (f"{zh} 第 {numbers} 行已损坏（不是 JSON），已跳过，其余照常读取 "
                    f"({'lines' if several else 'line'} {numbers} of {en} {'are' if several else 'is'} damaged, "
                    f"not JSON: skipped, the rest is read; {self.path})")
        if self.kind == "truncated" and self.expected is not None:
            return (f"{zh} 被截断：写入的 {self.expected} {zh_noun}中只有 {self.found} 完整，最后一行只写了一半 "
                    f"({en} is cut short: {self.found} of the {self.expected} {noun} its rank wrote are complete, "
                    f"the last line is cut mid-write)")
        if self.kind == "truncated":
            return (f"{zh} 的最后一行只写了一半，已跳过，读到 {self.found} 行完整 "
                    f"(the last line of {en} is cut mid-write: skipped; {self.found} complete {noun} read)")
        if not self.exists:
            return (f"{zh} 不见了：写入的 {self.expected} {zh_noun}都不在 "
                    f"({en} is gone: none of the {self.expected} {noun} its rank wrote is there)")
        return (f"{zh} 少了 {self.expected - self.found} {zh_noun}：写入的 {self.expected} {zh_noun}中只有 "
                f"{self.found} 在 ({en} lacks {self.expected - self.found} {noun}: {self.found} of the "
                f"{self.expected} {noun} its rank wrote are there)")


def _numbers(lines: tuple[int, ...]) -> str:
    shown = ", ".join(str(n) for n in lines[:5])
    return shown + (f" … (+{len(lines) - 5})" if len(lines) > 5 else "")


class RunDir:
    """File names and reading/writing of one run directory (see the module docstring)."""

    SPEC, PLAN, PARTITIONS, DECISIONS = "spec.json", "plan.json", "partitions.jsonl", "rebalance.jsonl"
    CHECKPOINTS, RESTART, MICRO_BATCHES = "checkpoints", "restart.json", "micro-batches.jsonl"
    COMMAND, STATUS, LAUNCHER_LOG = "command.txt", "status.json", "launcher.log"
    LAUNCH_TOKEN, TEMP = "launch-token", "tmp"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def create(cls, label: str, root: str | Path | None = None) -> RunDir:
        """A new, empty run directory named ``<time>-<label>-<random id>`` under `root`."""
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-")[:40] or "job"
        parent = Path(root or runs_dir())
        path = parent / f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}-{secrets.token_hex(3)}"
        try:
            path.mkdir(parents=True)
            probe = path / ".writable"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise OSError(f"cannot create a run directory under {parent} ({exc.strerror or exc}): "
                          "set WORKBOOK_RUNS to a writable folder, or pass directory=...") from None
        return cls(path)

    @property
    def name(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    # --- per-rank files ------------------------------------------------------------------------
    def rank_log(self, rank: int) -> Path:
        return self.path / f"rank{rank}.log"

    def status_slot(self, rank: int) -> Path:
        return self.path / f"status-rank{rank}"

    def events(self, rank: int) -> Path:
        return self.path / f"events-rank{rank}.jsonl"

    def progress_file(self, rank: int) -> Path:
        return self.path / f"progress-rank{rank}.jsonl"

    def layer_costs_file(self, rank: int) -> Path:
        return self.path / f"layer-costs-rank{rank}.jsonl"

    def layer_costs(self, rank: int) -> list[dict]:
        return read_jsonl(self.layer_costs_file(rank))

    def memory_file(self, rank: int) -> Path:
        return self.path / f"memory-rank{rank}.jsonl"

    def memory(self, rank: int) -> list[MemoryRecord]:
        """The rank's per-step memory rows (`MemoryRecord`), damaged ones left out."""
        return [m for row in read_jsonl(self.memory_file(rank)) if (m := MemoryRecord.from_dict(row)) is not None]

    def stacks_file(self, rank: int) -> Path:
        return self.path / f"stacks-rank{rank}.txt"

    def stacks(self, rank: int) -> str:
        """What the rank's stack dumps wrote ("" when it never dumped)."""
        try:
            return self.stacks_file(rank).read_text(errors="replace")
        except OSError:
            return ""

    def result_file(self, rank: int) -> Path:
        return self.path / f"result-rank{rank}.json"

    def error_file(self, rank: int) -> Path:
        return self.path / f"error-rank{rank}.json"

    def progress(self, rank: int) -> list[dict]:
        return read_jsonl(self.progress_file(rank))

    def result(self, rank: int) -> RankResult | None:
        """What the rank wrote when it finished (`RankResult`); None when it did not, or the file is
        unreadable."""
        return RankResult.from_dict(read_json(self.result_file(rank)))

    def error(self, rank: int) -> dict | None:
        return read_json(self.error_file(rank))

    def write_result(self, result: RankResult) -> None:
        write_json(self.result_file(result.rank), result.to_dict())

    def write_error(self, rank: int, data: dict) -> None:
        write_json(self.error_file(rank), data)

    def read_events(self, rank: int) -> list[dict]:
        return read_jsonl(self.events(rank))

    def rank_records(self, rank: int) -> dict[str, Path]:
        """The rank's JSON-lines records by name: what its result counts in ``record_lines``."""
        return {"events": self.events(rank), "progress": self.progress_file(rank),
                "memory": self.memory_file(rank), "layer_costs": self.layer_costs_file(rank)}

    def job_records(self) -> list[Path]:
        """The job-wide JSON-lines records (written by rank 0 while the job runs; not counted)."""
        return [self.file(name) for name in (self.PARTITIONS, self.DECISIONS, self.MICRO_BATCHES)]

    def scan_records(self, ranks) -> dict[Path, JsonLines]:
        """Every JSON-lines record of `ranks` and of the job, read once (`scan_jsonl`)."""
        paths = [path for rank in ranks for path in self.rank_records(rank).values()] + self.job_records()
        return {path: scan_jsonl(path) for path in paths}

    def record_problems(self, ranks, *, finished: bool,
                        scans: dict[Path, JsonLines] | None = None) -> list[RecordProblem]:
        """What is wrong with the JSON-lines records of `ranks` and of the job (`RecordProblem`),
        by rank, then the job-wide files; empty for a complete record.

        A damaged line is a problem whatever the run's state. Once the run is `finished` (not
        running), a last line cut mid-write is too (while it runs, that is the line being
        written), and so is a file with fewer lines than its rank's result says it wrote.
        `scans`: the files already read by `scan_records`, so that they are not read twice.
        """
        ranks = list(ranks)
        scans = scans if scans is not None else self.scan_records(ranks)
        problems: list[RecordProblem] = []
        for rank in ranks:
            result = self.result(rank)
            counted = result.record_lines if result is not None else {}
            for record, path in self.rank_records(rank).items():
                problems += _problems(path, scans.get(path) or scan_jsonl(path), rank=rank, record=record,
                                      expected=counted.get(record), finished=finished)
        for path in self.job_records():
            problems += _problems(path, scans.get(path) or scan_jsonl(path), rank=None, record=None,
                                  expected=None, finished=finished)
        return problems

    def placement_file(self, rank: int) -> Path:
        return self.path / f"node-rank{rank}.json"

    def write_placement(self, rank: int, data: dict) -> None:
        write_json(self.placement_file(rank), data)

    def placement(self, rank: int) -> dict | None:
        """Where the rank ran (``node``, ``host``, ``hostname``, ``local_rank``, ``pid``), as it
        recorded at start; None for a rank that never started."""
        data = read_json(self.placement_file(rank))
        return data if isinstance(data, dict) else None

    def launcher_log(self, node: int | None = None) -> Path:
        """What the launcher printed: ``launcher.log``, or for one node of a multi-node
        torchrun job ``launcher-node{node}.log`` (its agent's output)."""
        return self.file(self.LAUNCHER_LOG if node is None else f"launcher-node{node}.log")

    # --- job-wide records ----------------------------------------------------------------------
    def read_spec(self) -> dict | None:
        data = read_json(self.file(self.SPEC))
        return data if isinstance(data, dict) else None

    def write_spec(self, data: dict) -> None:
        write_json(self.file(self.SPEC), data, indent=2)

    def read_plan(self) -> dict | None:
        """The plan record, or None when it is missing or unreadable. Runs recorded before
        ``plan.json`` existed kept their partition in ``partition.json``; it is read as
        the plan's partition."""
        plan = read_json(self.file(self.PLAN))
        if isinstance(plan, dict) and isinstance(plan.get("partition"), dict):
            return plan
        legacy = read_json(self.file("partition.json"))
        if isinstance(legacy, dict) and "parts" in legacy:
            return {"partition": legacy}
        return None

    def write_plan(self, data: dict) -> None:
        write_json(self.file(self.PLAN), data, indent=2)

    def record_partition_change(self, change: PartitionChange) -> None:
        """Append one change (written by the job while it runs; one line is one write)."""
        line = json.dumps({"step": change.step, "boundaries": list(change.boundaries), "reason": change.reason})
        with open(self.file(self.PARTITIONS), "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def record_decision(self, decision: dict) -> None:
        """Append one re-balancing decision (written by rank 0 while the job runs)."""
        with open(self.file(self.DECISIONS), "a", encoding="utf-8") as f:
            f.write(json.dumps(decision) + "\n")

    def record_micro_batches(self, row: dict) -> None:
        """Append one step's micro-batch plan (``step``, ``samples``, ``real``, ``padded``)."""
        with open(self.file(self.MICRO_BATCHES), "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def micro_batches(self) -> list[dict]:
        return read_jsonl(self.file(self.MICRO_BATCHES))

    def decisions(self) -> list[dict]:
        return read_jsonl(self.file(self.DECISIONS))

    def read_restart(self) -> dict | None:
        """The restart a restart-mode job asked for (step, old and new boundaries, checkpoint
        tag), or None: what relaunched ranks resume from and what the launcher relaunches on."""
        record = read_json(self.file(self.RESTART))
        return record if isinstance(record, dict) else None

    def write_restart(self, record: dict) -> None:
        write_json(self.file(self.RESTART), record)

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    def partition_changes(self) -> list[PartitionChange]:
        return [PartitionChange(step=row["step"], boundaries=tuple(row["boundaries"]), reason=row.get("reason", ""))
                for row in read_jsonl(self.file(self.PARTITIONS))]

    def read_status(self) -> dict[str, Any]:
        status = read_json(self.file(self.STATUS), {})
        return status if isinstance(status, dict) else {}

    def write_status(self, *, failure: Failure | None = None, **status) -> None:
        """Write ``status.json``. A ``launcher_pid`` is recorded with that process's start time
        (``launcher_created``, unless given): a reader then tells the launcher from another
        process that got its pid later (`launcher_running`). `failure`: why the watch ended a
        job that did not succeed, as facts (`failure` reads them back)."""
        if status.get("launcher_pid") and "launcher_created" not in status:
            status["launcher_created"] = process_created(status["launcher_pid"])
        if failure is not None:
            status["failure"] = failure.to_dict()
        write_json(self.file(self.STATUS), status, indent=2)

    def failure(self, status: dict[str, Any] | None = None) -> Failure | None:
        """The facts of how the job failed or hung (`Failure`), as the launcher's watch recorded
        them in ``status.json``; None for a job that did not fail, or was recorded before them."""
        return Failure.from_dict((self.read_status() if status is None else status).get("failure"))

    def slot(self, rank: int) -> SlotStatus | None:
        """What the rank's status slot says it is doing (`StatusSlot.read`); None before it trained."""
        return StatusSlot.read(self.status_slot(rank))

    def launcher_running(self, status: dict[str, Any] | None = None) -> bool:
        """Whether the process that launched this run (``status.json``'s ``launcher_pid``) still
        runs: same pid, same start time, not a zombie. A status recorded without the start
        time is judged by the pid alone (a zombie still counts as gone)."""
        status = self.read_status() if status is None else status
        created = status.get("launcher_created")
        return process_alive(status.get("launcher_pid"),
                             created=float(created) if isinstance(created, (int, float)) else None)

    def command(self) -> str:
        path = self.file(self.COMMAND)
        return path.read_text() if path.exists() else ""

    def write_command(self, command: str) -> None:
        self.file(self.COMMAND).write_text(command + "\n", encoding="utf-8")


def _problems(path: Path, scan: JsonLines, *, rank: int | None, record: str | None, expected: int | None,
              finished: bool) -> list[RecordProblem]:
    """The `RecordProblem`s of one file as `scan_jsonl` read it."""
    found: list[RecordProblem] = []
    if scan.damaged:
        found.append(RecordProblem(path=path, rank=rank, kind="damaged", record=record, found=scan.lines,
                                   expected=expected, lines=scan.damaged))
    if finished and scan.tail:
        found.append(RecordProblem(path=path, rank=rank, kind="truncated", record=record, found=scan.lines,
                                   expected=expected))
    elif finished and expected is not None and scan.lines < expected:
        found.append(RecordProblem(path=path, rank=rank, kind="missing", record=record, found=scan.lines,
                                   expected=expected, exists=scan.exists))
    return found
