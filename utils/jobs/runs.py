"""The `Run` object: one finished (or failed) job, restored from its run directory.

The directory's files and their meaning are `utils.jobs.rundir.RunDir`'s business; a `Run`
reads them through it and never spells a file name out. Heavy parts (the timeline) load on
first use, and a missing or corrupt record (a run killed while it was being created, a file
edited by hand) reads as "unknown" instead of raising somewhere unrelated.

A finished run's per-line records are complete or say they are not: a file cut short or a
damaged line is a `RecordProblem` in `Run.record_problems`, shown in the run's repr (so in
`list_runs`), as a note of its timeline's metrics and as a finding of `utils.diagnose`; what
can be read is still read. A run reads "running" only while the very process that launched
it runs (its pid and start time), so a reused pid or a zombie does not keep it "running".
"""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from utils.analysis.comms import CommOp, comm_ops
from utils.analysis.report import PARTIAL
from utils.jobs.records import Failure, MemoryRecord, RankResult
from utils.jobs.rundir import PartitionChange, RecordProblem, RunDir, RunState, runs_dir
from utils.jobs.spec import JobSpec
from utils.planning.catalogue import schedule_info
from utils.planning.microbatching import MicroBatchDecision
from utils.planning.schedules import Schedule, build_schedule
from utils.planning.rebalance import Decision
from utils.system.fileio import JsonLines, scan_jsonl
from utils.timeline import COMPUTE_KINDS, KIND_LETTER, Event, Timeline


