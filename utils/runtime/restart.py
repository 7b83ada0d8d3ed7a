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

The disk is checked before anything is written (`save_checkpoint`): every rank creates the
checkpoint folder and writes a probe file in it (a read-only folder, a file in its way, no
permission), the ranks add up what they will write (`checkpoint_bytes`: each stage's
parameters and optimizer state) and compare it, with `SPACE_MARGIN` and `SPACE_SLACK`, with
the free space. A folder that fails, or a save that fails anyway (the disk filled meanwhile),
ends the job with `CheckpointDiskError` on the rank that met it: the folder, why, and what to
do; it removes the partial checkpoint, and the other ranks, finding it gone, end without an
error of their own. Only a complete checkpoint is ever resumed from: ``restart.json``,
which names it, is written after every rank's files are on disk.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from utils.jobs.rundir import PartitionChange
from utils.runtime.frozen import local_layers
from utils.runtime.lifecycle import RankExit
from utils.runtime.migrate import stage_of, torch_optimizer
from utils.system.diskspace import (FULL_FIX, UNWRITABLE_FIX, CheckpointDiskError, free_bytes, human,
                                    probe_writable, reason_text, write_problem)
from utils.timeline import Event

SPACE_MARGIN = 1.2
"""The space check asks for the estimate (`checkpoint_bytes`) plus 20 %: torch's zip format adds a
header and 64-byte alignment per tensor, the stage file carries the LR scheduler and counters."""
SPACE_SLACK = 4 << 20
"""And 4 MiB per rank: its data-position file, DeepSpeed's ``latest``, partly filled blocks."""


def _tag(step: int) -> str:
    return f"step{step}"


def request_restart(state, step: int, target: Sequence[int]) -> None:
    """Checkpoint this rank before `step`, record the restart and end the rank (raises
    `RankExit`: the rank program ends as after its last step)."""
    run_dir = state.run_dir
    started = time.time()
    estimate = save_checkpoint(state, step)
    dist.barrier()  # every rank's files are on disk before rank 0 says a restart is due
    if state.rank == 0:
        record = {"step": step, "old": list(state.boundaries), "new": list(target), "tag": _tag(step),
                  "started": started, "origin_wall": state.origin_wall, "checkpoint_bytes": estimate}
        try:
            run_dir.write_restart(record)
        except OSError as exc:  # a checkpoint that no restart.json names is never resumed from
            raise _disk_error(exc, Path(run_dir.checkpoints), _tag(step),
                              failed=Path(run_dir.file(run_dir.RESTART))) from None
        run_dir.record_partition_change(PartitionChange(step=step, boundaries=tuple(target), reason="repartition_at"))
    state.status("restart", step=step, detail="exiting for the relaunch")
    raise RankExit(f"restart before step {step}")


def save_checkpoint(state, step: int) -> int:
    """Save this rank's part of the checkpoint before `step` (DeepSpeed's files and its data
    position) in the run's checkpoint folder, after checking that folder (`check_folder`), and
    return the estimate it was checked with (all ranks' `checkpoint_bytes`). Raises
    `CheckpointDiskError` for a folder that is full or not writable, and leaves no file of the
    checkpoint behind when the save fails."""
    folder, tag = Path(state.run_dir.checkpoints), _tag(step)
    state.status("restart", step=step, detail="checking the checkpoint folder")
    estimate = check_folder(state, folder, tag)
    state.status("restart", step=step, detail="saving the checkpoint")
    try:
        with _no_recreation(state.engine, folder / tag):
            state.engine.save_checkpoint(str(folder), tag=tag)
        torch.save(state.data.state(), folder / tag / f"data-rank{state.rank}.pt")
    except BaseException as exc:  # whatever stopped it, a partial checkpoint must not stay
        if isinstance(exc, Exception) and not (folder / tag).exists():
            # Another rank's save failed and removed the checkpoint (this rank then lost it, or
            # its files): that rank's error says why, this one ends without adding a second.
            remove_partial(folder, tag)
            state.status("restart", step=step, detail="not saved, another rank's save failed")
            raise RankExit(f"the checkpoint before step {step} was removed after another rank's save failed") from None
        if write_problem(exc) is None:  # not the disk (Ctrl-C, a bug): as it was
            remove_partial(folder, tag)
            raise
        raise _disk_error(exc, folder, tag) from None
    return estimate


