"""Run a small real ``torch.distributed.pipelining`` job on this machine and read its timeline.

The DeepSpeed jobs of `utils.jobs.launch` cover the schedules DeepSpeed's engine executes
(1F1B, GPipe). Interleaved 1F1B, ZB-H1 and DualPipeV run on torch's pipelining instead; this
module starts one process per rank (``python -m utils.runtime.torchpipe``, gloo on CPU),
runs every requested schedule in those same processes on the same seeded model, watches
them to the end and turns what each rank traced into one `Timeline` per schedule
(``source="measured"``), which every metric, plot and `utils.planning.whatif` prediction takes.

Guarantees: every argument is checked before a process starts (ValueError/TypeError naming
the argument); no process outlives the call: when a rank fails, the time limit passes or the
caller is interrupted, every rank's process tree is ended before the error propagates; and
the ranks end themselves if this process dies.

CPU timing: all ranks share the machine's cores (``cores // ranks`` torch threads each, at
least one); with more ranks than cores they also contend, which `TorchPipelineRun.notes` says.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from utils import validation
from utils.jobs.multinode import free_port
from utils.planning.catalogue import schedule_info, schedules_on
from utils.planning.schedules import Schedule, build_schedule
from utils.planning.whatif import predict_from_timeline
from utils.system.cpu import rank_threads
from utils.system.paths import PROJECT_ROOT
from utils.system.procs import end_process_tree
from utils.timeline import COMPUTE_KINDS, KIND_LETTER, Event, Timeline

__all__ = ["TORCH_SCHEDULES", "TorchPipelineFailed", "TorchPipelineRun", "run_torch_pipeline"]

TORCH_SCHEDULES: tuple[str, ...] = schedules_on("torch")
"""Schedules this runner can run: the catalogue's torch runtime (`utils.planning.catalogue`)."""
_RUNTIME = "torch.distributed.pipelining"


class TorchPipelineFailed(RuntimeError):
    """A rank of a torch pipelining run failed; the message carries its error output."""


@dataclass(frozen=True)
class TorchPipelineRun:
    """What `run_torch_pipeline` measured: one `Timeline` per schedule, in the order run."""

    timelines: dict[str, Timeline]
    losses: dict[str, tuple[float, ...]]
    """Mean loss over the micro-batches of every step, per schedule (from the loss rank)."""
    ranks: int
    micro_batches: int
    wall_seconds: float
    """Start of the first rank to the end of the last, imports included."""
    notes: tuple[str, ...] = field(default=())

    def schedule(self, name: str) -> Schedule:
        """The workbook's `Schedule` of the same name and size (the order torch ran)."""
        return build_schedule(name, self.ranks, self.micro_batches,
                              chunks=self.timelines[name].meta["chunks"])

    def actions(self, name: str, rank: int, step: int) -> list[str]:
        """What `rank` computed in `step` of schedule `name`, in order, as action strings with
        the virtual stage (``"2F0"``), comparable with ``str(a) for a in
        run.schedule(name).actions[rank]``."""
        timeline = self.timelines[name]
        local = timeline.meta["virtual_stages"][rank]  # chunk index -> virtual stage
        return [f"{local[e.chunk]}{KIND_LETTER[e.kind]}{e.micro_batch}"
                for e in timeline.select(step=step, stage=rank, kinds=COMPUTE_KINDS)]

    def predict(self, name: str) -> Timeline:
        """The simulator's timeline for `name` with the costs measured in this run:
        per-virtual-stage median forward/backward (and weight) times and the median
        hand-over latency, over all steps but the first (`utils.planning.whatif`)."""
        timeline = self.timelines[name]
        if timeline.meta.get("placement") != "loop":
            raise ValueError(f"{name} places its chunks in a V; the calibration of "
                             "utils.planning.whatif assumes the loop placement: simulate "
                             "run.schedule(name) with costs of your own")
        return predict_from_timeline(timeline)


