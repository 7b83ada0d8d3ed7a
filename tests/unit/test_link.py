"""What crosses a stage boundary (`cut_bytes`, measured on a real micro-batch) and the
alpha-beta fit of a link; no process starts here (tests/integration/test_link_real.py
runs the real benchmark)."""

import math
import random

import numpy
import pytest
import torch
from torch import nn

from utils import get_model
from utils.profiling.link import Cut, LinkFit, LinkMeasurement, cut_bytes, fit_alpha_beta, measure_cuts, measure_link

TINY = {"blocks": 3, "hidden": 32, "heads": 2, "vocab": 128, "seq_len": 16}


def test_gpt_preset_cuts_are_micro_batch_x_seq_len_x_hidden_x_4_bytes():
    model = get_model("gpt")
    o = model.options
    cuts = cut_bytes(model, 4)
    assert len(cuts) == model.num_layers - 1 and [c.after for c in cuts] == list(range(model.num_layers - 1))
    for c in cuts:
        assert c.nbytes == 4 * o["seq_len"] * o["hidden"] * 4
        assert c.shapes == ((4, o["seq_len"], o["hidden"]),) and c.dtypes == ("float32",)
    assert (cuts[0].sender, cuts[0].receiver) == ("Embedding", "Block")
    assert (cuts[-1].sender, cuts[-1].receiver) == ("Block", "LMHead")
    assert all((c.sender, c.receiver) == ("Block", "Block") for c in cuts[1:-1])


def test_cut_bytes_follow_micro_batch_seq_len_and_dtype():
    model = get_model("gpt", TINY)
    assert {c.nbytes for c in cut_bytes(model, 3)} == {3 * 16 * 32 * 4}
    assert {c.nbytes for c in cut_bytes(model, 2, seq_len=8)} == {2 * 8 * 32 * 4}
    half = cut_bytes(model, 2, dtype=torch.bfloat16)
    assert {c.nbytes for c in half} == {2 * 16 * 32 * 2} and {c.dtypes for c in half} == {("bfloat16",)}


def test_mlp_preset_cuts():
    model = get_model("mlp", {"blocks": 3, "hidden": 24})
    assert [c.nbytes for c in cut_bytes(model, 5)] == [5 * 24 * 4] * 2


def test_cut_bytes_leaves_the_callers_random_state_alone():
    torch.manual_seed(7)
    random.seed(7)
    numpy.random.seed(7)
    expected = (torch.rand(3), random.random(), numpy.random.rand())
    torch.manual_seed(7)
    random.seed(7)
    numpy.random.seed(7)
    cut_bytes(get_model("gpt", TINY), 2, seed=5)
    got = (torch.rand(3), random.random(), numpy.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_measure_cuts_sums_a_tuple_output_and_sees_width_changes():
    class Pair(nn.Module):
        def forward(self, x):
            return x, x[:, :2].to(torch.float64)

    class First(nn.Module):
        def forward(self, pair):
            return pair[0]

    cuts = measure_cuts([nn.Linear(4, 6), Pair(), First(), nn.Linear(6, 3)], torch.zeros(5, 4))
    assert [c.nbytes for c in cuts] == [5 * 6 * 4, 5 * 6 * 4 + 5 * 2 * 8, 5 * 6 * 4]
    assert cuts[1] == Cut(1, "Pair", "First", ((5, 6), (5, 2)), ("float32", "float64"), 5 * 6 * 4 + 5 * 2 * 8)


def test_fit_recovers_latency_and_bandwidth():
    sizes = [2**k for k in range(10, 27)]
    fit = fit_alpha_beta(sizes, [20e-6 + n / 3e9 for n in sizes])
    assert math.isclose(fit.latency_s, 20e-6, rel_tol=1e-6) and math.isclose(fit.bandwidth, 3e9, rel_tol=1e-6)
    assert math.isclose(fit.seconds(1e6), 20e-6 + 1e6 / 3e9)


def test_fit_clamps_a_negative_latency_and_rejects_a_flat_link():
    sizes = [1e3, 1e6, 1e7]
    fit = fit_alpha_beta(sizes, [n / 1e9 - 1e-9 * (i == 0) * 0.5 for i, n in enumerate(sizes)])
    # timing-claim: construction — a fit of times the test wrote down, no clock read
    assert fit.latency_s == 0.0 and 0.9e9 < fit.bandwidth < 1.1e9
    with pytest.raises(ValueError, match="does not grow"):
        fit_alpha_beta(sizes, [1e-3, 1e-3 / 2, 1e-3 / 4])


def test_median_fastest_and_relative_error_against_this_or_another_fit():
    m = LinkMeasurement((1000, 2000), ((2e-6, 9e-6, 5e-6), (3e-6,)), LinkFit(1e-6, 1e9), "gloo")
    assert m.seconds == [5e-6, 3e-6] and m.fastest == [2e-6, 3e-6]
    assert m.relative_error() == pytest.approx([0.0, 0.0])  # against the fastest sample
    assert m.relative_error(LinkFit(0.0, 1e9)) == pytest.approx([-0.5, 2 / 3 - 1])


@pytest.mark.parametrize("kwargs", [dict(sizes_bytes=[]), dict(sizes_bytes=[0]), dict(sizes_bytes=[8], repeats=0),
                                    dict(sizes_bytes=[8], device="tpu")])
def test_measure_link_checks_its_arguments_before_starting_anything(kwargs):
    with pytest.raises(ValueError):
        measure_link(**kwargs)
