"""The program every rank of a pipeline job runs: ``python -m utils.runtime.rank RUN_DIR``.

Started by the launcher (`utils.jobs.launchers`), one process per rank. It reads the job's
spec and plan from the run directory (`utils.jobs.rundir.RunDir`: the device and the
boundaries were decided once, before launch), builds the `PipelineModule` and the DeepSpeed
engine, installs the schedule and then the tracer, trains, and writes what it saw back into
the run directory.

The training loop has one seam: `StepHook`s run before and after every step with the
`RankState` (engine, tracer, stage ...). Anything that changes a running job between steps —
freezing, re-partitioning (`utils.runtime.dynamic`), a new micro-batch plan — is a hook
that may replace ``state.engine``; the loop itself stays this short.

Before anything else a rank starts a watcher that ends it when its parent (torchrun) or the
process that launched the job (the notebook) is gone (`utils.runtime.lifecycle`), and checks that
it was started by the launch that owns its run directory (`_record_into`): a
``command.txt`` run by hand records a new sibling run instead of appending to this one.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from utils.jobs.records import MemoryRecord, RankResult
from utils.jobs.rundir import RUN_TOKEN_ENV, RunDir
from utils.jobs.spec import JobSpec
from utils.runtime.assembly import _varies, build_engine, build_module, trace  # noqa: F401 - build_module: chapters read it here
from utils.runtime.faults import lift_memory_cap
from utils.runtime.lifecycle import (RankExit, dump_stacks_on_signal, exit_with_parent, own_rank, record_placement,
                                     redirect_output)
from utils.system.fileio import LineAppender


@dataclass
class RankState:
    """What one rank holds while it trains; hooks may replace `engine` between steps
    (`adopt`), and the dynamic hooks share the freezing, the layer-cost meter and the events
    they add to the step (a re-partition) through it."""

    spec: JobSpec
    run_dir: RunDir
    rank: int
    device: str
    model: Any
    """The resolved `utils.workloads.models.Model`."""
    boundaries: list[int]
    """The stage boundaries the current engine was built with."""
    engine: Any
    tracer: Any
    data: Any
    """The iterator of micro-batches `engine.train_batch` reads (`utils.workloads.models.Batches`)."""
    frozen: Any = None
    """The `FrozenPrefix` of a job that freezes layers (`JobSpec.freeze_at`), else None."""
    meter: Any = None
    """The `LayerCostMeter` of a job that re-balances itself, else None."""
    memory: Any = None
    """The `MemoryMeter`: bytes in use after every traced instruction."""
    pending_events: list = field(default_factory=list)
    """Events a hook adds to the coming step (a re-partition), written with the step's own."""
    last_events: list = field(default_factory=list)
    """The events of the step that just ended (what a policy measures stage costs on)."""
    first_step: int = 0
    """The step training starts from: 0, or where a restart (`utils.runtime.restart`) resumes."""
    origin_wall: float | None = None
    """Wall-clock time of t = 0 (rank 0's), so a relaunched job continues the same time axis."""
    record_lines: dict[str, int] = field(default_factory=dict)
    """Lines in each of this rank's JSON-lines records (`RunDir.rank_records`), a restarted
    job's earlier launch's included: in its result, so readers can tell a record cut short."""
    _costs_file: Any = None

    def build_engine(self, boundaries: Sequence[int]):
        """A new engine for this rank at `boundaries`, with the schedule, the freezing and the
        layer-cost meter installed (the fault and the tracer come with `adopt`; the order is
        `utils.runtime.assembly.WRAP_ORDER`)."""
        return build_engine(self.spec, self.model, boundaries, self.device, frozen=self.frozen, meter=self.meter,
                            rank=self.rank)

    def adopt(self, engine, boundaries: Sequence[int]) -> None:
        """Train on `engine` (built at `boundaries`) from now on, traced from the same origin."""
        origin = self.tracer.origin if self.tracer is not None else 0.0
        self.engine, self.boundaries = engine, list(boundaries)
        self.tracer = trace(engine, self.spec, self.run_dir, self.rank, self.device,
                            after=self.memory.sample if self.memory is not None else None)
        self.tracer.set_origin(origin)

    def status(self, doing: str, *, step: int | None, detail: str = "") -> None:
        """What this rank does now (a phase between instructions: ``"repartition"``, ``"restart"``
        ...), in its status slot (`StatusSlot`: read when a job hangs or fails)."""
        if self.tracer is not None and self.tracer.status is not None:
            self.tracer.status.write(step=step, doing=doing, detail=detail)

    def fault_point(self, step: int, point: str) -> None:
        """Inject `spec.fault` here if it names this point (`utils.runtime.faults`)."""
        if self.tracer is not None and self.tracer.before is not None:
            self.tracer.before(step, point, None)

    def sync_device(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def record_layer_costs(self, step: int, costs: dict[int, tuple[float, float]]) -> None:
        """Append one step's measured per-layer costs to this rank's record."""
        from utils.runtime.dynamic import layer_costs_line

        if self._costs_file is None:
            self._costs_file = LineAppender(self.run_dir.layer_costs_file(self.rank))
        self._costs_file.write([layer_costs_line(step, costs)])
        self.record_lines["layer_costs"] = self._costs_file.lines

    @property
    def stage(self) -> int:
        return self.engine.stage_id

    @property
    def replica(self) -> int:
        return self.engine.grid.data_parallel_id


class StepHook(Protocol):
    """Called by the loop around every training step of this rank."""

    def before_step(self, state: RankState, step: int) -> None: ...

    def after_step(self, state: RankState, step: int, loss: float, seconds: float) -> None: ...


def use_device(device: str) -> None:
    """Make DeepSpeed's accelerator the plan's `device` (``"cpu"`` or ``"cuda"``).

    DeepSpeed picks its accelerator once, at first use, from ``DS_ACCELERATOR`` or else by
    probing (`deepspeed.accelerator.real_accelerator`). A rank started without the variable,
    or with a stale one (a pasted command, another launcher), would otherwise pair DeepSpeed's
    CPU accelerator with NCCL and ``cuda:N``, or the reverse, and crash. The device the
    launcher resolved is in the plan; this sets the variable from it before DeepSpeed is
    imported, and refuses if DeepSpeed already chose another accelerator in this process.
    """
    os.environ["DS_ACCELERATOR"] = device
    chosen = getattr(sys.modules.get("deepspeed.accelerator.real_accelerator"), "ds_accelerator", None)
    if chosen is not None and chosen._name != device:
        raise RuntimeError(f"DeepSpeed already uses its {chosen._name!r} accelerator in this process, "
                           f"but the plan says {device!r}: set DS_ACCELERATOR={device} before importing deepspeed")


def setup(run_dir: RunDir, rank: int) -> tuple[RankState, list[StepHook]]:
    """This rank's state at the plan's boundaries, and the hooks the spec asks for."""
    plan = run_dir.read_plan()
    device = plan["device"]
    use_device(device)  # before anything below imports DeepSpeed

    from utils.runtime.dynamic import Curriculum, Freezer, MicroBatching, Repartitioner
    from utils.runtime.frozen import FrozenPrefix
    from utils.runtime.layercost import LayerCostMeter
    from utils.runtime.memory import MemoryMeter
    from utils.runtime.tracing import CudaClock, HostClock
    from utils.system.cpu import prepare_cpu_rank
    from utils.workloads.models import batches, get_model
    from utils.workloads.varlen import batches_for

    from utils.runtime.restart import pending, resume

    spec = JobSpec.from_dict(run_dir.read_spec())
    restart = pending(run_dir)
    boundaries = list(restart["new"] if restart else plan["partition"]["parts"])
    if device == "cpu":
        prepare_cpu_rank()  # threads, and the allocator the profile measured with
    model = get_model(spec.model, spec.model_options)
    state = RankState(spec=spec, run_dir=run_dir, rank=rank, device=device, model=model, boundaries=boundaries,
                      engine=None, tracer=None, data=None,
                      frozen=FrozenPrefix() if spec.freeze_at else None,
                      meter=LayerCostMeter(CudaClock() if device == "cuda" else HostClock()) if spec.rebalance
                      else None, memory=MemoryMeter(device))
    engine = state.build_engine(boundaries)
    state.adopt(engine, boundaries)
    state.data = (batches_for(spec, model, replica=engine.grid.data_parallel_id) if _varies(spec) else
                  batches(model, seed=spec.seed, micro_batch_size=spec.micro_batch_size,
                          replica=engine.grid.data_parallel_id))
    if restart:
        state.origin_wall = restart["origin_wall"]
        state.first_step = resume(state, restart)
        if state.frozen is not None:  # what froze before the restart stays frozen
            state.frozen.freeze(engine, max((n for step, n in spec.freeze_at.items() if step < state.first_step),
                                            default=0))
    hooks: list[StepHook] = []
    if spec.freeze_at:
        hooks.append(Freezer())
    if spec.seq_len_at:
        hooks.append(Curriculum())
    if spec.repartition_at or spec.rebalance:
        hooks.append(Repartitioner(state))
    if _varies(spec):
        hooks.append(MicroBatching(state))  # last: it sets the count on the engine the step runs on
    return state, hooks


def train(state: RankState, hooks: Sequence[StepHook] = ()) -> None:
    """Run every step, appending events and progress to the run directory after each."""
    import json

    if state.origin_wall is None:
        origin, state.origin_wall = _common_origin()
    else:  # a relaunched job: the same t = 0 as before the restart
        origin = time.perf_counter() - (time.time() - state.origin_wall)
    shift = state.tracer.origin - origin  # events queued before t = 0 was known (a restart's)
    state.pending_events = [replace(e, start=e.start + shift, end=e.end + shift) for e in state.pending_events]
    state.tracer.set_origin(origin)
    files = state.run_dir.rank_records(state.rank)
    with (LineAppender(files["events"]) as events_file, LineAppender(files["progress"]) as progress_file,
          LineAppender(files["memory"]) as memory_file):
        for step in range(state.first_step, state.spec.steps):
            for hook in hooks:
                hook.before_step(state, step)
            state.memory.begin_step()
            state.tracer.begin_step(step)
            started = time.perf_counter()
            loss = float(state.engine.train_batch(data_iter=state.data))
            events = state.pending_events + state.tracer.end_step()  # on GPU this synchronizes
            state.pending_events, state.last_events = [], events
            seconds = time.perf_counter() - started
            events_file.write(json.dumps(asdict(e)) for e in events)
            progress_file.write([json.dumps({"step": step, "loss": loss, "seconds": seconds})])
            memory = state.memory.end_step(step)
            if memory is not None:
                memory_file.write([json.dumps(memory)])
            state.record_lines.update(events=events_file.lines, progress=progress_file.lines, memory=memory_file.lines)
            for hook in hooks:
                hook.after_step(state, step, loss, seconds)


def report(state: RankState) -> None:
    import torch

    from utils.runtime.commslog import raw_record
    from utils.runtime.frozen import local_layers
    from utils.runtime.migrate import MOVES

    peak, memory_kind = _peak_memory(state.device)
    parts = list(state.engine.module.parts)
    # Each local layer's final weights as (sum, sum of squares) in float64, enough to tell a frozen layer
    # that never changed or two runs that ended alike; detached (float() of one requiring grad warns).
    fingerprints = {str(i): [sum(float(p.detach().double().sum()) for p in layer.parameters()),
                             sum(float(p.detach().double().square().sum()) for p in layer.parameters())]
                    for i, layer in local_layers(state.engine).items()}
    state.run_dir.write_result(RankResult(
        rank=state.rank, stage=state.stage, replica=state.replica, parts=tuple(parts),
        layers=(parts[state.stage], parts[state.stage + 1]), peak_memory=MemoryRecord(kind=memory_kind, peak=peak),
        chunk_layers=tuple(map(tuple, state.engine.chunk_layers())) if state.spec.model_chunks > 1 else (),
        device=state.device, threads=torch.get_num_threads(), layer_fingerprints=fingerprints,
        record_lines=dict(state.record_lines), comms=raw_record(),  # DeepSpeed's comms logger, if on
        extra={"live_moves": list(MOVES)} if MOVES else {}))  # each live move's process groups and memory


def _common_origin() -> tuple[float, float]:
    """The host time every rank calls t = 0, and rank 0's wall-clock time then. Ranks on rank
    0's machine share its monotonic clock, so they take rank 0's reading as is (exact); ranks
    elsewhere map it through the wall clock (as good as the machines' clock sync)."""
    import socket

    import torch.distributed as dist

    reading = [(socket.gethostname(), time.time(), time.perf_counter())]
    dist.broadcast_object_list(reading, src=0)
    host, wall, perf = reading[0]
    if host == socket.gethostname():
        return perf, wall
    return time.perf_counter() - (time.time() - wall), wall


def _peak_memory(device: str) -> tuple[int, str]:
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(), "cuda_max_memory_allocated"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu_max_rss"


def _record_into(requested: RunDir) -> tuple[RunDir, str | None]:
    """The run directory this launch records into, and why when it is not `requested`.

    A run directory belongs to the launch that created it: the launcher writes a token into
    it and hands the same token to the ranks. Without it (``command.txt`` run by hand, or
    run again) the ranks would append a second copy of every step to the same record, so
    they record into a new sibling directory instead. All ranks must agree on it without
    talking to each other (no process group exists yet): its name comes from torchrun's run
    id, the same in every rank of one torchrun. Each rank creates it and copies the spec
    and the plan (atomic writes of identical content, so racing ranks are harmless).
    """
    expected = os.environ.get(RUN_TOKEN_ENV)
    try:
        recorded = requested.file(RunDir.LAUNCH_TOKEN).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = None
    spec = requested.read_spec()
    if (expected and expected == recorded) or spec is None:  # no spec: not a run, setup says so
        return requested, None
    # Without torchrun (a single rank started by hand) there is no one to agree with.
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or secrets.token_hex(3)
    suffix = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_id)[:6]
    fresh = RunDir(requested.path.with_name(f"{requested.name}-rerun-{suffix}"))
    fresh.path.mkdir(parents=True, exist_ok=True)
    plan = requested.read_plan()
    if not fresh.file(RunDir.SPEC).exists():
        fresh.write_spec(spec)
    if plan is not None and not fresh.file(RunDir.PLAN).exists():
        fresh.write_plan(plan)
    why = ("that directory belongs to the launch that created it and this torchrun is another "
           "(its command.txt run by hand?); appending would mix two runs in one record" if recorded else
           "that directory holds no launch token, so it may already hold another run's record")
    return fresh, why


