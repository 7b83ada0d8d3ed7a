"""Record a DeepSpeed pipeline job that a script of your own runs: ``utils.record(engine)``.

The workbook's jobs are recorded by their rank program (`utils.runtime.rank`). A learner's own
training script — their model, data, loss and launcher (``deepspeed train.py``, torchrun,
SLURM) — adds two lines instead::

    import utils
    engine, *_ = deepspeed.initialize(...)           # the script's own line
    utils.record(engine, out="runs/my-job")          # every rank, right after it

and from then on every ``engine.train_batch()`` is recorded into the workbook's run directory
format, which `utils.Run.load` reads back like any job's: per-rank events through the same
`InstructionTracer` (host clock on CPU, CUDA events resolved once per step on a GPU), the
loss and time of every step, memory in use at every instruction, each local layer's forward
and backward cost through the `LayerCostMeter` the dynamic half uses, and at exit each rank's
result (peak memory, how many lines it wrote) or, when the script raises, its error. It rides
on the script's own ranks: no process, no port, no launcher; one broadcast agrees on the run
directory, and the first step one more to agree on t = 0.

What the run directory says about the job is read from the engine: stages, data-parallel
replicas, micro-batches and their size, the partition (``engine.module.parts``), every layer's
name and parameter count (gathered from the ranks that built them), the device, the learning
rate and the DeepSpeed config. The model itself stays in the script: the spec names it
``"recorded"`` (`utils.workloads.presets`), so the run can be read, drawn, diagnosed and
re-partitioned on paper, but not rebuilt by `run_job`.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from utils.jobs.records import MemoryRecord, RankResult, StatusSlot
from utils.jobs.rundir import RunDir
from utils.jobs.spec import JobSpec
from utils.system.fileio import LineAppender
from utils.workloads.presets import RECORDED, recorded_model

__all__ = ["Recorder", "record"]



LAYER_COST_EVERY = 4
"""`utils.record` times every layer on steps 1, 1 + 4, 1 + 8, ...: the meter's hooks cost a few
tens of microseconds per layer and micro-batch, 1-4 % of a step of millisecond CPU layers
(`benchmarks/record_overhead.py`); one step in four keeps the recorder within 3 % with a margin
and still gives the partition suggestion a median over several steps."""


def record(engine, out: str | Path | None = None, *, name: str = "", layer_costs: bool = True,
           layer_cost_every: int = LAYER_COST_EVERY) -> Recorder:
    """Start recording `engine` (a DeepSpeed ``PipelineEngine``) into run directory `out`.

    Call it on every rank, once, after ``deepspeed.initialize`` and before the first
    ``train_batch``. `out`: the run directory (created; on a filesystem every node sees, for a
    job on several nodes); None makes a new one under `utils.runs_dir()`, named after the script
    and `name`. `layer_costs`: also time every local layer (a few clock reads per layer and
    micro-batch; off: the stage's instructions only). Returns the `Recorder` (its ``path`` is the
    run directory); it finishes by itself when the script exits.
    """
    return Recorder(engine, out, name=name, layer_costs=layer_costs, layer_cost_every=layer_cost_every)


class Recorder:
    """Records one rank of a script's pipeline engine (see the module docstring)."""

    def __init__(self, engine, out: str | Path | None, *, name: str = "", layer_costs: bool = True,
                 layer_cost_every: int = LAYER_COST_EVERY):
        import torch.distributed as dist

        from utils.runtime.layercost import LayerCostMeter
        from utils.runtime.lifecycle import record_placement
        from utils.runtime.memory import MemoryMeter
        from utils.runtime.tracing import CudaClock, HostClock, InstructionTracer

        if not hasattr(engine, "train_batch") or not hasattr(engine, "_INSTRUCTION_MAP"):
            raise TypeError(f"utils.record needs the pipeline engine deepspeed.initialize returned for a "
                            f"PipelineModule, got {type(engine).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("utils.record: the process group is not initialised; call it after deepspeed.initialize")
        if not isinstance(layer_cost_every, int) or isinstance(layer_cost_every, bool) or layer_cost_every < 1:
            raise ValueError(f"utils.record: layer_cost_every must be a whole number >= 1 (1 times every step), "
                             f"got {layer_cost_every!r}")
        if getattr(engine, "workbook_recorder", None) is not None:
            raise RuntimeError("utils.record was already called on this engine")
        self.engine, self.rank = engine, dist.get_rank()
        self.device = "cuda" if engine.device.type == "cuda" else "cpu"
        self.run_dir = RunDir(_agree_on_path(out, name))
        self.spec = self._describe(name)
        if self.rank == 0:
            self.run_dir.write_spec(self.spec.to_dict())
            self.run_dir.write_plan({"device": self.device, "threads": None, "notes": [_note()],
                                     "partition": {"parts": [int(b) for b in engine.module.parts],
                                                   "method": _method(engine),
                                                   "predicted_stage_costs": None, "layer_costs": None,
                                                   "profile": None},
                                     "launcher": "script", "nodes": []})
            self.run_dir.write_command(" ".join([sys.executable, *sys.argv]))
        dist.barrier()  # the spec exists before any rank appends to the directory
        record_placement(self.run_dir)  # its node and host: a job on several nodes is drawn and linked per node
        clock = CudaClock() if self.device == "cuda" else HostClock()
        self.memory = MemoryMeter(self.device)
        self.meter = LayerCostMeter(CudaClock() if self.device == "cuda" else HostClock()) if layer_costs else None
        if self.meter is not None:  # before the tracer: it times the meter's wrapped backward too
            self.meter.install(engine)
        self.tracer = InstructionTracer(engine, stage=engine.stage_id, rank=self.rank, clock=clock,
                                        status=StatusSlot(self.run_dir.status_slot(self.rank)),
                                        after=self.memory.sample)
        files = self.run_dir.rank_records(self.rank)
        self._files = {kind: LineAppender(path) for kind, path in files.items()}
        self._costs = LineAppender(self.run_dir.layer_costs_file(self.rank)) if layer_costs else None
        self.layer_cost_every = layer_cost_every
        self.steps = 0
        self.enabled = True
        self.finished = False
        self._origin_known = False
        self._train_batch = engine.train_batch
        engine.train_batch = self.train_batch  # on the instance: the class stays untouched
        engine.workbook_recorder = self
        self._excepthook = sys.excepthook
        sys.excepthook = self._on_error
        atexit.register(self.finish)

    @property
    def path(self) -> Path:
        return self.run_dir.path

    # --- what the run is ------------------------------------------------------------------------
    def _describe(self, name: str) -> JobSpec:
        """The job as a `JobSpec` read from the engine (every rank computes it; rank 0 writes it)."""
        import torch.distributed as dist

        from utils.runtime.frozen import local_layers

        engine = self.engine
        mine = {index: sum(p.numel() for p in layer.parameters())
                for index, layer in local_layers(engine).items()}
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        params = {int(k): v for found in gathered for k, v in found.items()}
        names = [_layer_name(spec) for spec in engine.module._layer_specs]
        optimizer = getattr(engine, "optimizer", None)
        lr = float(optimizer.param_groups[0]["lr"]) if optimizer is not None and optimizer.param_groups else 1e-3
        return JobSpec(model=RECORDED, model_options=recorded_model(names, [params.get(i, 0) for i in range(len(names))]),
                       num_stages=engine.num_stages, data_parallel=engine.grid.data_parallel_size,
                       micro_batches=engine.micro_batches, micro_batch_size=engine.train_micro_batch_size_per_gpu(),
                       partition=tuple(int(b) for b in engine.module.parts), steps=1, lr=lr or 1e-3,
                       device=self.device, name=name or Path(sys.argv[0]).stem, strict=False,
                       deepspeed_config=_config_of(engine))

    def enable(self, on: bool) -> None:
        """Record the coming steps or not (between steps; `benchmarks/record_overhead.py`
        alternates): off, ``train_batch`` is the engine's own and nothing is written."""
        self.enabled = on
        self.tracer.enable(on)
        if self.meter is not None:
            self.meter.enabled = on

    def times_layers(self, step: int) -> bool:
        """Whether recorded step `step` times every layer: steps 1, 1 + k, 1 + 2k, ... for
        ``layer_cost_every = k > 1``; every step for 1."""
        every = self.layer_cost_every
        return every == 1 or step % every == 1

    # --- every step -----------------------------------------------------------------------------
    def train_batch(self, *args, **kwargs):
        """The engine's own ``train_batch``, recorded (while `enabled`)."""
        from utils.runtime.rank import _common_origin

        if not self.enabled:
            return self._train_batch(*args, **kwargs)

        if not self._origin_known:  # every rank's first step: one broadcast of rank 0's clock
            origin, _ = _common_origin()
            self.tracer.set_origin(origin)
            self._origin_known = True
        step = self.steps
        if self.meter is not None:
            self.meter.enabled = self.times_layers(step)
        self.memory.begin_step()
        self.tracer.begin_step(step)
        started = time.perf_counter()
        loss = self._train_batch(*args, **kwargs)
        events = self.tracer.end_step()
        seconds = time.perf_counter() - started
        self._files["events"].write(json.dumps(asdict(e)) for e in events)
        value = float(loss) if loss is not None else None
        self._files["progress"].write([json.dumps({"step": step, "loss": value, "seconds": seconds})])
        memory = self.memory.end_step(step)
        if memory is not None:
            self._files["memory"].write([json.dumps(memory)])
        if self.meter is not None and (costs := self.meter.take_step()):
            from utils.runtime.dynamic import layer_costs_line

            self._costs.write([layer_costs_line(step, costs)])
        self.steps += 1
        return loss

    # --- the end --------------------------------------------------------------------------------
    def finish(self) -> None:
        """Write this rank's result (and, on rank 0, the step count into the spec). Runs at exit."""
        if self.finished:
            return
        self.finished = True
        import torch

        for appender in [*self._files.values(), *([self._costs] if self._costs else [])]:
            appender.close()
        lines = {kind: appender.lines for kind, appender in self._files.items()}
        if self._costs is not None:
            lines["layer_costs"] = self._costs.lines
        if self.rank == 0:  # the loop's length is known now
            self.run_dir.write_spec({**self.spec.to_dict(), "steps": max(1, self.steps)})
        parts = [int(b) for b in self.engine.module.parts]  # numpy integers under partition_method="parameters"
        stage = self.engine.stage_id
        peak, kind = ((torch.cuda.max_memory_allocated(), "cuda_max_memory_allocated") if self.device == "cuda"
                      else (_max_rss(), "cpu_max_rss"))
        self.run_dir.write_result(RankResult(
            rank=self.rank, stage=stage, replica=self.engine.grid.data_parallel_id, device=self.device,
            parts=tuple(parts), layers=(parts[stage], parts[stage + 1]),
            peak_memory=MemoryRecord(kind=kind, peak=peak), threads=torch.get_num_threads(), record_lines=lines))

    def _on_error(self, kind, value, tb) -> None:
        """The script raised: record why on this rank (as the rank program does), then let Python report it."""
        try:
            self.run_dir.write_error(self.rank, {
                "rank": self.rank, "stage": self.engine.stage_id, "time": time.time(), "type": kind.__name__,
                "message": str(value), "traceback": "".join(traceback.format_exception(kind, value, tb))})
            self.finished = True  # no result: the rank failed
        finally:
            self._excepthook(kind, value, tb)


def _agree_on_path(out: str | Path | None, name: str) -> Path:
    """Rank 0's run directory, created, for every rank (one broadcast)."""
    import torch.distributed as dist

    found: list[Any] = [None]
    if dist.get_rank() == 0:
        if out is None:
            path = RunDir.create(name or Path(sys.argv[0]).stem).path
        else:
            path = Path(out).resolve()
            path.mkdir(parents=True, exist_ok=True)
        found = [str(path)]
    dist.broadcast_object_list(found, src=0)
    return Path(found[0])


def _layer_name(spec) -> str:
    typename = getattr(spec, "typename", None)
    if typename is not None:
        return typename.__name__
    return getattr(spec, "__name__", None) or type(spec).__name__


def _method(engine) -> str:
    return str(getattr(engine.module, "partition_method", "parameters"))


def _config_of(engine) -> dict:
    config = getattr(getattr(engine, "_config", None), "_param_dict", None)
    try:
        return json.loads(json.dumps(config)) if isinstance(config, dict) else {}
    except (TypeError, ValueError):
        return {}


def _max_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _note() -> str:
    return (f"recorded from the script's own ranks by utils.record (pid {os.getpid()} on rank 0); the model, "
            "data and launcher are the script's")
