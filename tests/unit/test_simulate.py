"""Simulator: textbook bubbles, hand-checked makespans, memory, calibration and search."""

from __future__ import annotations

from dataclasses import replace

import pytest

from utils.planning.schedules import build_schedule
from utils.planning.simulator import simulate
from utils.timeline import COMPUTE_KINDS, Event, Timeline
from utils.planning.whatif import _time_search, fastest_within_memory, predict_from_timeline, search_micro_batches, measured_stage_costs


def makespan(tl: Timeline) -> float:
    ev = tl.select(kinds=COMPUTE_KINDS)
    return max(e.end for e in ev) - min(e.start for e in ev)


def bubble(tl: Timeline) -> float:
    """1 - sum of compute time / (ranks x makespan), makespan first compute start -> last end."""
    busy = sum(e.duration for e in tl.select(kinds=COMPUTE_KINDS))
    return 1.0 - busy / (tl.num_stages * makespan(tl))


# --- textbook results ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("f,b", [(1.0, 1.0), (1.0, 2.0), (0.3, 0.7)])
def test_uniform_bubble_is_textbook(name, f, b):
    for p in range(1, 7):
        for m in range(1, 13):
            tl = simulate(build_schedule(name, p, m), f, b)
            assert bubble(tl) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12), (p, m)
            assert makespan(tl) == pytest.approx((m + p - 1) * (f + b))


@pytest.mark.parametrize("t_f,t_b", [(1.0, 2.0), (1.0, 1.0), (2.0, 1.0)])
def test_interleaved_bubble_is_megatrons(t_f, t_b):
    """Megatron-LM (Narayanan et al. 2021, sec. 2.2): with v chunks per rank, the bubble is
    (p - 1)(t_f + t_b) / v per rank, where t_f, t_b are a rank's forward and backward time
    for one micro-batch through *all* its chunks (so each chunk costs t_f / v, t_b / v).

    Compared: the simulated makespan equals m (t_f + t_b) + (p - 1)(t_f + t_b) / v, i.e. ideal
    compute plus that bubble, for m a multiple of p (Megatron's requirement)."""
    for p in (2, 3, 4, 5):
        for v in (2, 3, 4):
            for m in (p, 2 * p, 3 * p):
                tl = simulate(build_schedule("interleaved-1f1b", p, m, chunks=v), t_f / v, t_b / v)
                ideal = m * (t_f + t_b)
                assert makespan(tl) == pytest.approx(ideal + (p - 1) * (t_f + t_b) / v)


def test_zb_h1_bubble_below_1f1b():
    for p in range(2, 7):
        for m in range(p, p + 7):
            for f, i, w in [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (0.5, 1.0, 1.0)]:
                zb = simulate(build_schedule("zb-h1", p, m), f, i, weight=w)
                one = simulate(build_schedule("1f1b", p, m), f, i, weight=w)  # B = I + W
                # timing-claim: simulated — the simulator on given F, I, W costs
                assert bubble(zb) < bubble(one) - 1e-9, (p, m, f, i, w)
    # ZB-H1 paper, equal F, B(I), W: bubble time (p - 1)(F + I - W) instead of (p - 1)(F + I + W)
    zb = simulate(build_schedule("zb-h1", 4, 8), 1.0, 1.0, weight=1.0)
    assert makespan(zb) == pytest.approx(8 * 3 + 3 * 1)


