"""A learner's own model (``JobSpec(model="pkg.mod:fn")``) without processes: it resolves, its
shape is what its function builds, bad input is refused before anything starts, saying what
to change, and the ranks are told where to import it from."""

from __future__ import annotations

import sys
import textwrap

import pytest

from utils import JobSpec
from utils.jobs.launchers import LocalTorchrun, model_root
from utils.jobs.plan import plan_job
from utils.workloads.models import get_model

MODULE = '''
import torch
from torch import nn
from deepspeed.pipe import LayerSpec

import utils


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


def _batch(width):
    def make_batch(generator, batch):
        x = torch.randn(batch, width, generator=generator)
        return x, x.roll(1, dims=1)
    return make_batch


def build(width=16, blocks=4):
    return utils.ModelDef(layers=[LayerSpec(nn.Linear, width, width), *[LayerSpec(Block, width) for _ in range(blocks)],
                                  lambda x: x * 0.5], loss_fn=nn.functional.mse_loss, make_batch=_batch(width))


def not_a_def():
    return [LayerSpec(nn.Linear, 4, 4)]


def an_instance():
    return utils.ModelDef(layers=[nn.Linear(4, 4)], loss_fn=nn.functional.mse_loss, make_batch=_batch(4))


def broken_chain():
    return utils.ModelDef(layers=[LayerSpec(nn.Linear, 4, 8), LayerSpec(nn.Linear, 4, 4)],
                          loss_fn=nn.functional.mse_loss, make_batch=_batch(4))


def vector_loss():
    return utils.ModelDef(layers=[LayerSpec(nn.Linear, 4, 4)], loss_fn=lambda y, t: (y - t).pow(2).mean(0),
                          make_batch=_batch(4))


def raises():
    raise RuntimeError("my bug")


NOT_CALLABLE = 3
'''


@pytest.fixture(scope="module")
def module_name(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner")
    (folder / "learner_model.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    sys.path.insert(0, str(folder))
    yield "learner_model", folder
    sys.path.remove(str(folder))
    sys.modules.pop("learner_model", None)


def test_an_import_path_is_a_model_whose_layers_are_what_its_function_builds(module_name):
    name, _ = module_name
    spec = JobSpec(model=f"{name}:build", model_options={"width": 8, "blocks": 3}, num_stages=2, device="cpu")
    spec.check()
    assert spec.shape.layer_names == ("Linear", "Block", "Block", "Block", "<lambda>")
    model = get_model(spec.model, spec.model_options)
    assert model.param_counts() == [8 * 8 + 8] * 4 + [0]
    built = model.build_sequential(seed=1)
    x, y = model.make_batch(__import__("torch").Generator().manual_seed(0), 2)
    assert built(x).shape == y.shape
    assert [layer.cls.__name__ for layer in model.layers][-1] == "FunctionLayer"


@pytest.mark.parametrize("function, error, text", [
    ("missing", ValueError, "has no 'missing'"),
    ("NOT_CALLABLE", ValueError, "is a int, not a function"),
    ("not_a_def", TypeError, "returned a list; return utils.ModelDef"),
    ("an_instance", TypeError, r"nn.Module instance \(Linear\); give LayerSpec\(Linear, ...\)"),
    ("broken_chain", ValueError, r"layer 1 \(Linear\) cannot take the output of layer 0 \(\(2, 8\)\)"),
    ("vector_loss", ValueError, r"loss_fn must return a scalar tensor, got \(4,\)"),
    ("raises", ValueError, "raised RuntimeError: my bug"),
])
def test_a_bad_model_function_is_refused_before_any_process_saying_what_to_change(module_name, function, error, text):
    name, _ = module_name
    with pytest.raises(error, match=text):
        JobSpec(model=f"{name}:{function}", device="cpu").check()


@pytest.mark.parametrize("model, options, text", [
    ("no_such_module_xyz:build", {}, "cannot import 'no_such_module_xyz'.*put its folder on sys.path"),
    ("learner_model:build", {"depth": 2}, "cannot take model_options.*unexpected keyword argument 'depth'"),
    ("learner_model:", {}, "write an import path as 'package.module:function'"),
])
def test_an_import_path_that_does_not_resolve_is_refused(module_name, model, options, text):
    with pytest.raises(ValueError, match=text):
        JobSpec(model=model, model_options=options, device="cpu").check()


def test_the_ranks_import_the_model_from_where_the_notebook_found_it(module_name, monkeypatch):
    name, folder = module_name
    plan = plan_job(JobSpec(model=f"{name}:build", num_stages=2, device="cpu", partition="uniform"))
    assert model_root(plan) == str(folder.resolve())
    launcher = LocalTorchrun()
    assert str(folder.resolve()) in launcher.environment(plan)["PYTHONPATH"].split(":")
    assert f"PYTHONPATH={folder.resolve()}" in launcher.command(plan, __import__("utils").jobs.rundir.RunDir(folder))
    assert model_root(plan_job(JobSpec(model="mlp", num_stages=2, device="cpu"))) is None


def test_a_language_model_must_take_the_sample_length(module_name, tmp_path):
    import torch

    import utils
    from utils.workloads.custom import load_model
    from deepspeed.pipe import LayerSpec

    def make(tokens_too: bool):
        def batch(generator, n, *rest):
            length = rest[0] if rest and rest[0] is not None else 8
            ids = torch.randint(0, 16, (n, length), generator=generator)
            return ids, ids
        return batch if tokens_too else (lambda generator, n: batch(generator, n))

    module = sys.modules[module_name[0]]
    module.lm_without_tokens = lambda: utils.ModelDef(layers=[LayerSpec(torch.nn.Embedding, 16, 16)],
                                                      loss_fn=lambda y, t: y.float().mean(), make_batch=make(False),
                                                      seq_len=8)
    module.lm_with_tokens = lambda: utils.ModelDef(layers=[LayerSpec(torch.nn.Embedding, 16, 16)],
                                                   loss_fn=lambda y, t: y.float().mean(), make_batch=make(True),
                                                   seq_len=8)
    with pytest.raises(TypeError, match=r"make_batch must take \(generator, batch_size, tokens\)"):
        load_model(f"{module_name[0]}:lm_without_tokens")
    model = load_model(f"{module_name[0]}:lm_with_tokens")
    inputs, _ = model.make_batch(torch.Generator().manual_seed(0), 2, 5)
    assert inputs.shape == (2, 5) and model.seq_len == 8