@dataclass
class Run:
    """A job's record. Heavy parts (timeline) load on first use."""

    path: Path
    spec: JobSpec
    state: RunState
    command: str
    error: str | None
    started: float
    finished: float | None
    notes: tuple[str, ...] = ()
    failure: Failure | None = None
    """How the job failed or hung, as the launcher's watch recorded the facts (`Failure`); None
    for a run that succeeded, or one recorded before the facts were."""

    @classmethod
    def load(cls, path: str | Path) -> Run:
        run_dir = RunDir(path)
        spec_data = run_dir.read_spec()
        if spec_data is None:
            why = "is missing" if not run_dir.file(RunDir.SPEC).exists() else "is not valid JSON (cut short?)"
            raise FileNotFoundError(f"{run_dir.path} is not a readable run directory: its {RunDir.SPEC} {why}")
        try:
            spec = JobSpec.from_dict(spec_data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{run_dir.path}: its {RunDir.SPEC} cannot be read by this version of the "
                             f"workbook ({exc}); it was written by another version or edited by hand") from None
        status = run_dir.read_status()
        state = status.get("state") or _unwatched_state(run_dir, spec)
        if state == "running" and not run_dir.launcher_running(status):
            state = "incomplete"
        return cls(path=run_dir.path, spec=spec, state=state, command=run_dir.command(),
                   error=status.get("error"), started=status.get("started", 0.0),
                   finished=status.get("finished"), notes=tuple(status.get("notes", ())),
                   failure=run_dir.failure(status))

    @property
    def run_dir(self) -> RunDir:
        return RunDir(self.path)

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def ranks(self) -> range:
        return range(self.spec.world_size)

    # --- how complete the record is ----------------------------------------------------------------
    @cached_property
    def _records(self) -> dict[Path, JsonLines]:
        """Every per-line record of the run, read once (`RunDir.scan_records`)."""
        return self.run_dir.scan_records(self.ranks)

    @cached_property
    def record_problems(self) -> tuple[RecordProblem, ...]:
        """What is wrong with the run's per-line records: a file cut short (fewer lines than
        its rank wrote, a last line cut mid-write once the run no longer runs) or a damaged
        line (`utils.jobs.rundir.RecordProblem`). Empty for a complete record. Figures
        computed from a run with problems are partial, and every reader says so."""
        return tuple(self.run_dir.record_problems(self.ranks, finished=self.state != "running",
                                                  scans=self._records))

    @property
    def partial(self) -> bool:
        """Whether the record has `record_problems`: its figures rest on part of what ran."""
        return bool(self.record_problems)

    def _rows(self, path: Path) -> list[dict]:
        """The rows of one per-line record: read once for a run that ended (its files no longer
        change), afresh each time for a running one. Damaged lines and a cut last line are left
        out (`record_problems` names them)."""
        if self.state != "running" and path in self._records:
            return list(self._records[path].rows)
        return scan_jsonl(path).rows

    @cached_property
    def rank_results(self) -> dict[int, RankResult]:
        """Per rank that finished, what it wrote (`RankResult`: stage, replica, layer range, peak
        memory, device, threads ...)."""
        found = {r: self.run_dir.result(r) for r in self.ranks}
        return {r: result for r, result in found.items() if result is not None}

    @cached_property
    def results(self) -> dict[int, dict]:
        """`rank_results` as plain data (`RankResult.to_dict`: ``stage``, ``replica``, ``layers``,
        ``device``, ``threads`` ...), for a notebook that indexes it."""
        return {r: result.to_dict() for r, result in self.rank_results.items()}

    @cached_property
    def timeline(self) -> Timeline:
        events = [Event(**row) for r in self.ranks for row in self._rows(self.run_dir.events(r))]
        spec = self.spec
        partial = [str(problem) for problem in self.record_problems]
        return Timeline(events=tuple(events), num_stages=spec.num_stages,
                        num_micro_batches=spec.micro_batches, source="measured",
                        micro_batch_size=spec.micro_batch_size, data_parallel=spec.data_parallel,
                        seq_len=spec.shape.seq_len,
                        label=spec.name or self.name,
                        meta={"schedule": spec.schedule, "runtime": spec.resolved_runtime, "chunks": spec.model_chunks,
                              "placement": schedule_info(spec.schedule).placement,
                              "parts": self.parts, "run": str(self.path),
                              "partitions": [(c.step, list(c.boundaries)) for c in self.partitions],
                              **({"micro_batch_tokens": self.micro_batch_tokens} if self.micro_batch_tokens else {}),
                              **({"nodes": self.nodes} if len(set(self.nodes.values())) > 1 else {}),
                              **({"record_problems": partial} if partial else {}),
                              "device": self.device})

    @cached_property
    def schedule(self) -> Schedule:
        """The catalogue's schedule this run executed (`utils.planning.schedules.build_schedule`
        at the spec's stages, micro-batches and chunks): the order its timeline follows."""
        spec = self.spec
        return build_schedule(spec.schedule, spec.num_stages, spec.micro_batches, chunks=spec.model_chunks)

    def actions(self, rank: int, step: int) -> list[str]:
        """What `rank` computed in `step`, in order, as action strings with the virtual stage
        (``"2F0"``, ``"1W3"``), comparable with ``[str(a) for a in run.schedule.actions[rank]]``."""
        schedule = self.schedule
        return [f"{schedule.virtual_stage(e.stage, e.chunk)}{KIND_LETTER[e.kind]}{e.micro_batch}"
                for e in self.timeline.select(step=step, rank=rank, kinds=COMPUTE_KINDS)]

    @cached_property
    def placement(self) -> dict[int, dict]:
        """Where each rank ran, as it recorded at start: ``node`` (the launcher's node index),
        ``host``, ``hostname``, ``local_rank``, ``pid``. Ranks that never started are absent."""
        found = {r: self.run_dir.placement(r) for r in self.ranks}
        return {r: data for r, data in found.items() if data is not None}

    @property
    def nodes(self) -> dict[int, int]:
        """Rank -> the node it ran on (from `placement`)."""
        return {r: int(p["node"]) for r, p in self.placement.items()}

    def progress(self, rank: int = 0) -> list[dict]:
        """The per-step lines (step, loss, seconds) one rank wrote."""
        return self._rows(self.run_dir.progress_file(rank))

    @property
    def losses(self) -> list[float]:
        """Training loss per step (averaged over data-parallel replicas by DeepSpeed)."""
        return [row["loss"] for row in self.progress(0)]

    @property
    def step_times(self) -> list[float]:
        """Seconds per step: the slowest rank's `train_batch` time."""
        per_rank = [[row["seconds"] for row in self.progress(r)] for r in self.ranks]
        return [max(times) for times in zip(*per_rank)] if per_rank else []

    # --- the partition -----------------------------------------------------------------------------
    @cached_property
    def plan(self) -> dict:
        """``plan.json``: device and the partition decided before launch ({} if unreadable)."""
        return self.run_dir.read_plan() or {}

    @cached_property
    def partition_record(self) -> dict:
        """The boundaries, how they were chosen and the predicted stage costs
        (`utils.jobs.plan.JobPlan.partition_record`); {} when the record is missing or corrupt."""
        record = self.plan.get("partition")
        return record if isinstance(record, dict) else {}

    @cached_property
    def partitions(self) -> list[PartitionChange]:
        """The partition history: ``(step, boundaries)`` from step 0 on, one entry per change.
        Empty when neither the plan nor any rank recorded the boundaries."""
        initial = self.partition_record.get("parts")
        if initial is None:  # fall back on what the ranks reported they ran
            initial = next((list(res.parts) for res in self.rank_results.values() if res.parts), None)
        history = [PartitionChange(step=0, boundaries=tuple(initial), reason="plan")] if initial else []
        return history + self.run_dir.partition_changes()

    @property
    def partition_history(self) -> list[tuple[int, list[int]]]:
        """``[(step, boundaries), ...]`` from ``(0, initial)`` on: the boundaries in force from
        each step until the next entry (forced moves, policy moves and restarts alike)."""
        return [(change.step, list(change.boundaries)) for change in self.partitions]

    @cached_property
    def micro_batch_tokens(self) -> dict[int, list[tuple[int, int, int]]]:
        """Variable micro-batching: per step, each micro-batch's ``(samples, real tokens,
        padded tokens)`` (one replica's plan); empty for fixed micro-batches."""
        return {row["step"]: list(zip(row["samples"], row["real"], row["padded"]))
                for row in self.run_dir.micro_batches()}

    @cached_property
    def rebalance_decisions(self) -> list[Decision]:
        """Every look of the re-balancing policy (`JobSpec.rebalance`), in step order: the
        per-layer costs it saw, the prediction, whether it moved and why."""
        return [Decision.from_dict(row) for row in self.run_dir.decisions() if "kind" not in row]

    @cached_property
    def micro_batch_decisions(self) -> list[MicroBatchDecision]:
        """Every look of the micro-batch policy (`JobSpec.micro_batch_policy`): the predicted
        step time of each count that fits the memory budget, the choice and why."""
        return [MicroBatchDecision.from_dict(row) for row in self.run_dir.decisions()
                if row.get("kind") == "micro-batches"]

    @cached_property
    def layer_costs(self) -> dict[int, dict[int, tuple[float, float]]]:
        """Per-layer ``(forward, backward)`` seconds per micro-batch that a re-balancing job
        measured while it trained: ``{step: {layer: (f, b)}}``, each layer from the rank
        that held it then (replicas averaged). Empty for jobs without a policy."""
        found: dict[int, dict[int, list[tuple[float, float]]]] = {}
        for rank in self.ranks:
            for row in self._rows(self.run_dir.layer_costs_file(rank)):
                for layer, value in row["layers"].items():
                    found.setdefault(row["step"], {}).setdefault(int(layer), []).append(tuple(value))
        return {step: {layer: tuple(sum(v[i] for v in values) / len(values) for i in range(2))
                       for layer, values in sorted(layers.items())}
                for step, layers in sorted(found.items())}

    @property
    def parts(self) -> list[int] | None:
        """Stage boundaries ``[0, b1, ..., n_layers]`` the job started with (None if unknown);
        see `partitions` for changes while it ran."""
        return list(self.partitions[0].boundaries) if self.partitions else None

    def parts_at(self, step: int) -> list[int] | None:
        """The boundaries in force during training step `step`."""
        current = None
        for change in self.partitions:
            if change.step <= step:
                current = list(change.boundaries)
        return current

    @property
    def predicted_stage_costs(self) -> list[float] | None:
        """Forward + backward seconds per micro-batch of each stage, predicted before launch
        from the job's layer profile: always present for ``partition="profile"``, for other
        methods only if the profile was already cached, else None."""
        return self.partition_record.get("predicted_stage_costs")

    @property
    def partition_method(self) -> str | None:
        """How the boundaries were chosen: ``"uniform"``, ``"parameters"``, ``"profile"`` or
        ``"explicit"`` (None if the record is missing)."""
        return self.partition_record.get("method")

    # --- DeepSpeed's comms logger ------------------------------------------------------------------
    @property
    def comms(self) -> dict[int, dict]:
        """Per rank, DeepSpeed's comms-logger record as the rank saved it (cumulative times,
        `utils.analysis.comms`); empty unless the job's DeepSpeed config has a
        ``"comms_logger"`` section."""
        return {rank: res.comms for rank, res in self.rank_results.items() if res.comms is not None}

    @property
    def comm_ops(self) -> dict[int, list[CommOp]]:
        """Per rank, every op of `comms` with its own duration (`utils.analysis.comms.comm_ops`)."""
        return {rank: comm_ops(raw) for rank, raw in self.comms.items()}

    # --- memory and device -------------------------------------------------------------------------
    @property
    def peak_memory(self) -> dict[int, int]:
        """Peak memory per stage in bytes (largest over replicas); see `memory_kind`."""
        peaks: dict[int, int] = {}
        for res in self.rank_results.values():
            if res.peak_memory is not None:
                peaks[res.stage] = max(peaks.get(res.stage, 0), res.peak_memory.peak)
        return dict(sorted(peaks.items()))

    @cached_property
    def memory_records(self) -> dict[int, list[MemoryRecord]]:
        """Per rank, one `MemoryRecord` per step: bytes in use as the step started (``base``),
        after each traced instruction (``after``, in the order of that rank's events of the
        step) and the step's ``peak``, with the reader's ``kind`` (`utils.runtime.memory`). A
        rank's list is empty where its device has no reader."""
        return {rank: [m for row in self._rows(self.run_dir.memory_file(rank))
                       if (m := MemoryRecord.from_dict(row)) is not None] for rank in self.ranks}

    @property
    def memory(self) -> dict[int, list[dict]]:
        """`memory_records` as plain data (``step``, ``kind``, ``base``, ``after``, ``peak``)."""
        return {rank: [m.to_dict() for m in rows] for rank, rows in self.memory_records.items()}

    @property
    def step_memory(self) -> dict[int, int]:
        """Per stage, the bytes a training step adds on top of what the stage holds between
        steps (``peak - base``: activations in flight, gradients, received tensors): over the
        steps after the first (which also allocates the optimizer state once), the median, the
        higher middle value for an even count (with 2 such steps: the larger), of the largest
        replica. Empty when nothing was measured."""
        found: dict[int, int] = {}
        for rank, rows in self.memory_records.items():
            if not rows or rank not in self.rank_results:
                continue
            rows = rows[1:] or rows
            added = sorted(row.added for row in rows)
            stage = self.rank_results[rank].stage
            found[stage] = max(found.get(stage, 0), added[len(added) // 2])
        return dict(sorted(found.items()))

    def memory_trace(self, step: int) -> dict[int, list[tuple[float, int]]]:
        """Per rank, ``(time, bytes above the step's start)`` from the step's first instruction
        and after each traced instruction of `step` (time on the run's timeline): the memory
        curve of every rank through one step, ready for `utils.plot_memory`."""
        curves = {}
        for rank, rows in self.memory_records.items():
            row = next((r for r in rows if r.step == step), None)
            events = sorted((e for e in self.timeline.events if e.rank == rank and e.step == step
                             and e.kind != "repartition"), key=lambda e: e.start)
            if row is None or not events:
                continue
            curves[rank] = [(events[0].start, 0)] + [(e.end, used - row.base)
                                                     for e, used in zip(events, row.after)]
        return curves

    @property
    def memory_kind(self) -> str | None:
        """What `peak_memory` measured: ``cuda_max_memory_allocated`` on GPU, ``cpu_max_rss``
        (whole process) on CPU (`utils.jobs.records.MEMORY_KINDS`)."""
        return next((res.peak_memory.kind for res in self.rank_results.values() if res.peak_memory), None)

    @property
    def device(self) -> str | None:
        return next((res.device for res in self.rank_results.values() if res.device), self.plan.get("device"))

    def log(self, rank: int, *, tail: int | None = None) -> str:
        path = self.run_dir.rank_log(rank)
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-tail:]) if tail else text

    def __repr__(self) -> str:
        problems = self.record_problems
        partial = ""
        if problems:
            by_rank = [f"{'rank ' + str(p.rank) + ' ' if p.rank is not None else ''}{p.brief}" for p in problems]
            more = f"; +{len(by_rank) - 3} more" if len(by_rank) > 3 else ""
            partial = f", record={PARTIAL}: {'; '.join(by_rank[:3])}{more}"
        return (f"Run({self.name!r}, state={self.state!r}, stages={self.spec.num_stages}, "
                f"micro_batches={self.spec.micro_batches}, steps={len(self.losses)}/{self.spec.steps}{partial})")