# --- heterogeneous costs, checked by hand -------------------------------------------------------
def test_hand_checked_makespans():
    # GPipe, p=2, m=2, forward (1, 2), backward (2, 3), no comm:
    #   r0: F0 [0,1] F1 [1,2]          r1: F0 [1,3] F1 [3,5] B0 [5,8] B1 [8,11]
    #   r0: B0 waits for 1B0 -> [8,10]; B1 waits for 1B1 -> [11,13]          => 13
    assert makespan(simulate(build_schedule("gpipe", 2, 2), [1, 2], [2, 3])) == pytest.approx(13)

    # 1F1B, p=2, m=3, forward (1, 2), backward (2, 4), comm 0.5
    #   orders r0: F0 F1 B0 F2 B1 B2        r1: F0 B0 F1 B1 F2 B2
    #   r0 F0 [0,1] F1 [1,2]; r1 F0 [1.5,3.5] B0 [3.5,7.5]; r0 B0 [8,10];
    #   r1 F1 [7.5,9.5] (input at 2.5, rank busy) B1 [9.5,13.5]; r0 F2 [10,11];
    #   r1 F2 [13.5,15.5]; r0 B1 [14,16]; r1 B2 [15.5,19.5]; r0 B2 [20,22]         => 22
    tl = simulate(build_schedule("1f1b", 2, 3), [1, 2], [2, 4], comm=0.5)
    assert makespan(tl) == pytest.approx(22)
    assert [(e.start, e.end) for e in tl.select(stage=0)][-1] == (20.0, 22.0)

    # ZB-H1, p=2, m=2, forward 1, input backward (1, 2), weight 1, no comm
    #   orders r0: F0 F1 I0 W0 I1 W1        r1: F0 I0 F1 I1 W0 W1
    #   r1: F0 [1,2] I0 [2,4] F1 [4,5] I1 [5,7] W0 [7,8] W1 [8,9]
    #   r0: F0 [0,1] F1 [1,2] I0 [4,5] W0 [5,6] I1 [7,8] W1 [8,9]                   => 9
    tl = simulate(build_schedule("zb-h1", 2, 2), 1.0, [1, 2], weight=1.0)
    assert makespan(tl) == pytest.approx(9)
    assert tl.compute_order(0, 0) == ["F0", "F1", "I0", "W0", "I1", "W1"]

    # GPipe, p=2, m=2, per stage x micro-batch forward [[1, 2], [1, 1]], backward 1
    #   r0: F0 [0,1] F1 [1,3]   r1: F0 [1,2] F1 [3,4] B0 [4,5] B1 [5,6]   r0: B0 [5,6] B1 [6,7]
    assert makespan(simulate(build_schedule("gpipe", 2, 2), [[1, 2], [1, 1]], 1.0)) == pytest.approx(7)


# --- the timeline and its memory ----------------------------------------------------------------
def test_timeline_fields_and_interleaved_rows():
    tl = simulate(build_schedule("interleaved-1f1b", 2, 4, chunks=2), 0.5, 1.0, comm=0.1)
    assert tl.source == "simulated" and tl.meta["schedule"] == "interleaved-1f1b"
    assert tl.num_stages == 2 and tl.num_micro_batches == 4 and tl.steps == [0]
    assert all(e.stage == e.rank for e in tl.events)
    assert {(e.stage, e.chunk) for e in tl.events} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for stage in (0, 1):  # a rank never runs two things at once
        ev = tl.select(stage=stage)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(ev, ev[1:]))


