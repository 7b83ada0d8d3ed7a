"""The torch side of the model presets: layer classes, `LayerDef` and `Model`, the losses and
the synthetic, learnable data, and the seeding DeepSpeed's ``seed_layers`` applies.

`utils.workloads.models` resolves a preset into these; `utils.workloads.presets` describes
the presets without them (no torch). Data is synthetic and generated in code (no
downloads) but learnable, so the loss visibly falls.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy
import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

class _SkipInit(TorchFunctionMode):
    """Inside it (this thread only), the ``torch.nn.init`` functions leave their tensor as is.

    Why: ``normal_`` on a meta tensor runs torch's Python reference (``torch._refs.normal_``),
    whose ``_disable_dynamo`` wrapper imports ``torch._dynamo`` on first use: 1.6 s in every
    kernel that plans a job (measured; building the layers takes ~5 ms without it). A meta
    tensor holds no values, so skipping the initialisation loses nothing.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":  # nn.init.normal_(tensor, ...) and the like
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


# --- layers --------------------------------------------------------------------------------
class Embedding(nn.Module):
    """Token plus learned position embedding: ids [b, L] -> hidden [b, L, d].

    Packed rows (``batching="packing"``) come as ``(ids, segments, positions)``: each token's
    position inside its own sample, and its segment, which goes on with the hidden states,
    ``(hidden, segments)``, so that every block masks attention across samples."""

    def __init__(self, vocab: int, hidden: int, seq_len: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(seq_len, hidden)

    def forward(self, ids):
        if isinstance(ids, tuple):
            ids, segments, positions = ids
            return self.tokens(ids) + self.positions(positions), segments
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(pos)


class Block(nn.Module):
    """Pre-LN transformer block with causal self-attention and a 4x MLP."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x):
        segments = None
        if isinstance(x, tuple):  # packed rows: (hidden, segments), see Embedding
            x, segments = x
        b, length, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, length, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        if segments is None:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # block-diagonal causal: a token sees the earlier tokens of its own sample only
            causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
            mask = causal & (segments[:, :, None] == segments[:, None, :])
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        x = x + self.proj(attn.transpose(1, 2).reshape(b, length, d))
        x = x + self.mlp(self.ln2(x))
        return x if segments is None else (x, segments)


class LMHead(nn.Module):
    """Final LayerNorm and the vocabulary projection: hidden -> logits [b, L, vocab]."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x) -> torch.Tensor:
        if isinstance(x, tuple):  # packed rows: (hidden, segments)
            x = x[0]
        return self.out(self.ln(x))


class MLPBlock(nn.Module):
    """Linear + GELU with a residual connection; every block costs the same."""

    def __init__(self, hidden: int):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.fc(x))


class InputStem(nn.Module):
    """The input side of the ``seed-case`` model: a wide MLP, hidden -> width -> hidden, on
    data of the hidden size. Its input comes from the data loader and needs no gradient, so
    its first projection computes the weight gradient only."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.up = nn.Linear(hidden, width)
        self.down = nn.Linear(width, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class ClassifierHead(nn.Module):
    """The output side of the ``seed-case`` model: LayerNorm, a wide MLP hidden -> width and
    the class projection width -> classes (the cross-entropy loss runs on the same stage)."""

    def __init__(self, hidden: int, width: int, classes: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, width)
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.up(self.ln(x))))


def lm_loss(logits: torch.Tensor, labels) -> torch.Tensor:
    """Next-token cross-entropy: the mean over every position, or, for variable-length
    micro-batches (`utils.workloads.varlen`), labels ``(targets, scale)``: the sum over real
    tokens (pads are -100, ignored) times `scale`, which normalises by the step's real tokens."""
    if isinstance(labels, (tuple, list)):
        targets, scale = labels
        summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                                 ignore_index=-100, reduction="sum")
        return summed * scale
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


def mse_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(outputs.float(), targets)


def class_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


# --- layer definitions and the model ------------------------------------------------------------
@dataclass(frozen=True)
class LayerDef:
    """A layer not built yet: its class and constructor arguments."""

    cls: type[nn.Module]
    kwargs: Mapping[str, Any]
    args: tuple = ()
    """Positional constructor arguments (a learner's ``LayerSpec(cls, *args)``)."""
    label: str | None = None
    """Its name when the class name does not say it (a function layer: the function's name)."""

    @property
    def name(self) -> str:
        return self.label or self.cls.__name__

    def build(self) -> nn.Module:
        return self.cls(*self.args, **self.kwargs)


