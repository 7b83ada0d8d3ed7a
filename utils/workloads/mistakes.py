"""Deliberately broken model presets: the pipeline mistakes of chapter 25, as real jobs.

Most mistakes people make with DeepSpeed's `PipelineModule` live in the *layer list*: what a
stage's last layer returns, what a stage receives, where the loss is computed, how a tied
weight is shared. The workbook's presets (`utils.workloads.models`) are correct by
construction, so this module adds presets that are wrong on purpose, each in exactly one
place, for ``JobSpec(model="mistake:...")``:

=============================  ==================================================  ====================================
preset                         what is wrong                                       expected diagnosis code
=============================  ==================================================  ====================================
``mistake:none``               nothing: the shared layer list, every rule kept     (the job succeeds)
``mistake:non-tensor-output``  stage 0's last layer returns a dict                 ``non-tensor-output``
``mistake:float-mask``         it sends its mask as a float tensor                 ``received-activation-without-grad``
``mistake:loss-between-stages`` a loss is computed in the layer list, mid-model    ``scalar-between-stages``
``mistake:no-loss-fn``         the PipelineModule gets no ``loss_fn``              ``loss-not-scalar``
``mistake:tied-forward``       the tied output head has no ``forward_fn``          ``tied-forward``
``mistake:tied-weight-attr``   the tied spec names an attribute that is missing    ``tied-weight-attr``
=============================  ==================================================  ====================================

The shared layer list (six layers; run it with ``partition="uniform"`` on 2 stages, which
splits it 0–2 | 3–5, so that layer 2's output is what crosses the stage boundary)::

    0  Embedding      tied (key "embed", tied_weight_attr "tokens.weight"): ids -> hidden
    1  Block          transformer block
    2  Tagger         hidden -> (hidden, keep): keep is an int64 [b, L] mask of the positions that count
    ---------------- stage boundary ----------------
    3  MaskedNorm     (hidden, keep) -> LayerNorm(hidden), zero where keep == 0
    4  Block
    5  Embedding      the same tied module, used as the output head through forward_fn=tied_head

and ``loss_fn=lm_loss`` (next-token cross-entropy) on the last stage. It is the "fixed" model
of every mistake above: one job of ``mistake:none`` shows all the fixes at once.

`MISTAKES` documents each preset (what is wrong, the fix, the diagnosis code a real job of it
gives); it lives in `utils.workloads.presets` (no torch), with the presets' names and
options, so that a job of one is checked without building it. `resolve` builds one:
`utils.workloads.models.get_model` calls it like any preset's, in the notebook and in every
rank.
`trace_layers` runs a preset's layer list in this process, as `PipelineModule` would on one
rank, to show what each layer returns without starting a job.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from utils.workloads.layers import Block, Embedding, LayerDef, Model, _progressions, lm_loss
from utils.workloads.presets import MISTAKE_PREFIX, MISTAKES, Mistake

__all__ = ["MISTAKES", "MISTAKE_PREFIX", "Mistake", "MaskedNorm", "MistakeModel", "Tagger",
           "TiedLayerDef", "resolve", "tied_head", "trace_layers"]


# --- layers ------------------------------------------------------------------------------------
class Tagger(nn.Module):
    """The last layer of stage 0: a linear map of the hidden states, plus a mask of the
    positions that count (all of them in this synthetic data; padding would be 0).

    `output` chooses what it returns (the mistake presets differ here only):
    ``"tuple"`` (right): ``(hidden, keep)`` with `keep` int64; ``"dict"``: ``{"hidden": ...,
    "keep": ...}``; ``"float-mask"``: ``(hidden, keep)`` with `keep` float32; ``"aux-loss"``:
    a 0-dimensional auxiliary loss (the mean square of the hidden states) instead of them.
    """

    OUTPUTS = ("tuple", "dict", "float-mask", "aux-loss")

    def __init__(self, hidden: int, output: str = "tuple"):
        super().__init__()
        if output not in self.OUTPUTS:
            raise ValueError(f"Tagger output must be one of {self.OUTPUTS}, got {output!r}")
        self.proj = nn.Linear(hidden, hidden)
        self.output = output

    def forward(self, x: torch.Tensor):
        hidden = self.proj(x)
        keep = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
        if self.output == "dict":
            return {"hidden": hidden, "keep": keep}
        if self.output == "float-mask":
            return hidden, keep.float()
        if self.output == "aux-loss":
            return hidden.float().pow(2).mean()
        return hidden, keep


class MaskedNorm(nn.Module):
    """The first layer of stage 1: LayerNorm of the hidden states, zero where ``keep == 0``.
    The mask is only read through a comparison (``keep.bool()``), never differentiated.
    Takes ``(hidden, keep)``, ``{"hidden": ..., "keep": ...}`` or the hidden states alone, so
    every mistake preset but two runs in one process (`trace_layers`): it is the pipeline
    that breaks them."""

    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)

    def forward(self, inputs):
        if isinstance(inputs, dict):
            hidden, keep = inputs["hidden"], inputs["keep"]
        else:
            hidden, keep = inputs if isinstance(inputs, tuple) else (inputs, None)
        out = self.ln(hidden)
        if keep is not None:
            out = out.masked_fill(~keep.bool().unsqueeze(-1), 0.0)
        return out


def tied_head(embedding: Embedding, x: torch.Tensor) -> torch.Tensor:
    """The output head that shares the embedding's token matrix: normalise, then project on
    it, scaled by 1/sqrt(hidden) so the first logits are small (``forward_fn`` of the second
    `TiedLayerSpec`)."""
    return F.layer_norm(x, x.shape[-1:]) @ embedding.tokens.weight.t() / math.sqrt(x.shape[-1])


# --- layer definitions and the model --------------------------------------------------------------
@dataclass(frozen=True)
class TiedLayerDef(LayerDef):
    """A layer that shares its module with every other layer of the same `key`
    (DeepSpeed's `TiedLayerSpec`): the first occurrence builds it, the others reuse it and
    run `forward_fn(module, x)` when given, else the module's own forward."""

    key: str = "embed"
    forward_fn: Callable | None = None
    tied_weight_attr: str | None = None
    """The dotted path of the shared parameter (DeepSpeed reduces its gradient across the
    stages that hold it); None: DeepSpeed's default, ``"weight"``."""

    @property
    def name(self) -> str:
        return f"{self.cls.__name__}[tied {self.key!r}]"


@dataclass(frozen=True)
class MistakeModel(Model):
    """A `Model` whose layers may be tied (`TiedLayerDef`)."""

    def layer_specs(self) -> list:
        from utils.system.dslog import quiet_accelerator_notice

        quiet_accelerator_notice()
        from deepspeed.pipe import LayerSpec, TiedLayerSpec

        specs = []
        for layer in self.layers:
            if isinstance(layer, TiedLayerDef):
                extra = {} if layer.tied_weight_attr is None else {"tied_weight_attr": layer.tied_weight_attr}
                specs.append(TiedLayerSpec(layer.key, layer.cls, forward_fn=layer.forward_fn, **extra,
                                           **layer.kwargs))
            else:
                specs.append(LayerSpec(layer.cls, **layer.kwargs))
        return specs

    def build_sequential(self, *, seed: int) -> nn.Sequential:
        raise NotImplementedError(f"{self.preset!r} shares layers (TiedLayerDef), which nn.Sequential cannot "
                                  "express; use utils.workloads.mistakes.trace_layers to run it in one process")


def trace_layers(model: Model, inputs, *, seed: int = 0) -> list[tuple[str, Any]]:
    """Run `model`'s layer list in this process on `inputs`, as one `PipelineModule` rank
    holding every layer would: tied layers share one module per key, later occurrences call
    its `forward_fn`. Returns ``(layer name, output)`` per layer; an error a layer raises
    propagates (the same error a stage would raise)."""
    torch.manual_seed(seed)
    tied: dict[str, nn.Module] = {}
    outputs, x = [], inputs
    for layer in model.layers:
        if isinstance(layer, TiedLayerDef):
            module = tied.setdefault(layer.key, layer.build()) if layer.key not in tied else tied[layer.key]
            x = module(x) if layer.forward_fn is None else layer.forward_fn(module, x)
        else:
            x = layer.build()(x)
        outputs.append((layer.name, x))
    return outputs


# --- the presets ------------------------------------------------------------------------------------
def resolve(preset: str, *, hidden: int, heads: int, vocab: int, seq_len: int) -> MistakeModel:
    """The `MistakeModel` of a mistake preset, its options checked (`presets.model_shape`)."""
    changes = MISTAKES[preset].changes
    attr = changes.get("tied_weight_attr", "tokens.weight")
    embed = {"vocab": vocab, "hidden": hidden, "seq_len": seq_len}
    layers = (
        TiedLayerDef(Embedding, embed, key="embed", tied_weight_attr=attr),
        LayerDef(Block, {"hidden": hidden, "heads": heads}),
        LayerDef(Tagger, {"hidden": hidden, "output": changes.get("output", "tuple")}),
        LayerDef(MaskedNorm, {"hidden": hidden}),
        LayerDef(Block, {"hidden": hidden, "heads": heads}),
        TiedLayerDef(Embedding, embed, key="embed", tied_weight_attr=attr,
                     forward_fn=None if changes.get("head_forward_fn", True) is False else tied_head),
    )
    return MistakeModel(preset=preset, options=dict(hidden=hidden, heads=heads, vocab=vocab, seq_len=seq_len),
                        layers=layers, loss_fn=None if changes.get("loss_fn", True) is False else lm_loss,
                        make_batch=_progressions(vocab, seq_len), seq_len=seq_len)
