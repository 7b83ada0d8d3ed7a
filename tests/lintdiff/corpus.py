"""The corpus of the differential test: DeepSpeed configs, each with the world it runs in.

Four sources, each case named by where it comes from:

- ``sample/…``: DeepSpeed's own example configs (``deepspeed_samples.json``, copied from
  DeepSpeedExamples with their path and commit), run as written in a 2-stage world, and
  (``sample-bf16/…``) those that train in fp16 once more with bf16, which a CPU can run;
- ``workbook/…``: the configs the workbook's own jobs run with (`utils.jobs.config.deepspeed_config`
  of `JobSpec`s as the chapters write them), the seed's snippet and chapter 1's keys;
- ``batch/…``: train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps
  with one, two or none missing, divisible or not, for 1 to 4 data-parallel replicas;
- ``mutate/…``: one change to a valid config — every value type the engine asserts or compares,
  pipeline keys, ZeRO stages as int/str/float, precision combinations, removed features, optimizer
  arguments the optimizer class does not take, misspelt and misplaced keys, sections DeepSpeed
  parses but applies only when the script calls something.

A case's `intent` holds what its author meant where the config alone cannot say it (the value a
misspelt or misplaced key was meant to set): `verdict.deepspeed_verdict` compares the engine's
facts with it. Building the corpus needs neither torch nor DeepSpeed.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).with_name("deepspeed_samples.json")


@dataclass(frozen=True)
class Case:
    """One config and the world it runs in."""

    id: str
    """``source/name``, unique."""
    config: dict[str, Any]
    num_stages: int = 2
    data_parallel: int = 1
    intent: dict[str, Any] = field(default_factory=dict)
    """Engine facts (`tests.lintdiff.world.engine_facts` names) the author meant to set with a key
    the config spells or places wrongly."""

    def as_dict(self) -> dict:
        return asdict(self)


def base(data_parallel: int = 1, **extra) -> dict:
    """A valid config of the workbook's kind: 2 × 4 micro-batches per replica, torch's AdamW."""
    config = {"train_batch_size": 8 * data_parallel, "train_micro_batch_size_per_gpu": 2,
              "gradient_accumulation_steps": 4,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}, "steps_per_print": 10**9}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def with_key(config: dict, path: str, value: Any) -> dict:
    """`config` with the dotted `path` set to `value` (sections created as needed)."""
    out = copy.deepcopy(config)
    *parents, last = path.split(".")
    node = out
    for name in parents:
        node = node.setdefault(name, {})
    node[last] = value
    return out


def without_key(config: dict, path: str) -> dict:
    out = copy.deepcopy(config)
    *parents, last = path.split(".")
    node = out
    for name in parents:
        node = node[name]
    node.pop(last, None)
    return out


def samples() -> list[Case]:
    """DeepSpeed's example configs as written, on 2 stages (their batch sizes divide by 2 × 1)."""
    cases = []
    for item in json.loads(SAMPLES.read_text(encoding="utf-8")):
        name = item["source"].split(":", 1)[1].removesuffix(".json").replace("/", "-")
        cases.append(Case(f"sample/{name}", item["config"]))
        fp16 = item["config"].get("fp16")
        if isinstance(fp16, dict) and fp16.get("enabled") is True:
            # the same sample as this CPU can run it (no fp16 here): its other settings get tried too
            config = {k: v for k, v in item["config"].items() if k != "fp16"}
            cases.append(Case(f"sample-bf16/{name}", {**config, "bf16": {"enabled": True}}))
    return cases


