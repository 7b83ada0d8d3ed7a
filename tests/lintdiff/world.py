"""One world of the differential test: every rank builds a real DeepSpeed `PipelineEngine` for
each config of a list in turn, runs one ``train_batch()``, and writes what happened.

    python -m torch.distributed.run --standalone --nproc-per-node=P*D \\
        -m tests.lintdiff.world CASES.json OUT_DIR

`CASES.json` is a list of ``{"id", "config", "num_stages"}`` (all with the same stage count;
the world size over it is the data-parallel size). For each case a rank appends one JSON line
to ``OUT_DIR/rank<R>.jsonl``: the phase it reached (``initialize``, ``step``, ``done``), the
error it caught there (type, message, the DeepSpeed line that raised it) and the facts the
engine reports (`engine_facts`). The ranks then compare their lines: when every rank finished,
or every rank failed in ``initialize`` with the same message (DeepSpeed's config checks run
alike on every rank, before or between collectives all of them completed), they go on to the
next case. A rank that failed mid-step leaves at once (its peers' transfers then fail instead of
waiting for the timeout). Otherwise a rank may be stuck in, or have left a message behind on, a channel the
next engine would use, so the world exits with `RESTART` and the recorder (`record.py`) starts
a fresh one at the next case. Every collective has a short timeout, so a rank whose peer
crashed mid-step fails instead of waiting forever.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

#: exit code: this world stopped after a case whose ranks disagree; start a fresh one.
RESTART = 3
#: seconds any collective or p2p transfer may wait (a healthy one takes milliseconds).
COLLECTIVE_TIMEOUT = 25
WIDTH, LAYERS = 8, 4


def engine_facts(engine) -> dict:
    """What the engine really does with its config, read from the engine after initialize."""
    from deepspeed.runtime.activation_checkpointing import checkpointing

    optimizer = engine.optimizer
    basic = getattr(engine, "basic_optimizer", None) or optimizer
    group = basic.param_groups[0] if basic is not None and getattr(basic, "param_groups", None) else {}
    scale = None
    for holder in (optimizer, getattr(optimizer, "loss_scaler", None)):
        if holder is not None and isinstance(getattr(holder, "cur_scale", None), (int, float)):
            scale = float(holder.cur_scale)
            break
    module = engine.module
    return {
        "train_batch_size": engine.train_batch_size(),
        "micro_batch_size": engine.train_micro_batch_size_per_gpu(),
        "micro_batches": engine.micro_batches,
        "num_stages": engine.num_stages,
        "data_parallel": engine.dp_world_size,
        "zero_stage": int(engine.zero_optimization_stage()),
        "fp16": bool(engine.fp16_enabled()),
        "bf16": bool(engine.bfloat16_enabled()),
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "basic_optimizer": type(basic).__name__ if basic is not None else None,
        "lr": _number(group.get("lr")),
        "betas": list(group["betas"]) if "betas" in group else None,
        "eps": _number(group.get("eps")),
        "weight_decay": _number(group.get("weight_decay")),
        "scheduler": type(engine.lr_scheduler).__name__ if engine.lr_scheduler is not None else None,
        "gradient_clipping": _number(engine.gradient_clipping()),
        "loss_scale": scale,
        "dynamic_loss_scale": bool(engine.dynamic_loss_scale()) if engine.fp16_enabled() else None,
        "pipe_partitioned": bool(engine.is_pipe_partitioned),
        "grad_partitioned": bool(engine.is_grad_partitioned),
        "activation_checkpoint_interval": module.activation_checkpoint_interval,
        "seed_layers": bool(module.seed_layers),
        "checkpoint_function": getattr(module.activation_checkpoint_func, "__name__", None),
        "checkpointing_configured": bool(checkpointing.is_configured()),
        "partition_activations": bool(checkpointing.PARTITION_ACTIVATIONS),
        "steps_per_print": engine.steps_per_print(),
        "wall_clock_breakdown": bool(engine.wall_clock_breakdown()),
        "communication_data_type": str(engine.communication_data_type),
        "gradient_predivide_factor": _number(engine.gradient_predivide_factor()),
        "prescale_gradients": not engine.postscale_gradients(),
        "zero_overlap_comm": getattr(optimizer, "overlap_comm", None),
    }


class TopLevelLookups(dict):
    """The config as DeepSpeed gets it, noting every top-level key DeepSpeed looks up by name
    (``get``, ``[]``, ``in``) into `looked_up`; copies share the note (DeepSpeedConfig copies it)."""

    def __init__(self, data: dict):
        super().__init__(data)
        self.looked_up: set = set()

    def get(self, key, default=None):
        self.looked_up.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.looked_up.add(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self.looked_up.add(key)
        return super().__contains__(key)


def _number(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _raising_line(exc: BaseException) -> str:
    """``file:line`` of the deepest frame of DeepSpeed or torch that raised `exc`."""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        for package in ("deepspeed", "torch"):
            marker = f"/{package}/"
            if marker in frame.filename:
                where = f"{package}/{frame.filename.split(marker, 1)[1]}:{frame.lineno}"
    return where


def _module(num_stages: int):
    import torch
    import torch.nn as nn
    from deepspeed.pipe import LayerSpec, PipelineModule

    class Linear(nn.Linear):
        """A linear layer that takes its input in its own dtype (fp16/bf16 engines cast it)."""

        def forward(self, x):
            return super().forward(x.to(self.weight.dtype))

    def loss_fn(out, target):
        return (out.float() - target.float()).pow(2).mean()

    torch.manual_seed(0)
    return PipelineModule(layers=[LayerSpec(Linear, WIDTH, WIDTH) for _ in range(LAYERS)], num_stages=num_stages,
                          loss_fn=loss_fn, partition_method="uniform")


def _batches(micro_batch_size: int):
    import torch

    generator = torch.Generator().manual_seed(1)
    while True:
        x = torch.randn(micro_batch_size, WIDTH, generator=generator)
        yield x, x.flip(-1)


def try_case(case: dict) -> dict:
    """Build the engine of `case`, run one step; the line this rank records."""
    import deepspeed
    import torch

    record = {"id": case["id"], "rank": int(os.environ["RANK"]), "phase": "initialize", "error": None, "facts": None}
    engine = None
    try:
        module = _module(case["num_stages"])
        config = TopLevelLookups(copy.deepcopy(case["config"]))
        engine, *_ = deepspeed.initialize(model=module, model_parameters=[p for p in module.parameters()],
                                          config=config)
        record["facts"] = engine_facts(engine)
        record["phase"] = "step"
        # the script's own data loader has its own batch size (int): DeepSpeed's value is not passed through it
        loss = engine.train_batch(data_iter=_batches(int(engine.train_micro_batch_size_per_gpu())))
        after = {"loss": float(loss) if loss is not None and torch.isfinite(loss).all() else None,
                 "global_steps": engine.global_steps, "skipped_steps": engine.skipped_steps,
                 "lr_after_step": _number(engine.get_lr()[0]) if engine.get_lr() else None,
                 # top-level keys DeepSpeed never looked up, in initialize or the first step
                 "unread_top_level": sorted(set(config) - config.looked_up)}
        record["facts"].update(after)
        record["phase"] = "done"
    except Exception as exc:  # noqa: BLE001 - the outcome being recorded
        record["error"] = {"type": type(exc).__name__, "message": str(exc)[:600], "where": _raising_line(exc)}
    finally:
        del engine
        gc.collect()
    return record


def _uniform(records: list[dict]) -> bool:
    if all(r["phase"] == "done" for r in records):
        return True
    first = records[0]
    return all(r["phase"] == "initialize" and r["error"] == first["error"] for r in records)


def main(cases_path: str, out_dir: str) -> int:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch.distributed as dist

    cases = json.loads(Path(cases_path).read_text(encoding="utf-8"))
    deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT))
    sync = dist.new_group(backend="gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT))
    out = Path(out_dir, f"rank{dist.get_rank()}.jsonl")
    out.touch()  # this rank started: the recorder tells a crash in a case from a world that never ran
    for case in cases:
        record = try_case(case)
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if record["phase"] == "step":
            return RESTART  # its peers are mid-step: leaving closes their channels, so they fail at once
        everyone: list = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(everyone, record, group=sync)
        except Exception:  # noqa: BLE001 - a peer is gone or stuck: this world is done
            return RESTART
        if not _uniform(everyone):
            return RESTART
    return 0


if __name__ == "__main__":
    code = main(*sys.argv[1:3])
    sys.stdout.flush()
    os._exit(code)  # no teardown of process groups a failed engine may have left mid-transfer
