"""The run directory and the `Run` object: one finished (or failed) job, restorable from disk.

Layout of ``runs/<time>-<name>-<id>/`` (the parent folder is `runs_dir()`):

- ``spec.json``, ``command.txt``         what was run, and the command to run it by hand
- ``partition.json``                     the stage boundaries chosen before launch, the method,
                                         and the predicted per-stage cost when a profile exists
- ``status.json``                        state, error, start and end, launcher pid, notes
- ``launcher.log``                       what torchrun printed
- per rank: ``rank{r}.log``, ``events-rank{r}.jsonl``, ``progress-rank{r}.jsonl``,
  ``result-rank{r}.json`` or ``error-rank{r}.json`` (see `utils.job`)

Only the launcher writes ``state: "succeeded"``, and only after every rank wrote its result
and torchrun exited 0; a run whose launcher vanished reads back as ``"incomplete"``, so a
crashed or killed run never looks successful.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .spec import JobSpec
from .timeline import Event, Timeline

FINAL_STATES = ("succeeded", "failed", "timeout", "stopped", "incomplete")


def runs_dir() -> Path:
    """Where runs are kept: ``$WORKBOOK_RUNS`` if set, else ``runs/`` at the project root."""
    configured = os.environ.get("WORKBOOK_RUNS")
    return Path(configured) if configured else Path(__file__).resolve().parent.parent / "runs"


def read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def write_json(path: Path, data, *, indent: int | None = None) -> None:
    """Write JSON so that readers (the launcher polling, another process) never see half a
    file: write a private temporary file, then rename it into place."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent), encoding="utf-8")
    tmp.replace(path)