class TerminalProgress:
    """Rank 0's phases and steps, one line each, on the terminal a job was started from by
    hand (its ``command.txt``): everything else a rank prints goes to its log, so without
    this a terminal run shows nothing for its whole length. A `StepHook`."""

    def __init__(self, out, run_dir: RunDir):
        self.out, self.run_dir, self.started = out, run_dir, time.time()

    def say(self, text: str) -> None:
        try:
            print(f"[rank 0 · {time.time() - self.started:.0f} s] {text}", file=self.out, flush=True)
        except (OSError, ValueError):  # the terminal is gone (closed, a broken pipe): train on
            pass

    def before_step(self, state: RankState, step: int) -> None:
        if step == 0:
            self.say(f"引擎就绪，开始训练 (engine ready; training {state.spec.steps} steps)")

    def after_step(self, state: RankState, step: int, loss: float, seconds: float) -> None:
        n = state.spec.steps
        self.say(f"第 {step + 1}/{n} 步 (step {step + 1}/{n}) · loss {loss:.4f} · {seconds:.2f} s/step")


def _terminal_progress(run_dir: RunDir, moved: str | None) -> TerminalProgress | None:
    """For rank 0 of a run started by hand (`_record_into` moved it): a `TerminalProgress`
    on a copy of the terminal's stdout, taken before `redirect_output` replaces it."""
    if own_rank() != 0 or moved is None:
        return None
    return TerminalProgress(os.fdopen(os.dup(1), "w", buffering=1), run_dir)


