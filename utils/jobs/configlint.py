"""`lint_config`: what DeepSpeed will really do with a config dict, before any process starts.

Its verdicts are checked against DeepSpeed's own: tests/integration/test_lint_differential.py
runs every config of a corpus (DeepSpeed's example configs, the workbook's, generated
mutations) through ``deepspeed.initialize`` of a real `PipelineModule` and one
``train_batch()`` on gloo ranks, and records whether DeepSpeed rejected it, ran it otherwise
than written, or ran it as written (tests/data/lint_outcomes.json; docs/config-lint.md has the
agreement and every disagreement). An ``error`` means DeepSpeed rejects the config in
``initialize`` or in the first step; a ``warning`` means it runs, but not as written.

Where DeepSpeed can say it, DeepSpeed says it:

- the config is parsed by DeepSpeed's ``DeepSpeedConfig`` with the job's data-parallel size,
  so the batch arithmetic (floor divisions included) and every check of the parser are its own;
- the vocabulary is read at run time: the config is handed to the parser wrapped in dicts that
  record every key it looks up (``get``, ``[]``, ``in``, ``in keys()``) and every section it
  passes on whole (``items()``, ``copy.copy``). A key DeepSpeed never looked up is one it
  ignores; the keys it did look up are the "did you mean" candidates;
- the engines' own checks (`utils.jobs.configrules`): the ``"pipeline"`` value rules are read
  from `PipelineEngine.__init__`'s assertions and comparisons, and the optimizer and LR
  scheduler are built with the classes DeepSpeed would pick, so their argument checks are the
  classes' own.

The rest are rules DeepSpeed's code does not state in one place (``wall_clock_breakdown`` on a
non-last stage, a derived micro-batch count below the stage count, sections applied only when
the script calls something), each named in its finding.
"""

from __future__ import annotations

import copy
import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from utils.jobs.configrules import BATCH_KEYS, INERT_SECTIONS, data_parallel_world, engine_findings, pipeline_keys
from utils.system.dslog import quiet_accelerator_notice

Severity = Literal["error", "warning"]

#: Keys people put in the config that are `PipelineModule` arguments or engine settings:
#: key -> (what the job really does, where the setting belongs).
NOT_CONFIG_KEYS: dict[str, tuple[str, str]] = {
    "pipe_parallel_size": ("the job has the stages PipelineModule(num_stages=...) gives it",
                           "the number of stages is PipelineModule(num_stages=...) (JobSpec(num_stages=...))"),
    "pipeline_parallel_size": ("the job has the stages PipelineModule(num_stages=...) gives it",
                               "the number of stages is PipelineModule(num_stages=...) (JobSpec(num_stages=...))"),
    "num_stages": ("the job has the stages PipelineModule(num_stages=...) gives it",
                   "the number of stages is PipelineModule(num_stages=...) (JobSpec(num_stages=...))"),
    "schedule": ("the engine runs DeepSpeed's TrainSchedule (1F1B)",
                 "the schedule is set on the engine, not in the config (JobSpec(schedule='1f1b' | 'gpipe'))"),
    "partition_method": ("the layers are split by PipelineModule(partition_method=...) (default 'parameters')",
                         "partitioning is PipelineModule(partition_method=...) (JobSpec(partition=...))"),
    "activation_checkpoint_interval": ("activations are checkpointed as the module or pipeline section says",
                                       "it is PipelineModule(activation_checkpoint_interval=...) or "
                                       "pipeline.activation_checkpoint_interval"),
    "micro_batch_size": ("the micro-batch size is train_micro_batch_size_per_gpu",
                         "the micro-batch size is the top-level train_micro_batch_size_per_gpu"),
    "micro_batches": ("the micro-batch count is gradient_accumulation_steps",
                      "the pipeline's micro-batches are the top-level gradient_accumulation_steps"),
}


@dataclass(frozen=True)
class Finding:
    """One thing the config does not do as written."""

    key: str
    """Dotted path of the key (``"pipeline.shedule"``), or ``""`` for the config as a whole."""
    severity: Severity
    """``"error"``: DeepSpeed rejects the config, in ``initialize`` or in the first
    ``train_batch()``; ``"warning"``: DeepSpeed runs it, but not as written (it ignores,
    overrides or derives otherwise what this key says; the message says what the job does)."""
    message: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.key}: " if self.key else ""
        return f"[{self.severity}] {where}{self.message} Fix: {self.fix}"


