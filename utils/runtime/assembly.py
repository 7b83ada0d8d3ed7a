"""How a rank's engine is put together: the one room where the workbook changes it.

Five things wrap a DeepSpeed engine's instruction map (``engine._INSTRUCTION_MAP``, the table
``PipelineEngine._exec_schedule`` looks every instruction up in), and each wraps what it finds
there, so their order decides what is timed and what a fault hits. `WRAP_ORDER` is that order,
innermost first, and `build_engine` + `trace` apply it (tests/unit/test_assembly.py checks the
two agree):

1. ``schedule``: the lowering of a non-default schedule (`utils.runtime.lowering`) replaces
   the schedule and stashes the last stage's losses in the map;
2. ``freeze``: a frozen prefix (`utils.runtime.frozen`) skips its layers' weight gradients;
3. ``layer_cost``: the per-layer cost meter (`utils.runtime.layercost`) times each layer;
4. ``fault``: an injected fault (`utils.runtime.faults`) slows, corrupts or strikes an
   instruction, so a slowed forward is timed as one longer forward;
5. ``tracer``: the tracer (`utils.runtime.tracing`) times exactly what runs, all of the above.

A job on torch's runtime (`utils.runtime.torchrank`) has no instruction map: its schedule is
torch's, freezing and the meter are refused by the spec, and the fault and the tracer wrap its
stages' compute calls in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

from utils.jobs.rundir import RunDir, StatusSlot
from utils.jobs.spec import JobSpec

WRAP_ORDER: tuple[str, ...] = ("schedule", "freeze", "layer_cost", "fault", "tracer")
"""What wraps a rank's engine, innermost first (see the module docstring)."""


def _varies(spec: JobSpec) -> bool:
    """Whether micro-batches change shape between steps (variable lengths, a new count)."""
    return spec.batching != "fixed" or bool(spec.micro_batches_at) or spec.micro_batch_policy is not None


def shapes_vary_in_a_step(spec: JobSpec) -> bool:
    """Whether one step's micro-batches may differ in shape: sorted and token-budget batching
    pad each to its own longest sample. DeepSpeed then needs ``dynamic_shape=True``: a metadata
    message before every micro-batch on every boundary. Every other way keeps one shape per step,
    and `utils.runtime.dynamic.MicroBatching` calls ``reset_activation_shape()`` before a step
    whose shape changed instead (``JobSpec(dynamic_shape=True)`` forces the former)."""
    return spec.batching in ("sorted", "token-budget") or spec.dynamic_shape


def build_module(spec: JobSpec, model, boundaries: Sequence[int]):
    """The `PipelineModule` for `spec`, split at `boundaries`.

    DeepSpeed partitions inside ``PipelineModule.__init__`` through ``_partition_layers``:
    the one documented place to impose boundaries instead of computing them (DESIGN.md).
    """
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.activation_checkpointing.checkpointing import non_reentrant_checkpoint

    from utils.workloads.models import seed_layer

    class FixedPartitionModule(PipelineModule):
        def _partition_layers(self, method="uniform"):
            self.parts = list(boundaries)
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

    return FixedPartitionModule(layers=model.layer_specs(), num_stages=spec.num_stages,
                                loss_fn=model.loss_fn, seed_layers=True, base_seed=spec.seed,
                                seed_fn=seed_layer, dynamic_shape=shapes_vary_in_a_step(spec),
                                activation_checkpoint_interval=spec.activation_checkpoint_interval,
                                # DeepSpeed's default (re-entrant) checkpoint gives stage 0 outputs without a
                                # grad_fn (token ids need no gradient; PipelineModule exempts only its own GPT
                                # classes, _is_checkpointable): the non-re-entrant one handles that input.
                                activation_checkpoint_func=non_reentrant_checkpoint)


def connect(device: str, spec: JobSpec) -> None:
    """Join the job's process group, with the spec's timeout (once per process; `utils.runtime.pgjoin`)."""
    from utils.runtime.pgjoin import join_process_group

    join_process_group(device, spec)


def build_engine(spec: JobSpec, model, boundaries: Sequence[int], device: str, *, frozen=None, meter=None,
                 rank: int | None = None):
    """This rank's engine at `boundaries` with the first three wrappers of `WRAP_ORDER`: the
    spec's schedule, then the freezing (`frozen`, a `FrozenPrefix`) and the layer-cost meter
    (`meter`, a `LayerCostMeter`) when given. On torch's runtime, the rank's
    `utils.runtime.torchrank.TorchPipeline` (`rank` required).

    The distributed process group is initialised once per process; building a second engine
    (a re-partition) reuses it.
    """
    connect(device, spec)
    if spec.resolved_runtime == "torch":
        from utils.runtime.torchrank import TorchPipeline

        return TorchPipeline(spec=spec, model=model, boundaries=boundaries, device=device, rank=rank,
                             world=spec.world_size)
    import deepspeed

    from utils.jobs.config import deepspeed_config
    from utils.runtime.lowering import install_schedule

    module = build_module(spec, model, boundaries)
    engine, _, _, _ = deepspeed.initialize(
        model=module, model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=deepspeed_config(spec))
    if spec.schedule != "1f1b":  # "1f1b" is DeepSpeed's own TrainSchedule
        install_schedule(engine, spec.schedule)
    if frozen is not None:
        frozen.install(engine, boundaries)
    if meter is not None:
        meter.install(engine)
    return engine


def trace(engine, spec: JobSpec, run_dir: RunDir, rank: int, device: str, *, after=None):
    """The last two wrappers of `WRAP_ORDER` on `engine`: the spec's fault, if it strikes this
    rank, then the tracer, which times what it finds (so always after `build_engine`)."""
    from utils.runtime.faults import fault_injector
    from utils.runtime.tracing import CudaClock, HostClock, InstructionTracer

    injector = fault_injector(spec, engine.stage_id, engine.grid.data_parallel_id, device)
    clock = CudaClock() if device == "cuda" else HostClock()
    status = StatusSlot(run_dir.status_slot(rank))
    before = injector.before if injector is not None else None
    if spec.resolved_runtime == "torch":
        from utils.runtime.torchrank import StageTracer

        slowed = injector.slowed if injector is not None and injector.fault.kind == "slow" else None
        return StageTracer(list(zip(engine.stages, range(len(engine.stages)))), rank=rank, clock=clock,
                           status=status, before=before, after=after, slowed=slowed)
    if injector is not None:  # under the tracer: a slowed forward is timed as one longer forward
        injector.install(engine)
    return InstructionTracer(engine, stage=engine.stage_id, rank=rank, status=status, clock=clock,
                             before=before, after=after)
