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

**Process groups.** Every build makes new ones: ``PipelineModule.__init__`` calls
``dist.new_group`` for its ``world_group`` (deepspeed 0.19.8, ``runtime/pipe/module.py:163``)
and builds a ``PipelineParallelGrid`` (``:183``), whose constructor calls ``dist.new_group``
for the model, data-parallel, pipe and slice groups (``runtime/pipe/topology.py:309, 321, 339,
353``), plus one per tied-weight group (``module.py:512``); ``PipelineEngine`` takes that grid
(``self.grid = self.module._grid``, ``runtime/pipe/engine.py:96``). Reusing the old groups —
the topology of a re-partition is always the same p × d — is not possible without patching:
the constructor has no grid parameter (``module.py:125``), ``topology=`` still builds a new
grid, and the grid ignores the ``process_group`` it is given (``topology.py:275``: "TODO use
process_group if provided"). So the old engine's groups are destroyed instead (`engine_groups`,
`destroy_groups`), through DeepSpeed's ``deepspeed.comm.destroy_process_group`` (``comm/comm.py:187``),
which calls torch's (a subgroup: ``pg.shutdown()`` and out of the registry,
``torch/distributed/distributed_c10d.py:2428-2436``) and then drops DeepSpeed's own cached
references to the group; the default group is never touched. They go right after the
snapshot, before the new engine is built: their last use was the old engine's last step
(the move itself talks over the default group), and on CUDA a ``torch.cuda.synchronize()``
first waits for every stream, NCCL's included. On NCCL that frees the old communicators
before the new ones are made; without it every move left five more groups behind (gloo, 2
stages: 6, 11, 16, 21 groups after three moves; now 6 after each).

**Memory.** The order keeps the peak low. After the snapshot the old engine keeps only the
state that moves (weights and Adam moments; between steps there are no gradients), and
`_drop_activations` empties its pipe buffers and loss: on the last stage DeepSpeed never frees
them (its backward returns early, ``pipe/engine.py:798-800``, before the lines that do,
``:865-866``), and their autograd graphs hold the backward hooks ``DeepSpeedEngine.forward``
registers (``runtime/engine.py:3019-3021``, bound methods of the engine) inside torch's C++
graph, where Python's collector cannot see the cycle — so every old last-stage engine stayed
alive for the rest of the job. A layer that stays is copied as soon as the new engine exists
and its old copy is freed (`_release`); a received weight lands straight in the new layer's
tensor (`_landing_place`); optimizer state is handed over, not cloned; a sent layer's old copy
is freed once sent. Peak during a move, on top of what the rank held before it: the new
stage's weights while the new engine is built, or, if larger, what the exchange adds (the
incoming layers' moments, less the staying layers' freed old weights) — about
``max(old stage + new weights, new stage + leaving layers)`` in state bytes (weights and
moments), where it was old stage + new stage + a second copy of the incoming layers, and the
old engine was freed only by a later garbage collection (never, on the last stage). Each move samples the
memory meter (`utils.runtime.memory.MemoryMeter`) at every phase (`MOVE_PHASES`; on CUDA it
also records ``torch.cuda.max_memory_allocated()`` over the move) into `MOVES`.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from utils.runtime.frozen import local_layers
from utils.runtime.memory import MemoryMeter

Key = tuple[str, ...]
"""One tensor of a layer: ``("param", name)``, ``("buffer", name)`` or ``("state", name, key)``."""
MOVE_PHASES = ("old activations and groups dropped", "new engine built", "staying layers copied",
               "moved layers exchanged", "end")
