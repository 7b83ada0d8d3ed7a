"""The program every rank of a pipeline job runs: ``python -m utils.runtime.rank RUN_DIR``.

Started by the launcher (`utils.jobs.launchers`), one process per rank. It reads the job's
spec and plan from the run directory (`utils.jobs.rundir.RunDir`: the device and the
boundaries were decided once, before launch), builds the `PipelineModule` and the DeepSpeed
engine, installs the schedule and then the tracer, trains, and writes what it saw back into
the run directory.

The training loop has one seam: `StepHook`s run before and after every step with the
`RankState` (engine, tracer, stage ...). Anything that changes a running job between steps —
re-partitioning, a new micro-batch count, per-layer measurement — is a hook that may
replace ``state.engine``; the loop itself stays this short.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from utils.jobs.rundir import RunDir, StatusSlot
from utils.jobs.spec import JobSpec

RANK = int(os.environ.get("RANK", "0"))


@dataclass
class RankState:
    """What one rank holds while it trains; hooks may replace `engine` between steps."""

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
    """The iterator of micro-batches `engine.train_batch` reads."""

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


def build_module(spec: JobSpec, model, boundaries: Sequence[int]):
    """The `PipelineModule` for `spec`, split at `boundaries`.

    DeepSpeed partitions inside ``PipelineModule.__init__`` through ``_partition_layers``:
    the one documented place to impose boundaries instead of computing them (DESIGN.md).
    """
    from deepspeed.pipe import PipelineModule

    from utils.workloads.models import seed_layer

    class FixedPartitionModule(PipelineModule):
        def _partition_layers(self, method="uniform"):
            self.parts = list(boundaries)
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

    return FixedPartitionModule(layers=model.layer_specs(), num_stages=spec.num_stages,
                                loss_fn=model.loss_fn, seed_layers=True, base_seed=spec.seed,
                                seed_fn=seed_layer)


def build_engine(spec: JobSpec, model, boundaries: Sequence[int], device: str):
    """The module and its DeepSpeed engine, with the spec's schedule installed.

    The distributed process group is initialised once per process; building a second engine
    (a re-partition) reuses it.
    """
    import deepspeed
    import torch

    from utils.jobs.config import deepspeed_config
    from utils.runtime.lowering import install_schedule

    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    module = build_module(spec, model, boundaries)
    engine, _, _, _ = deepspeed.initialize(
        model=module, model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=deepspeed_config(spec))
    if spec.schedule != "1f1b":  # "1f1b" is DeepSpeed's own TrainSchedule
        install_schedule(engine, spec.schedule)
    return engine


def trace(engine, spec: JobSpec, run_dir: RunDir, rank: int, device: str):
    """Install the tracer on `engine`. Always after `build_engine`: the tracer wraps the
    instruction map it finds, including the schedule's loss stash."""
    from utils.runtime.faults import fault_hook
    from utils.runtime.tracing import CudaClock, HostClock, InstructionTracer

    return InstructionTracer(engine, stage=engine.stage_id, rank=rank, status=StatusSlot(run_dir.status_slot(rank)),
                             clock=CudaClock() if device == "cuda" else HostClock(),
                             before=fault_hook(spec, engine.stage_id, engine.grid.data_parallel_id == 0))


def setup(run_dir: RunDir, rank: int) -> RankState:
    from utils.system.cpu import prepare_cpu_rank
    from utils.workloads.models import batches, get_model

    spec = JobSpec.from_dict(run_dir.read_spec())
    plan = run_dir.read_plan()
    device, boundaries = plan["device"], list(plan["partition"]["parts"])
    if device == "cpu":
        prepare_cpu_rank()  # threads, and the allocator the profile measured with
    model = get_model(spec.model, spec.model_options)
    engine = build_engine(spec, model, boundaries, device)
    data = batches(model, seed=spec.seed, micro_batch_size=spec.micro_batch_size,
                   replica=engine.grid.data_parallel_id)
    return RankState(spec=spec, run_dir=run_dir, rank=rank, device=device, model=model, boundaries=boundaries,
                     engine=engine, tracer=trace(engine, spec, run_dir, rank, device), data=data)


def train(state: RankState, hooks: Sequence[StepHook] = ()) -> None:
    """Run every step, appending events and progress to the run directory after each."""
    import json

    state.tracer.set_origin(_common_origin())
    run_dir, rank = state.run_dir, state.rank
    with open(run_dir.events(rank), "a") as events_file, open(run_dir.progress_file(rank), "a") as progress_file:
        for step in range(state.spec.steps):
            for hook in hooks:
                hook.before_step(state, step)
            state.tracer.begin_step(step)
            started = time.perf_counter()
            loss = float(state.engine.train_batch(data_iter=state.data))
            events = state.tracer.end_step()  # on GPU this synchronizes, so the step time is real
            seconds = time.perf_counter() - started
            events_file.write("".join(json.dumps(asdict(e)) + "\n" for e in events))
            events_file.flush()
            progress_file.write(json.dumps({"step": step, "loss": loss, "seconds": seconds}) + "\n")
            progress_file.flush()
            for hook in hooks:
                hook.after_step(state, step, loss, seconds)


def report(state: RankState) -> None:
    import torch

    peak, memory_kind = _peak_memory(state.device)
    parts = list(state.engine.module.parts)
    state.run_dir.write_result(state.rank, {
        "rank": state.rank, "stage": state.stage, "replica": state.replica, "parts": parts,
        "layers": [parts[state.stage], parts[state.stage + 1]], "peak_memory_bytes": peak,
        "memory_kind": memory_kind, "device": state.device, "threads": torch.get_num_threads()})


def _common_origin() -> float:
    """The host time every rank calls t = 0. Ranks on rank 0's machine share its monotonic
    clock, so they take rank 0's reading as is (exact); ranks elsewhere map it through the
    wall clock (as good as the machines' clock sync)."""
    import socket

    import torch.distributed as dist

    reading = [(socket.gethostname(), time.time(), time.perf_counter())]
    dist.broadcast_object_list(reading, src=0)
    host, wall, perf = reading[0]
    if host == socket.gethostname():
        return perf
    return time.perf_counter() - (time.time() - wall)


def _peak_memory(device: str) -> tuple[int, str]:
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(), "cuda_max_memory_allocated"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu_max_rss"


def _redirect_output(run_dir: RunDir) -> None:
    """Send this rank's stdout and stderr to its own log before anything can print."""
    log = open(run_dir.rank_log(RANK), "ab", buffering=0)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def _exit_with_parent() -> None:
    """End this rank if its launcher disappears, so no orphan outlives a killed job."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def main() -> None:
    run_dir = RunDir(Path(sys.argv[1]).resolve())
    _redirect_output(run_dir)
    _exit_with_parent()
    try:
        state = setup(run_dir, RANK)
        train(state)
        report(state)
    except BaseException as exc:  # record why, then fail loudly so the launcher stops the others
        spec = run_dir.read_spec() or {}
        run_dir.write_error(RANK, {
            # DeepSpeed's stage-major layout, from the spec: known even when no engine was built.
            "rank": RANK, "stage": RANK // spec.get("data_parallel", 1), "time": time.time(),
            "type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()})
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: process-group destructors can hang on gloo


if __name__ == "__main__":
    main()
