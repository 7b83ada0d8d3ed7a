"""The torch pipelining runner without processes: input checked before anything starts,
rank records turned into a `Timeline`, the two halves agreeing on the schedule table."""

from __future__ import annotations

import subprocess

import pytest

from utils.jobs import torchpipe as runner
from utils.planning.schedules import build_schedule


@pytest.fixture
def no_processes(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started for bad input")

    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.mark.parametrize("kwargs, error, text", [
    ({"schedules": "1f1b"}, TypeError, "list of names"),
    ({"schedules": []}, ValueError, "is empty"),
    ({"schedules": ["1f1b", "pipedream"]}, ValueError, r"unknown schedule\(s\) \['pipedream'\]"),
    ({"schedules": ["1f1b", "1F1B"]}, ValueError, "twice"),
    ({"ranks": 1}, ValueError, "between 2 and 8"),
    ({"ranks": 2.5}, TypeError, "must be an integer"),
    ({"micro_batches": 0}, ValueError, "micro_batches"),
    ({"micro_batches": 5}, ValueError, "equal rounds"),  # interleaved on 2 ranks: 2 rounds of 2.5
    ({"schedules": ["dualpipev"], "micro_batches": 3}, ValueError, "at least 2 \\* 2 = 4"),
    ({"chunks": 1}, ValueError, "chunks >= 2"),
    ({"layers": 6}, ValueError, "multiple of 4"),
    ({"steps": 1}, ValueError, "steps must be >= 2"),
    ({"timeout": 0}, ValueError, "positive number of seconds"),
    ({"timeout": True}, ValueError, "positive number of seconds"),
    ({"fault_rank": 2}, ValueError, "fault_rank"),
    ({"hidden": 0}, ValueError, "hidden"),
])
def test_bad_input_is_refused_before_any_process_starts(no_processes, kwargs, error, text):
    with pytest.raises(error, match=text):
        runner.run_torch_pipeline(**kwargs)


def test_every_torch_class_of_the_catalogue_exists_in_torch():
    from torch.distributed import pipelining

    from utils.planning.catalogue import schedule_info

    for name in runner.TORCH_SCHEDULES:
        info = schedule_info(name)
        cls = getattr(pipelining, info.torch_class)
        base = pipelining.schedules.PipelineScheduleMulti if info.torch_multi_stage else \
            pipelining.schedules.PipelineScheduleSingle
        assert issubclass(cls, base), name


def _results(name: str, p: int, m: int, *, start: float = 1000.0, chunks: int | None = None):
    """Rank records as `utils.runtime.torchpipe` writes them, in the schedule's order."""
    plan = build_schedule(name, p, m, chunks=chunks)
    out = []
    for r, row in enumerate(plan.actions):
        t, events = start + 0.5 * r, []
        for step in range(2):
            for a in row:
                events.append([step, a.kind, a.micro_batch, a.virtual_stage, a.chunk, t, t + 0.001])
                t += 0.002
        local = [k for k in range(plan.num_virtual_stages) if plan.rank_of(k) == r]
        out.append({"rank": r, "schedules": {name: {"events": events, "virtual_stages": local,
                                                     "losses": [1.0, 0.9] if 0 in local and r == 0 else None}}})
    return plan, out


@pytest.mark.parametrize("name, chunks", [("1f1b", None), ("interleaved-1f1b", 2), ("dualpipev", None)])
def test_rank_records_become_a_measured_timeline(name, chunks):
    plan, results = _results(name, 2, 4, chunks=chunks)
    config = {"layers": 8, "hidden": 64, "micro_batch_size": 4}
    timeline = runner._timeline(name, plan, results, config, threads=1)
    assert timeline.source == "measured" and timeline.num_stages == 2 and timeline.num_micro_batches == 4
    assert min(e.start for e in timeline.events) == 0.0  # the earliest start is the origin
    assert timeline.meta["schedule"] == name and timeline.meta["placement"] == plan.placement
    run = runner.TorchPipelineRun({name: timeline}, {name: (1.0, 0.9)}, 2, 4, 1.0)
    for rank in range(2):
        for step in (0, 1):
            assert run.actions(name, rank, step) == [str(a) for a in plan.actions[rank]]
    assert run.schedule(name) == plan
    if plan.placement == "v":
        with pytest.raises(ValueError, match="V"):
            run.predict(name)
    else:
        predicted = run.predict(name)
        assert predicted.source == "simulated"
        assert predicted.meta["schedule"] == name
