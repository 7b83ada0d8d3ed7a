"""Schedules as data: orders equal DeepSpeed's and torch's, validation, activations in flight."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from utils.planning.catalogue import schedule_info
from utils.planning.schedules import SCHEDULE_NAMES, Action, Schedule, build_schedule, parse_action


# --- actions -----------------------------------------------------------------------------------
def test_action_strings_round_trip():
    cases = {"1F0": Action(1, "forward", 0), "2B3": Action(2, "backward", 3),
             "0I1": Action(0, "backward_input", 1), "0W1": Action(0, "backward_weight", 1)}
    for text, action in cases.items():
        assert str(action) == text
        assert parse_action(text) == action
    assert parse_action("5F2", num_stages=4) == Action(5, "forward", 2, chunk=1)
    with pytest.raises(ValueError, match="cannot parse"):
        parse_action("1X0")
    with pytest.raises(ValueError, match="unknown action kind"):
        Action(0, "send_act", 0)


# --- building ----------------------------------------------------------------------------------
def test_build_rejects_bad_input():
    with pytest.raises(ValueError, match="gpipe, 1f1b, interleaved-1f1b, zb-h1"):
        build_schedule("pipedream", 2, 4)
    with pytest.raises(ValueError, match="num_micro_batches"):
        build_schedule("1f1b", 2, 0)
    with pytest.raises(ValueError, match="num_stages"):
        build_schedule("gpipe", 0, 4)
    with pytest.raises(TypeError):
        build_schedule("gpipe", 2, 2.5)
    with pytest.raises(ValueError, match="chunks=1"):
        build_schedule("1f1b", 2, 4, chunks=2)
    with pytest.raises(ValueError, match="chunks >= 2"):
        build_schedule("interleaved-1f1b", 2, 4, chunks=1)
    assert build_schedule("interleaved-1f1b", 2, 4) == build_schedule("interleaved-1f1b", 2, 4, chunks=2)
    with pytest.raises(ValueError, match="equal rounds"):
        build_schedule("interleaved-1f1b", 4, 9, chunks=2)  # 2 rounds of 4.5: torch refuses too


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_every_built_schedule_is_valid_and_well_placed(name):
    info = schedule_info(name)
    chunk_options = (info.default_chunks,) if info.fixed_chunks else (info.min_chunks, info.min_chunks + 1)
    for p in range(1, 7):
        for m in range(1, 13):
            for v in chunk_options:
                try:
                    s = build_schedule(name, p, m, chunks=v)
                except ValueError:
                    # m that cannot be split into rounds, or fewer than 2p for dualpipev
                    assert name == "interleaved-1f1b" or (name == "dualpipev" and m < 2 * p)
                    continue
                s.validate()
                def home(k: int) -> int:  # loop placement, or the V of DualPipeV and ZB-V
                    return (k if k < p else 2 * p - 1 - k) if info.placement == "v" else k % p

                for rank, row in enumerate(s.actions):
                    assert all(home(a.virtual_stage) == rank and a.chunk == a.virtual_stage // p for a in row)
                    if name != "dualpipev":  # dualpipev splits only some backwards
                        assert len(row) == (3 if s.split_backward else 2) * m * v


def _deepspeed_order(p: int, m: int, stage: int) -> list[str]:
    from deepspeed.runtime.pipe.schedule import BackwardPass, ForwardPass, TrainSchedule

    sched = TrainSchedule(micro_batches=m, stages=p, stage_id=stage)
    order = []
    for step_id, cmds in enumerate(sched.steps()):
        mb, _ = sched._step_to_micro_batch(step_id)
        for cmd in cmds:
            if isinstance(cmd, ForwardPass):
                order.append(f"F{mb}")
            elif isinstance(cmd, BackwardPass):
                order.append(f"B{mb}")
    return order


def test_1f1b_equals_deepspeed_train_schedule():
    for p in range(1, 7):
        for m in range(1, 11):
            s = build_schedule("1f1b", p, m)
            for stage in range(p):
                assert s.compute_order(stage) == _deepspeed_order(p, m, stage), (p, m, stage)


def _torch_order(cls, p: int, m: int, chunks: int) -> dict[int, list[str]]:
    """torch's per-rank compute order, built from stand-in stage objects (no process group)."""
    import torch

    stages = [SimpleNamespace(num_stages=p * chunks, group_size=p, group_rank=0,
                              stage_index=c * p, is_first=c == 0, is_last=False,
                              submod=torch.nn.Identity()) for c in range(chunks)]
    schedule = cls(stages, m)
    return {r: [str(a) for a in ops if a is not None] for r, ops in schedule.pipeline_order.items()}


@pytest.mark.parametrize("p,m,chunks", [(2, 2, 2), (2, 4, 2), (4, 8, 2), (4, 4, 3), (3, 9, 2),
                                        (4, 10, 2), (4, 3, 2), (2, 3, 3), (1, 4, 2)])
