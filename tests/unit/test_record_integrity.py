"""A run's record read back whole or said to be partial (issue 38, items 2, 3 and 7), on run
directories written here with the ranks' own line writer (no jobs):

- a finished run whose rank's file was cut short (mid-line, or at a line's end) is reported
  by `Run.record_problems`, its repr (so `list_runs`), its metrics and `diagnose`;
- a damaged line names its file and line number and the rest of the run is still read;
- "running" needs the launcher's pid *and* its start time; a zombie launcher is gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil

from tests.helpers import SMALL_GPT, schedule_events
from utils import JobSpec, Run, find_run, list_runs
from utils.analysis.report import PARTIAL
from utils.jobs.diagnose import diagnose
from utils.jobs.records import MemoryRecord, RankResult
from utils.jobs.rundir import RunDir
from utils.system.fileio import LineAppender, scan_jsonl
from utils.system.procs import process_alive, process_created

SPEC = JobSpec(**SMALL_GPT, num_stages=2, micro_batches=4, steps=3, name="record")


def _record(root: Path, *, state: str = "succeeded", results: bool = True, **status) -> RunDir:
    """The record a finished 2-stage job leaves, each rank's files written by the rank's own
    `LineAppender` and counted in its result, as `utils.runtime.rank` does. Stage 1 is the
    slow one (its backward takes twice as long)."""
    rd = RunDir.create("record", root)
    rd.write_spec(SPEC.to_dict())
    rd.write_plan({"device": "cpu", "partition": {"parts": [0, 2, 4], "method": "uniform",
                                                  "predicted_stage_costs": None}})
    for rank in range(2):
        files = rd.rank_records(rank)
        with (LineAppender(files["events"]) as events, LineAppender(files["progress"]) as progress):
            for step in range(SPEC.steps):
                step_events = schedule_events(2, 4, f=[0.010, 0.012], b=[0.020, 0.040], step=step, offset=step)
                events.write(json.dumps(asdict(e)) for e in step_events if e.rank == rank)
                progress.write([json.dumps({"step": step, "loss": 3.0 - step / 10, "seconds": 0.5})])
        if results:
            rd.write_result(RankResult(rank=rank, stage=rank, parts=(0, 2, 4), device="cpu",
                                       peak_memory=MemoryRecord(kind="cpu_max_rss", peak=1),
                                       record_lines={"events": events.lines, "progress": progress.lines}))
    rd.write_status(state=state, error=None if state == "succeeded" else "rank 1 died", started=1.0,
                    finished=None if state == "running" else 2.0, command="", notes=[], **status)
    return rd


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


# --- the reader --------------------------------------------------------------------------------------
def test_a_jsonl_file_says_what_it_left_out(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n[3]\n\xff\xfe garbage\n{"a": 3}\n{"a": {"b": 4}')
    scan = scan_jsonl(path)
    assert [r["a"] for r in scan.rows] == [1, 2, 3]
    assert scan.damaged == (4, 5) and scan.lines == 6  # a blank line is no row, and not damaged
    assert scan.tail == len(b'{"a": {"b": 4}')  # ends with "}", but is no whole object
    path.write_bytes(b'{"a": 1}\n{"a": 2}')  # a whole last object without its newline is a row
    assert scan_jsonl(path).rows == [{"a": 1}, {"a": 2}] and scan_jsonl(path).lines == 2
    assert scan_jsonl(tmp_path / "absent.jsonl").exists is False


def test_the_writer_counts_what_an_earlier_launch_wrote(tmp_path):
    path = tmp_path / "events.jsonl"
    with LineAppender(path) as first:
        first.write(['{"x": 1}', '{"x": 2}'])
    with LineAppender(path) as relaunched:  # a restart-mode job's relaunched rank
        relaunched.write(['{"x": 3}'])
        assert relaunched.lines == 3


# --- (a) a record cut short --------------------------------------------------------------------------
def test_a_complete_record_has_no_problems(tmp_path):
    rd = _record(tmp_path)
    run = Run.load(rd.path)
    assert run.record_problems == () and not run.partial
    assert "partial" not in repr(run)
    metrics = run.timeline.metrics()
    assert metrics.notes == () and PARTIAL not in str(metrics)
    assert "partial-record" not in diagnose(run).codes
    assert find_run(SPEC, tmp_path).path == rd.path


def test_a_finished_run_cut_mid_line_says_its_figures_are_partial(tmp_path):
    rd = _record(tmp_path)
    events = rd.events(1)
    lines = _lines(events)
    complete = lines[: len(lines) * 3 // 4]
    events.write_bytes(b"".join(complete) + lines[len(complete)][:30])  # cut 30 bytes into a line
    full = Run.load(_record(tmp_path / "whole").path).timeline.metrics()

    run = Run.load(rd.path)
    assert run.state == "succeeded" and run.partial
    [problem] = run.record_problems
    assert (problem.kind, problem.rank, problem.file) == ("truncated", 1, "events-rank1.jsonl")
    assert (problem.found, problem.expected) == (len(complete), len(lines))
    assert f"{len(complete)} of the {len(lines)} events" in str(problem)
    assert PARTIAL in repr(run) and f"{len(complete)} of {len(lines)} events" in repr(run)
    [listed] = list_runs(tmp_path)
    assert PARTIAL in repr(listed)

    metrics = run.timeline.metrics()  # computed from what is there, and saying so
    assert metrics.bubble_ratio != full.bubble_ratio
    assert metrics.notes and metrics.notes[0].startswith(PARTIAL) and "events-rank1.jsonl" in metrics.notes[0]
    assert PARTIAL in str(metrics) and metrics.diagnosis.startswith(f"[{PARTIAL}]")
    assert metrics.to_dict()["notes"] == list(metrics.notes)

    found = diagnose(run)
    assert found.kind == "ok" and found.headline.startswith(PARTIAL)
    assert found.primary.code == "partial-record" and found.primary.where.rank == 1
    assert any("events-rank1.jsonl" in text for text in found.primary.evidence["problems"])
    assert find_run(SPEC, tmp_path) is None  # a partial record is not reused as the job's result


def test_lines_missing_at_a_line_end_are_counted_against_the_ranks_record(tmp_path):
    rd = _record(tmp_path)
    lines = _lines(rd.progress_file(0))
    rd.progress_file(0).write_bytes(b"".join(lines[:1]))  # two whole steps gone: nothing is cut mid-line
    rd.events(1).unlink()
    run = Run.load(rd.path)
    problems = {p.file: p for p in run.record_problems}
    assert problems["progress-rank0.jsonl"].kind == "missing"
    assert (problems["progress-rank0.jsonl"].found, problems["progress-rank0.jsonl"].expected) == (1, 3)
    assert "1 of the 3 steps" in str(problems["progress-rank0.jsonl"])
    assert problems["events-rank1.jsonl"].kind == "missing" and "is gone" in str(problems["events-rank1.jsonl"])
    assert run.losses == [3.0]
    assert "partial-record" in diagnose(run).codes


def test_a_run_without_results_reports_a_cut_last_line(tmp_path):
    """No result, no count: a line cut mid-write at the end of a run that ended is still named."""
    rd = _record(tmp_path, state="failed", results=False)
    text = rd.progress_file(1).read_bytes()
    rd.progress_file(1).write_bytes(text + b'{"step": 3, "lo')
    run = Run.load(rd.path)
    [problem] = run.record_problems
    assert (problem.kind, problem.rank, problem.expected, problem.found) == ("truncated", 1, None, 3)
    assert len(run.progress(1)) == 3
    found = diagnose(run)
    assert found.kind == "failed" and found.primary.code != "partial-record"
    assert found.find("partial-record") is not None


def test_a_running_run_skips_the_line_being_written_silently(tmp_path):
    rd = _record(tmp_path, state="running", results=False, launcher_pid=os.getpid())
    rd.progress_file(0).write_bytes(rd.progress_file(0).read_bytes() + b'{"step": 3, "loss": 2.')
    run = Run.load(rd.path)
    assert run.state == "running" and run.record_problems == ()
    assert len(run.progress(0)) == 3 and len(run.losses) == 3


# --- (b) a damaged line --------------------------------------------------------------------------------
def test_a_damaged_line_is_named_and_the_rest_of_the_run_is_read(tmp_path):
    rd = _record(tmp_path)
    lines = _lines(rd.events(0))
    lines[4] = b'{"stage": 0, \x00\x13\xff garbage \x8e}\n'  # line 5: not UTF-8, not JSON
    rd.events(0).write_bytes(b"".join(lines))
    progress = _lines(rd.progress_file(0))
    progress[1] = b'{"step": 1, "loss": 2.9, "sec#@!}\n'  # line 2: not JSON (ends with "}", as a line does)
    rd.progress_file(0).write_bytes(b"".join(progress))

    run = Run.load(rd.path)
    text = repr(run)  # displaying the run raised JSONDecodeError before
    assert PARTIAL in text and "damaged line(s) 5" in text
    assert run.losses == [3.0, 2.8]  # the damaged step is skipped, not misread
    assert len(run.timeline.events) == sum(len(_lines(rd.events(r))) for r in range(2)) - 1
    damaged = {p.file: p for p in run.record_problems}
    assert set(damaged) == {"events-rank0.jsonl", "progress-rank0.jsonl"}
    assert damaged["events-rank0.jsonl"].kind == "damaged" and damaged["events-rank0.jsonl"].lines == (5,)
    message = str(damaged["events-rank0.jsonl"])
    assert "line 5" in message and str(rd.events(0)) in message
    assert run.timeline.metrics().notes  # metrics() computes, with the note
    found = diagnose(run)
    assert found.primary.code == "partial-record"
    assert any("line 2" in text and "progress-rank0.jsonl" in text for text in found.primary.evidence["problems"])


def test_a_damaged_job_wide_line_is_reported_too(tmp_path):
    rd = _record(tmp_path)
    rd.file(RunDir.PARTITIONS).write_text('{"step": 1, "boundaries": [0, 3, 4], "reason": "forced"}\nnot json\n')
    run = Run.load(rd.path)
    assert run.partition_history == [(0, [0, 2, 4]), (1, [0, 3, 4])]
    [problem] = run.record_problems
    assert (problem.file, problem.rank, problem.lines) == ("partitions.jsonl", None, (2,))


# --- (c) "running" is the launcher's pid and start time -----------------------------------------------
def _status(rd: RunDir, **fields) -> None:
    rd.file(RunDir.STATUS).write_text(json.dumps({"state": "running", "started": 1.0, **fields}))


def test_the_launchers_start_time_is_recorded_with_its_pid(tmp_path):
    rd = _record(tmp_path, state="running", launcher_pid=os.getpid())
    assert rd.read_status()["launcher_created"] == process_created(os.getpid())
    assert Run.load(rd.path).state == "running"


def test_a_reused_launcher_pid_does_not_keep_a_run_running(tmp_path):
    rd = _record(tmp_path, state="running")
    me = psutil.Process()
    _status(rd, launcher_pid=me.pid, launcher_created=process_created(me.pid) - 3600)  # its pid, another process
    assert Run.load(rd.path).state == "incomplete"
    assert [r.state for r in list_runs(tmp_path)] == ["incomplete"]
    _status(rd, launcher_pid=me.pid)  # recorded before the start time was: judged by the pid, as before
    assert Run.load(rd.path).state == "running"


def test_a_zombie_launcher_does_not_keep_a_run_running(tmp_path):
    rd = _record(tmp_path, state="running")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        proc = psutil.Process(child.pid)
        created = process_created(child.pid)
        deadline = time.monotonic() + 30
        while proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:  # exited, not reaped
            time.sleep(0.05)
        assert proc.status() == psutil.STATUS_ZOMBIE
        assert not process_alive(child.pid, created=created) and not process_alive(child.pid)
        _status(rd, launcher_pid=child.pid, launcher_created=created)
        assert Run.load(rd.path).state == "incomplete"
        _status(rd, launcher_pid=child.pid)
        assert Run.load(rd.path).state == "incomplete"
    finally:
        child.wait()


def test_the_start_stamp_does_not_move_with_the_clock(monkeypatch):
    """psutil's create_time adds the boot time of /proc/stat, a whole second derived from the
    wall clock: after a clock adjustment a fresh rank read its notebook's create_time one
    second off and exited ("the process that launched this job is gone"), in a CI run.
    The stamp the launcher records and the ranks compare does not include it."""
    from psutil import _pslinux

    me = os.getpid()
    stamp, wall = process_created(me), psutil.Process(me).create_time()
    boot = wall - stamp
    monkeypatch.setattr(_pslinux, "boot_time", lambda: boot + 1)  # the clock was adjusted meanwhile
    assert psutil.Process(me).create_time() != wall  # the clock-derived figure moved by a second
    assert process_created(me) == stamp
    from utils.system.procs import same_process

    assert same_process(me, stamp) and not same_process(me, stamp + 1)
