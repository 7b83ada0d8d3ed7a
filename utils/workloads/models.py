"""Model presets: layer lists with realistic, uneven costs, and the data to train them on.

A preset describes a model as a flat list of layers, which is what DeepSpeed's
`PipelineModule` partitions. The layers are described first (`LayerDef`: class and
arguments) and built later, so a job can be checked — how many layers, which boundaries —
before any process starts and before torch allocates anything.

Presets:
- ``gpt``: token + position embedding, N pre-LN transformer blocks, and a large-vocabulary
  LM head followed by the cross-entropy loss. The embedding holds many parameters but costs
  almost nothing to run; the head holds as many and costs more than a block. DeepSpeed's
  parameter-count balance therefore splits it badly, as in the course's 4-stage case.
- ``gpt-large``: the same with GPU-sized defaults.
- ``mlp``: identical Linear+GELU blocks, for textbook cases with equal stage costs.
- ``seed-case``: the course's 4-stage case (stage times 95/78/76/112 ms under 4 x 8 layers):
  a heavy input stem, 30 equal residual MLP blocks and a heavy classifier head + loss, sized
  so that the uniform 4-stage split reproduces the case's proportions (lab 4).

Data is synthetic and generated in code (no downloads) but learnable, so the loss visibly falls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from utils.workloads import mistakes
from utils.workloads.layers import (Batches, Block, ClassifierHead, Embedding, InputStem, LayerDef, LMHead,
                                    MLPBlock, Model, batches, class_loss, lm_loss, mse_loss, seed_layer)
from utils.workloads.layers import _progressions, _teacher_classes, _teacher_regression
from utils.workloads.presets import MISTAKE_PREFIX, PRESETS, RECORDED, is_import_path, model_shape

__all__ = ["PRESETS", "get_model", "Model", "LayerDef", "Batches", "batches", "seed_layer", "Embedding", "Block",
           "LMHead", "MLPBlock", "InputStem", "ClassifierHead", "lm_loss", "mse_loss", "class_loss",
           "SEED_CASE_STEM", "SEED_CASE_HEAD"]


def _gpt(preset: str, *, blocks: int, hidden: int, heads: int, vocab: int, seq_len: int) -> Model:
    layers = (LayerDef(Embedding, {"vocab": vocab, "hidden": hidden, "seq_len": seq_len}),
              *(LayerDef(Block, {"hidden": hidden, "heads": heads}) for _ in range(blocks)),
              LayerDef(LMHead, {"hidden": hidden, "vocab": vocab}))
    return Model(preset=preset, options=dict(blocks=blocks, hidden=hidden, heads=heads, vocab=vocab,
                                             seq_len=seq_len),
                 layers=layers, loss_fn=lm_loss, make_batch=_progressions(vocab, seq_len),
                 seq_len=seq_len)


def _mlp(preset: str, *, blocks: int, hidden: int) -> Model:
    layers = tuple(LayerDef(MLPBlock, {"hidden": hidden}) for _ in range(blocks))
    return Model(preset=preset, options=dict(blocks=blocks, hidden=hidden), layers=layers,
                 loss_fn=mse_loss, make_batch=_teacher_regression(hidden))


SEED_CASE_STEM = 23
"""``seed-case``: the stem's width in eighths of `hidden` (``width = SEED_CASE_STEM * hidden // 8``)."""
SEED_CASE_HEAD = 24
"""``seed-case``: the head's width in eighths of `hidden` (``width = SEED_CASE_HEAD * hidden // 8``)."""


def _seed_case(preset: str, *, hidden: int, blocks: int) -> Model:
    """The course's 4-stage case as a model: ``InputStem``, `blocks` x ``MLPBlock``, ``ClassifierHead``.

    With the default 30 blocks the model has 32 layers, and DeepSpeed's uniform 4-stage split
    (8 layers per stage) gives stage 0 the stem + 7 blocks, stages 1 and 2 eight blocks each and
    stage 3 seven blocks + the head and the loss. The seed's case says 95 / 78 / 76 / 112 ms:
    with equal blocks stages 1 and 2 cost the same (77 each on the seed's scale), so a block is
    77 / 8 = 9.6 ms there, the stem 95 - 7 x 9.6 = 27.6 ms (2.9 blocks) and the head + loss
    112 - 7 x 9.6 = 44.6 ms (4.6 blocks). All layers multiply (b, hidden) activations by
    matrices of the same order (hidden x hidden, hidden x width), so the proportions hold
    across micro-batch sizes far better than a huge input or vocabulary would; the widths
    (`SEED_CASE_STEM`, `SEED_CASE_HEAD`) were chosen by measurement. It is sized for CPU: on a
    GPU layers this small cost little more than their kernel launches, and the proportions go.

    Measured on a 2-core VM shared with other jobs (load average 9-15), torch 2.13, defaults,
    micro_batch_size=64, per stage of the uniform split, on the seed's scale (sum = 361 ms):

    - a real job, the shortest forward + the shortest backward of each stage over steps >= 1
      (lab 4's ``stage_times``): 4.70 / 3.61 / 3.66 / 5.48 ms = 97 / 75 / 76 / 113, and in a
      second run 5.06 / 3.67 / 3.67 / 5.34 ms = 103 / 75 / 75 / 109;
    - the layer profile summed per stage: 6.72 / 5.03 / 5.19 / 7.54 ms = 99 / 74 / 77 / 111,
      and 7.37 / 5.46 / 5.74 / 9.03 ms = 96 / 71 / 75 / 118 (stem 3.1, head 5.7 blocks).

    Commands::

        run = utils.run_job(utils.JobSpec(model="seed-case", num_stages=4, partition="uniform", micro_batches=8,
                                          micro_batch_size=64, steps=4, device="cpu"))
        profile = utils.profile_layers("seed-case", micro_batch_size=64, device="cpu", concurrency=4)
        utils.stage_costs(profile.total, [0, 8, 16, 24, 32])
    """
    stem = SEED_CASE_STEM * hidden // 8
    head = SEED_CASE_HEAD * hidden // 8
    layers = (LayerDef(InputStem, {"hidden": hidden, "width": stem}),
              *(LayerDef(MLPBlock, {"hidden": hidden}) for _ in range(blocks)),
              LayerDef(ClassifierHead, {"hidden": hidden, "width": head, "classes": hidden}))
    return Model(preset=preset, options=dict(hidden=hidden, blocks=blocks), layers=layers,
                 loss_fn=class_loss, make_batch=_teacher_classes(hidden, hidden))



_RESOLVERS = {"gpt": _gpt, "gpt-large": _gpt, "mlp": _mlp, "seed-case": _seed_case}


def get_model(preset: str, options: Mapping[str, Any] | None = None) -> Model:
    """Resolve a preset name and option overrides into a `Model` (nothing is built yet).
    The name and options are checked by `utils.workloads.presets.model_shape` (same errors).
    An import path ``"pkg.mod:fn"`` is a learner's model (`utils.workloads.custom`)."""
    if preset == RECORDED:
        raise ValueError("a recorded job's model lives in the script that ran it (utils.record): it can be read, "
                         "drawn and partitioned on paper, not rebuilt; give JobSpec your model as "
                         "model='package.module:function' to run it here")
    if is_import_path(preset):
        from utils.workloads.custom import load_model

        return load_model(preset, options)
    shape = model_shape(preset, options)
    if preset.startswith(MISTAKE_PREFIX):
        return mistakes.resolve(preset, **shape.options)
    return _RESOLVERS[preset](preset, **shape.options)
