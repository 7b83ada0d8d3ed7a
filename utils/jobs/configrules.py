"""What DeepSpeed's engines do with a parsed config, beyond its config parser.

`DeepSpeedConfig` accepts many configs that ``deepspeed.initialize`` of a `PipelineModule`,
or its first ``train_batch()``, then rejects or quietly runs differently. Each rule here is one
such place in DeepSpeed 0.19.8, checked on real ranks by tests/integration/test_lint_differential.py.
Where DeepSpeed's code can say the rule itself, it does: the value rules of the ``"pipeline"``
section are read from `PipelineEngine.__init__`'s own assertions and comparisons, and the
optimizer and LR scheduler are built with DeepSpeed's own choice of class on one dummy
parameter, so their argument checks are the classes' own.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import re
import textwrap
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from utils.system.dslog import quiet_accelerator_notice


@contextlib.contextmanager
def data_parallel_world(data_parallel: int):
    """DeepSpeed's config code asks ``deepspeed.comm`` for the rank and the data-parallel world
    size (and falls back to 1 process when no process group exists): answer them for a job of
    `data_parallel` replicas, for the time of one check in this process."""
    from deepspeed import comm

    saved = comm.get_rank, comm.get_world_size
    comm.get_rank, comm.get_world_size = (lambda *a, **k: 0), (lambda *a, **k: data_parallel)
    try:
        yield
    finally:
        comm.get_rank, comm.get_world_size = saved


@dataclass(frozen=True)
class PipelineValueRule:
    """One test `PipelineEngine.__init__` applies to a ``"pipeline"`` value, read from its source."""

    key: str
    kind: str
    """``"isinstance"`` (an assertion: any other type fails ``initialize``), ``"order"`` (an
    ordering comparison with a number: a value without an order fails with a TypeError) or
    ``"identity"`` (``is False``: any other value, ``"false"`` or 0 too, counts as not False)."""
    operand: Any
    """The type name, the number compared with, or the constant compared by identity."""
    line: str
    """The source expression, quoted in findings."""


@functools.cache
def pipeline_value_rules() -> tuple[PipelineValueRule, ...]:
    """The tests `PipelineEngine.__init__` applies to ``self._config.pipeline['KEY']``, found in
    its installed source (so a DeepSpeed that adds or drops one changes the linter with it)."""
    quiet_accelerator_notice()
    from deepspeed.runtime.pipe.engine import PipelineEngine

    tree = ast.parse(textwrap.dedent(inspect.getsource(PipelineEngine.__init__)))

    def key_of(node: ast.AST) -> str | None:
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and ast.unparse(node.value) == "self._config.pipeline"):
            return node.slice.value
        return None

    rules = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance" and len(node.args) == 2:
            key = key_of(node.args[0])
            if key:
                rules.append(PipelineValueRule(key, "isinstance", ast.unparse(node.args[1]), ast.unparse(node)))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and key_of(node.left):
            op, right = node.ops[0], node.comparators[0]
            if isinstance(op, (ast.Gt, ast.GtE, ast.Lt, ast.LtE)) and isinstance(right, ast.Constant):
                rules.append(PipelineValueRule(key_of(node.left), "order", right.value, ast.unparse(node)))
            elif isinstance(op, ast.Is) and isinstance(right, ast.Constant):
                rules.append(PipelineValueRule(key_of(node.left), "identity", right.value, ast.unparse(node)))
    return tuple(rules)


def pipeline_keys() -> tuple[set[str], set[str]]:
    """The keys of the ``"pipeline"`` section, from DeepSpeed's code: those its config
    defaults define (``get_pipeline_config``) or its pipeline engine and module look up,
    and, among the defaults, those nothing in the pipeline engine or module ever reads."""
    quiet_accelerator_notice()
    from deepspeed.runtime.config import get_pipeline_config
    from deepspeed.runtime.pipe import engine, module

    defaults = set(get_pipeline_config({}))
    source = inspect.getsource(engine) + inspect.getsource(module)
    used = set(re.findall(r"pipeline(?:\[|\.get\()\s*['\"](\w+)['\"]", source))
    return defaults | used, defaults - used


_TYPES = {"bool": bool, "int": int, "float": (int, float), "str": str}


def pipeline_value_problems(section: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(key, severity, message) for each value of the parsed ``"pipeline"`` section that
    `pipeline_value_rules` fails or reads otherwise than written."""
    problems = []
    for rule in pipeline_value_rules():
        if rule.key not in section:
            continue
        value = section[rule.key]
        shown = f"{value!r} ({type(value).__name__})"
        if rule.kind == "isinstance":
            wanted = _TYPES.get(rule.operand)
            if wanted is not None and not isinstance(value, wanted):
                problems.append((rule.key, "error", f"is {shown}; PipelineEngine.__init__ asserts "
                                 f"`{rule.line}` on every rank, so initialize fails with a bare AssertionError."))
        elif rule.kind == "order":
            if not isinstance(value, int):
                problems.append((rule.key, "error", f"is {shown}; PipelineEngine.__init__ computes `{rule.line}` "
                                 "and then uses it as a layer count, so it must be an int."))
            elif value < rule.operand:
                problems.append((rule.key, "warning", f"is {value}; PipelineEngine.__init__ applies it only when "
                                 f"`{rule.line}`, so the module keeps its own setting."))
        elif rule.kind == "identity" and value is not None and not isinstance(value, bool):
            problems.append((rule.key, "warning", f"is {shown}; PipelineEngine.__init__ tests `{rule.line}`, "
                             f"which no value but {rule.operand!r} itself passes: DeepSpeed acts as if it were "
                             f"{not rule.operand!r}."))
    return problems


