"""Micro-batch plans for variable-length samples (`utils.planning.microbatching`) and the
batches built from them (`utils.workloads.varlen`), without processes."""

import itertools
import random

import pytest
import torch

from utils.planning.microbatching import MicroBatchCost, plan_micro_batches
from utils.workloads.models import get_model, lm_loss
from utils.workloads.varlen import VarlenBatches, default_cost, sample_lengths

COST = MicroBatchCost(overhead=40.0, per_token=1.0, per_token_pair=0.01)


def _brute_force(lengths, budget, p):
    """Best predicted step over every contiguous grouping of the sorted samples."""
    ordered = sorted(lengths)
    n, best = len(ordered), float("inf")
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        groups = [ordered[a:b] for a, b in zip(bounds, bounds[1:])]
        if any(len(g) * g[-1] > budget for g in groups):
            continue
        costs = [COST(len(g), g[-1]) for g in groups]
        best = min(best, sum(costs) + (p - 1) * max(costs))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_token_budget_plan_is_the_exact_optimum(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([4, 8, 16, 32, 64]) for _ in range(rng.randint(2, 11))]
    budget, p = max(lengths) * rng.randint(1, 4), rng.randint(1, 4)
    plan = plan_micro_batches(lengths, method="token-budget", micro_batches=1, num_stages=p, cost=COST,
                              token_budget=budget)
    assert sorted(i for g in plan.groups for i in g) == list(range(len(lengths)))  # every sample once
    assert all(len(g) * pad <= budget for g, pad in zip(plan.groups, plan.padded))
    assert all(pad == max(lengths[i] for i in g) for g, pad in zip(plan.groups, plan.padded))
    assert plan.predicted_step(COST, p) == pytest.approx(_brute_force(lengths, budget, p))


def test_the_three_methods_pad_differently():
    lengths = [60, 4, 6, 50, 8, 5, 64, 7]
    naive = plan_micro_batches(lengths, method="pad-to-max", micro_batches=2, num_stages=2)
    ordered = plan_micro_batches(lengths, method="sorted", micro_batches=2, num_stages=2)
    budget = plan_micro_batches(lengths, method="token-budget", micro_batches=2, num_stages=2, cost=COST,
                                token_budget=128)
    assert naive.groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and naive.padded == (64, 64)
    assert ordered.padded == (7, 64) and naive.padded_tokens() == 512 and ordered.padded_tokens() == 284
    # timing-claim: construction — token counts of plans of given lengths
    assert budget.padded_tokens() <= ordered.padded_tokens()
    # timing-claim: simulated — predicted step of given lengths and a given cost model
    assert budget.predicted_step(COST, 2) <= ordered.predicted_step(COST, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"lengths": [], "method": "sorted"}, "an empty batch"),
    ({"lengths": [8, 40], "method": "token-budget", "token_budget": 32}, r"token_budget=32 is smaller than the longest"),
    ({"lengths": [8, 8, 8], "method": "sorted"}, "do not split into 2 micro-batches"),
    ({"lengths": [8], "method": "bucketed"}, "unknown batching 'bucketed'"),
])
def test_bad_plans_are_explained(kwargs, message):
    lengths = kwargs.pop("lengths")
    with pytest.raises(ValueError, match=message):
        plan_micro_batches(lengths, micro_batches=2, num_stages=2, cost=COST, **kwargs)