def workbook() -> list[Case]:
    from utils.jobs.config import deepspeed_config
    from utils.jobs.spec import JobSpec

    specs = {
        "default": {}, "bf16": {"precision": "bf16"}, "fp16": {"precision": "fp16"},
        "zero1-dp2": {"zero_stage": 1, "data_parallel": 2}, "warmup": {"lr_warmup_steps": 3},
        "gpipe-4-stages": {"num_stages": 4, "schedule": "gpipe", "model_options": {"blocks": 4}},
        "clip": {"deepspeed_config": {"gradient_clipping": 1.0}},
        "bf16-fp32-grads": {"precision": "bf16", "deepspeed_config": {"data_types": {"grad_accum_dtype": "fp32"}}},
        "bf16-fp32-comm": {"precision": "bf16", "deepspeed_config": {"communication_data_type": "fp32"}},
        "zero2-forced": {"zero_stage": 2, "strict": False},
    }
    cases = []
    for name, fields in specs.items():
        spec = JobSpec(**{"num_stages": 2, "device": "cpu", **fields})
        cases.append(Case(f"workbook/{name}", deepspeed_config(spec), spec.num_stages, spec.data_parallel))
    seed = {"train_batch_size": 64, "gradient_accumulation_steps": 8, "zero_optimization": {"stage": 1}}
    cases += [
        Case("workbook/seed-snippet-dp3", seed, 2, 3),
        Case("workbook/seed-snippet-dp2", seed, 2, 2),
        Case("workbook/seed-snippet-dp1", seed, 2, 1),
        Case("workbook/seed-snippet-dp4", seed, 1, 4),
        Case("workbook/chapter1-pipe-parallel-size", base(pipe_parallel_size=4), intent={"num_stages": 4}),
        Case("workbook/chapter1-schedule", base(schedule="1F1B"), intent={"schedule": "1F1B"}),
        Case("workbook/chapter1-pipeline-stages", base(pipeline={"stages": 4}), intent={"num_stages": 4}),
        Case("workbook/chapter1-pipeline-partition", base(pipeline={"partition": "type:Linear"}),
             intent={"partition": "type:Linear"}),
        Case("workbook/chapter1-micro-batch-size", base(micro_batch_size=4), intent={"micro_batch_size": 4}),
        Case("workbook/chapter1-num-stages", base(num_stages=4), intent={"num_stages": 4}),
        Case("workbook/chapter1-partition-method", base(partition_method="parameters"),
             intent={"partition": "parameters"}),
    ]
    return cases


def batch_triples() -> list[Case]:
    """The batch equation with 0 to 2 of its three values missing, for 1 to 4 replicas."""
    cases = []
    for d in (1, 2, 3, 4):
        stages = 2 if d <= 3 else 1
        triples = {
            "all-consistent": (8 * d, 2, 4), "all-inconsistent": (8 * d + 2, 2, 4),
            "total-micro": (8 * d, 2, None), "total-micro-not-divisible": (8 * d + 2, 2, None),
            "total-micro-floor-to-zero": (d, 2, None), "total-steps": (8 * d, None, 4),
            "total-steps-not-divisible": (8 * d + 4, None, 4), "total-steps-floor-to-zero": (4, None, 8),
            "micro-steps": (None, 2, 4), "total-only": (8 * d, None, None),
            "total-only-not-divisible": (8 * d + 1, None, None),
            "micro-only": (None, 2, None), "steps-only": (None, None, 4), "none": (None, None, None),
            "total-micro-few-micro-batches": (2 * d, 2, None),
        }
        for name, (total, micro, steps) in triples.items():
            config = base(d)
            for key, value in (("train_batch_size", total), ("train_micro_batch_size_per_gpu", micro),
                               ("gradient_accumulation_steps", steps)):
                config = with_key(config, key, value) if value is not None else without_key(config, key)
            cases.append(Case(f"batch/dp{d}-{name}", config, stages, d))
    # few micro-batches for the stages: 4 stages, 1 replica
    for name, (total, micro, steps) in {"total-micro-m1": (2, 2, None), "total-micro-m2": (4, 2, None),
                                         "total-micro-m4": (8, 2, None), "written-m2": (4, 2, 2),
                                         "total-only-m1": (8, None, None)}.items():
        config = base()
        for key, value in (("train_batch_size", total), ("train_micro_batch_size_per_gpu", micro),
                           ("gradient_accumulation_steps", steps)):
            config = with_key(config, key, value) if value is not None else without_key(config, key)
        cases.append(Case(f"batch/4-stages-{name}", config, 4, 1))
    return cases