def lint_config(config: Mapping[str, Any], *, data_parallel: int = 1, num_stages: int = 1,
                device: str | None = None) -> list[Finding]:
    """Every `Finding` for `config` given to ``deepspeed.initialize`` with a `PipelineModule`
    of `num_stages` stages and `data_parallel` replicas, errors first. `device` (``"cpu"``,
    ``"cuda"``): also what that device's accelerator rejects (fp16 on a CPU); None leaves it out."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    for name, value in (("data_parallel", data_parallel), ("num_stages", num_stages)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    findings = _misplaced(config, num_stages)
    parsed, error = parse(config, data_parallel)
    if error is not None:
        findings += _from_parse_error(config, error, data_parallel)
        if _is_batch_error(error):  # DeepSpeed stops at the batch sizes: list what it would meet next too
            parsed, _ = parse(_batch_made_consistent(config, data_parallel), data_parallel)
    if parsed is not None:
        findings += [Finding(*found) for found in engine_findings(config, parsed, num_stages=num_stages,
                                                                  device=device, scalar_defaults=scalar_defaults())
                     if error is None or found[0] not in BATCH_KEYS]
    findings += _comms_logger_switch(config)
    unknown, errors = _unknown(config, {f.key for f in findings} - set(INERT_SECTIONS))
    findings += unknown
    if error is not None:  # every section DeepSpeed's validation rejects, not only the first
        findings += [f for e in errors if type(e).__name__ == "ValidationError" for f in _from_error(e)]
        if not any(f.severity == "error" for f in findings):
            findings += _from_error(error)
    return sorted(_unique(findings), key=lambda f: (f.severity != "error", f.key))


def _unique(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        if (f.key, f.message) not in seen:
            seen.add((f.key, f.message))
            out.append(f)
    return out


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
    """A dict that records (into `read`) every key looked up, under its dotted path, and (into
    `defaults`) the default DeepSpeed passes when it gets a top-level key."""

    def __init__(self, data: Mapping, path: str, read: set[str], defaults: dict | None = None):
        super().__init__({k: _Recording(v, f"{path}{k}.", read) if isinstance(v, Mapping) else v
                          for k, v in data.items()})
        self._path, self._read, self._defaults = path, read, {} if defaults is None else defaults

    def _seen(self, key) -> None:
        self._read.add(f"{self._path}{key}")

    def get(self, key, default=None):
        self._seen(key)
        if not self._path and default is not None:
            self._defaults.setdefault(key, default)
        return super().get(key, default)

    def __getitem__(self, key):
        self._seen(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self._seen(key)
        return super().__contains__(key)

    def keys(self):
        return _Keys(self)

    def items(self):
        """A section DeepSpeed iterates (``for k, v in s.items()``, ``copy.copy(s)``) is passed
        on whole: each key in it, at any depth, counts as read. Not the top level, which
        DeepSpeedConfig copies before it looks its keys up one by one."""
        if self._path:
            self._mark_whole()
        return super().items()

    def _mark_whole(self) -> None:
        for key, value in dict.items(self):
            self._seen(key)
            if isinstance(value, _Recording):
                value._mark_whole()


#: Sections passed whole to a constructor DeepSpeed does not check: their keys are the
#: optimizer's or scheduler's arguments, not config keys.
PASSED_THROUGH = ("optimizer.params", "scheduler.params")


PROBE = "__workbook_lint_probe__"


@functools.cache
def scalar_defaults() -> dict[str, Any]:
    """Each top-level key DeepSpeedConfig gets with a default (``get_scalar_param``), and that
    default: the type DeepSpeed computes with, from its own code."""
    quiet_accelerator_notice()
    from deepspeed.runtime.config import DeepSpeedConfig

    defaults: dict[str, Any] = {}
    with data_parallel_world(1):
        DeepSpeedConfig(_Recording({"train_batch_size": 1}, "", set(), defaults))
    return defaults


def parse(config: Mapping[str, Any], data_parallel: int = 1):
    """DeepSpeed's own parse of `config` for `data_parallel` replicas: (the `DeepSpeedConfig`,
    None), or (None, what it raised)."""
    quiet_accelerator_notice()
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        with data_parallel_world(data_parallel):
            return DeepSpeedConfig(copy.deepcopy(dict(config))), None
    except Exception as exc:  # noqa: BLE001 - DeepSpeed's verdict, reported as findings
        return None, exc


def _ask(config: dict) -> tuple[set[str], Exception | None]:
    """Hand `config` to DeepSpeed's ``DeepSpeedConfig``; the keys it looked up, what it raised."""
    quiet_accelerator_notice()
    from deepspeed.runtime.config import DeepSpeedConfig

    read: set[str] = set()
    try:
        with data_parallel_world(1):
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