def test_long_tailed_lengths_stay_in_range_and_are_mostly_short():
    lengths = sample_lengths(4000, seq_len=256, generator=torch.Generator().manual_seed(0))
    assert min(lengths) >= 4 and max(lengths) == 256
    median = sorted(lengths)[len(lengths) // 2]
    assert 24 <= median <= 40  # an eighth of seq_len
    assert sum(x > 128 for x in lengths) / len(lengths) > 0.02  # a real tail


def test_every_cut_of_the_same_samples_gives_the_same_per_token_loss():
    """The loss a step reports (the mean of the micro-batch losses DeepSpeed averages) is
    the mean over real tokens, however the samples are cut; per micro-batch it is not."""
    model = get_model("gpt", {"vocab": 64, "seq_len": 32, "hidden": 32, "heads": 4})
    torch.manual_seed(0)
    logits_of = torch.nn.Linear(1, 64)

    def step_loss(method, loss_per="token", **extra):
        data = VarlenBatches(vocab=64, seq_len=32, seed=5, replica=0, samples=8, micro_batches=2, method=method,
                             num_stages=2, cost=default_cost(model), loss_per=loss_per, **extra)
        m = data.begin_step(3)
        losses = []
        for _ in range(m):
            inputs, labels = next(data)
            logits = logits_of(inputs.unsqueeze(-1).float())  # a stand-in model, per token
            losses.append(float(lm_loss(logits, labels).detach()))
        return sum(losses) / m

    reference = step_loss("pad-to-max")
    assert step_loss("sorted") == pytest.approx(reference, rel=1e-6)
    assert step_loss("token-budget", token_budget=64) == pytest.approx(reference, rel=1e-6)
    assert step_loss("sorted", loss_per="micro-batch") != pytest.approx(reference, rel=1e-3)


def test_metrics_and_timeline_show_each_micro_batchs_tokens():
    from tests.helpers import schedule_events
    from utils import compute_metrics, plot_timeline
    from utils.timeline import Timeline

    planned = [(4, 100, 128), (2, 200, 256), (6, 60, 64)]  # (samples, real, padded)
    events = schedule_events(2, 3, f=0.01, b=0.02, step=1)
    timeline = Timeline(events=tuple(events), num_stages=2, num_micro_batches=4, source="measured",
                        micro_batch_size=4, seq_len=64, meta={"micro_batch_tokens": {"1": planned}})
    m = compute_metrics(timeline, 1)
    assert m.num_micro_batches == 3
    assert m.padding_waste == pytest.approx(1 - 360 / 448)
    assert m.tokens_per_s == pytest.approx(360 / m.step_time)  # real tokens, not samples × seq_len
    fig = plot_timeline(timeline, 1, lang="en")
    forward = next(t for t in fig.data if t.meta == "forward")
    notes = {row[1]: row[8] for row in forward.customdata}
    assert "2 samples · 200 real / 256 computed tokens" in notes[1]
    widths = dict(zip([row[1] for row in forward.customdata], forward.width))
    assert widths[1] > widths[0] > widths[2]  # thickness follows computed tokens


def test_micro_batch_order_changes_the_fill_and_drain_not_the_samples():
    """When stages scale differently with length (attention-heavy blocks on stage 0, the
    head on stage 1), where the big micro-batch sits changes the step: in the middle it hides
    inside the steady state, first or last it is paid in the fill or the drain."""
    from utils import build_schedule, simulate
    from utils.planning.microbatching import MicroBatchPlan, reorder

    stage_cost = ({"big": 60.0, "small": 10.0}, {"big": 20.0, "small": 25.0})

    def makespan(kinds):
        f = [[c[k] / 3 for k in kinds] for c in stage_cost]
        b = [[2 * c[k] / 3 for k in kinds] for c in stage_cost]
        return max(e.end for e in simulate(build_schedule("1f1b", 2, len(kinds)), f, b).events)

    assert makespan(["big"] + ["small"] * 4) == pytest.approx(165.0)
    assert makespan(["small", "small", "big", "small", "small"]) == pytest.approx(150.0)
    plan = MicroBatchPlan(groups=((0, 1), (2,), (3, 4, 5)), padded=(8, 64, 4))
    first = reorder(plan, "longest-first", cost=COST)
    assert first.padded == (64, 8, 4) and sorted(first.groups) == sorted(plan.groups)
    assert reorder(plan, "shortest-first", cost=COST).padded == (4, 8, 64)
    assert reorder(plan, "random", cost=COST, seed=1) == reorder(plan, "random", cost=COST, seed=1)
    with pytest.raises(ValueError, match="unknown micro-batch order"):
        reorder(plan, "middle-first", cost=COST)


@pytest.mark.parametrize("seed", range(8))
def test_packing_puts_every_sample_whole_into_one_row_within_the_cap(seed):
    from utils.planning.microbatching import pack

    rng = random.Random(seed)
    lengths = [rng.randint(1, 64) for _ in range(rng.randint(1, 40))]
    budget = 64 * rng.randint(1, 4)
    plan = pack(lengths, row_length=64, token_budget=budget)
    rows = [row for mb in plan.rows for row in mb]
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))       # every sample once, unsplit
    assert all(sum(lengths[i] for i in row) <= 64 for row in rows)                    # no row overflows
    assert len({len(mb) for mb in plan.rows}) == 1 and plan.shapes()[0][0] * 64 <= budget  # one shape, in the cap
    filled = [row for row in rows if row]
    # first fit: at most one row is half empty or less (its samples would have fitted another such row)
    assert sum(sum(lengths[i] for i in row) <= 32 for row in filled) <= 1
    assert sum(len(mb) == 0 for mb in plan.groups) == 0 and plan.micro_batches == -(-len(filled) // (budget // 64))
    # masked attention pairs: the causal pairs of each row minus those of its own samples
    assert plan.masked_pairs(lengths) == sum(64 * 65 // 2 - sum(lengths[i] * (lengths[i] + 1) // 2 for i in row)
                                             for row in rows)


def test_packing_is_refused_what_cannot_fit():
    from utils.planning.microbatching import pack

    with pytest.raises(ValueError, match="does not fit a row of 64"):
        pack([65], row_length=64, token_budget=128)
    with pytest.raises(ValueError, match="holds no packed row of 64 tokens: use token_budget >= 64"):
        pack([8], row_length=64, token_budget=32)


def test_deepspeeds_dynamic_batching_is_its_own_batch_by_seqlens():
    """The plans are DeepSpeed's: equal sample counts per micro-batch in a step (its pipeline
    setting), at most max_tokens real tokens each, every micro-batch padded to the step's
    longest; the samples are taken in stream order; the LR is its linear scale_lr."""
    from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import batch_by_seqlens, scale_lr

    from utils.planning.microbatching import deepspeed_batches, deepspeed_lr

    lengths = sample_lengths(256, seq_len=64, generator=torch.Generator().manual_seed(0))
    plans, sizes = deepspeed_batches(lengths, micro_batches=4, max_tokens=200)
    ids, ds_sizes, longest = batch_by_seqlens(lengths, 200, effective_batch_size=4,
                                              required_microbatches_of_same_size=True)
    assert sizes == ds_sizes and [p.padded[0] for p in plans] == longest
    assert [list(g) for p in plans for g in p.groups] == [list(s) for _, s in ids]
    steps = [sorted(i for g in p.groups for i in g) for p in plans]
    assert all(a[-1] < b[0] for a, b in zip(steps, steps[1:]))  # stream order: a step takes the samples after the last
    for plan, size in zip(plans, sizes):
        assert plan.micro_batches == 4 and len({len(g) for g in plan.groups}) == 1 and size == sum(map(len, plan.groups))
        assert all(sum(lengths[i] for i in g) <= 200 for g in plan.groups)
        assert set(plan.padded) == {max(lengths[i] for g in plan.groups for i in g)}
    assert len(set(sizes)) > 1  # the sample count per step varies with the lengths
    assert deepspeed_lr(1e-3, base_samples=32, samples=48) == scale_lr(32, 48, base_lr=1e-3) == pytest.approx(1.5e-3)


def test_packed_micro_batches_compute_the_same_gradient_as_padded_ones():
    """One step of 16 samples, packed into rows or padded to the longest: the same per-token
    loss and gradient (a block-diagonal mask and positions restarting per sample)."""
    model = get_model("gpt", {"blocks": 2, "hidden": 32, "heads": 4, "vocab": 128, "seq_len": 64})
    net = model.build_sequential(seed=0)
    grads = {}
    for method, budget in (("pad-to-max", None), ("packing", 128)):
        data = VarlenBatches(vocab=128, seq_len=64, seed=1, replica=0, samples=16, micro_batches=4, method=method,
                             num_stages=2, cost=default_cost(model), token_budget=budget)
        m = data.begin_step(0)
        net.zero_grad()
        for _ in range(m):
            inputs, labels = next(data)
            (lm_loss(net(inputs), labels) / m).backward()
        grads[method] = torch.cat([p.grad.flatten() for p in net.parameters()])
        if method == "packing":
            tokens, segments, positions = inputs
            assert tokens.shape == segments.shape == positions.shape and tokens.shape[1] == 64
            # timing-claim: construction — a token count of a plan of seeded lengths, no clock
            assert data.plan.padded_tokens() < 16 * 64
    assert torch.allclose(grads["packing"], grads["pad-to-max"], rtol=1e-4, atol=1e-7)