def main(path: str, *, forked: bool = False) -> None:
    """Run this rank of the job whose run directory is `path`.

    A rank of its own interpreter (torchrun's) ends here with ``os._exit``: interpreter
    teardown can hang in process-group destructors on gloo. A rank `forked` from a fork
    server (`forked_main`) returns instead: elastic's agent waits for every rank's return
    value, and the fork server ends the process with ``os._exit`` after it."""
    rank = own_rank()
    exit_with_parent()
    run_dir, moved = _record_into(RunDir(Path(path).resolve()))
    if moved and rank == 0:  # the one line a terminal shows before the output goes to the logs
        print(f"this run is recorded in {run_dir.path}, not in {path}: {moved}", flush=True)
    terminal = _terminal_progress(run_dir, moved)
    redirect_output(run_dir)
    record_placement(run_dir)
    dump_stacks_on_signal(run_dir)  # the launcher asks for every rank's stacks when a job hangs
    try:
        if terminal:
            terminal.say("正在导入并构建 DeepSpeed 引擎 (setting up DeepSpeed: a few seconds; the first job in "
                         "an environment also compiles its communication op, 1-2 min)")
        state, hooks = setup(run_dir, rank)
        train(state, hooks + ([terminal] if terminal else []))
        report(state)
        if terminal:
            terminal.say(f"完成 (done): {state.spec.steps} steps; record in {run_dir.path}")
    except RankExit:  # ended early on purpose (a restart's checkpoint is written): not a failure
        pass
    except BaseException as exc:  # record why, then fail loudly so the launcher stops the others
        lift_memory_cap()  # an injected memory cap (`utils.runtime.faults`) must not stop the record
        if terminal:
            terminal.say(f"失败 (failed): {type(exc).__name__}: {exc}; log: {run_dir.rank_log(rank)}")
        spec = run_dir.read_spec() or {}
        run_dir.write_error(rank, {
            # DeepSpeed's stage-major layout, from the spec: known even when no engine was built.
            "rank": rank, "stage": rank // spec.get("data_parallel", 1), "time": time.time(),
            "type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()})
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    if not forked:
        os._exit(0)


def forked_main(path: str) -> None:
    """`main` for a rank that elastic's agent forked from a fork server (`utils.runtime.warm_agent`)."""
    main(path, forked=True)


if __name__ == "__main__":
    main(sys.argv[1])
