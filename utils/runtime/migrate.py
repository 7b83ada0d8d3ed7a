"""Live re-partition: move a running pipeline to new stage boundaries without stopping it.

DeepSpeed builds a `PipelineModule`'s layers once, inside its constructor, and nothing in it
re-partitions a running engine. What does work (DESIGN.md, checked by running) is a second
``deepspeed.initialize`` in the same processes: the process group stays, a new engine is
built for the new boundaries. What the new engine lacks is the *state*: its layers are
freshly initialised and its optimizer is empty. `repartition_live` carries it over, layer by
layer, so that training continues exactly as if the partition had never changed:

1. every rank snapshots its layers — parameters, buffers and each parameter's optimizer
   state (Adam's ``exp_avg``, ``exp_avg_sq``, ``step``) — keyed by *global layer index and
   parameter name*, never by position in an optimizer's flat list (the position is what
   DeepSpeed's checkpoint loader pairs by, and it changes with the partition);
2. every rank builds its new engine (a collective: all ranks at once);
3. the ranks agree on what travels (one ``all_gather_object`` of small descriptions), then
   each layer that changes stage is sent by its old rank to its new one — point-to-point,
   every send and receive posted at once, so no order of blocking calls can deadlock;
4. layers that stay are copied locally; the optimizer state is installed on the new
   parameters, and the optimizer's hyper-parameters (the scheduled learning rate), the LR
   scheduler and the engine's step counters are copied from the old engine.

Data-parallel replicas each move their own copy (rank of stage s in the same replica). The
data iterators live in the rank processes, which stay up, so the data position is kept as is.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from utils.runtime.frozen import local_layers

Key = tuple[str, ...]
"""One tensor of a layer: ``("param", name)``, ``("buffer", name)`` or ``("state", name, key)``."""
COUNTERS = ("global_steps", "global_samples", "micro_steps", "skipped_steps")
"""Engine counters a new engine must continue from (the LR scheduler and logging read them)."""


def stage_of(layer: int, boundaries: Sequence[int]) -> int:
    return next(s for s in range(len(boundaries) - 1) if boundaries[s] <= layer < boundaries[s + 1])


def torch_optimizer(engine) -> torch.optim.Optimizer:
    """The torch optimizer inside DeepSpeed's wrappers (fp32 without ZeRO: the engine's own)."""
    optimizer = engine.optimizer
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"cannot reach a torch optimizer inside {type(engine.optimizer).__name__}: a live "
                        "re-partition carries torch optimizer state per parameter (fp32, no ZeRO)")
    return optimizer


def layer_tensors(layer: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[Key, torch.Tensor]:
    """Every tensor that defines `layer`'s training state, by name; optimizer state only for
    parameters that have some (none before the first step, none when `optimizer` is None)."""
    found: dict[Key, torch.Tensor] = {}
    for name, param in layer.named_parameters():
        found[("param", name)] = param.detach()
        state = optimizer.state.get(param, {}) if optimizer is not None else {}
        for key in sorted(state):
            if not isinstance(state[key], torch.Tensor):
                raise TypeError(f"optimizer state {key!r} of {name} is a {type(state[key]).__name__}, not a "
                                "tensor: this optimizer cannot be carried across a re-partition")
            found[("state", name, key)] = state[key].detach()
    for name, buffer in layer.named_buffers():
        found[("buffer", name)] = buffer.detach()
    return found


def repartition_live(engine, *, old: Sequence[int], new: Sequence[int], build: Callable[[Sequence[int]], object],
                     carry_optimizer: bool = True, between: Callable[[], None] | None = None,
                     phase: Callable[[str], None] = lambda _: None):
    """Move this rank from `engine` (built at boundaries `old`) to a new engine at `new` and
    return it; every rank of the job calls it at the same point with the same arguments.

    `build(boundaries)` builds the new engine (with its schedule, freezing and tracer).
    `carry_optimizer=False` drops the optimizer state (the comparison that shows it matters).
    `between` runs after the new engine exists and before any state moved (where a fault is
    injected on purpose); `phase(name)` is told each phase, for the rank's status line.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    old_stage, replica = engine.stage_id, engine.grid.data_parallel_id
    old_grid = engine.grid
    optimizer = torch_optimizer(engine) if carry_optimizer else None
    mine = {index: layer_tensors(layer, optimizer) for index, layer in local_layers(engine).items()}
    carried = _engine_scalars(engine)
    outgoing = {index: tensors for index, tensors in mine.items() if stage_of(index, new) != old_stage}

    phase("building the new engine")
    fresh = build(new)
    if between is not None:
        between()

    phase("agreeing on what moves")
    described = [None] * world
    dist.all_gather_object(described, (rank, replica, {index: [(key, tuple(t.shape), str(t.dtype), t.device.type)
                                                                for key, t in tensors.items()]
                                                        for index, tensors in outgoing.items()}))
    phase("moving layers")
    new_stage = fresh.stage_id
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    new_optimizer = torch_optimizer(fresh)
    new_layers = local_layers(fresh)
    ops, landing = [], []  # landing: (received buffer, where it goes)
    for index in sorted(outgoing):  # what I send, in layer order
        destination = old_grid.stage_to_global(stage_of(index, new), data=replica)
        for n, (key, tensor) in enumerate(outgoing[index].items()):
            ops.append(dist.P2POp(dist.isend, tensor.to(device).contiguous(), destination, tag=_tag(index, n)))
    for source, source_replica, layers in described:
        if source_replica != replica:
            continue
        for index in sorted(layers):
            if stage_of(index, new) != new_stage:
                continue
            for n, (key, shape, dtype, kind) in enumerate(layers[index]):
                buffer = torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")), device=device)
                ops.append(dist.P2POp(dist.irecv, buffer, source, tag=_tag(index, n)))
                landing.append((index, key, buffer, kind))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    phase("installing the state")
    received: dict[int, dict[Key, torch.Tensor]] = {}
    for index, key, buffer, kind in landing:
        received.setdefault(index, {})[key] = buffer.to(kind)
    for index, layer in new_layers.items():
        tensors = received.get(index) if index not in mine else mine[index]
        if tensors is None:
            raise RuntimeError(f"rank {rank}: layer {index} moved to stage {new_stage} but nothing arrived for it")
        _install(layer, tensors, new_optimizer if carry_optimizer else None)
    _restore_scalars(fresh, new_optimizer, carried)
    del engine, mine, outgoing, received, ops, landing
    gc.collect()
    return fresh


