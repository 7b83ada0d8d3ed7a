"""The menu of model presets, without torch: names, options, and the shape each resolves to.

A `JobSpec` is checked against its preset (how many layers, how long a sample) when it is
made, in the notebook, in a grading kernel, wherever a run is read back. None of that needs
the layers themselves, so this module answers it without importing torch (1.5-2 s in every
process that only describes or reads jobs); `utils.workloads.models.get_model` validates
through `model_shape` first and then builds the real layer list, whose names a unit test
compares with `ModelShape.layer_names` for every preset.

The deliberately broken ``mistake:...`` presets of chapter 25 are catalogued here too
(`MISTAKES`: what is wrong, the fix, the diagnosis code), in `HIDDEN_PRESETS`, kept off the
menu of trainable models; `utils.workloads.mistakes` builds them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from utils import validation


@dataclass(frozen=True)
class ModelShape:
    """What a preset with its options is, short of its layers: enough to check a job."""

    preset: str
    options: Mapping[str, Any]
    """Every option, the defaults filled in."""
    layer_names: tuple[str, ...]
    """The class name of each layer, as `Model.layer_names` gives it."""
    seq_len: int | None
    """Tokens per sample (language models), else None."""

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)


@dataclass(frozen=True)
class PresetInfo:
    description: str
    defaults: Mapping[str, Any]
    layer_names: Callable[..., tuple[str, ...]]
    """(preset, **options) -> the layer names; raises ValueError for options that cannot build."""


def _divisible(preset: str, hidden: int, heads: int, hint: str = "") -> None:
    if hidden % heads:  # caught here, before any rank builds a block and fails
        raise ValueError(f"preset {preset!r}: hidden ({hidden}) must be divisible by heads ({heads}){hint}")


def _gpt(preset: str, *, blocks: int, hidden: int, heads: int, vocab: int, seq_len: int) -> tuple[str, ...]:
    _divisible(preset, hidden, heads, "; change one of them in model_options")
    return ("Embedding", *("Block",) * blocks, "LMHead")


def _mlp(preset: str, *, blocks: int, hidden: int) -> tuple[str, ...]:
    return ("MLPBlock",) * blocks


def _seed_case(preset: str, *, hidden: int, blocks: int) -> tuple[str, ...]:
    return ("InputStem", *("MLPBlock",) * blocks, "ClassifierHead")


PRESETS: dict[str, PresetInfo] = {
    "gpt": PresetInfo(
        "GPT-like LM sized for a CPU: embedding, transformer blocks, large-vocabulary head + loss",
        {"blocks": 6, "hidden": 128, "heads": 4, "vocab": 8192, "seq_len": 64}, _gpt),
    "gpt-large": PresetInfo(
        "the GPT-like LM at GPU size",
        {"blocks": 14, "hidden": 1024, "heads": 16, "vocab": 32768, "seq_len": 512}, _gpt),
    "mlp": PresetInfo(
        "identical residual Linear+GELU blocks (equal stage costs)",
        {"blocks": 8, "hidden": 256}, _mlp),
    "seed-case": PresetInfo(
        "the course's 4-stage case: heavy input stem, 30 residual MLP blocks, heavy classifier head + loss "
        "(uniform 4 x 8 split: stage times in the proportions 95/78/76/112)",
        {"hidden": 256, "blocks": 30}, _seed_case),
}
"""The trainable models (the menu of the notebook's controls)."""


# --- chapter 25's broken presets ----------------------------------------------------------------
MISTAKE_PREFIX = "mistake:"


@dataclass(frozen=True)
class Mistake:
    """What a mistake preset gets wrong, how to fix it, and the `utils.diagnose` code a real
    2-stage job of it fails with (None: it does not fail)."""

    wrong: str
    fix: str
    code: str | None
    changes: Mapping[str, Any]
    """What differs from ``mistake:none``: ``output`` (the Tagger's), ``loss_fn`` (False: none),
    ``head_forward_fn`` (False: none), ``tied_weight_attr`` (None: DeepSpeed's default)."""


MISTAKES: dict[str, Mistake] = {
    "mistake:none": Mistake(
        "nothing: every layer returns a tensor or a tuple of tensors, the mask crosses the boundary as int64, "
        "the loss is PipelineModule's loss_fn, the tied head has forward_fn and the right tied_weight_attr",
        "(this is the fix of all the others)", None, {}),
    "mistake:non-tensor-output": Mistake(
        "stage 0's last layer returns a dict {'hidden': ..., 'keep': ...}; DeepSpeed can only send tensors and "
        "tuples of tensors between stages",
        "return a tuple (hidden, keep) instead", "non-tensor-output", {"output": "dict"}),
    "mistake:float-mask": Mistake(
        "stage 0 sends its mask as a float tensor; DeepSpeed sets requires_grad on every floating-point tensor "
        "a stage receives and expects a gradient for it, but the mask is only compared, so it gets none",
        "send the mask as an int64 or bool tensor (DeepSpeed does not differentiate those)",
        "received-activation-without-grad", {"output": "float-mask"}),
    "mistake:loss-between-stages": Mistake(
        "a loss (an auxiliary one: the mean square of the hidden states) is computed as a layer of the list; "
        "the partition puts it at the end of stage 0, which then sends a 0-dimensional tensor to stage 1",
        "take the loss out of the layer list; DeepSpeed computes PipelineModule(loss_fn=...) on the last stage, "
        "on the last layer's output and the labels", "scalar-between-stages", {"output": "aux-loss"}),
    "mistake:no-loss-fn": Mistake(
        "the PipelineModule gets no loss_fn: the last stage treats its output (the logits) as the loss, which "
        "is not a scalar", "pass PipelineModule(loss_fn=lm_loss)", "loss-not-scalar", {"loss_fn": False}),
    "mistake:tied-forward": Mistake(
        "the second TiedLayerSpec of the embedding (the output head) has no forward_fn, so it runs the "
        "embedding's own forward on float hidden states",
        "give it forward_fn=tied_head (project on the shared token matrix)", "tied-forward",
        {"head_forward_fn": False}),
    "mistake:tied-weight-attr": Mistake(
        "the TiedLayerSpecs keep DeepSpeed's default tied_weight_attr 'weight', which the Embedding module "
        "does not have (its shared matrix is tokens.weight)",
        "tied_weight_attr='tokens.weight' on both TiedLayerSpecs", "tied-weight-attr",
        {"tied_weight_attr": None}),
}


def _mistake(preset: str, *, hidden: int, heads: int, vocab: int, seq_len: int) -> tuple[str, ...]:
    """The shared six-layer list of `utils.workloads.mistakes` (its docstring draws it)."""
    _divisible(preset, hidden, heads)
    tied = "Embedding[tied 'embed']"
    return (tied, "Block", "Tagger", "MaskedNorm", "Block", tied)


HIDDEN_PRESETS: dict[str, PresetInfo] = {
    name: PresetInfo(f"{'broken on purpose: ' if m.code else ''}{m.wrong}",
                     {"hidden": 64, "heads": 4, "vocab": 512, "seq_len": 16}, _mistake)
    for name, m in MISTAKES.items()
}
"""Presets `utils.workloads.models.get_model` resolves that `PRESETS` (the menu) does not list."""


def is_import_path(model: object) -> bool:
    """Whether `model` names a learner's model function (``"pkg.mod:fn"``,
    `utils.workloads.custom`) rather than a preset."""
    return isinstance(model, str) and ":" in model and not model.startswith(MISTAKE_PREFIX)


def draws_token_samples(preset: str, seq_len: int | None) -> bool:
    """Whether the workbook draws this model's variable-length token samples itself
    (`utils.workloads.varlen`): its own language-model presets, whose loss takes the per-token
    scale. Any other model — a learner's, ``mlp``, ``seed-case`` — trains on the samples its
    ``make_batch`` draws, which a job can re-cut into another micro-batch count
    (`utils.workloads.recut`) but not shorten or pad."""
    return seq_len is not None and not is_import_path(preset)


_CUSTOM_SHAPES: dict[tuple[str, str], ModelShape] = {}
"""A learner's model's shape per (import path, options), so `JobSpec.shape` loads it once."""


def _custom_shape(path: str, options: Mapping[str, Any]) -> ModelShape:
    key = (path, json.dumps(dict(options), sort_keys=True, default=repr))
    if key not in _CUSTOM_SHAPES:
        from utils.workloads.custom import load_model  # imports torch and the learner's module

        model = load_model(path, options)
        _CUSTOM_SHAPES[key] = ModelShape(preset=path, options=dict(options), layer_names=tuple(model.layer_names),
                                         seq_len=model.seq_len)
    return _CUSTOM_SHAPES[key]


RECORDED = "recorded"
"""The model of a job recorded from a script of its own (`utils.runtime.recorder`): its
``model_options`` hold what the engine said about it, ``{"layers": [names], "params": [counts]}``;
it can be read, drawn and partitioned on paper, not rebuilt."""


def recorded_model(names: tuple[str, ...] | list[str], params: list[int]) -> dict[str, Any]:
    """The `model_options` of a recorded model."""
    return {"layers": list(names), "params": [int(p) for p in params]}


def model_shape(preset: str, options: Mapping[str, Any] | None = None) -> ModelShape:
    """Check a preset name and option overrides and say what they resolve to; raises
    ValueError saying what to change (the errors `get_model` gives, before any torch). A
    learner's model (an import path) is loaded and checked once per options, which imports
    torch and its module (`utils.workloads.custom.load_model`)."""
    if preset == RECORDED:
        found = dict(options or {})
        names, params = found.get("layers"), found.get("params")
        if not isinstance(names, (list, tuple)) or not isinstance(params, (list, tuple)) or len(names) != len(params) \
                or not names:
            raise ValueError("a recorded model's model_options must hold 'layers' (names) and 'params' (counts) of "
                             "the same non-zero length, as utils.record writes them")
        return ModelShape(preset=preset, options=found, layer_names=tuple(map(str, names)), seq_len=None)
    if is_import_path(preset):
        return _custom_shape(preset, options or {})
    info = (PRESETS.get(preset) or HIDDEN_PRESETS.get(preset)) if isinstance(preset, str) else None
    if info is None:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}, or your own model as "
                         "an import path 'package.module:function' returning a utils.ModelDef "
                         "(or a 'mistake:...' preset of utils.workloads.mistakes)")
    options = dict(options or {})
    unknown = set(options) - set(info.defaults)
    if unknown:
        raise ValueError(f"preset {preset!r} has no option(s) {sorted(unknown)}; "
                         f"its options are {sorted(info.defaults)}")
    merged = {**info.defaults, **options}
    for name, value in merged.items():
        validation.count(f"model option {name}", value)
    return ModelShape(preset=preset, options=merged, layer_names=info.layer_names(preset, **merged),
                      seq_len=merged.get("seq_len"))