def read_jsonl(path: Path) -> list[dict]:
    """Complete lines only: a line still being written is skipped, not misread."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


@dataclass
class Run:
    """A job's record. Heavy parts (timeline) load on first use."""

    path: Path
    spec: JobSpec
    state: str
    command: str
    error: str | None
    started: float
    finished: float | None
    notes: tuple[str, ...] = ()

    @classmethod
    def load(cls, path: str | Path) -> Run:
        path = Path(path)
        spec_data = read_json(path / "spec.json")
        if spec_data is None:
            raise FileNotFoundError(f"{path} is not a run directory (no readable spec.json)")
        status = read_json(path / "status.json", {})
        state = status.get("state", "incomplete")
        if state == "running" and not _alive(status.get("launcher_pid")):
            state = "incomplete"
        return cls(path=path, spec=JobSpec.from_dict(spec_data), state=state,
                   command=(path / "command.txt").read_text() if (path / "command.txt").exists() else "",
                   error=status.get("error"), started=status.get("started", 0.0),
                   finished=status.get("finished"), notes=tuple(status.get("notes", ())))

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def ranks(self) -> range:
        return range(self.spec.world_size)

    @cached_property
    def results(self) -> dict[int, dict]:
        """Per rank: stage, layer range, peak memory, device (only ranks that finished)."""
        found = {r: read_json(self.path / f"result-rank{r}.json") for r in self.ranks}
        return {r: data for r, data in found.items() if data is not None}

    @cached_property
    def timeline(self) -> Timeline:
        from .models import get_model

        events = [Event(**row) for r in self.ranks
                  for row in read_jsonl(self.path / f"events-rank{r}.jsonl")]
        spec = self.spec
        return Timeline(events=tuple(events), num_stages=spec.num_stages,
                        num_micro_batches=spec.micro_batches, source="measured",
                        micro_batch_size=spec.micro_batch_size, data_parallel=spec.data_parallel,
                        seq_len=get_model(spec.model, spec.model_options).seq_len,
                        label=spec.name or self.name,
                        meta={"schedule": spec.schedule, "parts": self.parts, "run": str(self.path),
                              "device": self.device})

    def progress(self, rank: int = 0) -> list[dict]:
        """The per-step lines (step, loss, seconds) one rank wrote."""
        return read_jsonl(self.path / f"progress-rank{rank}.jsonl")

    @property
    def losses(self) -> list[float]:
        """Training loss per step (averaged over data-parallel replicas by DeepSpeed)."""
        return [row["loss"] for row in self.progress(0)]

    @property
    def step_times(self) -> list[float]:
        """Seconds per step: the slowest rank's `train_batch` time."""
        per_rank = [[row["seconds"] for row in self.progress(r)] for r in self.ranks]
        return [max(times) for times in zip(*per_rank)] if per_rank else []

    @cached_property
    def partition_record(self) -> dict:
        """``partition.json``: the boundaries, how they were chosen and the predicted stage
        costs (`utils.profiling.partition_record`)."""
        return read_json(self.path / "partition.json")

    @property
    def parts(self) -> list[int]:
        """Stage boundaries ``[0, b1, ..., n_layers]`` the job ran with."""
        return self.partition_record["parts"]

    @property
    def predicted_stage_costs(self) -> list[float] | None:
        """Forward + backward seconds per micro-batch of each stage, predicted before launch
        from the job's layer profile: always present for ``partition="profile"``, for other
        methods only if the profile was already cached, else None."""
        return self.partition_record["predicted_stage_costs"]

    @property
    def partition_method(self) -> str:
        """How the boundaries were chosen: ``"uniform"``, ``"parameters"``, ``"profile"`` or
        ``"explicit"``."""
        return self.partition_record["method"]

    @property
    def peak_memory(self) -> dict[int, int]:
        """Peak memory per stage in bytes (largest over replicas); see `memory_kind`."""
        peaks: dict[int, int] = {}
        for data in self.results.values():
            peaks[data["stage"]] = max(peaks.get(data["stage"], 0), data["peak_memory_bytes"])
        return dict(sorted(peaks.items()))

    @property
    def memory_kind(self) -> str | None:
        """``cuda_max_memory_allocated`` on GPU, ``cpu_max_rss`` (whole process) on CPU."""
        return next((data["memory_kind"] for data in self.results.values()), None)

    @property
    def device(self) -> str | None:
        return next((data["device"] for data in self.results.values()), None)

    def log(self, rank: int, *, tail: int | None = None) -> str:
        text = (self.path / f"rank{rank}.log").read_text(errors="replace") \
            if (self.path / f"rank{rank}.log").exists() else ""
        return "\n".join(text.splitlines()[-tail:]) if tail else text

    def __repr__(self) -> str:
        return (f"Run({self.name!r}, state={self.state!r}, stages={self.spec.num_stages}, "
                f"micro_batches={self.spec.micro_batches}, steps={len(self.losses)}/{self.spec.steps})")


def list_runs(directory: str | Path | None = None) -> list[Run]:
    """Every readable run under `directory` (default `runs_dir()`), oldest first."""
    root = Path(directory) if directory else runs_dir()
    if not root.exists():
        return []
    return [Run.load(p) for p in sorted(root.iterdir()) if (p / "spec.json").exists()]


def find_run(spec: JobSpec, directory: str | Path | None = None) -> Run | None:
    """The newest run under `directory` (default `runs_dir()`) that succeeded with exactly
    `spec`, else None; ``find_run(spec) or run_job(spec)`` reuses a finished job instead of
    running it again.

    Only each record's ``spec.json`` is read until one matches, so a long ``runs/`` costs
    little; records whose spec this version cannot read (an older format, a half-written
    file) are skipped, and so are failed, stopped and incomplete runs.
    """
    root = Path(directory) if directory else runs_dir()
    if not root.exists():
        return None
    for path in sorted(root.iterdir(), reverse=True):  # names start with the start time
        data = read_json(path / "spec.json")
        if not isinstance(data, dict):
            continue
        try:
            recorded = JobSpec.from_dict(data)
        except (TypeError, ValueError, KeyError):
            continue
        if recorded == spec:
            run = Run.load(path)
            if run.ok:
                return run
    return None


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