#: (dotted key, value) that one mutation writes into `base()`; named by key and value.
VALUE_MUTATIONS: list[tuple[str, Any]] = [
    # batch values as other types, zero and negative
    *[(k, v) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
      for v in ("8" if k == "train_batch_size" else "2" if k.startswith("train_micro") else "4",
                8.0 if k == "train_batch_size" else 2.0 if k.startswith("train_micro") else 4.0,
                0, -1, True, None)],
    ("steps_per_print", "10"), ("steps_per_print", 0), ("steps_per_print", -1), ("steps_per_print", 2.5),
    ("gradient_clipping", "1.0"), ("gradient_clipping", 1), ("gradient_clipping", -1.0), ("gradient_clipping", True),
    ("gradient_clipping", 0.5),
    ("wall_clock_breakdown", True), ("wall_clock_breakdown", "true"), ("wall_clock_breakdown", 1),
    ("wall_clock_breakdown", False),
    ("prescale_gradients", True), ("prescale_gradients", "true"), ("gradient_predivide_factor", 2.0),
    ("gradient_predivide_factor", "2"),
    ("communication_data_type", "fp32"), ("communication_data_type", "fp16"), ("communication_data_type", "float64"),
    ("communication_data_type", "bf16"),
    ("dump_state", True), ("disable_allgather", True), ("memory_breakdown", True), ("memory_breakdown", "yes"),
    ("zero_allow_untested_optimizer", True), ("zero_force_ds_cpu_optimizer", False),
    ("seed", 1234),
    # pipeline section
    ("pipeline.pipe_partitioned", True), ("pipeline.pipe_partitioned", False), ("pipeline.pipe_partitioned", "true"),
    ("pipeline.pipe_partitioned", 1), ("pipeline.pipe_partitioned", None),
    ("pipeline.grad_partitioned", True), ("pipeline.grad_partitioned", False), ("pipeline.grad_partitioned", "false"),
    ("pipeline.grad_partitioned", 0),
    ("pipeline.activation_checkpoint_interval", 1), ("pipeline.activation_checkpoint_interval", 2),
    ("pipeline.activation_checkpoint_interval", "1"), ("pipeline.activation_checkpoint_interval", 1.0),
    ("pipeline.activation_checkpoint_interval", -1), ("pipeline.activation_checkpoint_interval", 0),
    ("pipeline.activation_checkpoint_interval", True), ("pipeline.activation_checkpoint_interval", None),
    ("pipeline.use_reentrant", False), ("pipeline.use_reentrant", True), ("pipeline.use_reentrant", "false"),
    ("pipeline.use_reentrant", 0),
    ("pipeline.seed_layers", False), ("pipeline.stages", "auto"),
    ("pipeline.partition", "best"),
    # ZeRO stages as int / str / float / bool, out of range
    *[("zero_optimization.stage", v) for v in (0, 1, 2, 3, "0", "1", "2", 1.0, 1.5, True, -1, 4, "optimizer_states")],
    ("zero_optimization.reduce_bucket_size", 5e5), ("zero_optimization.reduce_bucket_size", "5e5"),
    ("zero_optimization.overlap_comm", True), ("zero_optimization.contiguous_gradients", "yes"),
    ("zero_optimization.offload_optimizer", {"device": "cpu"}),
    ("zero_optimization.offload_optimizer", {"device": "nvme"}),
    ("zero_optimization.round_robin_gradients", True), ("zero_optimization.cpu_offload", True),
    # precision
    ("fp16", {"enabled": True}), ("fp16", {"enabled": "true"}), ("fp16", {"enabled": False}),
    ("fp16", {"enabled": "auto"}), ("fp16", {"enabled": True, "loss_scale": 128}),
    ("fp16", {"enabled": True, "loss_scale": -1}), ("fp16", {"enabled": True, "initial_scale_power": "16"}),
    ("fp16", {"enabled": True, "auto_cast": True}), ("fp16", {"enabled": False, "loss_scale": 128}),
    ("bf16", {"enabled": True}), ("bf16", {"enabled": "true"}), ("bf16", {"enabled": 1}),
    ("bf16", {"enabled": False}), ("bf16", {"enabled": "auto"}), ("bfloat16", {"enabled": True}),
    ("bf16", {"enabled": True, "immediate_grad_update": True}),
    ("bf16", {"enabled": True, "check_grad_overflow": True}),
    ("data_types", {"grad_accum_dtype": "fp32"}), ("data_types", {"grad_accum_dtype": "fp8"}),
    ("torch_autocast", {"enabled": True}), ("torch_autocast", {"enabled": True, "dtype": "torch.bfloat16"}),
    # removed features
    ("amp", {"enabled": True}), ("nebula", {"enabled": True}), ("compression_training", {}),
    ("quantize_training", {"enabled": True}), ("zero_optimization.mics_shard_size", 2),
    ("sparse_attention", {"mode": "fixed"}), ("progressive_layer_drop", {"enabled": True}),
    # optimizer: arguments the class does not take, types, names
    ("optimizer.params.momentum", 0.9), ("optimizer.params.lr", "1e-3"), ("optimizer.params.lr", -0.1),
    ("optimizer.params.lr", 0.01), ("optimizer.params.betas", [0.9]), ("optimizer.params.betas", [0.8, 0.99]),
    ("optimizer.params.weight_decay", 0.1), ("optimizer.params.weight_decay", -1.0), ("optimizer.params.eps", 1e-6),
    ("optimizer.params.amsgrad", True), ("optimizer.params.max_grad_norm", 1.0),
    ("optimizer.params.bias_correction", False), ("optimizer.params.adam_w_mode", False),
    ("optimizer.params.torch_adam", False), ("optimizer.params.foreach", True),
    ("optimizer.type", "AdamW"), ("optimizer.type", "adam"), ("optimizer.type", "SGD"), ("optimizer.type", "Adagrad"),
    ("optimizer.type", "Lamb"), ("optimizer.type", "Lion"), ("optimizer.type", "RMSprop"),
    ("optimizer.type", "NoSuchOptimizer"), ("optimizer.type", "OneBitAdam"),
    ("optimizer", {"type": "SGD", "params": {"lr": 0.1, "betas": [0.9, 0.99]}}),
    ("optimizer", {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}),
    ("optimizer", {"type": "Adam"}), ("optimizer", {"params": {"lr": 1e-3}}),
    # scheduler
    ("scheduler", {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 2}}),
    ("scheduler", {"type": "WarmupLR", "params": {"warmup_max": 1e-3}}),
    ("scheduler", {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2}}),
    ("scheduler", {"type": "WarmupDecayLR", "params": {"total_num_steps": 10, "warmup_num_steps": 2}}),
    ("scheduler", {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}}),
    ("scheduler", {"type": "NoSuchSchedule"}), ("scheduler", {"type": "StepLR", "params": {"step_size": 1}}),
    # sections DeepSpeed parses and applies only when the script calls something
    ("activation_checkpointing", {"partition_activations": True}),
    ("activation_checkpointing", {"cpu_checkpointing": True, "contiguous_memory_optimization": False}),
    ("activation_checkpointing", {"partition_activations": False}),
    ("flops_profiler", {"enabled": True, "profile_step": 1}),
    ("comms_logger", {"enabled": True}), ("tensorboard", {"enabled": False}),
    ("csv_monitor", {"enabled": False}), ("curriculum_learning", {"enabled": False}),
    ("elasticity", {"enabled": False}), ("autotuning", {"enabled": False}),
    ("checkpoint", {"tag_validation": "Warn"}), ("checkpoint", {"tag_validation": "nope"}),
    ("aio", {"block_size": 1048576}), ("zero_optimization.stage3_prefetch_bucket_size", 1000),
]