@contextmanager
def _no_recreation(engine, checkpoint: Path):
    """While DeepSpeed saves, its checkpoint engine may not create `checkpoint` again once it
    is gone (every rank created it in `check_folder`): a rank whose save failed removed it,
    and a slower rank must then fail (and end quietly) instead of writing a fresh partial copy
    that nobody would remove."""
    saver = getattr(engine, "checkpoint_engine", None)
    if saver is None:
        yield
        return
    own = vars(saver).get("makedirs")
    makedirs = saver.makedirs

    def guarded(path, *args, **kwargs):
        if Path(path) == checkpoint and not checkpoint.is_dir():
            raise FileNotFoundError(errno.ENOENT, "removed after another rank's save failed", str(path))
        return makedirs(path, *args, **kwargs)

    saver.makedirs = guarded
    try:
        yield
    finally:
        if own is None:
            del saver.makedirs
        else:
            saver.makedirs = own


def check_folder(state, folder: Path, tag: str) -> int:
    """Check, on every rank and before anything is written, that checkpoint `tag` can be saved
    in `folder`: the folder can be created and written (a probe file), and its disk holds what
    all ranks will write (`checkpoint_bytes`, summed over the ranks, × `SPACE_MARGIN` +
    `SPACE_SLACK` per rank). The ranks agree first (two collectives), so all of them stop
    together; a rank whose own check failed raises `CheckpointDiskError`, the others end quietly
    (`RankExit`), leaving the failing rank's error as the job's. Returns the ranks' estimate."""
    try:
        probe_writable(folder / tag)
        refused = None
    except OSError as exc:
        refused = exc
    replica = getattr(getattr(state.engine, "grid", None), "data_parallel_id", 0)
    mine = checkpoint_bytes(state.engine, replica=replica)
    world = dist.get_world_size() if dist.is_initialized() else 1
    flags = [0] * world
    flags[state.rank if dist.is_initialized() else 0] = int(refused is not None)
    total, *failed = _agree(state, [mine, *flags], dist.ReduceOp.SUM)
    if refused is not None:
        raise _disk_error(refused, folder, tag, wrote=False) from None
    if any(failed):
        remove_partial(folder, tag)
        ranks = [r for r, f in enumerate(failed) if f]
        state.status("restart", step=None, detail=f"{tag} not saved, rank(s) {ranks} cannot write {folder}")
        raise RankExit(f"the checkpoint folder failed its check on rank(s) {ranks}")
    free = _agree(state, [free_bytes(folder)], dist.ReduceOp.MIN)[0]  # one verdict on every rank
    needed = int(total * SPACE_MARGIN) + SPACE_SLACK * world
    if free < needed:
        remove_partial(folder, tag)
        raise CheckpointDiskError(
            f"磁盘空间不足，重启模式的检查点放不下：保存 {tag} 约需 {human(needed)}，{folder} 所在磁盘只剩 "
            f"{human(free)} (not enough disk space for the restart-mode checkpoint: saving {tag} needs about "
            f"{human(needed)} — every stage's parameters and optimizer state, {human(total)}, plus "
            f"{SPACE_MARGIN - 1:.0%} and {human(SPACE_SLACK)} per rank — and the disk of {folder} has "
            f"{human(free)} free; nothing was written). {FULL_FIX}", path=folder, reason="full")
    return total