def test_costs_shapes_and_errors():
    s = build_schedule("1f1b", 2, 4)
    assert makespan(simulate(s, 1.0, 1.0, weight=1.0)) == makespan(simulate(s, 1.0, 2.0))
    with pytest.raises(ValueError, match="weight="):
        simulate(build_schedule("zb-h1", 2, 4), 1.0, 1.0)
    with pytest.raises(ValueError, match="one per virtual stage"):
        simulate(build_schedule("interleaved-1f1b", 2, 4, chunks=2), [1.0, 1.0], 1.0)
    with pytest.raises(ValueError, match=r"forward\[1\] needs 4 values"):
        simulate(s, [[1, 1, 1, 1], [1, 1]], 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        simulate(s, -1.0, 1.0)


def test_activation_memory_matches_in_flight():
    for name in ("gpipe", "1f1b", "zb-h1"):
        s = build_schedule(name, 4, 6)
        tl = simulate(s, 1.0, 2.0, weight=1.0 if name == "zb-h1" else None,
                      activation_bytes=[10, 20, 30, 40])
        assert tl.meta["activation_memory_unit"] == "bytes"
        for r, points in enumerate(tl.meta["activation_memory"]):
            assert points[0][0] == 0.0 and points[-1][1] == pytest.approx(0)
            assert all(a[0] < b[0] for a, b in zip(points, points[1:]))
            assert tl.meta["peak_activation_memory"][r] == s.in_flight(r) * 10 * (r + 1)
    tl = simulate(build_schedule("interleaved-1f1b", 2, 4, chunks=2), 1.0, 2.0)
    assert tl.meta["activation_memory_unit"] == "micro-batches"
    s = build_schedule("interleaved-1f1b", 2, 4, chunks=2)
    assert tl.meta["peak_activation_memory"] == [s.in_flight(0), s.in_flight(1)]


# --- calibration and prediction ------------------------------------------------------------------
def _measured_like(schedule, forward, backward, *, weight=None, comm=0.0, steps=3) -> Timeline:
    """A multi-step timeline from the simulator; step 0 is slow, as a warm-up step is."""
    events = []
    offset = 0.0
    for step in range(steps):
        slow = 3.0 if step == 0 else 1.0
        tl = simulate(schedule, [x * slow for x in forward], [x * slow for x in backward],
                      weight=None if weight is None else [x * slow for x in weight], comm=comm)
        events += [replace(e, step=step, start=e.start + offset, end=e.end + offset)
                   for e in tl.events]
        offset += makespan(tl) + 1.0
    return Timeline(events=tuple(events), num_stages=schedule.num_stages,
                    num_micro_batches=schedule.num_micro_batches, label="synthetic",
                    meta={"schedule": schedule.name})


def test_predict_recovers_costs_and_makespan():
    fwd, bwd = [1.0, 1.5, 0.8, 1.2], [2.0, 3.1, 1.7, 2.5]
    measured = _measured_like(build_schedule("1f1b", 4, 8), fwd, bwd, comm=0.05)
    costs = measured_stage_costs(measured)
    assert costs.forward == pytest.approx(fwd) and costs.backward == pytest.approx(bwd)
    assert costs.weight is None and costs.comm == pytest.approx(0.05)
    same = predict_from_timeline(measured)
    assert same.source == "simulated" and same.label.startswith("1f1b, m=8 (predicted")
    assert makespan(same) == pytest.approx(makespan(measured.for_step(1)))
    more = predict_from_timeline(measured, micro_batches=16)
    assert makespan(more) == pytest.approx(makespan(simulate(build_schedule("1f1b", 4, 16), fwd, bwd,
                                                                comm=0.05)))
    gpipe = predict_from_timeline(measured, schedule="gpipe", forward=[1.1] * 4)
    assert makespan(gpipe) == pytest.approx(makespan(simulate(build_schedule("gpipe", 4, 8), 1.1, bwd,
                                                                 comm=0.05)))
    with pytest.raises(ValueError, match="weight="):
        predict_from_timeline(measured, schedule="zb-h1")


def test_predict_from_split_backward_run():
    fwd, inp, wgt = [1.0, 1.2, 0.9], [1.0, 1.1, 0.7], [0.6, 0.9, 0.5]
    measured = _measured_like(build_schedule("zb-h1", 3, 6), fwd, inp, weight=wgt, comm=0.02)
    costs = measured_stage_costs(measured)
    assert costs.weight == pytest.approx(wgt) and costs.comm == pytest.approx(0.02)
    assert makespan(predict_from_timeline(measured)) == pytest.approx(makespan(measured.for_step(2)))
    as_1f1b = predict_from_timeline(measured, schedule="1f1b")  # full backward = I + W
    direct = simulate(build_schedule("1f1b", 3, 6), fwd, [a + b for a, b in zip(inp, wgt)], comm=0.02)
    assert makespan(as_1f1b) == pytest.approx(makespan(direct))


def test_calibration_counts_load_and_transfer_but_not_waiting():
    """One micro-batch on two stages with DeepSpeed's blocking p2p, times in ms: the
    forward cost includes the micro-batch load and the transfer part of the send, the
    backward includes the transfer part of send_grad, and the link latency is measured
    from the end of the send. A recv posted early (waiting) counts in none of them."""
    ms = 1e-3

    def ev(stage, kind, start, end):
        return Event(stage=stage, rank=stage, step=0, kind=kind, micro_batch=0,
                     start=start * ms, end=end * ms)

    timeline = Timeline(events=(
        ev(0, "load", 0, 1), ev(0, "forward", 1, 11), ev(0, "send_act", 11, 13),
        ev(1, "recv_act", 0, 13),                       # waits 11 ms, transfers 2 ms
        ev(1, "forward", 14, 34), ev(1, "backward", 34, 74), ev(1, "send_grad", 74, 76),
        ev(0, "recv_grad", 13, 76),                     # waits 61 ms, transfers 2 ms
        ev(0, "backward", 77, 97)), num_stages=2, num_micro_batches=1)
    costs = measured_stage_costs(timeline)
    assert costs.forward == pytest.approx((13 * ms, 20 * ms))   # 1 load + 10 + 2 transfer; 20
    assert costs.backward == pytest.approx((20 * ms, 42 * ms))  # 20; 40 + 2 transfer
    assert costs.comm == pytest.approx(1 * ms)                  # send ends at 13, consumer starts at 14


# --- micro-batch search ------------------------------------------------------------------------
def test_search_rows_agree_with_simulation_and_budget():
    rows = search_micro_batches(
        16, num_stages=2, forward_per_sample=[1.0, 2.0], backward_per_sample=2.0,
        activation_bytes_per_sample=100, memory_budget=800, fixed_overhead=0.5)
    assert {(r.schedule, r.micro_batches) for r in rows} == {
        (s, m) for s in ("1f1b", "gpipe") for m in (1, 2, 4, 8, 16)}
    for r in rows:
        b = 16 // r.micro_batches
        tl = simulate(build_schedule(r.schedule, 2, r.micro_batches), [0.5 + b, 0.5 + 2 * b], 0.5 + 2 * b)
        assert r.step_time == pytest.approx(makespan(tl)) and r.micro_batch_size == b
        assert r.bubble == pytest.approx(bubble(tl))
        held = 2 if r.schedule == "1f1b" else r.micro_batches
        assert r.peak_activation[0] == min(held, r.micro_batches) * b * 100
        assert r.feasible == (r.max_peak_activation <= 800)
    chosen = fastest_within_memory(rows)
    assert chosen.feasible
    # timing-claim: simulated — the search's rows are simulator output on given costs
    assert chosen.step_time == min(r.step_time for r in rows if r.feasible)
    with pytest.raises(ValueError, match="no configuration fits"):
        fastest_within_memory([replace(r, feasible=False) for r in rows])


def test_search_sweep_covers_at_least_500_configurations():
    """The workbook's sweep (schedules x micro-batch counts) evaluates at least 500
    configurations. Its speed is a measurement, printed by benchmarks/predict_accuracy.py:
    no timed unit tests."""
    n, _ = _time_search(repeat_batches=(64, 96, 120, 240, 360))
    assert n >= 500


def test_memory_changes_at_the_same_instant_are_one_point():
    """10/20 ms costs put a free and the next allocation 3e-17 s apart (two float paths to
    the same instant): one change, not a zero-width dip in the curve."""
    sim = simulate(build_schedule("1f1b", 4, 8), [0.01] * 4, [0.02] * 4)
    for points in sim.meta["activation_memory"]:
        gaps = [t2 - t1 for (t1, _), (t2, _) in zip(points, points[1:])]
        assert min(gaps) > 1e-6
    assert sim.meta["peak_activation_memory"] == [4, 3, 2, 1]
