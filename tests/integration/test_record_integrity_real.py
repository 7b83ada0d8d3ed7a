"""A real 2-stage job's record against issue 38's items 2 and 7: the launcher's start time is
recorded with its pid while the job runs, every rank's result counts the lines of its files,
and the same record cut short afterwards reads as partial."""

from __future__ import annotations

import os

import pytest

from tests.helpers import SMALL_GPT
from utils import JobSpec, Run, start_job
from utils.analysis.report import PARTIAL
from utils.jobs.diagnose import diagnose
from utils.system.fileio import scan_jsonl
from utils.system.procs import process_created

pytestmark = pytest.mark.integration


def test_a_real_record_is_counted_and_a_cut_one_reads_as_partial(runs_root):
    job = start_job(JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, steps=3, name="counted"))
    status = job.run_dir.read_status()
    assert status["launcher_created"] == process_created(os.getpid())
    assert Run.load(job.path).state in ("running", "succeeded")  # not "incomplete": the launcher is this process
    run = job.wait()
    assert run.ok and run.record_problems == ()
    for rank in run.ranks:
        counted = run.results[rank]["record_lines"]
        for record, path in run.run_dir.rank_records(rank).items():
            if path.exists():
                assert counted[record] == scan_jsonl(path).lines, (rank, record)
        assert counted["progress"] == 3

    events = run.run_dir.events(1)
    data = events.read_bytes()
    events.write_bytes(data[: data.rfind(b"\n", 0, len(data) - 1) + 20])  # 20 bytes into its last line
    cut = Run.load(run.path)
    [problem] = cut.record_problems
    assert (problem.kind, problem.rank, problem.expected) == ("truncated", 1, run.results[1]["record_lines"]["events"])
    assert PARTIAL in repr(cut) and cut.timeline.metrics().notes
    assert diagnose(cut).primary.code == "partial-record"
