"""Restart mode: re-partition by checkpoint, exit and relaunch (`repartition_mode="restart"`).

The baseline a live move is compared against, and what a DeepSpeed user does today:

1. before the step, every rank saves a DeepSpeed checkpoint: one file per layer
   (``layer_XX-model_states.pt``, which loads into any partition) and one file per stage
   (``mp_rank_SS_model_states.pt``) holding that stage's optimizer state as *one flat list*
   in the order the stage handed its parameters to the optimizer;
2. each rank saves its data position, rank 0 writes ``restart.json`` (step, old and new
   boundaries), and the ranks exit; the launcher (`utils.jobs.launch.RunningJob`) sees a
   clean exit with a restart pending and starts the job again;
3. the new ranks build their engines at the new boundaries and `resume` them: DeepSpeed's
   ``load_checkpoint`` loads the weights, the LR scheduler and the counters, but **not** the
   optimizer state — its loader would pair the flat list of the stage that had the same
   number with this stage's parameters by position, which fails on a size mismatch or,
   worse, silently gives layers another layer's Adam moments. `remap_optimizer` instead finds
   every parameter's entry by its *layer* in the stage that held it before.

The time from the checkpoint to the resumed engine is the job's "repartition" event, as for a
live move, so the two modes compare on one timeline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from utils.jobs.rundir import PartitionChange
from utils.runtime.frozen import local_layers
from utils.runtime.lifecycle import RankExit
from utils.runtime.migrate import stage_of, torch_optimizer
from utils.timeline import Event


def _tag(step: int) -> str:
    return f"step{step}"


def request_restart(state, step: int, target: Sequence[int]) -> None:
    """Checkpoint this rank before `step`, record the restart and end the rank (raises
    `RankExit`: the rank program ends as after its last step)."""
    run_dir = state.run_dir
    started = time.time()
    state.status(f"step={step} restart: saving the checkpoint")
    state.engine.save_checkpoint(str(run_dir.checkpoints), tag=_tag(step))
    torch.save(state.data.state(), run_dir.checkpoints / _tag(step) / f"data-rank{state.rank}.pt")
    dist.barrier()  # every rank's files are on disk before rank 0 says a restart is due
    if state.rank == 0:
        run_dir.write_restart({
            "step": step, "old": list(state.boundaries), "new": list(target), "tag": _tag(step),
            "started": started, "origin_wall": state.origin_wall})
        run_dir.record_partition_change(PartitionChange(step=step, boundaries=tuple(target), reason="repartition_at"))
    state.status(f"step={step} restart: exiting for the relaunch")
    raise RankExit(f"restart before step {step}")


def pending(run_dir) -> dict | None:
    """The restart a relaunched rank resumes from, or None for a fresh start."""
    return run_dir.read_restart()


def resume(state, record: dict) -> int:
    """Load the checkpoint of `record` into this rank's new engine and return the step to
    continue from; queues the restart's "repartition" event for that step."""
    engine, run_dir = state.engine, state.run_dir
    state.status(f"step={record['step']} restart: loading the checkpoint")
    # DeepSpeed's loader is asked for the optimizer state only to show its pitfall ("deepspeed").
    deepspeed_loader = state.spec.repartition_optimizer == "deepspeed"
    load_path, _ = engine.load_checkpoint(str(run_dir.checkpoints), tag=record["tag"],
                                          load_optimizer_states=deepspeed_loader, load_lr_scheduler_states=True)
    if load_path is None:
        raise RuntimeError(f"no checkpoint {record['tag']} in {run_dir.checkpoints} to resume from")
    state.status(f"step={record['step']} restart: checkpoint loaded")
    if state.spec.repartition_optimizer == "remap":
        remap_optimizer(engine, state.model, run_dir.checkpoints / record["tag"], old=record["old"],
                        new=record["new"])
    state.data.restore(torch.load(run_dir.checkpoints / record["tag"] / f"data-rank{state.rank}.pt"))
    state.sync_device()
    dist.barrier()
    origin = state.tracer.origin
    now = time.perf_counter()
    state.pending_events.append(Event(
        stage=state.stage, rank=state.rank, step=record["step"], kind="repartition", micro_batch=None,
        start=now - (time.time() - record["started"]) - origin, end=now - origin))
    return record["step"]


def remap_optimizer(engine, model, folder, *, old: Sequence[int], new: Sequence[int]) -> None:
    """Install on `engine` (at boundaries `new`) the Adam state each of its parameters had in
    the checkpoint in `folder`, written at boundaries `old`.

    Stage s of the old partition saved ``state[i]`` for the i-th parameter it gave its
    optimizer: all parameters of its layers, layer by layer, in ``named_parameters`` order
    (`utils.runtime.rank.build_engine` passes them so). The layer-to-index table is rebuilt
    from the model's definition on the meta device, so nothing is guessed from sizes.
    """
    names = _param_names(model)
    optimizer = torch_optimizer(engine)
    files: dict[int, dict] = {}
    for index, layer in local_layers(engine).items():
        stage = stage_of(index, old)
        if stage not in files:
            checkpoint = torch.load(folder / f"mp_rank_{stage:02d}_model_states.pt", map_location="cpu",
                                    weights_only=False)
            files[stage] = checkpoint["optimizer"]
        saved = files[stage]
        offset = sum(len(names[i]) for i in range(old[stage], index))
        params = dict(layer.named_parameters())
        for position, name in enumerate(names[index]):
            entry = saved["state"].get(offset + position)
            if entry:
                param = params[name]
                optimizer.state[param] = {key: value.to(param.device) if key != "step" else value
                                          for key, value in entry.items()}
    for group, saved_group in zip(optimizer.param_groups, next(iter(files.values()))["param_groups"]):
        group.update({k: v for k, v in saved_group.items() if k != "params"})


def _param_names(model) -> list[list[str]]:
    return [[name for name, _ in layer.named_parameters()] for layer in model.meta_layers()]
