"""A learner's own model in a job: ``JobSpec(model="my_package.my_module:build")``.

The presets (`utils.workloads.models`) are the workbook's models; a learner's model comes in
through an import path ``"module.path:function"``. The function is called with the job's
``model_options`` as keyword arguments and returns a `ModelDef`: the layer list (what a
`PipelineModule` takes: ``LayerSpec``\\ s, or parameter-free functions such as
``lambda x: x.flatten(1)``), the loss function and a data source. Every rank calls it again in
its own process (so the module must be importable there: `import_root` is put on the ranks'
``PYTHONPATH``), and builds only its own layers, seeded layer by layer as
``PipelineModule(seed_layers=True)`` seeds them, like a preset's.

Bad input is refused in the notebook, before any process starts, by `load_model` (through
`utils.workloads.presets.model_shape`, which `JobSpec.check` calls): an import path that does
not resolve, a function that raises or returns something else, a layer that is neither a
``LayerSpec`` nor a function, layers whose shapes do not chain, a loss that is not a scalar, a
data source that does not give ``(inputs, labels)``. The chain is checked by running one
small batch through the layers on torch's ``meta`` device: shapes only, no arithmetic, no
memory.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["FunctionLayer", "ModelDef", "import_root", "load_model", "source_digest"]


@dataclass(frozen=True)
class ModelDef:
    """What a model function returns (``JobSpec(model="pkg.mod:fn")``)."""

    layers: Sequence[Any]
    """The layers in order, as `PipelineModule(layers=...)` takes them: ``LayerSpec(cls, *args,
    **kwargs)`` (built only on the rank that holds it) or a parameter-free function of one
    tensor. An ``nn.Module`` instance is refused: every rank would build the whole model."""
    loss_fn: Callable[[Any, Any], Any]
    """``loss_fn(outputs, labels)`` -> a scalar tensor (`PipelineModule(loss_fn=...)`)."""
    make_batch: Callable[..., tuple[Any, Any]]
    """``make_batch(generator, batch_size)`` -> ``(inputs, labels)`` of one micro-batch, drawn
    with the ``torch.Generator`` given (so every rank of one replica draws the same samples). A
    language model's takes a third argument, ``tokens``: the sample length (None: `seq_len`)."""
    seq_len: int | None = None
    """Tokens per sample, for a language model (tokens/s, and what variable-length batching and
    a sequence-length curriculum shorten: ``make_batch`` must then take ``tokens``); None otherwise."""


def _resolve(path: str) -> Callable:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"model {path!r}: write an import path as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model {path!r}: cannot import {module_name!r} ({exc}); put its folder on sys.path "
                         "(or install it) in the notebook, and give the module's dotted name") from None
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"model {path!r}: module {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"model {path!r}: {attribute!r} is a {type(target).__name__}, not a function that "
                         "returns a utils.ModelDef")
    return target


def import_root(path: str) -> str | None:
    """The ``sys.path`` entry the module of import path `path` is found under (its package's
    parent folder), for the ranks' ``PYTHONPATH``; None for a module that is not a file."""
    module_name = path.partition(":")[0]
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    origin = getattr(module, "__file__", None)
    if origin is None:
        return None
    folder = Path(origin).resolve().parent
    for _ in module_name.split(".")[1:]:
        folder = folder.parent
    if Path(origin).name == "__init__.py":
        folder = folder.parent
    return str(folder)


def source_digest(path: str) -> str:
    """A digest of the source file of import path `path`'s module: a cached layer profile of a
    learner's model is reused only while its code is unchanged."""
    import hashlib

    module = importlib.import_module(path.partition(":")[0])
    origin = getattr(module, "__file__", None)
    return hashlib.sha256(Path(origin).read_bytes()).hexdigest()[:16] if origin else "no-file"


