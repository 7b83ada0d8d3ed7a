"""`utils.workloads.presets`: every preset described without torch, exactly as `get_model`
resolves it, so that a job is checked (and a run read back) in a process that never imports
torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from utils.system.paths import PROJECT_ROOT
from utils.workloads.models import get_model
from utils.workloads.presets import HIDDEN_PRESETS, PRESETS, model_shape

CASES = [(name, options) for name, info in {**PRESETS, **HIDDEN_PRESETS}.items()
         for options in ({}, {"blocks": 3} if "blocks" in info.defaults else {"hidden": 32})]


@pytest.mark.parametrize("name, options", CASES)
def test_the_shape_is_what_get_model_builds(name, options):
    model, shape = get_model(name, options), model_shape(name, options)
    assert shape.layer_names == tuple(model.layer_names) and shape.num_layers == model.num_layers
    assert shape.seq_len == model.seq_len and dict(shape.options) == dict(model.options)


@pytest.mark.parametrize("name, options, said", [
    ("gtp", {}, "unknown model preset 'gtp'"),
    ("gpt", {"layers": 3}, "preset 'gpt' has no option(s) ['layers']"),
    ("gpt", {"hidden": 130}, "hidden (130) must be divisible by heads (4); change one of them"),
    ("mistake:none", {"heads": 5}, "hidden (64) must be divisible by heads (5)"),
    ("mlp", {"blocks": 0}, "model option blocks"),
])
def test_bad_presets_fail_alike_in_both(name, options, said):
    for resolve in (model_shape, get_model):
        with pytest.raises(ValueError) as caught:
            resolve(name, options)
        assert said in str(caught.value), (resolve.__name__, str(caught.value))


def test_describing_jobs_and_reading_runs_imports_no_torch(tmp_path):
    probe = """
import json, sys
import utils
spec = utils.JobSpec(model="seed-case", num_stages=4, partition=[0, 8, 16, 24, 32], micro_batches=8)
spec.check()
utils.JobSpec(model="mistake:float-mask", num_stages=2, partition="uniform").check()
utils.find_run(spec)
print(json.dumps(sorted(m for m in ("torch", "deepspeed") if m in sys.modules)))
"""
    done = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "WORKBOOK_RUNS": str(tmp_path)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_layer_flops_follow_the_structure_not_the_clock():
    """Counted, not timed: a GPT's embedding (a lookup) does no matrix multiply, every block the
    same, the head + loss more than a block; a backward costs about twice its forward."""
    from utils.workloads.models import get_model

    model = get_model("gpt", {"blocks": 3})  # the default width and vocabulary: a head wider than a block
    forward = model.layer_flops(1)
    both = model.layer_flops(1, backward=True)
    assert len(forward) == len(both) == model.num_layers and forward[0] == both[0] == 0
    assert forward[1] == forward[2] == forward[3] > 0 and forward[-1] > forward[1]
    assert all(2.5 * f <= b <= 3.5 * f for f, b in zip(forward[1:], both[1:]))
    assert model.layer_flops(2) == [2 * f for f in forward]  # linear in the micro-batch size