@dataclass(frozen=True)
class Model:
    """A preset resolved with its options: layers, loss and data, ready to build."""

    preset: str
    options: Mapping[str, Any]
    layers: tuple[LayerDef, ...]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    make_batch: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    """(generator, micro_batch_size, tokens=None) -> (inputs, labels) for one micro-batch;
    `tokens` shortens a language model's samples (None: `seq_len`), others ignore it."""
    seq_len: int | None = None
    """Tokens per sample (language models), for tokens/s."""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def layer_specs(self) -> list:
        """The layers as DeepSpeed `LayerSpec`s, for `PipelineModule(layers=...)`."""
        from utils.system.dslog import quiet_accelerator_notice

        quiet_accelerator_notice()
        from deepspeed.pipe import LayerSpec  # deepspeed is imported only by code that needs it

        return [LayerSpec(layer.cls, *layer.args, **layer.kwargs) for layer in self.layers]

    def param_counts(self) -> list[int]:
        """Parameters per layer, counted on the meta device (nothing is allocated)."""
        return [sum(p.numel() for p in layer.parameters()) for layer in self.meta_layers()]

    def layer_flops(self, micro_batch_size: int, *, backward: bool = False) -> list[int]:
        """Floating-point operations of each layer on one micro-batch (the last layer's with the
        loss): its forward, or forward + backward with `backward`, as torch's ``FlopCounterMode``
        counts them while the layers run once on the CPU. Set by the model's structure (matrix
        multiplies, attention; element-wise operations are not counted), not measured: the same
        on any machine, however busy."""
        from torch.utils.flop_counter import FlopCounterMode

        x, labels = self.make_batch(torch.Generator().manual_seed(0), micro_batch_size)
        flops = []
        for index, layer in enumerate(self.build_sequential(seed=0)):
            inputs = x.detach().requires_grad_(backward and x.is_floating_point())
            with FlopCounterMode(display=False) as counter:
                y = layer(inputs)
                if backward and index == self.num_layers - 1:
                    self.loss_fn(y, labels).backward()
                elif backward:
                    y.backward(torch.ones_like(y))
                elif index == self.num_layers - 1:
                    self.loss_fn(y, labels)
            flops.append(int(counter.get_total_flops()))
            x = y.detach()
        return flops

    def meta_layers(self) -> list[nn.Module]:
        """The layers built on the meta device and left uninitialised: their parameters'
        names and shapes, with no memory allocated and no random numbers drawn."""
        with torch.device("meta"), _SkipInit():
            return [layer.build() for layer in self.layers]

    def build_sequential(self, *, seed: int) -> nn.Sequential:
        """All layers in one module, seeded exactly as `PipelineModule(seed_layers=True,
        base_seed=seed)` seeds them, so both start from identical weights."""
        modules = []
        for index, layer in enumerate(self.layers):
            seed_layer(seed + index)
            modules.append(layer.build())
        return nn.Sequential(*modules)


# --- synthetic, learnable data -------------------------------------------------------------
def _progressions(vocab: int, seq_len: int, *, active: int = 256):
    """Arithmetic progressions with a random start and a stride in 1..4, over the first
    `active` token ids (the head still scores the whole vocabulary). The loss falls fast at
    first (which tokens occur), then slowly (the next token follows from the previous two,
    which attention must learn), so a few dozen steps show a clear curve."""
    active = min(active, vocab)

    def make_batch(generator: torch.Generator, batch: int, tokens: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(0, active, (batch, 1), generator=generator)
        stride = torch.randint(1, 5, (batch, 1), generator=generator)
        seq = (start + stride * torch.arange((tokens or seq_len) + 1)) % active
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    return make_batch


def _teacher_regression(hidden: int):
    """Regress a fixed random teacher, y = tanh(x W / sqrt(d)): learnable by the MLP blocks."""
    teacher = torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(0))

    def make_batch(generator: torch.Generator, batch: int, tokens: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch, hidden, generator=generator)
        return x, torch.tanh(x @ teacher / math.sqrt(hidden))

    return make_batch


def _teacher_classes(features: int, classes: int, *, seen: int = 32):
    """Classify x by a fixed random teacher on its first `seen` features:
    label = argmax(x[:, :seen] @ T). Cheap to generate (the data loader runs on the first and
    last stages) and learnable by the blocks."""
    seen = min(seen, features)
    teacher = torch.randn(seen, classes, generator=torch.Generator().manual_seed(0))

    def make_batch(generator: torch.Generator, batch: int, tokens: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch, features, generator=generator)
        return x, (x[:, :seen] @ teacher).argmax(dim=1)

    return make_batch


class Batches:
    """Endless micro-batches for one data-parallel replica; the same (seed, replica) always
    gives the same sequence, on every stage and in the sequential reference.

    `tokens` may change between steps (a sequence-length curriculum): later samples are that
    long. The position in the stream is the object's own state, so a job that rebuilds its
    engine (a live re-partition) keeps reading where it was.
    """

    def __init__(self, model: Model, *, seed: int, micro_batch_size: int, replica: int = 0):
        self.model, self.micro_batch_size = model, micro_batch_size
        self.tokens: int | None = model.seq_len
        self._generator = torch.Generator().manual_seed(seed * 1000 + replica)

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.make_batch(self._generator, self.micro_batch_size, self.tokens)

    def state(self) -> dict:
        """The position in the stream (saved with a checkpoint; see `restore`)."""
        return {"generator": self._generator.get_state(), "tokens": self.tokens}

    def restore(self, state: dict) -> None:
        self._generator.set_state(state["generator"])
        self.tokens = state["tokens"]


def batches(model: Model, *, seed: int, micro_batch_size: int, replica: int = 0) -> Batches:
    """`Batches` for one replica (see there)."""
    return Batches(model, seed=seed, micro_batch_size=micro_batch_size, replica=replica)


def seed_layer(seed: int) -> None:
    """Seed Python, NumPy and torch the way DeepSpeed's ``set_random_seed`` does — the
    seeding ``PipelineModule(seed_layers=True)`` applies before building each layer and
    again before *every layer's forward* — but cheaply when CUDA is not initialised.

    There, ``torch.manual_seed`` queues a lazy CUDA seed and records
    ``traceback.format_stack()`` with it on every call. Inside a pipeline stage's deep call
    stack that costs about a millisecond per layer per forward: measured with py-spy on a
    CPU job, a third of stage 0's forward time. Jobs pass this function as ``seed_fn``; the
    generators end in the same state, so weights and losses are unchanged.
    """
    random.seed(seed)
    numpy.random.seed(seed % 2**32)
    if torch.cuda.is_initialized():
        torch.manual_seed(seed % 2**63)  # seeds the CUDA generators directly, nothing queued
    else:
        torch.default_generator.manual_seed(seed % 2**63)