def load_model(path: str, options: Mapping[str, Any] | None = None):
    """The `utils.workloads.layers.Model` that ``path(**options)`` defines, checked (see the
    module docstring); ValueError/TypeError saying what to change."""
    from utils.workloads.layers import LayerDef, Model

    build = _resolve(path)
    options = dict(options or {})
    try:
        inspect.signature(build).bind(**options)
    except TypeError as exc:
        raise ValueError(f"model {path!r} cannot take model_options {options}: {exc}") from None
    try:
        definition = build(**options)
    except Exception as exc:  # noqa: BLE001 - the learner's code: say where it failed
        raise ValueError(f"model {path!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(definition, ModelDef):
        raise TypeError(f"model {path!r} returned a {type(definition).__name__}; return "
                        "utils.ModelDef(layers=[...], loss_fn=..., make_batch=...)")
    if isinstance(definition.layers, (str, bytes)) or not isinstance(definition.layers, Sequence) \
            or not definition.layers:
        raise TypeError(f"model {path!r}: ModelDef.layers must be a non-empty list of layers")
    layers = tuple(_layer(path, i, layer, LayerDef) for i, layer in enumerate(definition.layers))
    if not callable(definition.loss_fn) or not callable(definition.make_batch):
        raise TypeError(f"model {path!r}: ModelDef.loss_fn and ModelDef.make_batch must be functions")

    takes_tokens = _takes_three(definition.make_batch)
    if definition.seq_len is not None and not takes_tokens:
        raise TypeError(f"model {path!r}: ModelDef.seq_len is set (a language model), so make_batch must take "
                        "(generator, batch_size, tokens): the sample length variable-length batching asks for")

    def make_batch(generator: torch.Generator, batch: int, tokens: int | None = None):
        if takes_tokens:
            return definition.make_batch(generator, batch, tokens)
        return definition.make_batch(generator, batch)

    model = Model(preset=path, options=options, layers=layers, loss_fn=definition.loss_fn, make_batch=make_batch,
                  seq_len=definition.seq_len)
    _check_chain(path, model)
    return model


def _takes_three(fn: Callable) -> bool:
    """Whether `fn` can be called with three positional arguments."""
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): call it with two
        return False
    return True


def _layer(path: str, index: int, layer, LayerDef):
    spec_type = getattr(sys.modules.get("deepspeed.runtime.pipe.module"), "LayerSpec", None)
    if spec_type is not None and isinstance(layer, spec_type):
        if type(layer).__name__ != "LayerSpec":
            raise TypeError(f"model {path!r}: layer {index} is a {type(layer).__name__}; tied layers are not "
                            "supported here: give plain LayerSpecs")
        return LayerDef(layer.typename, dict(layer.module_kwargs), args=tuple(layer.module_args))
    if isinstance(layer, nn.Module):
        raise TypeError(f"model {path!r}: layer {index} is an nn.Module instance ({type(layer).__name__}); give "
                        f"LayerSpec({type(layer).__name__}, ...) so that each rank builds only its own layers, "
                        "seeded (an instance is built whole in every process)")
    if isinstance(layer, type) and issubclass(layer, nn.Module):
        return LayerDef(layer, {})
    if callable(layer):
        return LayerDef(FunctionLayer, {"fn": layer}, label=getattr(layer, "__name__", "function"))
    raise TypeError(f"model {path!r}: layer {index} is a {type(layer).__name__}; give a LayerSpec(cls, ...) or "
                    "a parameter-free function of one tensor")


def _check_chain(path: str, model) -> None:
    """One micro-batch of 2 samples through every layer and the loss, on the meta device."""
    inputs, labels = model.make_batch(torch.Generator().manual_seed(0), 2)
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"model {path!r}: make_batch must return (inputs, labels) tensors, got "
                        f"{type(inputs).__name__} inputs")
    x = inputs.to("meta")
    for index, layer in enumerate(model.meta_layers()):
        try:
            x = layer(x)
        except Exception as exc:  # noqa: BLE001 - the learner's layers: say which one
            raise ValueError(f"model {path!r}: layer {index} ({model.layers[index].name}) cannot take the output "
                             f"of layer {index - 1} ({tuple(x.shape) if hasattr(x, 'shape') else type(x).__name__})"
                             f": {type(exc).__name__}: {exc}") from None
    meta_labels = labels.to("meta") if isinstance(labels, torch.Tensor) else labels
    try:
        loss = model.loss_fn(x, meta_labels)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"model {path!r}: loss_fn cannot take the last layer's output {tuple(x.shape)} and the "
                         f"labels: {type(exc).__name__}: {exc}") from None
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError(f"model {path!r}: loss_fn must return a scalar tensor, got "
                         f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}")


class FunctionLayer(nn.Module):
    """A parameter-free function as a layer: what `PipelineModule` does with a callable in its
    layer list, as a module (torch's pipeline stages and the profiler take modules)."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)