def _signature_check(cls, params: dict) -> Exception | None:
    """Whether `cls(params_list, **params)` accepts these keyword arguments, without building it
    (DeepSpeed's own optimizers compile an op when built)."""
    try:
        inspect.signature(cls.__init__).bind(None, [], **params)
    except TypeError as exc:
        return TypeError(f"{cls.__name__}.__init__(): {exc}")
    return None


def _torch_optimizer(cls, params: list, **options):
    """``cls(params, **options)`` for a torch optimizer class, built as its own ``__init__``
    builds it (every check of names and values runs) but with ``Optimizer.add_param_group``
    called unwrapped: torch wraps it in ``_disable_dynamo``, whose first call imports
    ``torch._dynamo`` (about a second in every kernel that plans a job; a dummy optimizer is
    never compiled)."""
    import torch

    plain = getattr(torch.optim.Optimizer.add_param_group, "__wrapped__", None)
    if plain is None:
        return cls(params, **options)
    optimizer = type(cls.__name__, (cls,), {"add_param_group": plain})(params, **options)
    optimizer.__class__ = cls  # DeepSpeed tests type(optimizer) against its list of classes
    return optimizer


def build_optimizer(parsed):
    """The optimizer DeepSpeed's ``_configure_basic_optimizer`` would build from `parsed` (a
    `DeepSpeedConfig`), built on one dummy parameter: (the optimizer or None, the exception
    building it raised or None). torch's classes are built, so their own checks of names and
    values run; DeepSpeed's compiled ones (FusedAdam, FusedLamb, FusedLion, the CPU ones) are
    checked for their argument names only."""
    import torch
    from deepspeed.runtime import config as ds_config

    name = parsed.optimizer_name
    if name is None:
        return None, None
    params = dict(parsed.optimizer_params or {})
    if "max_grad_norm" in params:
        return None, ValueError("'max_grad_norm' is not supported as an optimizer parameter, please switch to "
                                "using the deepspeed parameter 'gradient_clipping'")
    offload = parsed.zero_config.offload_optimizer
    cpu_optimizer = offload is not None and str(getattr(offload.device, "value", offload.device)) in ("cpu", "nvme")
    dummy = [torch.nn.Parameter(torch.zeros(1))]
    if name in (ds_config.ADAM_OPTIMIZER, ds_config.ADAMW_OPTIMIZER):
        adam_w_mode = params.pop("adam_w_mode", True)
        adam_w_mode = name == ds_config.ADAMW_OPTIMIZER or adam_w_mode
        if params.pop("torch_adam", False):
            cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
            params.pop("fp32_optimizer_states", None)
        elif cpu_optimizer:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            params.pop("fp32_optimizer_states", None)
            return None, _signature_check(DeepSpeedCPUAdam, {**params, "adamw_mode": adam_w_mode})
        else:
            from deepspeed.ops.adam import FusedAdam

            params.pop("fp32_optimizer_states", None)
            return None, _signature_check(FusedAdam, {**params, "adam_w_mode": adam_w_mode})
    elif name == ds_config.ADAGRAD_OPTIMIZER:
        if cpu_optimizer:
            from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

            return None, _signature_check(DeepSpeedCPUAdagrad, params)
        cls = torch.optim.Adagrad
    elif name == ds_config.LAMB_OPTIMIZER:
        from deepspeed.ops.lamb import FusedLamb

        return None, _signature_check(FusedLamb, params)
    elif name == ds_config.LION_OPTIMIZER:
        from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

        return None, _signature_check(DeepSpeedCPULion if cpu_optimizer else FusedLion, params)
    elif name in ds_config.DEEPSPEED_OPTIMIZERS:
        return None, None  # the mu-P and Muon optimizers: not checked
    elif hasattr(torch.optim, name):
        cls = getattr(torch.optim, name)
    else:
        return None, AttributeError(f"module 'torch.optim' has no attribute {name!r}")
    try:
        return _torch_optimizer(cls, dummy, **params), None
    except Exception as exc:  # noqa: BLE001 - the class's own verdict
        return None, exc