def _unwatched_state(run_dir: RunDir, spec: JobSpec) -> RunState:
    """The state of a run no launcher watched (prepared commands, a SLURM script), which has
    no status record: what its ranks wrote says it. Succeeded once every rank wrote its
    result, failed once one wrote an error, else incomplete (still running, or killed)."""
    ranks = range(spec.world_size)
    if any(run_dir.error_file(r).exists() for r in ranks):
        return "failed"
    if all(run_dir.result_file(r).exists() for r in ranks):
        return "succeeded"
    return "incomplete"


def list_runs(directory: str | Path | None = None) -> list[Run]:
    """Every readable run under `directory` (default `runs_dir()`), oldest first.

    A record this version cannot read (a spec cut short, one from another version) is
    skipped with a warning that names its directory; `Run.load` on it says why. A run whose
    per-line records are cut short or damaged is listed: its row (repr) says its figures are
    partial and names the files (`Run.record_problems`).
    """
    root = Path(directory) if directory else runs_dir()
    if not root.exists():
        return []
    runs = []
    for path in _newest_first(root)[::-1]:
        if not RunDir(path).file(RunDir.SPEC).exists():
            continue  # not a run directory at all
        try:
            runs.append(Run.load(path))
        except (OSError, ValueError) as exc:
            warnings.warn(f"skipped {path}: {exc}", stacklevel=2)
    return runs


