"""`lint_config`: what DeepSpeed will really do with a config dict, before any process starts.

DeepSpeed 0.19.8 silently ignores a top-level key it does not know (the seed's
``pipe_parallel_size``, ``"schedule": "1F1B"``) and any unknown key inside ``"pipeline"``;
only its pydantic-validated sections (``zero_optimization``, ``fp16``, ``bf16`` ...) reject
unknown keys, with an error that does not say what was meant. The linter reports all of it as
`Finding`s (key, severity, message, fix).

The vocabulary is DeepSpeed's own, read at run time: the config is handed to DeepSpeed's
``DeepSpeedConfig`` wrapped in dicts that record every key DeepSpeed looks up (``get``,
``[]``, ``in``, ``in keys()``), present or not. A key of the config that DeepSpeed never looked
up is one it ignores; the keys it did look up are the "did you mean" candidates. So the list
stays right when DeepSpeed changes, and a key DeepSpeed reads is never reported as unknown.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from utils.system.dslog import quiet_accelerator_notice

Severity = Literal["error", "warning"]

#: Keys people put in the config that are `PipelineModule` arguments or engine settings.
NOT_CONFIG_KEYS: dict[str, str] = {
    "pipe_parallel_size": "the number of stages is PipelineModule(num_stages=...) (JobSpec(num_stages=...))",
    "pipeline_parallel_size": "the number of stages is PipelineModule(num_stages=...) (JobSpec(num_stages=...))",
    "num_stages": "the number of stages is PipelineModule(num_stages=...) (JobSpec(num_stages=...))",
    "schedule": "the schedule is set on the engine, not in the config (JobSpec(schedule='1f1b' | 'gpipe'))",
    "partition_method": "partitioning is PipelineModule(partition_method=...) (JobSpec(partition=...))",
    "activation_checkpoint_interval": "it is PipelineModule(activation_checkpoint_interval=...)",
    "micro_batch_size": "the micro-batch size is the top-level train_micro_batch_size_per_gpu",
}


@dataclass(frozen=True)
class Finding:
    """One thing the config does not do as written."""

    key: str
    """Dotted path of the key (``"pipeline.shedule"``), or ``""`` for the config as a whole."""
    severity: Severity
    """``"error"``: DeepSpeed rejects it, or the job cannot be what the config says;
    ``"warning"``: DeepSpeed runs but ignores or overrides it."""
    message: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.key}: " if self.key else ""
        return f"[{self.severity}] {where}{self.message} Fix: {self.fix}"


def lint_config(config: Mapping[str, Any], *, data_parallel: int = 1, num_stages: int = 1) -> list[Finding]:
    """Every `Finding` for `config` run with `num_stages` pipeline stages and `data_parallel`
    replicas, errors first."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    findings = _misplaced(config) + _batch(config, data_parallel) + _zero_and_precision(config, num_stages)
    findings += _unknown(config, {f.key for f in findings})
    return sorted(findings, key=lambda f: (f.severity != "error", f.key))


# --- what DeepSpeed reads -----------------------------------------------------------------------
class _Keys:
    """``d.keys()`` of a recording dict: ``k in d.keys()`` is a look-up too."""

    def __init__(self, owner: _Recording):
        self.owner = owner

    def __contains__(self, key) -> bool:
        self.owner._seen(key)
        return dict.__contains__(self.owner, key)

    def __iter__(self):
        return iter(dict.keys(self.owner))

    def __len__(self) -> int:
        return dict.__len__(self.owner)


