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
- ``status.json``               state, error, start and end, launcher pid, notes
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
  instruction it executes now), ``events-rank{r}.jsonl`` (traced instructions),
  ``progress-rank{r}.jsonl`` (step, loss, seconds), ``layer-costs-rank{r}.jsonl`` (per-layer
  forward and backward seconds a re-balancing job measured in each step),
  ``memory-rank{r}.jsonl`` (per step: bytes in use as it started, after every traced
  instruction, and the peak; `utils.runtime.memory`),
  ``node-rank{r}.json`` (where it ran: node index, host, local rank, pid; written at start),
  ``result-rank{r}.json`` on success,
  ``error-rank{r}.json`` on failure,
  ``stacks-rank{r}.txt`` (every thread's Python stack, written by the rank's ``faulthandler``
  each time it gets `STACK_SIGNAL`: the launcher asks for them when a job hangs)

Only the launcher writes ``state: "succeeded"``, and only after every rank wrote its result
and the launcher process exited 0; a run whose launcher vanished reads back as
``"incomplete"``, so a crashed or killed run never looks successful.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from utils.system.fileio import read_json, read_jsonl, write_json
from utils.system.paths import PROJECT_ROOT

RunState = Literal["running", "succeeded", "failed", "timeout", "stopped", "incomplete"]
STATUS_BYTES = 128

# The rest of the launcher-rank contract: what a launch hands every rank in its environment.
LAUNCHER_PID_ENV = "WORKBOOK_LAUNCHER_PID"
"""Pid of the process that launched the job (the notebook); ranks exit when it is gone."""
LAUNCHER_CREATED_ENV = "WORKBOOK_LAUNCHER_CREATED"
"""Its `psutil.Process.create_time`, so that a reused pid is not taken for it."""
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

    def memory(self, rank: int) -> list[dict]:
        return read_jsonl(self.memory_file(rank))

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

    def result(self, rank: int) -> dict | None:
        return read_json(self.result_file(rank))

    def error(self, rank: int) -> dict | None:
        return read_json(self.error_file(rank))

    def write_result(self, rank: int, data: dict) -> None:
        write_json(self.result_file(rank), data)

    def write_error(self, rank: int, data: dict) -> None:
        write_json(self.error_file(rank), data)

    def read_events(self, rank: int) -> list[dict]:
        return read_jsonl(self.events(rank))

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

    def write_status(self, **status) -> None:
        write_json(self.file(self.STATUS), status, indent=2)

    def command(self) -> str:
        path = self.file(self.COMMAND)
        return path.read_text() if path.exists() else ""

    def write_command(self, command: str) -> None:
        self.file(self.COMMAND).write_text(command + "\n", encoding="utf-8")


class StatusSlot:
    """A small memory-mapped file holding the instruction a rank is executing now.

    Writing it costs a memory copy, no system call, so it is updated at every instruction;
    the launcher reads it when a job hangs, even while the rank is blocked inside a
    collective where no Python code runs.
    """

    def __init__(self, path: Path):
        path.write_bytes(b" " * STATUS_BYTES)
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), STATUS_BYTES)

    def write(self, text: str) -> None:
        data = text.encode()[:STATUS_BYTES].ljust(STATUS_BYTES)
        self._map[:] = data

    @staticmethod
    def read(path: Path) -> str:
        try:
            return path.read_bytes().decode(errors="replace").strip()
        except OSError:
            return ""