def _unknown(config: Mapping, already: set[str]) -> tuple[list[Finding], list[Exception]]:
    """Warnings for the keys DeepSpeed never reads, and the errors its parser raised on the way."""
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
                                f"did you mean {parent + close[0]!r}?" if close else
                                f"remove it (DeepSpeed reads {len(siblings)} keys here)"))
    return findings, errors


def _comms_logger_switch(config: Mapping) -> list[Finding]:
    """DeepSpeed turns its comms logger on whenever a ``"comms_logger"`` section is present
    (``DeepSpeedCommsConfig``: ``'comms_logger' in ds_config``; ``CommsLogger.configure`` sets
    ``enabled`` from that, not from the section's ``enabled``). A section that does not say
    ``"enabled": true`` reads as off and is on."""
    section = config.get("comms_logger")
    if not isinstance(section, Mapping) or section.get("enabled") is True:
        return []
    said = "'enabled': false" if "enabled" in section else "no 'enabled' (its default is false)"
    return [Finding("comms_logger.enabled", "warning",
                    f"the section says {said}, but DeepSpeed turns the comms logger on whenever a 'comms_logger' "
                    "section is present: every deepspeed.comm op is timed and followed by a device synchronize.",
                    "remove the whole 'comms_logger' section to keep the logger off, or write 'enabled': true")]


def _pipeline_section(section) -> list[Finding]:
    """DeepSpeed copies every key of ``"pipeline"`` onto its defaults and reads a few: an
    unknown one is ignored silently, and some defaults are never read at all (a value other
    than the default there is one the job does not get)."""
    if not isinstance(section, Mapping):
        return []
    from deepspeed.runtime.config import get_pipeline_config

    known, unused = pipeline_keys()
    defaults = get_pipeline_config({})
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
        elif name in unused and section[name] != defaults[name]:
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
def _misplaced(config: Mapping, num_stages: int) -> list[Finding]:
    """Keys that look like pipeline settings but that DeepSpeed never reads where they are, at
    the top level or inside ``"pipeline"`` (the seed's snippet puts them there)."""
    found = []
    pipeline = config.get("pipeline") if isinstance(config.get("pipeline"), Mapping) else {}
    for prefix, section in (("", config), ("pipeline.", pipeline)):
        for key, (really, where) in NOT_CONFIG_KEYS.items():
            if key in section and not (prefix and key == "activation_checkpoint_interval"):
                if "stages" in really:
                    really = f"the job has {num_stages} stage{'s' * (num_stages != 1)} (PipelineModule(num_stages=...))"
                found.append(Finding(prefix + key, "warning", f"not a DeepSpeed config key here: DeepSpeed ignores "
                                     f"it silently; {really}.", f"drop it; {where}"))
    return found


def _is_batch_error(error: Exception) -> bool:
    """Whether DeepSpeed's parser stopped at the batch sizes (its assertions name them)."""
    return type(error).__name__ == "AssertionError" and ("batch" in str(error).lower()
                                                         or "train_micro_batch_size_per_gpu" in str(error))


def _batch_made_consistent(config: Mapping, data_parallel: int) -> dict:
    """`config` with batch sizes DeepSpeed accepts (the written micro-batch size and count where
    they are positive ints, else 1), to check the rest of it."""
    trial = copy.deepcopy(dict(config))
    sizes = [trial.get(k) for k in BATCH_KEYS[1:]]
    micro, steps = (v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1 for v in sizes)
    trial.update(train_batch_size=micro * steps * data_parallel, train_micro_batch_size_per_gpu=micro,
                 gradient_accumulation_steps=steps)
    return trial


def _from_parse_error(config: Mapping, error: Exception, data_parallel: int) -> list[Finding]:
    """DeepSpeed's parser rejected `config`: its message, and for the batch sizes what it
    derived and which values would hold."""
    from utils.jobs import configrules

    if type(error).__name__ == "ValidationError":
        return []  # reported key by key from deepspeed_reads' errors
    message = f"{type(error).__name__}: {error}".strip().rstrip(":")
    if _is_batch_error(error):
        return [Finding("train_batch_size", "error", f"DeepSpeed rejects it: {message}. "
                        f"{configrules.batch_story(config, data_parallel)}",
                        configrules.batch_fix(config, data_parallel))]
    return _from_error(error)
