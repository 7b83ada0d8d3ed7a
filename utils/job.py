"""The program every rank of a pipeline job runs: ``python -m utils.job RUN_DIR``.

Started by torchrun (see `utils.launch`), one process per rank. It reads the job's
``spec.json``, builds the `PipelineModule` and the DeepSpeed engine, installs the tracer,
trains, and writes what it saw into the run directory:

- ``rank{r}.log``            everything the rank printed
- ``status-rank{r}``         the instruction it is executing now (read when a job hangs)
- ``events-rank{r}.jsonl``   one traced instruction per line, appended after every step
- ``progress-rank{r}.jsonl`` step, loss and step time, one line per step
- ``result-rank{r}.json``    on success: stage, boundaries, peak memory, device
- ``error-rank{r}.json``     on failure: stage, exception and traceback
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path

RANK = int(os.environ.get("RANK", "0"))


def _redirect_output(run_dir: Path) -> None:
    """Send this rank's stdout and stderr to its own log before anything can print."""
    log = open(run_dir / f"rank{RANK}.log", "ab", buffering=0)
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


def build_module(spec, model, parts: list[int]):
    """The `PipelineModule` for `spec`, split at the boundaries `parts` the launcher chose."""
    from deepspeed.pipe import PipelineModule

    from .models import seed_layer

    class FixedPartitionModule(PipelineModule):
        """DeepSpeed partitions inside ``__init__`` through ``_partition_layers``: the one place
        to impose boundaries instead of computing them."""

        def _partition_layers(self, method="uniform"):
            self.parts = list(parts)
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

    return FixedPartitionModule(layers=model.layer_specs(), num_stages=spec.num_stages,
                                loss_fn=model.loss_fn, seed_layers=True, base_seed=spec.seed,
                                seed_fn=seed_layer)


def build_engine(spec, model, parts: list[int]):
    """Initialise distributed, then the module and the engine (GPipe installed if asked)."""
    import deepspeed
    import torch

    device = spec.resolved_device()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    module = build_module(spec, model, parts)
    engine, _, _, _ = deepspeed.initialize(
        model=module, model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=spec.deepspeed_config())
    if spec.schedule == "gpipe":
        from .engine_schedules import use_gpipe

        use_gpipe(engine)
    return engine


def _fault_hook(spec, stage: int, is_first_replica: bool):
    fault = spec.fault
    if fault is None or stage != fault.stage or not is_first_replica:
        return None

    def before(step, kind, micro_batch):
        if step == fault.step and kind == fault.instruction and micro_batch in (None, 0):
            message = f"injected fault: stage {stage} fails at step {step} in {kind}"
            if fault.kind == "raise":
                raise RuntimeError(message)
            print(message, flush=True)
            if fault.kind == "exit":
                os._exit(3)
            if fault.kind == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            while True:  # "hang": block like a rank stuck in a collective
                time.sleep(3600)

    return before


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


def run(run_dir: Path) -> None:
    from .cpu_setup import prepare_cpu_rank
    from .models import batches, get_model
    from .runs import write_json
    from .spec import JobSpec
    from .tracing import CudaClock, HostClock, InstructionTracer, StatusSlot

    spec = JobSpec.from_dict(json.loads((run_dir / "spec.json").read_text()))
    device = spec.resolved_device()
    import torch

    if device == "cpu":
        prepare_cpu_rank()  # threads, and the allocator the profile measured with
    model = get_model(spec.model, spec.model_options)
    engine = build_engine(spec, model, json.loads((run_dir / "partition.json").read_text())["parts"])
    stage, replica = engine.stage_id, engine.grid.data_parallel_id
    status = StatusSlot(run_dir / f"status-rank{RANK}")
    tracer = InstructionTracer(engine, stage=stage, rank=RANK, status=status,
                               clock=CudaClock() if device == "cuda" else HostClock(),
                               before=_fault_hook(spec, stage, replica == 0))
    data = batches(model, seed=spec.seed, micro_batch_size=spec.micro_batch_size, replica=replica)

    tracer.set_origin(_common_origin())
    with open(run_dir / f"events-rank{RANK}.jsonl", "a") as events_file, \
            open(run_dir / f"progress-rank{RANK}.jsonl", "a") as progress_file:
        for step in range(spec.steps):
            tracer.begin_step(step)
            started = time.perf_counter()
            loss = engine.train_batch(data_iter=data)
            events = tracer.end_step()  # on GPU this synchronizes, so the step time is real
            seconds = time.perf_counter() - started
            events_file.write("".join(json.dumps(asdict(e)) + "\n" for e in events))
            events_file.flush()
            progress_file.write(json.dumps({"step": step, "loss": float(loss), "seconds": seconds}) + "\n")
            progress_file.flush()
    peak, memory_kind = _peak_memory(device)
    write_json(run_dir / f"result-rank{RANK}.json", {
        "rank": RANK, "stage": stage, "replica": replica, "parts": list(engine.module.parts),
        "layers": [engine.module.parts[stage], engine.module.parts[stage + 1]],
        "peak_memory_bytes": peak, "memory_kind": memory_kind, "device": device,
        "threads": torch.get_num_threads()})


def main() -> None:
    run_dir = Path(sys.argv[1]).resolve()
    _redirect_output(run_dir)
    _exit_with_parent()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        run(run_dir)
    except BaseException as exc:  # record why, then fail loudly so torchrun stops the others
        from .runs import write_json

        write_json(run_dir / f"error-rank{RANK}.json", {
            "rank": RANK, "stage": _stage_of(run_dir, RANK), "time": time.time(),
            "type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()})
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: process-group destructors can hang on gloo


def _stage_of(run_dir: Path, rank: int) -> int:
    """A rank's pipeline stage, by DeepSpeed's stage-major layout (rank = stage × dp + replica);
    read from the spec so it is known even when the engine was never built."""
    spec = json.loads((run_dir / "spec.json").read_text())
    return rank // spec.get("data_parallel", 1)


if __name__ == "__main__":
    main()
