"""The auto-tuner's search without processes: the per-layer cost lines, the candidate space,
predictions against the closed-form makespan, the memory budget, and its speed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from utils.planning.partitioning import bottleneck
from utils.planning.tuning import Calibration, LayerModel, fit_layer_model, predict, tune


def _profile(b: int, *, fixed: float = 1e-3, per_sample: float = 2e-3, layers: int = 6):
    """A stand-in LayerProfile: every layer costs fixed + per_sample·b forward, twice that backward."""
    f = [fixed + per_sample * b] * layers
    return SimpleNamespace(micro_batch_size=b, forward=f, backward=[2 * x for x in f],
                           activation_bytes=[1000 * b] * layers, param_bytes=[4000] * layers)


def _flat(layers: int = 8, f: float = 1.0, b: float = 2.0) -> LayerModel:
    """Every layer costs f forward and b backward per micro-batch, whatever its size."""
    n = layers
    return LayerModel(forward_fixed=(f,) * n, forward_per_sample=(0.0,) * n, backward_fixed=(b,) * n,
                      backward_per_sample=(0.0,) * n, activation_per_sample=(10.0,) * n, static=(100.0,) * n,
                      params=(1.0,) * n)


def test_two_profiles_give_each_layer_its_line():
    model = fit_layer_model(_profile(4), _profile(1))
    assert model.forward(1) == pytest.approx([3e-3] * 6) and model.forward(8) == pytest.approx([17e-3] * 6)
    assert model.forward_fixed == pytest.approx((1e-3,) * 6) and model.backward_per_sample == pytest.approx((4e-3,) * 6)
    assert model.activation_per_sample == (1000.0,) * 6 and model.static == (16000,) * 6
    one = fit_layer_model(_profile(4))  # one size: proportional to b
    assert one.forward(2) == pytest.approx([4.5e-3] * 6) and one.forward_fixed == (0.0,) * 6
    with pytest.raises(ValueError, match="different models"):
        fit_layer_model(_profile(4), _profile(1, layers=5))


def test_1f1b_on_equal_stages_takes_m_plus_p_minus_1_beats():
    # Range: equal stage costs, no link latency: makespan = (m + p - 1)(f + b) per stage.
    rows = tune(_flat(), global_batch=8, stages=(4,), schedules=("1f1b", "gpipe"), partitions=("uniform",))
    for row in rows:
        per_stage = (1.0 + 2.0) * 8 / 4
        assert row.step_time == pytest.approx((row.micro_batches + 4 - 1) * per_stage)
        assert row.bubble == pytest.approx(3 / (row.micro_batches + 3))
    assert {r.micro_batches for r in rows} == {1, 2, 4, 8}
    ones = {r.schedule: r for r in rows if r.micro_batches == 8}
    assert max(ones["gpipe"].peak_memory) > max(ones["1f1b"].peak_memory)  # GPipe holds all 8
    assert rows[0].schedule == "1f1b"  # equal time: the one holding less memory ranks first


def test_calibration_scales_costs_and_adds_the_overhead():
    plain = tune(_flat(), global_batch=4, stages=(2,), schedules=("1f1b",), partitions=("uniform",),
                 micro_batch_counts=(4,))[0]
    cal = tune(_flat(), global_batch=4, stages=(2,), schedules=("1f1b",), partitions=("uniform",),
               micro_batch_counts=(4,), calibration=Calibration(forward_scale=2.0, backward_scale=2.0, overhead=0.5))[0]
    assert cal.step_time == pytest.approx(2 * plain.step_time + 0.5)


def test_balanced_partitions_beat_uniform_on_uneven_layers():
    model = fit_layer_model(SimpleNamespace(micro_batch_size=1, forward=[1, 1, 1, 1, 1, 6], backward=[2] * 5 + [12],
                                            activation_bytes=[1] * 6, param_bytes=[4] * 6))
    rows = tune(model, global_batch=4, stages=(2,), schedules=("1f1b",), micro_batch_counts=(4,))
    by = {r.partition: r for r in rows}
    costs = [f + b for f, b in zip(model.forward(1), model.backward(1))]
    # timing-claim: construction — partitions of a fitted model of given layer costs
    assert bottleneck(costs, list(by["balanced"].boundaries)) <= bottleneck(costs, list(by["uniform"].boundaries))
    # timing-claim: simulated — the tuner's predictions from given layer costs
    assert rows[0].partition == "balanced" and rows[0].step_time < by["uniform"].step_time
    # parameters and uniform coincide here (equal parameters): evaluated once
    assert len(rows) == len({r.boundaries for r in rows})


def test_the_memory_budget_marks_candidates_infeasible_and_ranks_them_last():
    rows = tune(_flat(), global_batch=8, stages=(2,), schedules=("1f1b", "gpipe"), partitions=("uniform",),
                memory_budget=500.0)
    assert any(not r.feasible for r in rows) and any(r.feasible for r in rows)
    assert all(max(r.peak_memory) <= 500 for r in rows if r.feasible)
    first_infeasible = next(i for i, r in enumerate(rows) if not r.feasible)
    assert all(not r.feasible for r in rows[first_infeasible:])


def test_interleaving_and_zero_bubble_are_predictions_only():
    rows = tune(_flat(), global_batch=8, stages=(2,), partitions=("uniform",))
    assert {r.schedule for r in rows} == {"1f1b", "gpipe", "interleaved-1f1b", "zb-h1"}
    assert all(r.runnable == (r.schedule in ("1f1b", "gpipe")) for r in rows)
    inter = [r for r in rows if r.schedule == "interleaved-1f1b"]
    assert inter and all(r.chunks == 2 and len(r.boundaries) == 2 * 2 + 1 for r in inter)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="multiple of data_parallel"):
        tune(_flat(), global_batch=5, data_parallel=2)
    with pytest.raises(ValueError, match="unknown schedule or partition"):
        tune(_flat(), global_batch=4, schedules=("pipedream",))


def test_the_search_space_of_the_benchmark_holds_five_hundred_candidates():
    # Uneven layers (a light embedding, a heavy head) so that the three partitions differ.
    # How long the search takes next to a job's start is benchmarks/autotune.py's to print.
    forward = [0.2] + [1.0] * 10 + [3.0]
    model = fit_layer_model(SimpleNamespace(micro_batch_size=1, forward=forward, backward=[2 * f for f in forward],
                                            activation_bytes=[1] * 12, param_bytes=[40] + [8] * 10 + [40]))
    rows = tune(model, global_batch=96, stages=(2, 3, 4, 6))
    assert len(rows) >= 500 and len({(r.num_stages, r.boundaries, r.schedule, r.micro_batches) for r in rows}) == len(rows)


def test_predict_gives_a_configuration_what_tune_gives_its_candidate():
    model = _flat()
    cal = Calibration(forward_scale=1.5, overhead=0.2, action_overhead=0.05, comm=0.01)
    searched = tune(model, global_batch=8, stages=(2,), schedules=("1f1b",), partitions=("uniform",),
                    micro_batch_counts=(4,), calibration=cal)[0]
    alone = predict(model, searched.boundaries, schedule="1f1b", micro_batches=4, global_batch=8, calibration=cal)
    assert alone.step_time == pytest.approx(searched.step_time) and alone.peak_memory == searched.peak_memory
    with pytest.raises(ValueError, match="do not split"):
        predict(model, searched.boundaries, schedule="1f1b", micro_batches=3, global_batch=8)
