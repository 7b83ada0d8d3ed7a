"""The checks of `JobSpec`'s dynamic fields (re-partitioning, freezing, curricula, variable
micro-batching), kept apart from the spec so that it stays a readable list of fields: each
says what to change, before any process starts. `JobSpec.check` calls them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal, get_args

from utils import validation
from utils.planning.microbatching import BATCHING_METHODS, MICRO_BATCH_ORDERS, MicroBatchPolicy, in_flight_samples
from utils.planning.rebalance import Rebalance
from utils.workloads.presets import draws_token_samples

BUDGETED = ("token-budget", "packing", "deepspeed")
"""The batching methods whose micro-batches a token cap bounds (`JobSpec.token_budget`)."""

RepartitionMode = Literal["live", "restart"]
"""How a job changes its partition while it trains (`JobSpec.repartition_mode`)."""
OptimizerCarry = Literal["remap", "drop", "deepspeed"]
"""What a re-partition does with the optimizer state (`JobSpec.repartition_optimizer`)."""
LossNormalisation = Literal["token", "micro-batch"]
"""What a variable-length job's loss is the mean over (`JobSpec.loss_per`)."""
Precision = Literal["fp32", "bf16", "fp16"]
"""Number format of weights and activations (`JobSpec.precision`)."""
REPARTITION_MODES: tuple[str, ...] = get_args(RepartitionMode)
OPTIMIZER_CARRIES: tuple[str, ...] = get_args(OptimizerCarry)
LOSS_NORMALISATIONS: tuple[str, ...] = get_args(LossNormalisation)
PRECISIONS: tuple[str, ...] = get_args(Precision)


def check_dynamic(spec, n_layers: int) -> None:
    """The dynamic fields: every step inside the run, every partition valid, freezing only
    ever grows, one way of re-partitioning at a time."""
    for name in ("repartition_at", "freeze_at", "seq_len_at", "micro_batches_at"):
        if not isinstance(getattr(spec, name), Mapping):
            raise TypeError(f"{name} must be a dict {{step: ...}}, got {getattr(spec, name)!r}")
    for step, boundaries in spec.repartition_at.items():
        step_in_run("repartition_at", step, spec.steps, first=1,
                     why="step 0 starts with the planned partition: set partition= for it")
        try:
            validation.boundaries(boundaries, n_layers=n_layers, num_stages=spec.num_stages)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"repartition_at[{step}]: {exc}") from None
    if spec.repartition_mode not in REPARTITION_MODES:
        raise ValueError(f"unknown repartition_mode {spec.repartition_mode!r}; choose one of {REPARTITION_MODES}")
    if spec.repartition_optimizer not in OPTIMIZER_CARRIES:
        raise ValueError(f"unknown repartition_optimizer {spec.repartition_optimizer!r}; "
                         f"choose one of {OPTIMIZER_CARRIES}")
    if spec.repartition_optimizer == "deepspeed" and spec.repartition_mode != "restart":
        raise ValueError("repartition_optimizer='deepspeed' (DeepSpeed's own optimizer loader) happens on a "
                         "checkpoint reload: set repartition_mode='restart', or carry the state with 'remap'")
    if spec.rebalance is not None:
        if not isinstance(spec.rebalance, Rebalance):
            raise TypeError(f"rebalance must be a utils.Rebalance(...) or None, got {spec.rebalance!r}")
        spec.rebalance.check()
        if spec.repartition_at:
            raise ValueError("give either repartition_at (forced moves) or rebalance (the job decides), "
                             "not both: a forced move would overrule the policy's measurements")
        if spec.repartition_mode != "live":
            raise ValueError("rebalance re-partitions a running job, which needs repartition_mode='live' "
                             "(restart mode is the baseline for forced moves, repartition_at)")
    previous = 0
    for step, frozen in spec.freeze_at.items():
        step_in_run("freeze_at", step, spec.steps)
        count(f"freeze_at[{step}]", frozen)
        if frozen >= n_layers:
            raise ValueError(f"freeze_at[{step}]={frozen} freezes every layer of the {n_layers}: nothing "
                             f"would train; freeze at most {n_layers - 1}")
        if frozen < previous:
            raise ValueError(f"freeze_at[{step}]={frozen} unfreezes layers frozen earlier ({previous}); "
                             "progressive freezing only grows: give non-decreasing counts")
        previous = frozen
    if spec.seq_len_at:
        longest = spec.shape.seq_len
        if longest is None:
            raise ValueError(f"seq_len_at needs a language model preset ('gpt', 'gpt-large'), not {spec.model!r}")
        for step, tokens in spec.seq_len_at.items():
            step_in_run("seq_len_at", step, spec.steps)
            count(f"seq_len_at[{step}]", tokens)
            if tokens > longest:
                raise ValueError(f"seq_len_at[{step}]={tokens} exceeds the model's seq_len {longest} (its "
                                 f"position table); use at most {longest} or model_options={{'seq_len': ...}}")