def _check(schedules, ranks, micro_batches, chunks, layers, hidden, micro_batch_size, steps,
           timeout, fault_rank) -> tuple[list[str], dict[str, Schedule]]:
    if isinstance(schedules, str) or not isinstance(schedules, Sequence):
        raise TypeError(f"schedules must be a list of names such as ['1f1b', 'interleaved-1f1b'], "
                        f"got {schedules!r}")
    names = [str(s).lower().strip() for s in schedules]
    if not names:
        raise ValueError("schedules is empty: name at least one of " + ", ".join(TORCH_SCHEDULES))
    unknown = [n for n in names if n not in TORCH_SCHEDULES]
    if unknown:
        raise ValueError(f"unknown schedule(s) {unknown}; this runner knows {', '.join(TORCH_SCHEDULES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"schedules lists a name twice: {names}")
    ranks = validation.count("ranks", ranks, meaning="number of pipeline ranks (processes)")
    if not 2 <= ranks <= 8:
        raise ValueError(f"ranks must be between 2 and 8 for a pipeline on one machine, got {ranks}")
    for name, value in (("micro_batches", micro_batches), ("chunks", chunks), ("layers", layers),
                        ("hidden", hidden), ("micro_batch_size", micro_batch_size), ("steps", steps)):
        validation.count(name, value)
    if steps < 2:
        raise ValueError(f"steps must be >= 2: step 0 is warm-up and is left out of statistics, got {steps}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if fault_rank is not None and (isinstance(fault_rank, bool) or fault_rank not in range(ranks)):
        raise ValueError(f"fault_rank must be None or a rank in 0..{ranks - 1}, got {fault_rank!r}")
    plans = {}
    for name in names:  # build_schedule says why an m does not fit (rounds, 2p for dualpipev)
        plans[name] = build_schedule(name, ranks, micro_batches, chunks=schedule_info(name).chunks_for(chunks))
        vs = plans[name].num_virtual_stages
        if layers % vs:
            raise ValueError(f"{name} on {ranks} ranks cuts the model into {vs} virtual stages: "
                             f"layers must be a multiple of {vs}, got {layers}")
    return names, plans


def run_torch_pipeline(schedules: Sequence[str] = ("1f1b", "interleaved-1f1b"), *, ranks: int = 2,
                       micro_batches: int = 4, chunks: int = 2, layers: int = 8, hidden: int = 512,
                       micro_batch_size: int = 64, steps: int = 4, timeout: float = 60.0,
                       fault_rank: int | None = None) -> TorchPipelineRun:
    """Run `schedules` for real on `ranks` CPU processes (gloo) and return their timelines.

    The model is `layers` blocks of Linear(`hidden`, `hidden`) + Tanh with an MSE loss, the
    same seeded weights and data for every schedule; a step feeds `micro_batches`
    micro-batches of `micro_batch_size` samples. A schedule whose chunk count is free
    (``interleaved-1f1b``) runs `chunks` model chunks per rank, the others their catalogue's
    fixed count (``dualpipev`` and ``zbv`` two in a V, the rest one). Every schedule runs `steps`
    steps (step 0 is warm-up). `timeout` bounds the whole call (seconds, imports included).
    `fault_rank` (for tests) makes that rank raise before its first step.

    Raises ValueError/TypeError before starting anything, `TorchPipelineFailed` when a rank
    fails and TimeoutError past `timeout`; in every case no rank process is left running.
    """
    names, plans = _check(schedules, ranks, micro_batches, chunks, layers, hidden,
                          micro_batch_size, steps, timeout, fault_rank)
    threads = rank_threads(ranks)
    cores = len(os.sched_getaffinity(0))
    config = {"schedules": names, "micro_batches": micro_batches, "chunks": chunks, "layers": layers,
              "hidden": hidden, "micro_batch_size": micro_batch_size, "steps": steps, "seed": 0,
              "lr": 0.1, "pg_timeout": max(30, int(timeout) + 5), "fault_rank": fault_rank}
    work = Path(tempfile.mkdtemp(prefix="torchpipe-"))
    try:
        (work / "config.json").write_text(json.dumps(config), encoding="utf-8")
        started = time.perf_counter()
        _launch_and_wait(work, ranks, threads, float(timeout))
        wall = time.perf_counter() - started
        results = [json.loads((work / f"events-rank{r}.json").read_text(encoding="utf-8"))
                   for r in range(ranks)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    notes = [f"{ranks} ranks on {cores} core(s), {threads} torch thread(s) each"]
    if ranks > cores:
        notes.append(f"more ranks ({ranks}) than cores ({cores}): the timings include contention")
    timelines, losses = {}, {}
    for name in names:
        timelines[name] = _timeline(name, plans[name], results, config, threads)
        losses[name] = next(tuple(r["schedules"][name]["losses"]) for r in results
                            if r["schedules"][name]["losses"] is not None)
    return TorchPipelineRun(timelines, losses, ranks, micro_batches, wall, tuple(notes))


def _launch_and_wait(work: Path, ranks: int, threads: int, timeout: float) -> None:
    env = dict(os.environ)
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(ranks),
                "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))})
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + timeout
    try:
        for r in range(ranks):
            log = open(work / f"rank{r}.log", "wb")  # noqa: SIM115 - closed below, after the wait
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "utils.runtime.torchpipe", str(work / "config.json"), str(work)],
                cwd=PROJECT_ROOT, env={**env, "RANK": str(r)}, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True))
            log.close()
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:  # usually one rank; its peers fail after it (connection closed)
                raise TorchPipelineFailed("the torch pipelining run failed; all ranks were ended.\n" + "\n".join(
                    f"rank {r} (exit code {codes[r]}):\n{_tail(work, r)}" for r in failed))
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                waiting = [r for r, c in enumerate(codes) if c is None]
                raise TimeoutError(f"the torch pipelining run did not finish within {timeout:g} s "
                                   f"(ranks {waiting} still running; all ranks were ended). Last "
                                   f"output of rank {waiting[0]}:\n{_tail(work, waiting[0])}")
            time.sleep(0.02)
    finally:  # success, failure, timeout or KeyboardInterrupt: nothing outlives the call
        for p in procs:
            if p.poll() is None:
                end_process_tree(p.pid, grace=1.0)
            p.wait()


