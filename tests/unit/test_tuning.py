"""The auto-tuner's search without processes: the per-layer cost lines, the candidate space,
predictions against the closed-form makespan, the memory budget, its speed, the p × d splits
with their collectives, ZeRO-1, activation checkpointing, and the memory tie-break."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from utils.planning.partitioning import bottleneck
from dataclasses import replace

from utils.planning.tuning import (DEFAULT_TOLERANCE, Calibration, Candidate, LayerModel, allgather_seconds,
                                   allreduce_seconds, choose, fit_layer_model, predict, ranked,
                                   static_bytes_per_param_byte, tune)


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


LINK = Calibration(link_latency=0.01, link_bandwidth=1000.0)  # α = 10 ms, β = 1000 bytes/s: visible in the sums


def test_ring_collectives_follow_the_alpha_beta_formula():
    assert allreduce_seconds(800.0, 1, 0.01, 1000.0) == 0.0
    assert allreduce_seconds(800.0, 4, 0.01, 1000.0) == pytest.approx(2 * 3 * 0.01 + 2 * 3 / 4 * 0.8)
    assert allgather_seconds(800.0, 4, 0.01, 1000.0) == pytest.approx(3 * 0.01 + 3 / 4 * 0.8)
    assert allreduce_seconds(1e9, 8, 0.0, 1e9) == pytest.approx(2 * 7 / 8)  # → 2·bytes/β for large d


def test_a_fixed_device_count_is_searched_as_every_p_times_d_split():
    rows = tune(_flat(), global_batch=8, devices=4, schedules=("1f1b",), partitions=("uniform",), calibration=LINK)
    assert {(r.num_stages, r.data_parallel) for r in rows} == {(1, 4), (2, 2), (4, 1)}
    assert all(r.devices == 4 and r.micro_batch_size * r.micro_batches * r.data_parallel == 8 for r in rows)
    two = tune(_flat(), global_batch=8, devices=4, stages=(2,), schedules=("1f1b",), partitions=("uniform",))
    assert {(r.num_stages, r.data_parallel) for r in two} == {(2, 2)}
    # a replica count that does not divide the batch is skipped: 6 samples over 4 devices -> no (1, 4)
    six = tune(_flat(), global_batch=6, devices=4, schedules=("1f1b",), partitions=("uniform",))
    assert {(r.num_stages, r.data_parallel) for r in six} == {(2, 2), (4, 1)}


def test_replicas_add_each_stage_s_gradient_all_reduce_to_the_pipeline_of_one_replica():
    # The same per-replica work (4 samples, m = 4, 2 stages) with d = 1 and with d = 2 (8 samples).
    one = predict(_flat(), (0, 4, 8), schedule="1f1b", micro_batches=4, global_batch=4, calibration=LINK)
    two = predict(_flat(), (0, 4, 8), schedule="1f1b", micro_batches=4, global_batch=8, data_parallel=2,
                  calibration=LINK)
    grads = 4 * 100.0 / 4  # four layers of 100 static bytes, a quarter of them parameter bytes
    ring = allreduce_seconds(grads, 2, 0.01, 1000.0)
    assert one.collective_time == 0.0 and two.collective_time == pytest.approx(ring)
    # timing-claim: construction — stage 0 ends the 1F1B drain last, so its all-reduce lands whole on the step
    assert two.step_time == pytest.approx(one.step_time + ring)
    assert two.peak_memory == one.peak_memory  # without ZeRO every replica holds the same


def test_zero_1_divides_the_optimizer_state_and_adds_the_all_gather():
    kwargs = dict(schedule="1f1b", micro_batches=4, global_batch=16, data_parallel=4, calibration=LINK)
    plain = predict(_flat(), (0, 4, 8), **kwargs)
    zero = predict(_flat(), (0, 4, 8), zero_stage=1, zero_bucket_bytes=0.0, **kwargs)
    bucket = predict(_flat(), (0, 4, 8), zero_stage=1, zero_bucket_bytes=1234.0, **kwargs)
    grads = 4 * 100.0 / 4
    assert static_bytes_per_param_byte(0, 4) == 4 and static_bytes_per_param_byte(1, 4) == 2 + 3 / 4
    assert static_bytes_per_param_byte(1, 1) == 5  # at d = 1 ZeRO-1 only adds its fp32 partition copy
    assert [p - z for p, z in zip(plain.peak_memory, zero.peak_memory)] == pytest.approx([(4 - 2.75) * grads] * 2)
    assert [b - z for b, z in zip(bucket.peak_memory, zero.peak_memory)] == pytest.approx([1234.0] * 2)
    gather = allgather_seconds(grads, 4, 0.01, 1000.0)
    # timing-claim: construction — the all-gather follows the all-reduce after the drain, on the same links
    assert zero.collective_time == pytest.approx(plain.collective_time + gather)
    assert zero.step_time == pytest.approx(plain.step_time + gather)
    rows = tune(_flat(), global_batch=8, devices=2, schedules=("1f1b",), partitions=("uniform",),
                zero_stages=(0, 1))
    assert {(r.data_parallel, r.zero_stage) for r in rows} == {(1, 0), (2, 0), (2, 1)}  # ZeRO-1 needs d > 1
    with pytest.raises(ValueError, match="zero_stages"):
        tune(_flat(), global_batch=8, zero_stages=(2,))


def test_activation_checkpointing_keeps_segment_inputs_and_repeats_the_forward():
    model = _flat()  # per layer: forward 1, backward 2, 10 bytes of output per sample, 100 static bytes
    kwargs = dict(schedule="1f1b", micro_batches=1, global_batch=1)
    keep = predict(model, (0, 4, 8), **kwargs)
    every = predict(model, (0, 4, 8), checkpoint_interval=1, **kwargs)
    pairs = predict(model, (0, 4, 8), checkpoint_interval=2, **kwargs)
    # one micro-batch on 2 stages of 4 layers: F0 + F1 + B1 + B0, each backward longer by its stage's forward
    # timing-claim: construction — the simulator sums the given costs along the only path
    assert keep.step_time == pytest.approx(4 + 4 + 8 + 8) and every.step_time == pytest.approx(4 + 4 + 12 + 12)
    assert pairs.step_time == pytest.approx(every.step_time)  # every layer is still recomputed once
    static = 4 * 100.0
    assert keep.peak_memory == pytest.approx((static + 40, static + 40))  # four layers' outputs
    # interval 1: each layer's input (stage 0's first input: token ids, not counted) + one layer recomputed
    assert every.peak_memory == pytest.approx((static + 30 + 10, static + 40 + 10))
    # interval 2: the inputs of two segments + one segment (2 layers) recomputed
    assert pairs.peak_memory == pytest.approx((static + 10 + 20, static + 20 + 20))


def _candidate(schedule: str, step_time: float, peak: float, *, feasible: bool = True) -> Candidate:
    return Candidate(num_stages=2, partition="uniform", boundaries=(0, 4, 8), schedule=schedule, chunks=1,
                     micro_batches=8, micro_batch_size=1, step_time=step_time, bubble=0.1, peak_memory=(peak, peak / 2),
                     feasible=feasible)


def test_within_the_tolerance_the_least_memory_wins():
    gpipe, one_f_one_b = _candidate("gpipe", 0.2656, 155e6), _candidate("1f1b", 0.2693, 36e6)  # the review's case
    # timing-claim: simulated — given predicted step times: 1.4 % apart
    assert one_f_one_b.step_time / gpipe.step_time - 1 < DEFAULT_TOLERANCE
    assert choose([gpipe, one_f_one_b]) is one_f_one_b  # within 5 %: 4x less memory wins
    assert choose([gpipe, one_f_one_b], tolerance=0.0) is gpipe  # no tolerance: the fastest
    assert ranked([gpipe, one_f_one_b]) == [one_f_one_b, gpipe]


def test_a_gain_beyond_the_tolerance_goes_to_the_faster():
    fast, lean = _candidate("gpipe", 0.200, 155e6), _candidate("1f1b", 0.240, 36e6)  # 20 % apart
    assert choose([lean, fast]) is fast and choose([lean, fast], tolerance=0.25) is lean
    # infeasible and prediction-only candidates never win, whatever their time or memory
    ghost = replace(_candidate("1f1b", 0.1, 1.0), feasible=False)
    inter = replace(_candidate("interleaved-1f1b", 0.1, 1.0), chunks=2)
    assert choose([ghost, inter, lean, fast]) is fast and ranked([ghost, inter]) == []
    with pytest.raises(ValueError, match="raise memory_budget"):
        choose([ghost, inter])
    with pytest.raises(ValueError, match="tolerance"):
        ranked([fast], tolerance=-0.1)
