"""`find_run` on hand-written run records (no jobs): which record it reuses, which it skips."""

from __future__ import annotations

import json

import pytest

from utils import JobSpec, Run, find_run
import utils.jobs.runs as runs_module

SPEC = JobSpec(num_stages=2, micro_batches=4, steps=3, name="reuse-me")


def record(root, name: str, spec: JobSpec | dict | str, state: str = "succeeded"):
    """A run directory as the launcher leaves it, minus the rank files `find_run` never reads."""
    path = root / name
    path.mkdir(parents=True)
    text = spec.to_json() if isinstance(spec, JobSpec) else spec if isinstance(spec, str) else json.dumps(spec)
    (path / "spec.json").write_text(text, encoding="utf-8")
    (path / "status.json").write_text(json.dumps({"state": state, "started": 1.0, "finished": 2.0}),
                                      encoding="utf-8")
    return path


def test_the_newest_successful_run_with_the_same_spec_is_found(tmp_path):
    record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC)
    newest_ok = record(tmp_path, "20260101-110000-reuse-me-bbbbbb", SPEC)
    record(tmp_path, "20260101-120000-reuse-me-cccccc", SPEC, state="failed")
    record(tmp_path, "20260101-130000-reuse-me-dddddd", SPEC, state="stopped")
    record(tmp_path, "20260101-140000-other-eeeeee", JobSpec(num_stages=2, micro_batches=8, steps=3,
                                                             name="reuse-me"))
    found = find_run(SPEC, tmp_path)
    assert isinstance(found, Run) and found.path == newest_ok and found.ok and found.spec == SPEC


def test_no_match_gives_none(tmp_path):
    record(tmp_path, "20260101-100000-x-aaaaaa", SPEC, state="failed")
    record(tmp_path, "20260101-110000-x-bbbbbb", JobSpec(num_stages=2, micro_batches=4, steps=4,
                                                         name="reuse-me"))
    assert find_run(SPEC, tmp_path) is None
    assert find_run(SPEC, tmp_path / "not-there") is None


def test_unreadable_and_old_records_are_skipped(tmp_path):
    good = record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC)
    record(tmp_path, "20260101-110000-half-bbbbbb", '{"model": "gp')               # half written
    record(tmp_path, "20260101-120000-old-cccccc", {**SPEC.to_dict(), "pipeline": 2})  # unknown field
    record(tmp_path, "20260101-130000-list-dddddd", "[1, 2]")                        # not a spec at all
    (tmp_path / "20260101-140000-no-spec-eeeeee").mkdir()                           # no spec.json
    (tmp_path / "notes.txt").write_text("not a run directory", encoding="utf-8")
    assert find_run(SPEC, tmp_path).path == good


def test_a_running_run_whose_launcher_is_gone_is_not_reused(tmp_path):
    path = record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC)
    (path / "status.json").write_text(json.dumps({"state": "running", "launcher_pid": 2**22 + 12345}),
                                      encoding="utf-8")
    assert find_run(SPEC, tmp_path) is None


def test_only_the_matching_record_is_loaded(tmp_path, monkeypatch):
    for i in range(20):
        record(tmp_path, f"20260101-1000{i:02d}-other-{i:06d}",
               JobSpec(num_stages=2, micro_batches=4, steps=3, name=f"other-{i}"))
    match = record(tmp_path, "20260101-090000-reuse-me-aaaaaa", SPEC)  # the oldest of all
    loaded = []
    real_load = Run.load.__func__

    def counting_load(cls, path):
        loaded.append(path)
        return real_load(cls, path)

    monkeypatch.setattr(Run, "load", classmethod(counting_load))
    assert find_run(SPEC, tmp_path).path == match
    assert loaded == [match]


def test_default_directory_is_runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_RUNS", str(tmp_path))
    path = record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC)
    assert runs_module.runs_dir() == tmp_path
    assert find_run(SPEC).path == path


@pytest.mark.parametrize("state", ["failed", "timeout", "stopped", "incomplete"])
def test_every_unsuccessful_final_state_is_skipped(tmp_path, state):
    record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC, state=state)
    assert find_run(SPEC, tmp_path) is None


def test_a_spec_with_tuple_boundaries_finds_its_run(tmp_path):
    # Before, spec.json held a list and the notebook's spec a tuple: never equal, never reused.
    spec = JobSpec(num_stages=2, partition=(0, 3, 8), name="tuple")
    path = record(tmp_path, "20260101-100000-tuple-aaaaaa", spec)
    assert json.loads((path / "spec.json").read_text())["partition"] == [0, 3, 8]
    assert find_run(spec, tmp_path).path == path
    assert find_run(JobSpec(num_stages=2, partition=[0, 3, 8], name="tuple"), tmp_path).path == path