class _EngineView:
    """Just enough of a `DeepSpeedEngine` for its config accessors: each engine method looked up
    on the view runs DeepSpeed's own code with ``self._config`` = the parsed config."""

    def __init__(self, parsed):
        self._config = parsed
        self.global_rank = 0
        self.pipeline_parallelism = True

    def __getattr__(self, name: str):
        from deepspeed.runtime.engine import DeepSpeedEngine

        return types.MethodType(getattr(DeepSpeedEngine, name), self)


def optimizer_sanity(parsed, optimizer) -> Exception | None:
    """What DeepSpeed's ``_do_optimizer_sanity_check`` raises for `parsed` with the basic
    `optimizer` (a stand-in torch AdamW where the real one is a compiled op): its own code, run
    on the parsed config (model dtype against ``data_types.grad_accum_dtype``, ZeRO with an
    untested optimizer). None when it passes, or when this DeepSpeed's check needs more of an
    engine than the config."""
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine

    if optimizer is None:
        optimizer = _torch_optimizer(torch.optim.AdamW, [torch.nn.Parameter(torch.zeros(1))])
    try:
        with data_parallel_world(1):
            DeepSpeedEngine._do_optimizer_sanity_check(_EngineView(parsed), optimizer)
    except AttributeError:
        return None
    except Exception as exc:  # noqa: BLE001 - DeepSpeed's verdict
        return exc
    return None