def _tag(layer: int, entry: int) -> int:
    """One tag per tensor of a move (gloo matches a receive to its send by source and tag)."""
    return layer * 4096 + entry


def _install(layer: torch.nn.Module, tensors: dict[Key, torch.Tensor], optimizer) -> None:
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.copy_(tensors[("param", name)])
            if optimizer is not None:
                state = {key[2]: t.clone() for key, t in tensors.items() if key[0] == "state" and key[1] == name}
                if state:
                    optimizer.state[param] = state
        for name, buffer in layer.named_buffers():
            buffer.copy_(tensors[("buffer", name)])


def _engine_scalars(engine) -> dict:
    """What a new engine must continue from besides the layers: step counters, the
    optimizer's per-group hyper-parameters (the learning rate the scheduler set) and the LR
    scheduler's state."""
    optimizer = torch_optimizer(engine)
    return {"counters": {name: getattr(engine, name) for name in COUNTERS},
            "groups": [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups],
            "scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None}


def _restore_scalars(engine, optimizer, carried: dict) -> None:
    for name, value in carried["counters"].items():
        setattr(engine, name, value)
    if len(carried["groups"]) != len(optimizer.param_groups):
        raise RuntimeError(f"the new optimizer has {len(optimizer.param_groups)} parameter groups, the old "
                           f"{len(carried['groups'])}: cannot carry their learning rates")
    for group, old in zip(optimizer.param_groups, carried["groups"]):
        group.update(old)
    if carried["scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(carried["scheduler"])