def _with_rank_records(path, parts=(0, 4, 8)):
    """The rank files a finished 2-stage job leaves: one event each and a result."""
    for rank in range(2):
        event = {"stage": rank, "rank": rank, "step": 0, "kind": "forward", "micro_batch": 0,
                 "start": 0.1 * rank, "end": 0.1 * rank + 0.05}
        (path / f"events-rank{rank}.jsonl").write_text(json.dumps(event) + "\n")
        (path / f"result-rank{rank}.json").write_text(json.dumps({
            "rank": rank, "stage": rank, "replica": 0, "parts": list(parts), "peak_memory_bytes": 1,
            "memory_kind": "cpu_max_rss", "device": "cpu"}))


@pytest.mark.parametrize("partition_file", [None, "{not json", '["a list"]', '{"partition": 3}'])
def test_a_missing_or_corrupt_plan_reads_as_unknown(tmp_path, partition_file):
    # Before, Run.parts and Run.timeline raised TypeError here (None["parts"]).
    path = record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC)
    if partition_file is not None:
        (path / "plan.json").write_text(partition_file)
    run = Run.load(path)
    assert run.parts is None and run.partition_method is None and run.predicted_stage_costs is None
    assert len(run.timeline.events) == 0 and run.timeline.meta["parts"] is None
    _with_rank_records(path)
    run = Run.load(path)  # the ranks' own record of what they ran fills the gap
    assert run.parts == [0, 4, 8] and run.timeline.meta["parts"] == [0, 4, 8]
    assert len(run.timeline.events) == 2


def test_partition_history(tmp_path):
    from utils.jobs.rundir import PartitionChange, RunDir

    path = record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC)
    run_dir = RunDir(path)
    run_dir.write_plan({"device": "cpu", "partition": {"parts": [0, 4, 8], "method": "parameters",
                                                       "predicted_stage_costs": None}})
    run_dir.record_partition_change(PartitionChange(step=2, boundaries=(0, 5, 8), reason="forced"))
    run = Run.load(path)
    assert [(c.step, c.boundaries) for c in run.partitions] == [(0, (0, 4, 8)), (2, (0, 5, 8))]
    assert run.parts == [0, 4, 8]  # what it started with
    assert [run.parts_at(s) for s in range(4)] == [[0, 4, 8], [0, 4, 8], [0, 5, 8], [0, 5, 8]]
    assert run.timeline.meta["partitions"] == [(0, [0, 4, 8]), (2, [0, 5, 8])]


def test_a_spec_spelling_out_the_preset_defaults_finds_its_run(tmp_path):
    path = record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC)
    spelled_out = JobSpec(num_stages=2, micro_batches=4, steps=3, name="reuse-me",
                          model_options={"blocks": 6})  # gpt's default: the same job
    assert find_run(spelled_out, tmp_path).path == path
    assert find_run(JobSpec(num_stages=2, micro_batches=4, steps=3, name="reuse-me",
                            model_options={"blocks": 5}), tmp_path) is None


def test_a_folder_renamed_by_hand_is_placed_by_its_age(tmp_path):
    import os

    older = record(tmp_path, "best-run", SPEC)
    os.utime(older, (1e9, 1e9))  # 2001: older than any launcher-named run
    newest = record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC)
    # Before, "best-run" sorted after every "2026..." name and was taken as the newest.
    assert find_run(SPEC, tmp_path).path == newest


def test_one_bad_record_does_not_break_list_runs(tmp_path):
    good = record(tmp_path, "20260101-100000-reuse-me-aaaaaa", SPEC)
    cut = record(tmp_path, "20260101-110000-cut-bbbbbb", '{"model": "gp')
    other_version = record(tmp_path, "20260101-120000-old-cccccc", {**SPEC.to_dict(), "pipeline": 2})
    (tmp_path / "20260101-130000-no-spec-dddddd").mkdir()  # not a run directory: no warning
    with pytest.warns(UserWarning) as warned:
        runs = runs_module.list_runs(tmp_path)
    assert [r.path for r in runs] == [good]
    messages = [str(w.message) for w in warned]
    assert len(messages) == 2 and str(cut) in messages[0] and str(other_version) in messages[1]
    with pytest.raises(FileNotFoundError, match="spec.json is not valid JSON"):
        Run.load(cut)
    with pytest.raises(ValueError, match=r"cannot be read by this version .*unknown JobSpec field\(s\) \['pipeline'\]"):
        Run.load(other_version)


def test_batches_change_length_and_resume_where_they_were():
    """A curriculum shortens samples between steps; a restart resumes the stream exactly."""
    from utils.workloads.models import batches, get_model

    model = get_model("gpt", {"seq_len": 16, "vocab": 64})
    stream = batches(model, seed=3, micro_batch_size=2)
    assert next(stream)[0].shape == (2, 16)
    stream.tokens = 4
    inputs, labels = next(stream)
    assert inputs.shape == labels.shape == (2, 4)
    saved = stream.state()
    expected = [next(stream)[0] for _ in range(3)]
    again = batches(model, seed=3, micro_batch_size=2)
    again.restore(saved)
    assert all((next(again)[0] == e).all() for e in expected)