class _Recording(dict):
    """A dict that records (into `read`) every key looked up, under its dotted path."""

    def __init__(self, data: Mapping, path: str, read: set[str]):
        super().__init__({k: _Recording(v, f"{path}{k}.", read) if isinstance(v, Mapping) else v
                          for k, v in data.items()})
        self._path, self._read = path, read

    def _seen(self, key) -> None:
        self._read.add(f"{self._path}{key}")

    def get(self, key, default=None):
        self._seen(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self._seen(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self._seen(key)
        return super().__contains__(key)

    def keys(self):
        return _Keys(self)


#: Sections passed whole to a constructor DeepSpeed does not check: their keys are the
#: optimizer's or scheduler's arguments, not config keys.
PASSED_THROUGH = ("optimizer.params", "scheduler.params")


PROBE = "__workbook_lint_probe__"


def _ask(config: dict) -> tuple[set[str], Exception | None]:
    """Hand `config` to DeepSpeed's ``DeepSpeedConfig``; the keys it looked up, what it raised."""
    quiet_accelerator_notice()
    from deepspeed.runtime.config import DeepSpeedConfig

    read: set[str] = set()
    try:
        DeepSpeedConfig(_Recording(config, "", read))
    except Exception as exc:  # noqa: BLE001 - reported as findings by the caller
        return read, exc
    return read, None


def deepspeed_reads(config: Mapping[str, Any]) -> tuple[set[str], set[str], list[Exception]]:
    """What DeepSpeed's ``DeepSpeedConfig`` makes of `config`: the dotted keys it looks up,
    the sections it validates whole (pydantic: it rejects unknown keys there itself), and
    what it raised.

    The vocabulary does not depend on the config being valid: a minimal config gives every
    top-level key DeepSpeed looks up, and each section of `config` alone (next to the minimal
    one) the keys looked up inside it; a probe key tells the validated sections. Then the
    whole config, with the batch sizes made consistent for one process (their arithmetic is
    checked on its own), and again without each key a validated section rejected, so one
    misspelling does not hide the keys read after it."""
    minimal = {"train_batch_size": 1}
    read, _ = _ask(dict(minimal))
    validated = set()
    for section, value in config.items():
        if not isinstance(value, Mapping):
            continue
        alone, _ = _ask({**minimal, section: copy.deepcopy(dict(value))})
        read |= alone
        _, probed = _ask({**minimal, section: {PROBE: 1}})
        if probed is not None and type(probed).__name__ == "ValidationError" and PROBE in str(probed):
            validated.add(section)
    trial = copy.deepcopy(dict(config))
    micro = trial.get("train_micro_batch_size_per_gpu", 1)
    steps = trial.get("gradient_accumulation_steps", 1)
    if isinstance(micro, int) and isinstance(steps, int) and micro > 0 and steps > 0:
        trial.update(train_batch_size=micro * steps, train_micro_batch_size_per_gpu=micro,
                     gradient_accumulation_steps=steps)
    errors: list[Exception] = []
    for _ in range(8):
        seen, error = _ask(trial)
        read |= seen
        if error is None:
            break
        errors.append(error)
        if not _drop_rejected(trial, error):
            break
    return read, validated, errors


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


def _drop_rejected(trial: dict, error: Exception) -> bool:
    """Remove from `trial` the keys a pydantic section rejected as unknown; False if none."""
    if type(error).__name__ != "ValidationError":
        return False
    dropped = False
    for item in error.errors():
        if item.get("type") != "extra_forbidden" or not item.get("loc"):
            continue
        name = item["loc"][-1]
        for section in trial.values():
            if isinstance(section, dict) and name in section:
                del section[name]
                dropped = True
    return dropped


def _unknown(config: Mapping, already: set[str]) -> list[Finding]:
    read, validated, errors = deepspeed_reads(config)
    findings = _pipeline_section(config.get("pipeline"))
    for path, _ in _paths(config):
        if path in read or path in already or any(path.startswith(a + ".") for a in already):
            continue
        parent = path.rsplit(".", 1)[0] + "." if "." in path else ""
        top = path.split(".", 1)[0]
        if parent and (parent[:-1] not in read or top in validated or top == "pipeline"
                       or parent[:-1].startswith(PASSED_THROUGH)):
            # inside a section DeepSpeed ignores (reported there), validates whole (pydantic:
            # it rejects what it does not know, below) or passes on (optimizer arguments)
            continue
        siblings = sorted(k[len(parent):] for k in read if k.startswith(parent) and "." not in k[len(parent):])
        name = path[len(parent):]
        close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.75)
        findings.append(Finding(path, "warning", "DeepSpeed does not read this key and ignores it silently.",
                                f"did you mean {parent}{close[0]!r}?" if close else
                                f"remove it (DeepSpeed reads {len(siblings)} keys here)"))
    for error in errors:
        findings += _from_error(error)
    return findings


def _pipeline_section(section) -> list[Finding]:
    """DeepSpeed copies every key of ``"pipeline"`` onto its defaults and reads a few: an
    unknown one is ignored silently, and some defaults are never read at all."""
    if not isinstance(section, Mapping):
        return []
    known, unused = pipeline_keys()
    findings = []
    for name in section:
        if name in NOT_CONFIG_KEYS and name != "activation_checkpoint_interval":
            continue  # reported by _misplaced, with its proper place
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
            findings.append(Finding(f"pipeline.{name}", "warning", "DeepSpeed's pipeline engine never reads this "
                                    "key and ignores it silently.",
                                    f"did you mean 'pipeline.{close[0]}'?" if close else
                                    f"the keys it knows: {', '.join(sorted(known))}"))
        elif name in unused:
            findings.append(Finding(f"pipeline.{name}", "warning", "DeepSpeed keeps this key in its config but its "
                                    "pipeline engine and module never read it.",
                                    "set it through PipelineModule (num_stages=, partition_method=, seed_layers=) "
                                    "and drop it here"))
    return findings


def _from_error(error: Exception) -> list[Finding]:
    """DeepSpeed's own rejection, one finding per pydantic error (with the fields it knows)."""
    if type(error).__name__ != "ValidationError":
        return [Finding("", "error", f"DeepSpeed rejects the config: {type(error).__name__}: {error}",
                        "change what the message names")]
    model = getattr(error, "title", "")
    findings = []
    for item in error.errors():
        where = ".".join(str(p) for p in item.get("loc", ()))
        fix = "change or remove it"
        if item.get("type") == "extra_forbidden":
            fields = _fields_of(model)
            close = difflib.get_close_matches(str(item["loc"][-1]), fields, n=1, cutoff=0.6)
            fix = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(fields)}"
        findings.append(Finding(f"{model}.{where}" if model else where, "error",
                                f"DeepSpeed rejects it: {item.get('msg')}.", fix))
    return findings


