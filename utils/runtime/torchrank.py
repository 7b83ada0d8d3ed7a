"""A job's ranks on ``torch.distributed.pipelining``: the torch runtime of the rank program.

DeepSpeed's `PipelineEngine` runs one model chunk per rank and one full backward, so
interleaved 1F1B, ZB-H1, DualPipeV and ZB-V run on torch's pipelining instead
(`utils.jobs.spec_runtime`). `utils.runtime.rank` starts here for a spec whose
`JobSpec.resolved_runtime` is ``"torch"``; everything around the step is the rank program's own
(the launcher, the process group with the spec's timeout, the common time origin, the training
loop writing events, progress and memory into the run directory, the status slot, faults),
so a torch-runtime job is recorded, watched, diagnosed and drawn like a DeepSpeed one.

What differs is the step, which `TorchPipeline.train_batch` runs: the rank builds its
virtual stages from the job's preset — each layer seeded exactly as
``PipelineModule(seed_layers=True, base_seed=seed)`` seeds it, so a torch and a DeepSpeed job
of one spec start from identical weights — wraps each in a ``PipelineStage``, and runs the
catalogue's ``torch_class`` over the same micro-batches a DeepSpeed job reads (its first and
last stage draw them from the same seeded stream), with the optimizer DeepSpeed builds for the
workbook's config (``torch.optim.AdamW``, ``torch_adam``) and DeepSpeed's own ``WarmupLR``.
DeepSpeed scales each micro-batch's loss by 1/m before its backward; torch's schedules divide
the summed gradients by m after (``scale_grads``): the same gradient up to rounding.

`StageTracer` times every ``forward_one_chunk`` / ``backward_one_chunk`` /
``backward_weight_one_chunk`` of the rank's stages. torch's schedules wait for a chunk's
receives before calling it, so the intervals are compute only and waiting shows as idle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from utils.planning.catalogue import schedule_info
from utils.planning.schedules import Schedule, build_schedule
from utils.timeline import Event

__all__ = ["StageTracer", "TorchPipeline"]


class StageTracer:
    """Records this rank's compute calls on its ``PipelineStage`` objects as `Event`s per step.

    The same duties, and the same interface towards the training loop (`begin_step`,
    `end_step`, `set_origin`, `origin`, `status`), as `utils.runtime.tracing.InstructionTracer`
    on a DeepSpeed engine: the clock (host, or CUDA events resolved once per step), the status
    slot written as each call starts, the fault injector's `before` as each call starts and the
    memory sample as each ends. Events carry the rank as their stage and the rank's local chunk
    index (0, 1, ...), which the schedule's placement maps to a virtual stage.
    """

    def __init__(self, stages: Sequence[tuple[Any, int]], *, rank: int, clock, status=None,
                 before: Callable[[int, str, int | None], None] | None = None,
                 after: Callable[[], None] | None = None, slowed: Callable | None = None):
        self.rank, self.clock, self.status = rank, clock, status
        self.before, self.after = before, after
        self.origin, self.step = 0.0, -1
        self._pending: list[tuple[str, int, int, object, object]] = []
        for stage, chunk in stages:
            self._wrap(stage, chunk, slowed)

    def _wrap(self, stage, chunk: int, slowed) -> None:
        tracer = self
        forward, backward, weight = (stage.forward_one_chunk, stage.backward_one_chunk,
                                     stage.backward_weight_one_chunk)
        if slowed is not None:  # under the timing: a slowed forward is timed as one longer forward
            forward, backward, weight = slowed(forward), slowed(backward), slowed(weight)

        def timed(kind: str, micro_batch: int, call):
            if tracer.status is not None:
                tracer.status.write(step=tracer.step, doing=kind, micro_batch=micro_batch, chunk=chunk)
            if tracer.before is not None:
                tracer.before(tracer.step, kind, micro_batch)
            start = tracer.clock.mark()
            out = call()
            tracer._pending.append((kind, micro_batch, chunk, start, tracer.clock.mark()))
            if tracer.after is not None:
                tracer.after()
            if tracer.status is not None:  # torch's schedule sends and receives between compute calls
                tracer.status.write(step=tracer.step, doing="wait", micro_batch=micro_batch, chunk=chunk,
                                    detail=f"after {kind}: in torch's sends and receives")
            return out

        def forward_one_chunk(fwd_chunk_id, *args, **kwargs):
            return timed("forward", fwd_chunk_id, lambda: forward(fwd_chunk_id, *args, **kwargs))

        def backward_one_chunk(bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
            return timed("backward" if full_backward else "backward_input", bwd_chunk_id,
                         lambda: backward(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                          last_backward=last_backward))

        def backward_weight_one_chunk(bwd_chunk_id, last_backward=False):
            return timed("backward_weight", bwd_chunk_id, lambda: weight(bwd_chunk_id, last_backward=last_backward))

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk

    def set_origin(self, origin: float) -> None:
        self.origin = origin

    def begin_step(self, step: int) -> None:
        self.step = step
        self._pending.clear()
        self.clock.begin_step()

    def end_step(self) -> list[Event]:
        marks = [m for *_, start, end in self._pending for m in (start, end)]
        times = self.clock.resolve(marks)
        events = [Event(stage=self.rank, rank=self.rank, step=self.step, kind=kind, micro_batch=mb,
                        start=times[2 * i] - self.origin, end=times[2 * i + 1] - self.origin, chunk=chunk)
                  for i, (kind, mb, chunk, _, _) in enumerate(self._pending)]
        self._pending.clear()
        if self.status is not None:
            self.status.write(step=self.step, doing="finished")
        return events


class TorchPipeline:
    """One rank's share of a torch-pipelining job, behind what the rank program asks of an
    engine: `train_batch` (one training step, the mean loss of its micro-batches on every
    rank), `stage_id`, ``grid.data_parallel_id`` and `module`: like a `PipelineModule`, it holds
    the rank's layers as children named by their global index, and the boundaries as ``parts``
    (one piece per virtual stage). A wrapper, not a DeepSpeed engine: it holds the
    ``PipelineStage`` objects, the schedule and the optimizer."""

    def __init__(self, *, spec, model, boundaries: Sequence[int], device: str, rank: int, world: int):
        import torch
        from torch.distributed import pipelining

        from utils.workloads.models import seed_layer

        info = schedule_info(spec.schedule)
        self.plan: Schedule = build_schedule(info.name, world, spec.micro_batches, chunks=spec.model_chunks)
        self.spec, self.rank, self.world = spec, rank, world
        self.stage_id, self.grid = rank, SimpleNamespace(data_parallel_id=0)
        self.module = torch.nn.Module()
        self.module.parts = list(boundaries)
        vs = self.plan.num_virtual_stages
        self.virtual_stages = [k for k in range(vs) if self.plan.rank_of(k) == rank]  # local chunk c -> stage
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu")
        self.stages = []
        for k in self.virtual_stages:
            modules = []
            for index in range(boundaries[k], boundaries[k + 1]):
                seed_layer(spec.seed + index)  # PipelineModule's seeding, layer by layer
                modules.append(model.layers[index].build())
                self.module.add_module(str(index), modules[-1])
            chunk = torch.nn.Sequential(*modules).to(self.device)
            self.stages.append(pipelining.PipelineStage(chunk, k, vs, self.device))
        self.first, self.last = 0 in self.virtual_stages, vs - 1 in self.virtual_stages
        self.loss_rank = self.plan.rank_of(vs - 1)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=spec.lr)  # what DeepSpeed builds for torch_adam
        self.lr_scheduler = None
        if spec.lr_warmup_steps:
            from deepspeed.runtime.lr_schedules import WarmupLR

            self.lr_scheduler = WarmupLR(self.optimizer, warmup_min_lr=0.0, warmup_max_lr=spec.lr,
                                         warmup_num_steps=spec.lr_warmup_steps, warmup_type="linear")
        cls = getattr(pipelining, info.torch_class)
        self.schedule = cls(self.stages if info.torch_multi_stage else self.stages[0], spec.micro_batches,
                            loss_fn=model.loss_fn)

    def train_batch(self, data_iter) -> float:
        """One step over `spec.micro_batches` micro-batches drawn from `data_iter` (by the
        ranks holding the first or the last virtual stage, as DeepSpeed's first and last stages
        draw them); returns their mean loss, on every rank."""
        import torch
        import torch.distributed as dist

        kwargs: dict[str, Any] = {}
        inputs: tuple = ()
        if self.first or self.last:
            drawn = [next(data_iter) for _ in range(self.spec.micro_batches)]
            if self.first:
                inputs = (torch.cat([x for x, _ in drawn]).to(self.device),)
            if self.last:
                losses: list = []
                kwargs = {"target": torch.cat([y for _, y in drawn]).to(self.device), "losses": losses}
        self.schedule.step(*inputs, **kwargs)
        self._clip_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        mean = (torch.stack([loss.detach().float() for loss in kwargs["losses"]]).mean() if self.last
                else torch.zeros((), device=self.device))
        dist.broadcast(mean, src=self.loss_rank)
        return float(mean)

    def _clip_gradients(self) -> None:
        """Scale every gradient by min(1, max_norm / (norm + 1e-6)), `norm` being the L2 norm of
        the whole model's gradient (summed over the ranks) and max_norm DeepSpeed's default
        ``gradient_clipping`` (1.0): what DeepSpeed's ``clip_grad_norm_`` means to do. DeepSpeed
        0.19.8's pipeline engine counts only the first stage's gradients in that norm (chapter 8
        shows why); with every norm below max_norm both runtimes leave the gradients alone."""
        import torch
        import torch.distributed as dist
        from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        squares = (torch.stack([g.detach().float().norm() for g in grads]).pow(2).sum() if grads
                   else torch.zeros((), device=self.device))
        dist.all_reduce(squares)
        coefficient = torch.clamp(GRADIENT_CLIPPING_DEFAULT / (squares.sqrt() + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coefficient)

    def chunk_layers(self) -> list[list[int]]:
        """[first layer, end] of each local chunk, in chunk order."""
        parts = self.module.parts
        return [[parts[k], parts[k + 1]] for k in self.virtual_stages]