"""When a move samples memory (``memory.after`` of a `MOVES` record, in this order)."""
MOVES: list[dict] = []
"""This process's live moves, in order: boundaries, process groups before and after and how
many were destroyed, how many engines replaced by earlier moves are still alive (after a
collection: a leak when not 0), memory at each of `MOVE_PHASES` (a `MemoryRecord` without
``step``; on CUDA also ``cuda_max_memory_allocated`` over the move). The rank writes them into
its result (``live_moves``)."""
_RETIRED: list[weakref.ref] = []
"""The engines earlier moves replaced, weakly: ``earlier_engines_alive`` counts the ones not collected."""
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
    The old engine is left without tensors or process groups: it must not be used again.
    What the move found and left is appended to `MOVES`.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    meter = MemoryMeter(device.type)  # on "cuda" it resets the peak: max_memory_allocated is this move's
    meter.begin_step()
    groups_before = live_process_groups()
    old_stage, replica = engine.stage_id, engine.grid.data_parallel_id
    old_grid = engine.grid  # stage_to_global below is arithmetic on its topology: no process group
    old_optimizer = torch_optimizer(engine)
    old_layers = local_layers(engine)
    mine = {index: layer_tensors(layer, old_optimizer if carry_optimizer else None)
            for index, layer in old_layers.items()}
    carried = _engine_scalars(engine)
    outgoing = {index: tensors for index, tensors in mine.items() if stage_of(index, new) != old_stage}
    # The old engine's last collective ran in its last step; nothing below uses its groups.
    _drop_activations(engine)
    if device.type == "cuda":
        torch.cuda.synchronize()  # every stream, NCCL's included, is past the old groups' last work
    destroyed = destroy_groups(engine_groups(engine))
    meter.sample()

    phase("building the new engine")
    fresh = build(new)
    meter.sample()
    if between is not None:
        between()

    new_stage = fresh.stage_id
    new_optimizer = torch_optimizer(fresh)
    new_layers = local_layers(fresh)
    held = {t.data_ptr() for t in (*fresh.module.parameters(), *fresh.module.buffers())}
    for index in sorted(set(new_layers) & set(mine)):  # layers that stay: copy, then free the old copy
        _install(new_layers[index], mine.pop(index), new_optimizer if carry_optimizer else None)
        _release(old_layers[index], held)
    meter.sample()

    phase("agreeing on what moves")
    described = [None] * world
    dist.all_gather_object(described, (rank, replica, {index: [(key, tuple(t.shape), str(t.dtype), t.device.type)
                                                                for key, t in tensors.items()]
                                                        for index, tensors in outgoing.items()}))
    phase("moving layers")
    ops, landing = [], []  # landing: (layer, key, received tensor, device it goes to)
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
                buffer = _landing_place(new_layers[index], key, shape, getattr(torch, dtype.removeprefix("torch.")),
                                        device)
                ops.append(dist.P2POp(dist.irecv, buffer, source, tag=_tag(index, n)))
                landing.append((index, key, buffer, kind))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    del ops, outgoing
    for index in mine:  # sent: the old copies go
        _release(old_layers[index], held)
    mine.clear()
    old_optimizer.state.clear()
    meter.sample()

    phase("installing the state")
    received: dict[int, dict[Key, torch.Tensor]] = {}
    for index, key, buffer, kind in landing:
        received.setdefault(index, {})[key] = buffer.to(kind)
    del landing
    for index, layer in new_layers.items():
        if index in old_layers:
            continue  # installed above
        if index not in received:
            raise RuntimeError(f"rank {rank}: layer {index} moved to stage {new_stage} but nothing arrived for it")
        _install(layer, received.pop(index), new_optimizer if carry_optimizer else None)
    _restore_scalars(fresh, new_optimizer, carried)
    retired = weakref.ref(engine)  # the caller still holds it; it must be gone by the next move's end
    del engine, old_layers, old_optimizer
    gc.collect()
    meter.sample()
    record = {"old": list(old), "new": list(new), "groups_before": groups_before, "groups_destroyed": destroyed,
              "groups_after": live_process_groups(), "earlier_engines_alive": sum(r() is not None for r in _RETIRED),
              "phases": list(MOVE_PHASES),
              "memory": {k: v for k, v in (meter.end_step(len(MOVES)) or {}).items() if k != "step"}}
    if device.type == "cuda":  # what the allocator's peak saw between the samples too
        record["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated()
    MOVES.append(record)
    _RETIRED.append(retired)
    return fresh


def live_process_groups() -> int:
    """The process groups this process holds now, the default one included (torch registers
    every group a rank is a member of in ``_world.pg_map``; `destroy_groups` removes them)."""
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_map)