def _tail(work: Path, rank: int, chars: int = 3000) -> str:
    for name in (f"error-rank{rank}.txt", f"rank{rank}.log"):
        path = work / name
        if path.exists() and (text := path.read_text(encoding="utf-8", errors="replace").strip()):
            return text[-chars:]
    return "(no output)"


def _timeline(name: str, plan: Schedule, results: list[dict], config: dict, threads: int) -> Timeline:
    rows = [(r["rank"], ev) for r in results for ev in r["schedules"][name]["events"]]
    origin = min(ev[5] for _, ev in rows)  # the earliest start: all ranks share the host clock
    events = [Event(stage=rank, rank=rank, step=step, kind=kind, micro_batch=mb,
                    start=start - origin, end=end - origin, chunk=chunk)
              for rank, (step, kind, mb, _virtual, chunk, start, end) in rows]
    meta = {"schedule": name, "chunks": plan.chunks, "placement": plan.placement, "runtime": _RUNTIME,
            "torch_class": schedule_info(name).torch_class, "layers": config["layers"], "hidden": config["hidden"],
            "threads_per_rank": threads,
            "virtual_stages": {r["rank"]: r["schedules"][name]["virtual_stages"] for r in results}}
    return Timeline(events=tuple(events), num_stages=plan.num_stages,
                    num_micro_batches=plan.num_micro_batches, source="measured",
                    micro_batch_size=config["micro_batch_size"],
                    label=f"{name} ({_RUNTIME}, measured)", meta=meta)