#: (misspelt or misplaced key, value, the engine fact it was meant to set, that value).
MISSPELLINGS: list[tuple[str, Any, str, Any]] = [
    ("gradient_acumulation_steps", 8, "micro_batches", 8),
    ("train_micro_batch_size_per_GPU", 4, "micro_batch_size", 4),
    ("gradient_clip", 0.5, "gradient_clipping", 0.5),
    ("gradient_clipping_norm", 0.5, "gradient_clipping", 0.5),
    ("steps_per_prints", 5, "steps_per_print", 5),
    ("zero_optimisation", {"stage": 1}, "zero_stage", 1),
    ("zero", {"stage": 1}, "zero_stage", 1),
    ("zero_optimization.stages", 1, "zero_stage", 1),
    ("bf_16", {"enabled": True}, "bf16", True),
    ("fp16.enable", True, "fp16", True),
    ("bf16.enable", True, "bf16", True),
    ("optimizer.param", {"lr": 0.01}, "lr", 0.01),
    ("optimizer.params.learning_rate", 0.01, "lr", 0.01),
    ("optimizer.params.beta", [0.8, 0.99], "betas", [0.8, 0.99]),
    ("optimizer.params.weight_decay_rate", 0.1, "weight_decay", 0.1),
    ("optimiser", {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}}, "lr", 0.01),
    ("scheduler.typ", "WarmupLR", "scheduler", "WarmupLR"),
    ("pipeline.activation_checkpoint_intervals", 1, "activation_checkpoint_interval", 1),
    ("pipeline.activation_checkpointing_interval", 1, "activation_checkpoint_interval", 1),
    ("activation_checkpoint_interval", 1, "activation_checkpoint_interval", 1),
    ("pipeline.use_reentrent", False, "checkpoint_function", "non_reentrant_checkpoint"),
    ("train_micro_batch_size", 4, "micro_batch_size", 4),
    ("wall_clock_break_down", True, "wall_clock_breakdown", True),
    ("prescale_gradient", True, "prescale_gradients", True),
    ("communication_dtype", "fp16", "communication_data_type", "torch.float16"),
    ("fp16.loss_scaling", 128, "loss_scale", 128.0),
    ("activation_checkpointing.partition_activation", True, "partition_activations", True),
    ("pipeline_parallel_size", 4, "num_stages", 4),
    ("pipeline.seed_layers", True, "seed_layers", True),
    ("pipeline.partition", "parameters", "partition", "parameters"),
    ("pipeline.stages", 4, "num_stages", 4),
    ("pipeline.num_stages", 4, "num_stages", 4),
    ("pipeline.micro_batches", 8, "micro_batches", 8),
    ("pipeline.schedule", "gpipe", "schedule", "gpipe"),
    ("micro_batches", 8, "micro_batches", 8),
    ("train_batch", 16, "train_batch_size", 16),
]