def test_interleaved_equals_torch(p, m, chunks):
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    expected = _torch_order(ScheduleInterleaved1F1B, p, m, chunks)
    ours = build_schedule("interleaved-1f1b", p, m, chunks=chunks)
    assert {r: [str(a) for a in row] for r, row in enumerate(ours.actions)} == expected


@pytest.mark.parametrize("p,m", [(2, 2), (2, 6), (3, 3), (3, 8), (4, 4), (4, 6), (4, 2), (5, 10)])
def test_zb_h1_equals_torch_zero_bubble_with_one_chunk(p, m):
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    expected = _torch_order(ScheduleInterleavedZeroBubble, p, m, 1)
    ours = build_schedule("zb-h1", p, m)
    assert {r: [str(a) for a in row] for r, row in enumerate(ours.actions)} == expected


# --- compute order ---------------------------------------------------------------------------------
def test_compute_order_labels_kind_and_micro_batch():
    assert build_schedule("gpipe", 2, 3).compute_order(1) == ["F0", "F1", "F2", "B0", "B1", "B2"]
    assert build_schedule("1f1b", 3, 4).compute_order(0) == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert build_schedule("1f1b", 3, 4).compute_order(2) == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert build_schedule("zb-h1", 2, 2).compute_order(1) == ["F0", "I0", "F1", "I1", "W0", "W1"]
    hand = Schedule.from_strings(["0F0 0F1 0B1 0B0", "1F0 1B0 1F1 1B1"])
    assert hand.compute_order(0) == ["F0", "F1", "B1", "B0"]  # the listed order, not sorted
    with pytest.raises(ValueError, match="chunks per rank"):
        build_schedule("interleaved-1f1b", 2, 4, chunks=2).compute_order(0)
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        build_schedule("1f1b", 2, 4).compute_order(2)
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        build_schedule("1f1b", 2, 4).compute_order(-1)
    with pytest.raises(TypeError):
        build_schedule("1f1b", 2, 4).compute_order(0.0)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
def test_compute_order_matches_timeline_compute_order(name):
    from utils.planning.simulator import simulate

    s = build_schedule(name, 4, 6)
    timeline = simulate(s, 0.001, 0.002, weight=0.001 if name == "zb-h1" else None)
    for rank in range(4):
        assert s.compute_order(rank) == timeline.compute_order(rank, 0)


# --- activations in flight -----------------------------------------------------------------------
def test_in_flight_1f1b_gpipe_zb():
    for p in range(1, 7):
        for m in range(1, 13):
            one_f_one_b, gpipe, zb = build_schedule("1f1b", p, m), build_schedule("gpipe", p, m), build_schedule("zb-h1", p, m)
            for s in range(p):
                assert one_f_one_b.in_flight(s) == min(p - s, m)
                assert gpipe.in_flight(s) == m
                # same forward/input-backward order as 1F1B: equal when I frees activations
                assert zb.in_flight(s, release="input") == min(p - s, m)
            # W keeps inputs alive a little longer; the peak over ranks stays 1F1B's
            assert max(zb.in_flight(s) for s in range(p)) == min(p, m)


# --- validation ----------------------------------------------------------------------------------
def test_validate_reports_missing_and_duplicate_actions():
    missing_b = Schedule.from_strings(["0F0 0F1 0B0", "1F0 1B0 1F1 1B1"])
    with pytest.raises(ValueError, match=r"missing backward \(0B1\)"):
        missing_b.validate()
    twice = Schedule.from_strings(["0F0 0F0 0B0", "1F0 1B0"])
    with pytest.raises(ValueError, match="appears twice"):
        twice.validate()
    misplaced = Schedule.from_strings(["0F0 0B0 1F0", "1B0"])
    with pytest.raises(ValueError, match="belongs on rank 1"):
        misplaced.validate()


def test_validate_detects_deadlock_and_names_stuck_ranks():
    crossed = Schedule.from_strings(["0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0"])
    with pytest.raises(ValueError, match="deadlocks") as info:
        crossed.validate()
    assert "rank 0 waits at 0B0 for 1B0" in str(info.value)
    assert "rank 1 waits at 1F1 for 0F1" in str(info.value)
    backwards_first = Schedule.from_strings(["0B0 0F0"])
    with pytest.raises(ValueError, match="later on the same rank"):
        backwards_first.validate()


def test_from_strings_and_pretty_grid():
    s = build_schedule("gpipe", 2, 2)
    assert Schedule.from_strings(["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"], name="gpipe") == s
    assert s.grid() == [["0F0", ""], ["0F1", "1F0"], ["", "1F1"], ["", "1B0"],
                        ["0B0", "1B1"], ["0B1", ""]]
    text = str(s)
    assert text.splitlines()[1].split() == ["slot", "rank", "0", "rank", "1"]
    assert "0B0" in text.splitlines()[6]