def find_run(spec: JobSpec, directory: str | Path | None = None) -> Run | None:
    """The newest run under `directory` (default `runs_dir()`) that succeeded with exactly
    `spec`, else None; ``find_run(spec) or run_job(spec)`` reuses a finished job instead of
    running it again.

    Only each record's spec is read until one matches, so a long ``runs/`` costs little;
    records whose spec this version cannot read (an older format, a half-written file) are
    skipped, and so are failed, stopped and incomplete runs, and runs whose per-line
    records are cut short or damaged (`Run.record_problems`: their figures are partial).
    """
    root = Path(directory) if directory else runs_dir()
    if not root.exists():
        return None
    wanted = _canonical(spec)
    source = _model_source(spec.model)  # a learner's model: only a run of the same code counts
    for path in _newest_first(root):
        data = RunDir(path).read_spec()
        if data is None:
            continue
        try:
            recorded = JobSpec.from_dict(data)
        except (TypeError, ValueError, KeyError):
            continue
        if _canonical(recorded) == wanted and (source is None or (RunDir(path).read_plan() or {}).get(
                "model_source") == source):
            run = Run.load(path)
            if run.ok and not run.partial:
                return run
    return None


def _model_source(model: str) -> str | None:
    """The digest of a learner's model's source (``"pkg.mod:fn"``), None for a preset."""
    from utils.workloads.presets import is_import_path

    if not is_import_path(model):
        return None
    from utils.workloads.custom import source_digest

    return source_digest(model)


_STARTED = re.compile(r"^(\d{8}-\d{6})-")


def _newest_first(root: Path) -> list[Path]:
    """Folders under `root`, newest first: by the start time their name begins with (the
    launcher names them so), else by modification time, so that a folder renamed by hand
    (``best-run``) is placed by its age, not by its name."""
    def started(path: Path) -> str:
        match = _STARTED.match(path.name)
        if match:
            return match[1]
        try:
            return time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
        except OSError:
            return ""

    return sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: (started(p), p.name), reverse=True)


def _canonical(spec: JobSpec) -> JobSpec:
    """`spec` with its model options spelled out in full: ``{"blocks": 6}`` and ``{}`` are the
    same job when 6 is the preset's default."""
    try:
        return replace(spec, model_options=dict(sorted(spec.shape.options.items())))
    except (TypeError, ValueError):
        return spec
