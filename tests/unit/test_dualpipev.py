"""DualPipeV as plain data: the V placement, torch's own order, the simulator on it."""

from __future__ import annotations

import pytest

from utils.planning import vshaped
from utils.planning.schedules import Schedule, build_schedule
from utils.planning.simulator import simulate
from utils.runtime.torchpipe import torch_schedule_order


def test_v_placement():
    assert [vshaped.v_rank(k, 4) for k in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    with pytest.raises(ValueError, match="outside 0..7"):
        vshaped.v_rank(8, 4)
    s = build_schedule("dualpipev", 3, 6)
    assert s.placement == "v" and s.chunks == 2 and s.num_virtual_stages == 6
    assert [s.rank_of(k) for k in range(6)] == [0, 1, 2, 2, 1, 0]
    assert build_schedule("interleaved-1f1b", 3, 6, chunks=2).rank_of(5) == 2  # loop: k % p
    for rank, row in enumerate(s.actions):
        assert {a.virtual_stage for a in row} == {rank, 2 * 3 - 1 - rank}
    assert "placement='v'" in repr(s) and "in a V" in str(s).splitlines()[0]


def test_build_rejects_what_torch_and_deepspeed_reject():
    with pytest.raises(ValueError, match="at least 2 \\* 2 = 4 micro-batches"):
        build_schedule("dualpipev", 2, 3)
    with pytest.raises(ValueError, match="exactly 2 model chunks"):
        build_schedule("dualpipev", 2, 4, chunks=3)
    assert build_schedule("dualpipev", 2, 4, chunks=2) == build_schedule("dualpipev", 2, 4)
    with pytest.raises(ValueError, match="placement must be"):
        Schedule("x", 2, 4, 3, build_schedule("dualpipev", 2, 4).actions, placement="v").validate()


@pytest.mark.parametrize("p,m", [(1, 2), (1, 5), (2, 4), (2, 5), (2, 9), (3, 6), (3, 8), (4, 8),
                                 (4, 11), (5, 10), (5, 13), (6, 12)])
def test_dualpipev_equals_torch_schedule_dualpipev(p, m):
    ours = build_schedule("dualpipev", p, m)
    ours.validate()  # complete, on the right ranks, deadlock-free
    assert {r: [str(a) for a in row] for r, row in enumerate(ours.actions)} == \
        torch_schedule_order("dualpipev", p, m)


def test_the_loop_placed_schedules_still_equal_torch_through_the_helper():
    for p, m, v in ((2, 4, 2), (4, 3, 2), (4, 8, 3)):
        ours = build_schedule("interleaved-1f1b", p, m, chunks=v)
        assert {r: [str(a) for a in row] for r, row in enumerate(ours.actions)} == \
            torch_schedule_order("interleaved-1f1b", p, m, chunks=v)
    zb = build_schedule("zb-h1", 3, 5)
    assert {r: [str(a) for a in row] for r, row in enumerate(zb.actions)} == torch_schedule_order("zb-h1", 3, 5)
    with pytest.raises(ValueError, match="not '1f1b'"):
        torch_schedule_order("1f1b", 2, 4)


def test_dualpipev_mixes_full_and_split_backwards_and_frees_on_the_right_pass():
    s = build_schedule("dualpipev", 4, 8)
    kinds = {a.kind for row in s.actions for a in row}
    assert kinds == {"forward", "backward", "backward_input", "backward_weight"}
    assert s.split_backward
    # every (virtual stage, micro-batch) has one F and either one B or one I + one W
    for k in range(8):
        for mb in range(8):
            got = sorted(a.kind for row in s.actions for a in row if (a.virtual_stage, a.micro_batch) == (k, mb))
            assert got in (["backward", "forward"], ["backward_input", "backward_weight", "forward"])


def test_simulating_dualpipev():
    p, m, f, i, w = 4, 16, 1.0, 1.0, 1.0  # per chunk: a 1F1B stage is two chunks (2f, 2i, 2w)
    sim = simulate(build_schedule("dualpipev", p, m), f, i, weight=w)
    assert sim.meta["chunks"] == 2
    # every rank does 2 chunks x m micro-batches x (F + I + W): the same work as a 1F1B stage
    for rank in range(p):
        busy = sum(e.duration for e in sim.events if e.stage == rank)
        assert busy == pytest.approx(2 * m * (f + i + w))
    # the first and the last virtual stage share rank 0; a micro-batch enters and leaves there
    assert {e.chunk for e in sim.events if e.stage == 0} == {0, 1}
    ideal = 2 * m * (f + i + w)
    bubbles = {"dualpipev": sim.metrics().makespan - ideal}
    for name, v in (("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2)):
        other = simulate(build_schedule(name, p, m, chunks=v), 2 * f / v, 2 * i / v, weight=2 * w / v)
        bubbles[name] = other.metrics().makespan - ideal
    assert bubbles == pytest.approx({"dualpipev": 3.0, "1f1b": 18.0, "zb-h1": 6.0, "interleaved-1f1b": 9.0})


def test_dualpipev_activation_peak_is_2p_plus_1_chunks():
    # DualPipe README: activation per device PP + 1 (PP = 2p stages, one chunk each).
    # Freed by B, or by W when split: a mixed schedule must free on both.
    for p in (1, 2, 3, 4, 6):
        for m in (2 * p, 2 * p + 3, 4 * p):
            s = build_schedule("dualpipev", p, m)
            sim = simulate(s, 1.0, 1.0, weight=1.0)
            expected = min(2 * p + 1, 2 * m)
            assert sim.meta["peak_activation_memory"] == [expected] * p, (p, m)
            assert [s.in_flight(r) for r in range(p)] == [expected] * p
            assert all(level == 0 for level in (pts[-1][1] for pts in sim.meta["activation_memory"]))


def test_what_if_calibration_reads_the_v_placement_and_predicts_dualpipev_when_told_how():
    from dataclasses import replace

    from utils.planning.whatif import measured_stage_costs, predict_from_timeline

    measured = simulate(build_schedule("1f1b", 2, 4), 0.002, 0.004)
    with pytest.raises(ValueError, match="per virtual stage"):  # whole-stage costs do not say how to halve them
        predict_from_timeline(measured, schedule="dualpipev")
    predicted = predict_from_timeline(measured, schedule="dualpipev", forward=0.001, backward=0.0015,
                                      weight=0.0005)
    assert predicted.meta["schedule"] == "dualpipev" and predicted.meta["chunks"] == 2
    forward, backward = [0.001, 0.002, 0.003, 0.004], [0.0015, 0.0025, 0.0035, 0.0045]
    v_shaped = simulate(build_schedule("dualpipev", 2, 4), forward, backward, weight=0.0005)
    assert v_shaped.meta["placement"] == "v"
    costs = measured_stage_costs(v_shaped)  # each event's chunk placed on its virtual stage through the V
    assert costs.forward == pytest.approx(forward) and costs.backward == pytest.approx(backward)
    loop = replace(v_shaped, meta={**v_shaped.meta, "placement": "loop"})  # misread as loop: stages 2 and 3 swap
    assert measured_stage_costs(loop).forward == pytest.approx([0.001, 0.002, 0.004, 0.003])