def engine_groups(engine) -> list:
    """The process groups DeepSpeed made for `engine` and keeps nowhere else, in the order it
    made them: ``PipelineModule.__init__``'s ``world_group``, the four its
    ``PipelineParallelGrid`` keeps (model, data-parallel, pipe, slice) and the tied-weight
    groups (`_index_tied_modules`). Groups this rank is not a member of were never made here."""
    grid, module = engine.grid, engine.module
    found = [module.world_group, grid.ds_model_proc_group, grid.dp_proc_group, grid.pp_proc_group,
             grid.slice_proc_group, *(comm["group"] for comm in module.tied_comms.values())]
    unique = {id(group): group for group in found if group is not None}
    return list(unique.values())


def destroy_groups(groups) -> int:
    """Destroy `groups` (never the default group) through DeepSpeed's ``destroy_process_group``,
    which also drops DeepSpeed's own cached references to each; how many were destroyed."""
    import deepspeed.comm as ds_dist

    destroyed = 0
    for group in groups:
        if group is dist.group.WORLD or group == dist.GroupMember.NON_GROUP_MEMBER:
            continue
        ds_dist.destroy_process_group(group)
        destroyed += 1
    return destroyed


def _drop_activations(engine) -> None:
    """Drop what the old engine's last step left behind: DeepSpeed's pipe buffers and, on the
    last stage, the loss (its backward returns before the lines that free them). Their
    autograd graphs hold the backward hooks ``DeepSpeedEngine.forward`` registers, bound
    methods of the engine, inside torch's C++ graph where Python's collector cannot see the
    cycle: left in place, they keep the whole old engine alive for good."""
    for buffers in engine.pipe_buffers.values():
        buffers[:] = [None] * len(buffers)
    for name in ("loss", "outputs"):
        if isinstance(getattr(engine, name, None), (torch.Tensor, tuple, list)):
            setattr(engine, name, None)


def _release(layer: torch.nn.Module, held: set[int]) -> None:
    """Free the storage of an old layer's parameters and buffers now, rather than when the
    old engine is collected; a tensor the new engine holds too (`held`: its data pointers) stays."""
    with torch.no_grad():
        for tensor in (*layer.parameters(), *layer.buffers()):
            if tensor.data_ptr() not in held:
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)


def _landing_place(layer: torch.nn.Module, key: Key, shape, dtype, device) -> torch.Tensor:
    """Where a received tensor lands: a weight or buffer straight into the new layer's own
    tensor when it matches (no second copy), anything else into a new tensor."""
    if key[0] in ("param", "buffer"):
        target = dict(layer.named_parameters() if key[0] == "param" else layer.named_buffers()).get(key[1])
        if (target is not None and tuple(target.shape) == tuple(shape) and target.dtype == dtype
                and target.device == device and target.is_contiguous()):
            return target.detach()
    return torch.empty(shape, dtype=dtype, device=device)


def _tag(layer: int, entry: int) -> int:
    """One tag per tensor of a move (gloo matches a receive to its send by source and tag)."""
    return layer * 4096 + entry


def _install(layer: torch.nn.Module, tensors: dict[Key, torch.Tensor], optimizer) -> None:
    """Put `tensors` into `layer`: weights and buffers copied (unless one already landed in
    place), the optimizer state handed over as is (the old optimizer, or the receive buffer,
    keeps no other use of it)."""
    with torch.no_grad():
        for name, param in layer.named_parameters():
            source = tensors[("param", name)]
            if source.data_ptr() != param.data_ptr():
                param.copy_(source)
            if optimizer is not None:
                state = {key[2]: t for key, t in tensors.items() if key[0] == "state" and key[1] == name}
                if state:
                    optimizer.state[param] = state
        for name, buffer in layer.named_buffers():
            source = tensors[("buffer", name)]
            if source.data_ptr() != buffer.data_ptr():
                buffer.copy_(source)


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