def check_batching(spec) -> None:
    """Variable-length samples and micro-batch plans: caught here, not in a rank."""
    if spec.batching not in BATCHING_METHODS:
        raise ValueError(f"unknown batching {spec.batching!r}; choose one of {BATCHING_METHODS}")
    if spec.loss_per not in LOSS_NORMALISATIONS:
        raise ValueError(f"unknown loss_per {spec.loss_per!r}; choose one of {LOSS_NORMALISATIONS}")
    varlen = spec.batching != "fixed"
    if spec.micro_batch_order not in MICRO_BATCH_ORDERS:
        raise ValueError(f"unknown micro_batch_order {spec.micro_batch_order!r}; choose one of {MICRO_BATCH_ORDERS}")
    if spec.micro_batch_order != "as-planned" and not varlen:
        raise ValueError("micro_batch_order reorders variable-length micro-batches: set batching= too")
    longest = spec.shape.seq_len
    tokens_drawn = draws_token_samples(spec.model, longest)
    if varlen and not tokens_drawn:
        raise ValueError(f"batching={spec.batching!r} draws variable-length token samples of the workbook's "
                         f"language-model presets ('gpt', 'gpt-large'), not of {spec.model!r}, whose samples its "
                         "make_batch draws: keep batching='fixed'; micro_batches_at and micro_batch_policy re-cut "
                         "any model's samples into another micro-batch count")
    if spec.lengths is not None:
        if not varlen:
            raise ValueError(f"lengths only apply to variable-length batching: set batching= one of "
                             f"{BATCHING_METHODS[1:]}")
        if not is_sequence(spec.lengths) or not spec.lengths:
            raise ValueError(f"lengths must be a non-empty list of sample lengths, got {spec.lengths!r}")
        for length in spec.lengths:
            count("lengths[...]", length)
            if length > longest:
                raise ValueError(f"a sample length {length} exceeds the model's seq_len {longest}; use "
                                 f"lengths <= {longest} or model_options={{'seq_len': ...}}")
    if spec.seq_len_at and (varlen or spec.micro_batches_at or spec.micro_batch_policy is not None):
        raise ValueError("seq_len_at shortens the samples of the fixed stream; batching=, micro_batches_at and "
                         "micro_batch_policy draw each step's samples themselves (whose lengths seq_len_at would "
                         "not reach): drop one of them")
    if spec.batching in BUDGETED:
        if spec.token_budget is None:
            raise ValueError(f"batching={spec.batching!r} needs token_budget=..., the most "
                             f"{'real ' if spec.batching == 'deepspeed' else 'padded '}tokens a micro-batch may hold")
        count("token_budget", spec.token_budget)
        needed = longest if spec.batching == "packing" else max(spec.lengths) if spec.lengths else longest
        if spec.token_budget < needed:
            what = ("a packed row (the model's seq_len) ({needed} tokens)" if spec.batching == "packing" else
                    "the longest sample ({needed} tokens" + ("" if spec.lengths else
                                                             ", the model seq_len the default lengths reach") + ")")
            raise ValueError(f"token_budget={spec.token_budget} is smaller than {what.format(needed=needed)}: no "
                             f"micro-batch could hold it; use token_budget >= {needed}")
        if spec.micro_batches_at:
            raise ValueError(f"{spec.batching} batching chooses the micro-batches itself: drop micro_batches_at")
    elif spec.token_budget is not None:
        raise ValueError(f"token_budget only applies to batching= one of {BUDGETED}")
    if spec.batching == "deepspeed" and spec.lr_warmup_steps:
        raise ValueError("batching='deepspeed' sets each step's learning rate itself (DeepSpeed's scale_lr of the "
                         "step's sample count): drop lr_warmup_steps")
    if not isinstance(spec.dynamic_shape, bool):
        raise TypeError(f"dynamic_shape must be True or False, got {spec.dynamic_shape!r}")
    samples = spec.micro_batch_size * spec.micro_batches
    policy = spec.micro_batch_policy
    if policy is not None:
        if not isinstance(policy, MicroBatchPolicy):
            raise TypeError(f"micro_batch_policy must be a utils.MicroBatchPolicy(...) or None, got {policy!r}")
        policy.check()
        if policy.overhead_samples is None and not tokens_drawn:
            raise ValueError(f"MicroBatchPolicy(overhead_samples=...) is needed for {spec.model!r}: the fixed cost of "
                             "one micro-batch in samples is measured only for the language-model presets. Time a "
                             "micro-batch of n and one of 2n samples: overhead_samples = n (2 t_n - t_2n) / "
                             "(t_2n - t_n)")
        if varlen or spec.micro_batches_at:
            raise ValueError("micro_batch_policy chooses the count of fixed-length micro-batches itself: use it "
                             "without batching= and micro_batches_at")
        if in_flight_samples(spec.micro_batches, samples, spec.num_stages, spec.schedule) > policy.memory_samples:
            raise ValueError(f"micro_batches={spec.micro_batches} already keeps "
                             f"{in_flight_samples(spec.micro_batches, samples, spec.num_stages, spec.schedule)} samples "
                             f"in flight, over memory_samples={policy.memory_samples}: start from a count that fits")
    for step, m in spec.micro_batches_at.items():
        step_in_run("micro_batches_at", step, spec.steps)
        count(f"micro_batches_at[{step}]", m)
        if samples % m:
            raise ValueError(f"micro_batches_at[{step}]={m} does not divide the {samples} samples of a "
                             f"step (micro_batch_size × micro_batches): use a divisor of {samples}")