def build_scheduler(parsed) -> Exception | None:
    """Build the LR scheduler DeepSpeed's `_scheduler_from_config` would build from `parsed`
    on a dummy torch optimizer; the exception it raises, or None."""
    import torch
    from deepspeed.runtime import lr_schedules

    name = parsed.scheduler_name
    if name is None:
        return None
    if hasattr(lr_schedules, name):
        cls = getattr(lr_schedules, name)
    elif hasattr(torch.optim.lr_scheduler, name):
        cls = getattr(torch.optim.lr_scheduler, name)
    else:
        return AssertionError(f"DeepSpeed does not recognize LR scheduler {name}")
    optimizer = _torch_optimizer(torch.optim.SGD, [torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    try:
        cls(optimizer, **(parsed.scheduler_params or {}))
    except Exception as exc:  # noqa: BLE001 - the class's own verdict
        return exc
    return None


_FALSE_WORDS = ("false", "0", "no", "off", "")
#: top-level numbers whose DeepSpeed default is None (so their lookup shows no type), with a
#: stand-in default of the type the engine computes with: steps_per_print in
#: ``global_steps % steps_per_print`` after each step.
NUMBERS_WITHOUT_DEFAULT = {"steps_per_print": 10}


def scalar_problems(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(key, severity, message, fix) for top-level values of a type DeepSpeed does not check
    and then computes with: its default (`defaults`, read from DeepSpeedConfig's own lookups)
    says which type that is. A number written as a string fails where DeepSpeed first uses it;
    a true/false setting written as a string is tested for truth, so ``"false"`` acts as True."""
    problems = []
    for key, value in config.items():
        default = defaults.get(key, NUMBERS_WITHOUT_DEFAULT.get(key))
        if default is None or key in BATCH_KEYS or not isinstance(value, str):
            continue
        if isinstance(default, bool):
            if value.strip().lower() in _FALSE_WORDS:
                problems.append((key, "warning", f"is the string {value!r}; DeepSpeed tests it for truth (its "
                                 f"default is {default!r}) and any non-empty string is true: it acts as True.",
                                 "write it as a JSON false"))
        elif isinstance(default, (int, float)):
            problems.append((key, "error", f"is the string {value!r}; DeepSpeed reads it unchecked (its default is "
                             f"{default!r}) and computes with it, which fails with a TypeError where it is first used "
                             "(for steps_per_print, gradient_clipping, gradient_predivide_factor: the first step).",
                             f"write it as a number, e.g. {value.strip()}" if _is_number(value)
                             else "write it as a number"))
    steps = config.get("steps_per_print")
    if isinstance(steps, (int, float)) and not isinstance(steps, bool) and steps == 0:
        problems.append(("steps_per_print", "error", "is 0; the engine logs when global_steps % steps_per_print == 0, "
                         "so the first step fails with ZeroDivisionError.", "use a positive count, e.g. 10**9 to "
                         "print (almost) never"))
    micro_batches = config.get("gradient_accumulation_steps")
    if isinstance(micro_batches, float):
        problems.append(("gradient_accumulation_steps", "error", f"is the float {micro_batches!r}; it is the "
                         "pipeline's micro-batch count, which the schedule passes to range(): the first step fails "
                         "with TypeError.", f"write it as an int, e.g. {int(micro_batches)}"))
    return problems


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
"""The three batch values DeepSpeed derives from one another."""


def derived_batch(total, micro, steps, data_parallel: int) -> tuple:
    """(train_batch_size, micro-batch size, gradient_accumulation_steps) as DeepSpeedConfig
    derives the missing ones (``_set_batch_related_parameters``: floor divisions by the
    data-parallel size, then by the other written value); None where it derives nothing."""
    if None not in (total, micro, steps):
        return total, micro, steps
    if total is not None and micro is not None:
        return total, micro, total // micro // data_parallel
    if total is not None and steps is not None:
        return total, total // data_parallel // steps, steps
    if micro is not None and steps is not None:
        return micro * steps * data_parallel, micro, steps
    if total is not None:
        return total, total // data_parallel, 1
    if micro is not None:
        return micro * data_parallel, micro, 1
    return None, None, steps


def batch_story(config: Mapping, data_parallel: int) -> str:
    """What DeepSpeed derived from the written batch values, for an error message ("" when all
    three are written or they are not ints)."""
    written = [config.get(k) for k in BATCH_KEYS]
    if not all(isinstance(v, int) and not isinstance(v, bool) or v is None for v in written) or \
            all(v is None for v in written[:2]):
        return ""
    total, micro, steps = derived_batch(*written, data_parallel)
    missing = [k for k, v in zip(BATCH_KEYS, written) if v is None]
    if not missing:
        return ""
    return (f"With {data_parallel} replica{'s' * (data_parallel != 1)} it derives {', '.join(missing)} by floor "
            f"division: train_batch_size={total}, micro-batch size {micro}, {steps} micro-batches, and "
            f"{micro} × {steps} × {data_parallel} = {micro * steps * data_parallel}"
            f"{' ≠ ' + str(total) if micro * steps * data_parallel != total else ''}.")


def batch_fix(config: Mapping, data_parallel: int) -> str:
    """Values that would satisfy DeepSpeed's batch assertion, as a fix."""
    total, micro, steps = (config.get(k) for k in BATCH_KEYS)
    ints = [v for v in (total, micro, steps) if v is not None]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in ints) or not ints:
        return ("write train_batch_size and train_micro_batch_size_per_gpu (or gradient_accumulation_steps) as "
                "positive ints with train_batch_size = micro-batch size × gradient_accumulation_steps × "
                f"{data_parallel} replicas")
    if micro is not None and steps is not None:
        return f"set train_batch_size to {micro * steps * data_parallel} (= {micro} × {steps} × {data_parallel})"
    if total is not None and micro is not None:
        return (f"make train_batch_size a multiple of {micro * data_parallel} (micro-batch {micro} × "
                f"{data_parallel} replicas), e.g. {max(1, total // (micro * data_parallel)) * micro * data_parallel}")
    if total is not None and steps is not None:
        return (f"make train_batch_size a multiple of {steps * data_parallel} (gradient_accumulation_steps {steps} × "
                f"{data_parallel} replicas), e.g. {max(1, total // (steps * data_parallel)) * steps * data_parallel}")
    if total is not None:
        return (f"make train_batch_size a multiple of {data_parallel} (the replicas), "
                f"e.g. {max(1, total // data_parallel) * data_parallel}")
    return "write train_batch_size or train_micro_batch_size_per_gpu"


INERT_SECTIONS = ("activation_checkpointing",)
"""Sections `engine_findings` may report as parsed but never applied. Such a finding is about the
section's effect, not its keys: a misspelt key inside it still gets its own "did you mean"."""


def engine_findings(config: Mapping, parsed, *, num_stages: int, device: str | None,
                    scalar_defaults: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(key, severity, message, fix) for what ``deepspeed.initialize`` of a PipelineModule and
    its first step do with a config DeepSpeed's parser accepted (`parsed`); `scalar_defaults`:
    the defaults DeepSpeedConfig passes for top-level keys (`configlint.scalar_defaults`)."""
    from deepspeed.runtime.zero.config import ZeroStageEnum

    found = []
    stage = int(parsed.zero_optimization_stage)
    if stage >= ZeroStageEnum.gradients:
        found.append(("zero_optimization.stage", "error", f"ZeRO stage {stage} partitions gradients; "
                      "PipelineEngine.__init__ asserts 'ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                      "parallelism'.", "use stage 0 or 1 with pipeline parallelism"))
    if parsed.optimizer_name is None:
        found.append(("optimizer", "error", (
            f"ZeRO stage {stage} and no optimizer: initialize asserts 'zero stage {stage} requires an optimizer'"
            if stage >= 1 else "no optimizer: the first train_batch() asserts 'must provide optimizer during init "
            "in order to use backward'") + " (unless the script passes optimizer= to deepspeed.initialize).",
            "add an optimizer section, e.g. {'type': 'Adam', 'params': {'lr': 1e-3}}"))
    optimizer, problem = build_optimizer(parsed)
    if problem is not None:
        found.append(("optimizer", "error", f"DeepSpeed builds {parsed.optimizer_name!r} with these params "
                      f"and it fails: {type(problem).__name__}: {problem}.",
                      "give the params the optimizer class takes, with values of its types"))
    if parsed.optimizer_name is not None and problem is None and \
            (problem := optimizer_sanity(parsed, optimizer)) is not None:
        found.append(("data_types" if "dtype" in str(problem).lower() else "optimizer", "error",
                      f"initialize raises {type(problem).__name__}: {problem} (DeepSpeedEngine."
                      "_do_optimizer_sanity_check, run on this config).",
                      "without ZeRO, leave data_types.grad_accum_dtype at the model's dtype (an fp32 "
                      "accumulation with bf16 needs ZeRO stage 1)" if "unsupported mix" in str(problem) else
                      "use one of DeepSpeed's dtype names: fp32, fp16, bf16" if "DtypeEnum" in str(problem) else
                      "change what the message names"))
    if (problem := build_scheduler(parsed)) is not None:
        found.append(("scheduler", "error", f"DeepSpeed builds the LR scheduler {parsed.scheduler_name!r} "
                      f"and it fails: {type(problem).__name__}: {problem}.",
                      "give a DeepSpeed (deepspeed.runtime.lr_schedules) or torch scheduler and its params"))
    for key, severity, message in pipeline_value_problems(parsed.pipeline):
        found.append((f"pipeline.{key}", severity, message,
                      "write it as a JSON true/false" if "bool" in message or "is False" in message
                      else "write it as an int"))
    found += scalar_problems(config, scalar_defaults)
    if parsed.wall_clock_breakdown and num_stages > 1:
        by_profiler = not config.get("wall_clock_breakdown")
        found.append(("wall_clock_breakdown", "error", (
            "is on because flops_profiler.enabled is (DeepSpeedConfig sets it to wall_clock_breakdown or "
            "flops_profiler.enabled); " if by_profiler else "") + "with more than one stage, the first "
            "train_batch() fails on every stage but the last: 'bwd_microstep timer has already been started' "
            "(the pipeline's backward starts that timer inside the engine's own backward timer).",
            ("turn the flops profiler off" if by_profiler else "set it to false") +
            "; read the stages' times from the workbook's timeline instead"))
    if device == "cpu" and parsed.float16_config.enabled:
        found.append(("fp16", "error", "DeepSpeed's CPU accelerator has no fp16 training "
                      "(is_fp16_supported() is False): initialize fails 'Type fp16 is not supported on your "
                      "device'.", "use bf16 on CPU (JobSpec(precision='bf16'), or bf16.enabled), or run on a GPU"))
    micro_batches = parsed.gradient_accumulation_steps
    if "gradient_accumulation_steps" not in config and isinstance(micro_batches, int) and micro_batches < num_stages:
        bubble = (num_stages - 1) / (micro_batches + num_stages - 1)
        found.append(("gradient_accumulation_steps", "warning", f"not written, DeepSpeed derives "
                      f"m = {micro_batches} micro-batch{'es' * (micro_batches != 1)} < {num_stages} stages: "
                      f"the pipeline never fills, {bubble:.0%} of each step is bubble ((p-1)/(m+p-1)).",
                      f"write gradient_accumulation_steps >= {num_stages} (several times the stages)"))
    pipeline = config.get("pipeline") if isinstance(config.get("pipeline"), Mapping) else {}
    for key in ("pipe_partitioned", "grad_partitioned"):
        if pipeline.get(key) is True:
            found.append((f"pipeline.{key}", "warning", "has no effect here: PipelineEngine partitions "
                          "activations and gradients between stages only with model (tensor) parallelism "
                          f"(is_{key.split('_')[0]}_partitioned = is_model_parallel and ...).",
                          "drop it unless the job also has tensor parallelism"))
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT

    section = config.get("activation_checkpointing")
    if isinstance(section, Mapping) and any(k in ACT_CHKPT_DEFAULT and v != ACT_CHKPT_DEFAULT[k]
                                            for k, v in section.items()):  # asks for anything at all
        found.append(("activation_checkpointing", "warning", "DeepSpeed parses this section but applies it "
                      "only when the script calls deepspeed.checkpointing.configure(mpu, deepspeed_config=...): "
                      "the engine never does, so PipelineModule's checkpoints run without these options.",
                      "call deepspeed.checkpointing.configure(None, deepspeed_config=config) before "
                      "initialize, or drop the section"))
    zero = config.get("zero_optimization")
    if isinstance(zero, Mapping) and zero.get("overlap_comm") is True:
        found.append(("zero_optimization.overlap_comm", "warning", "pipeline parallelism does not overlap "
                      "ZeRO's communication: the engine turns it off ('Pipeline parallelism does not support "
                      "overlapped communication, will be disabled')." if stage else "has no effect without "
                      "ZeRO (stage 0).", "drop it"))
    return found
