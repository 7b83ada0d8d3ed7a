"""The deliberately broken presets of `utils.workloads.mistakes`: each resolves through
`get_model` like any preset, builds, splits at the boundary it is about, and is wrong in
exactly the one way its documentation says (checked in one process: no job starts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from utils.jobs.errors import explain
from utils.planning.partitioning import partition_layers
from utils.workloads import presets
from utils.workloads.mistakes import MISTAKES, MistakeModel, TiedLayerDef, tied_head, trace_layers
from utils.workloads.models import Embedding, get_model

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "data" / "deepspeed_errors.json").read_text())
#: mistake preset -> the case of tests/integration/record_errors.py that made the same mistake.
RECORDED_CASE = {"mistake:non-tensor-output": "dict_out", "mistake:float-mask": "unused_float",
                 "mistake:loss-between-stages": "loss_mid", "mistake:no-loss-fn": "no_loss_fn",
                 "mistake:tied-forward": "tied_no_fn", "mistake:tied-weight-attr": "tied_attr"}


def _batch(model, size=2):
    return model.make_batch(torch.Generator().manual_seed(0), size)


def _outputs(name):
    model = get_model(name)
    return model, dict((i, out) for i, (_, out) in enumerate(trace_layers(model, _batch(model)[0])))


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_every_mistake_preset_resolves_builds_and_splits_after_the_tagger(name):
    model = get_model(name, {"hidden": 32, "heads": 4})
    assert isinstance(model, MistakeModel) and model.preset == name and model.options["hidden"] == 32
    assert model.num_layers == 6 and model.layer_names[2] == "Tagger"
    specs = model.layer_specs()
    modules = [spec.build() for spec in specs]
    assert all(isinstance(m, torch.nn.Module) for m in modules)
    assert [type(s).__name__ for s in specs] == ["TiedLayerSpec", "LayerSpec", "LayerSpec", "LayerSpec", "LayerSpec",
                                                 "TiedLayerSpec"]
    assert specs[0].key == specs[-1].key == "embed"
    # partition="uniform" on 2 stages: layer 2's output is what crosses the boundary
    assert partition_layers(model.param_counts(), 2, method="uniform") == [0, 3, 6]
    assert name not in presets.PRESETS and name in presets.HIDDEN_PRESETS  # menus do not offer broken ones
    assert MISTAKES[name].wrong and MISTAKES[name].fix


def test_the_correct_preset_keeps_every_rule():
    model, out = _outputs("mistake:none")
    hidden, keep = out[2]
    assert hidden.dtype == torch.float32 and keep.dtype == torch.int64  # a tuple of tensors, the mask not float
    logits = out[5]
    assert logits.shape == (2, model.seq_len, model.options["vocab"])
    loss = model.loss_fn(logits, _batch(model)[1])
    assert loss.dim() == 0 and torch.isfinite(loss)
    first, head = model.layers[0], model.layers[5]
    assert isinstance(first, TiedLayerDef) and first.tied_weight_attr == "tokens.weight" and head.forward_fn is tied_head
    assert MISTAKES["mistake:none"].code is None
    with pytest.raises(NotImplementedError, match="trace_layers"):
        model.build_sequential(seed=0)


def test_non_tensor_output_sends_a_dict():
    _, out = _outputs("mistake:non-tensor-output")
    assert isinstance(out[2], dict) and set(out[2]) == {"hidden", "keep"}
    assert out[5].dim() == 3  # the rest of the model runs: only the pipeline cannot send a dict


def test_float_mask_sends_a_float_mask_that_gets_no_gradient():
    _, out = _outputs("mistake:float-mask")
    hidden, keep = out[2]
    assert keep.is_floating_point()
    received = keep.detach().requires_grad_(True)  # what DeepSpeed does to a received float tensor
    from utils.workloads.mistakes import MaskedNorm

    MaskedNorm(hidden.shape[-1])((hidden.detach().requires_grad_(True), received)).sum().backward()
    assert received.grad is None  # the mask is only compared: no gradient to send back


def test_loss_between_stages_sends_a_scalar():
    model = get_model("mistake:loss-between-stages")
    x = _batch(model)[0]
    stage0 = MistakeModel(**{**model.__dict__, "layers": model.layers[:3]})
    assert trace_layers(stage0, x)[-1][1].dim() == 0  # what stage 0 sends: a 0-dimensional loss
    with pytest.raises(RuntimeError, match=r"got input of size\s?\[\]"):
        trace_layers(model, x)


def test_no_loss_fn_and_the_tied_mistakes():
    assert get_model("mistake:no-loss-fn").loss_fn is None
    tied_fwd = get_model("mistake:tied-forward")
    assert tied_fwd.layers[5].forward_fn is None and tied_fwd.layer_specs()[5].forward_fn is None
    with pytest.raises(RuntimeError, match="'indices'"):
        trace_layers(tied_fwd, _batch(tied_fwd)[0])
    attr = get_model("mistake:tied-weight-attr")
    spec = attr.layer_specs()[0]
    assert spec.tied_weight_attr == ["weight"]  # DeepSpeed's default
    embedding = spec.build()
    assert isinstance(embedding, Embedding) and not hasattr(embedding, "weight") and hasattr(embedding.tokens, "weight")
    assert get_model("mistake:none").layer_specs()[0].tied_weight_attr == ["tokens.weight"]


@pytest.mark.parametrize("name", sorted(RECORDED_CASE))
def test_the_documented_code_is_what_the_recorded_deepspeed_error_gives(name):
    recorded = RECORDED[RECORDED_CASE[name]]
    assert recorded["expected"] == MISTAKES[name].code
    codes = {x.code for e in recorded["errors"]
             if (x := explain(f"{e['type']}: {e['message']}\n{e['traceback']}")) is not None and not x.consequence}
    assert codes == {MISTAKES[name].code}


def test_unknown_mistake_names_are_refused():
    with pytest.raises(ValueError, match="unknown model preset 'mistake:typo'"):
        get_model("mistake:typo")
    with pytest.raises(ValueError, match="has no option"):
        get_model("mistake:none", {"blocks": 4})