def check_config(spec) -> None:
    """The configuration fields' types and ranges. What DeepSpeed makes of them together
    (ZeRO stage with a pipeline, precision on the device) is `lint_config`'s, in `plan_job`."""
    if spec.precision not in PRECISIONS:
        raise ValueError(f"unknown precision {spec.precision!r}; choose one of {PRECISIONS}")
    count("zero_stage", spec.zero_stage, minimum=0)
    if spec.zero_stage > 3:
        raise ValueError(f"zero_stage={spec.zero_stage}: ZeRO has stages 0 to 3 (pipelines accept 0 and 1)")
    count("activation_checkpoint_interval", spec.activation_checkpoint_interval, minimum=0)
    config = spec.deepspeed_config
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise TypeError(f"deepspeed_config must be a dict of DeepSpeed config keys, got {config!r}")
    try:
        json.dumps(config)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"deepspeed_config must be plain JSON data (it is saved with the run): {exc}") from None
    if not isinstance(spec.strict, bool):
        raise TypeError(f"strict must be True or False, got {spec.strict!r}")


def is_sequence(value) -> bool:
    return not isinstance(value, (str, bytes, Mapping)) and hasattr(value, "__iter__")


def step_in_run(name: str, step, steps: int, *, first: int = 0, why: str = "") -> None:
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"{name}: steps must be integers, got {step!r}")
    if not first <= step < steps:
        raise ValueError(f"{name}: step {step} is outside {first}..{steps - 1} (the job trains steps=" +
                         f"{steps}){'; ' + why if why else ''}")


def count(name: str, value, *, minimum: int = 1) -> None:
    """An integer field: no floats (2.0 would reach DeepSpeed as a float), no booleans."""
    if isinstance(value, float):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    validation.count(name, value, minimum=minimum)
