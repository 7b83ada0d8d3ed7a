"""The ``seed-case`` preset: the course's 4-stage case (lab 4) as a model.

Its stage-time proportions are measured (see the preset's docstring); these tests pin its
structure, which is what makes a uniform 4 x 8 split put the heavy input layer on stage 0 and
the heavy head + loss on stage 3, and check that it trains.
"""

from __future__ import annotations

import pytest
import torch

from utils.planning.partitioning import partition_layers
from utils.workloads.models import (PRESETS, SEED_CASE_HEAD, SEED_CASE_STEM, ClassifierHead, InputStem, MLPBlock,
                                    batches, get_model)


def test_it_is_a_menu_preset_with_32_layers_by_default():
    assert "seed-case" in PRESETS
    model = get_model("seed-case")
    assert model.num_layers == 32
    assert model.layer_names == ["InputStem"] + ["MLPBlock"] * 30 + ["ClassifierHead"]
    assert model.options == {"hidden": 256, "blocks": 30}
    assert model.seq_len is None  # not a language model: no tokens/s, no sequence-length options


def test_a_uniform_four_stage_split_puts_the_heavy_layers_on_the_first_and_last_stage():
    model = get_model("seed-case")
    parts = partition_layers([1.0] * model.num_layers, 4, method="uniform")
    assert parts == [0, 8, 16, 24, 32]
    stages = [model.layer_names[a:b] for a, b in zip(parts, parts[1:])]
    assert stages[0] == ["InputStem"] + ["MLPBlock"] * 7
    assert stages[1] == stages[2] == ["MLPBlock"] * 8
    assert stages[3] == ["MLPBlock"] * 7 + ["ClassifierHead"]


@pytest.mark.parametrize("hidden", [64, 256])
def test_the_heavy_layers_widths_scale_with_hidden(hidden):
    model = get_model("seed-case", {"hidden": hidden})
    stem, block, head = model.layers[0], model.layers[1], model.layers[-1]
    assert (stem.cls, block.cls, head.cls) == (InputStem, MLPBlock, ClassifierHead)
    assert stem.kwargs == {"hidden": hidden, "width": SEED_CASE_STEM * hidden // 8}
    assert block.kwargs == {"hidden": hidden}
    assert head.kwargs == {"hidden": hidden, "width": SEED_CASE_HEAD * hidden // 8, "classes": hidden}
    # wider than a block (hidden x hidden), the head wider than the stem, both of the same order
    assert hidden < stem.kwargs["width"] < head.kwargs["width"] < 4 * hidden
    params = model.param_counts()
    assert params[0] > params[1] and params[-1] > params[0]
    assert len(set(params[1:-1])) == 1  # the 30 blocks are identical


def test_blocks_option_changes_the_depth():
    assert get_model("seed-case", {"blocks": 6}).num_layers == 8
    with pytest.raises(ValueError, match=r"has no option\(s\) \['vocab'\]"):
        get_model("seed-case", {"vocab": 10})


def test_batches_are_deterministic_classification_data_and_the_model_learns():
    model = get_model("seed-case", {"hidden": 32, "blocks": 4})
    x, y = next(batches(model, seed=3, micro_batch_size=16))
    again, labels = next(batches(model, seed=3, micro_batch_size=16))
    assert x.shape == (16, 32) and x.dtype == torch.float32
    assert y.shape == (16,) and y.dtype == torch.int64 and 0 <= int(y.min()) and int(y.max()) < 32
    assert torch.equal(x, again) and torch.equal(y, labels)

    net = model.build_sequential(seed=0)
    assert net(x).shape == (16, 32)
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    data = batches(model, seed=0, micro_batch_size=64)
    losses = []
    for _ in range(60):
        inputs, targets = next(data)
        loss = model.loss_fn(net(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:10]) / 10  # the teacher's classes are learnable