def _name(key: str, value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else f"'{value}'"
    return f"{key}={text}".replace(" ", "")


def mutations() -> list[Case]:
    cases = [Case(f"mutate/{_name(key, value)}", with_key(base(), key, value)) for key, value in VALUE_MUTATIONS]
    cases += [Case(f"mutate/misspelt/{_name(key, value)}", with_key(base(), key, value), intent={fact: meant})
              for key, value, fact, meant in MISSPELLINGS]
    # the same changes where they interact with the world: replicas, more stages
    cases += [Case(f"mutate/dp2/{_name(k, v)}", with_key(base(2), k, v), 2, 2) for k, v in (
        ("zero_optimization.stage", 1), ("zero_optimization.stage", "1"), ("zero_optimization.stage", 2),
        ("bf16", {"enabled": True}), ("communication_data_type", "fp32"), ("prescale_gradients", True),
        ("gradient_predivide_factor", 2.0), ("wall_clock_breakdown", True),
        ("zero_optimization", {"stage": 1, "reduce_bucket_size": 1000, "allgather_bucket_size": 1000}),
        ("zero_optimization", {"stage": 1, "overlap_comm": True}),
        ("bf16", {"enabled": True, "immediate_grad_update": False}))]
    cases += [Case(f"mutate/4-stages/{_name(k, v)}", with_key(base(), k, v), 4, 1) for k, v in (
        ("wall_clock_breakdown", True), ("pipeline.activation_checkpoint_interval", 1), ("bf16", {"enabled": True}),
        ("pipeline.pipe_partitioned", "true"), ("zero_optimization.stage", 1))]
    # two changes at once: the combinations people write
    pairs = {
        "fp16-and-bf16": {"fp16": {"enabled": True}, "bf16": {"enabled": True}},
        "fp16-off-bf16-on": {"fp16": {"enabled": False}, "bf16": {"enabled": True}},
        "bf16-zero1": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
        "bf16-clip": {"bf16": {"enabled": True}, "gradient_clipping": 1.0},
        "fp16-zero1": {"fp16": {"enabled": True}, "zero_optimization": {"stage": 1}},
        "bf16-fp32-grad-accum": {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
        "ckpt-section-and-interval": {"activation_checkpointing": {"partition_activations": True},
                                      "pipeline": {"activation_checkpoint_interval": 1}},
        "non-reentrant-interval": {"pipeline": {"activation_checkpoint_interval": 1, "use_reentrant": False}},
        "warmup-and-lr": {"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 2}},
                          "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}}},
        "zero1-offload": {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}},
        "clip-and-max-grad-norm": {"gradient_clipping": 1.0,
                                   "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True,
                                                                            "max_grad_norm": 1.0}}},
    }
    cases += [Case(f"mutate/pair/{name}", base(**extra)) for name, extra in pairs.items()]
    cases.append(Case("mutate/curriculum-block", base(data_efficiency=CURRICULUM)))
    cases.append(Case("mutate/curriculum-legacy", base(curriculum_learning={
        "enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64,
        "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}})))
    return cases


#: A data-efficiency curriculum block of the shape DeepSpeed's docs and examples use
#: (DeepSpeedExamples training/data_efficiency/…/ds_config_gpt2-medium_1clmetric_TEMPLATE.json
#: with its placeholders filled in).
CURRICULUM = {
    "enabled": True, "seed": 1234,
    "data_sampling": {
        "enabled": True, "num_workers": 0,
        "curriculum_learning": {
            "enabled": True, "data_cluster_path": "/tmp/cl_cluster",
            "curriculum_metrics": {"seqlen": {
                "index_to_sample_path": "/tmp/index_to_sample", "index_to_metric_path": "/tmp/index_to_metric",
                "difficulty_type": "value", "clustering_type": "single_cluster",
                "min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_root",
                "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8, "root_degree": 2}}},
        },
    },
}


def corpus() -> list[Case]:
    """Every case, in a fixed order; ids are unique."""
    cases = samples() + workbook() + batch_triples() + mutations()
    ids = [c.id for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate case ids: {duplicates}")
    return cases