def checkpoint_bytes(engine, *, replica: int = 0) -> int:
    """Bytes this rank writes into a checkpoint, estimated from its tensors: its stage's
    parameters and buffers (the layer files, written by the first replica of the stage) and
    its optimizer's state tensors and master copies (the stage's ``mp_rank`` file, also
    written by the first replica; with ZeRO every replica writes its own partition). Each
    tensor counted once, at its own size; no header or alignment (see `SPACE_MARGIN`)."""
    sizes: dict[int, int] = {}

    def add(tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                sizes[id(t)] = t.numel() * t.element_size()

    if replica == 0:
        add(engine.module.parameters())
        add(engine.module.buffers())
    zero = bool(engine.zero_optimization()) if hasattr(engine, "zero_optimization") else False
    if engine.optimizer is not None and (replica == 0 or zero):
        try:
            optimizer = torch_optimizer(engine)
        except TypeError:  # no torch optimizer inside: count a copy of the weights and two moments
            add(engine.module.parameters())
            return sum(sizes.values()) * 3
        add(p for group in optimizer.param_groups for p in group["params"])
        add(value for entry in optimizer.state.values() for value in entry.values())
    return sum(sizes.values())


def remove_partial(folder: Path, tag: str) -> bool:
    """Remove what a failed save of `tag` left in `folder`: the tag's folder, DeepSpeed's
    ``latest`` when it names `tag`, and `folder` itself when nothing else is in it. The tag's
    folder is renamed first, in one step: another rank may still be writing into it, and from
    then on its next file fails (it finds the checkpoint gone and ends quietly, see
    `save_checkpoint`) instead of landing in a folder half removed. Returns whether they are
    gone (a read-only folder may keep them; no ``restart.json`` names them, so no restart
    resumes from them)."""
    target = folder / tag
    doomed = folder / f".{tag}.removing-{os.getpid()}"
    try:
        target.rename(doomed)
    except OSError:  # gone already, or the folder refuses: remove it where it is
        doomed = target
    shutil.rmtree(doomed, ignore_errors=True)
    latest = folder / "latest"
    try:
        if latest.read_text().strip() == tag:
            latest.unlink()
    except OSError:
        pass
    try:
        folder.rmdir()  # only when empty: a folder this save created
    except OSError:
        pass
    return not target.exists() and not doomed.exists()


def _disk_error(exc: BaseException, folder: Path, tag: str, *, failed: Path | None = None,
                wrote: bool = True) -> CheckpointDiskError:
    """`exc`, a refused write of checkpoint `tag` in `folder` (or of the file `failed` that
    completes it), as a `CheckpointDiskError` naming the folder, the reason and the fix, after
    removing the partial checkpoint. `wrote`: False when nothing was written yet (the probe)."""
    gone = remove_partial(folder, tag)
    problem = write_problem(exc) or "unwritable"  # an OSError writing: the folder refused it
    checkpoint = folder / tag
    if not wrote:
        left = "没有写入任何检查点文件 (nothing was written)"
    elif gone:
        left = "未写完的文件已删除 (its partial files were removed)"
    else:
        left = (f"未写完的文件无法删除，请手动删除 {checkpoint} (its partial files could not be removed: delete "
                f"{checkpoint}; no restart resumes from it)")
    place = failed.parent if failed is not None else folder
    what = f"{tag} (its record {failed.name})" if failed is not None else tag
    if problem == "full":
        return CheckpointDiskError(
            f"磁盘已满，重启模式的检查点 {what} 没有写完 (no space left on the disk of {place}: the restart-mode "
            f"checkpoint {what} could not be written: {reason_text(exc)}); {left}. {FULL_FIX}",
            path=place, reason="full")
    name, name_en = ("检查点目录", "the checkpoint folder") if failed is None else ("运行目录", "the run directory")
    return CheckpointDiskError(
        f"{name} {place} 不可写，重启模式的检查点 {what} 无法保存 ({name_en} {place} is not writable, so the "
        f"restart-mode checkpoint {what} could not be saved: {reason_text(exc)}); {left}. {UNWRITABLE_FIX}",
        path=place, reason="unwritable")


def _agree(state, values: list[int], op) -> list[int]:
    """`values` reduced over every rank with `op` (as given when there is no process group:
    a unit test, a single process)."""
    if not dist.is_initialized():
        return list(values)
    device = torch.device("cuda", torch.cuda.current_device()) if state.device == "cuda" else torch.device("cpu")
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=op)
    return [int(v) for v in tensor.tolist()]


def pending(run_dir) -> dict | None:
    """The restart a relaunched rank resumes from, or None for a fresh start."""
    return run_dir.read_restart()


def resume(state, record: dict) -> int:
    """Load the checkpoint of `record` into this rank's new engine and return the step to
    continue from; queues the restart's "repartition" event for that step."""
    engine, run_dir = state.engine, state.run_dir
    state.status("restart", step=record["step"], detail="loading the checkpoint")
    # DeepSpeed's loader is asked for the optimizer state only to show its pitfall ("deepspeed").
    deepspeed_loader = state.spec.repartition_optimizer == "deepspeed"
    load_path, _ = engine.load_checkpoint(str(run_dir.checkpoints), tag=record["tag"],
                                          load_optimizer_states=deepspeed_loader, load_lr_scheduler_states=True)
    if load_path is None:
        raise RuntimeError(f"no checkpoint {record['tag']} in {run_dir.checkpoints} to resume from")
    state.status("restart", step=record["step"], detail="checkpoint loaded")
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