def _fields_of(model_name: str) -> list[str]:
    """Field names (and aliases) of DeepSpeed's pydantic config model `model_name`."""
    import deepspeed.runtime.config_utils as utils

    for cls in _subclasses(utils.DeepSpeedConfigModel):
        if cls.__name__ == model_name:
            return sorted({name for name, f in cls.model_fields.items()} |
                          {f.alias for f in cls.model_fields.values() if f.alias})
    return []


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _paths(config: Mapping, prefix: str = ""):
    for key, value in config.items():
        path = f"{prefix}{key}"
        yield path, value
        if isinstance(value, Mapping):
            yield from _paths(value, path + ".")


# --- rules DeepSpeed itself does not state ---------------------------------------------------------
def _misplaced(config: Mapping) -> list[Finding]:
    """Keys that look like pipeline settings but that DeepSpeed never reads where they are, at
    the top level or inside ``"pipeline"`` (the seed's snippet puts them there)."""
    found = []
    pipeline = config.get("pipeline") if isinstance(config.get("pipeline"), Mapping) else {}
    for prefix, section in (("", config), ("pipeline.", pipeline)):
        for key, where in NOT_CONFIG_KEYS.items():
            if key in section and not (prefix and key == "activation_checkpoint_interval"):
                found.append(Finding(prefix + key, "error", "not a DeepSpeed config key here: DeepSpeed ignores it "
                                     "silently, so the job does not get what it says.", f"drop it; {where}"))
    return found


def _batch(config: Mapping, data_parallel: int) -> list[Finding]:
    total, micro, steps = (config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                     "gradient_accumulation_steps"))
    if not all(isinstance(v, int) for v in (total, micro, steps)):
        return []
    if total == micro * steps * data_parallel:
        return []
    return [Finding("train_batch_size", "error",
                    f"train_batch_size={total} but train_micro_batch_size_per_gpu × gradient_accumulation_steps × "
                    f"data parallel = {micro} × {steps} × {data_parallel} = {micro * steps * data_parallel}; "
                    "DeepSpeed asserts they are equal.",
                    f"set train_batch_size to {micro * steps * data_parallel}, or gradient_accumulation_steps "
                    f"(the pipeline's micro-batches) to {total // (micro * data_parallel)}"
                    if total % (micro * data_parallel) == 0 else
                    f"set train_batch_size to {micro * steps * data_parallel}")]


def _zero_and_precision(config: Mapping, num_stages: int) -> list[Finding]:
    found = []
    zero = config.get("zero_optimization")
    stage = zero.get("stage", 0) if isinstance(zero, Mapping) else 0
    if num_stages > 1 and isinstance(stage, int) and stage >= 2:
        found.append(Finding("zero_optimization.stage", "error",
                             f"ZeRO stage {stage} partitions gradients, which DeepSpeed's PipelineEngine rejects "
                             "(it assumes whole gradients per stage).", "use stage 0 or 1 with pipeline parallelism"))
    enabled = [k for k in ("fp16", "bf16", "bfloat16") if isinstance(config.get(k), Mapping)
               and config[k].get("enabled") is True]
    if "fp16" in enabled and len(enabled) > 1:
        found.append(Finding("fp16", "error", f"both {' and '.join(enabled)} are enabled; DeepSpeed trains in one.",
                             "enable one of them"))
    amp = config.get("amp")
    if enabled and isinstance(amp, Mapping) and amp.get("enabled") is True:
        found.append(Finding("amp", "error", "amp (apex) and DeepSpeed's own fp16/bf16 are both enabled.",
                             "disable amp"))
    return found
