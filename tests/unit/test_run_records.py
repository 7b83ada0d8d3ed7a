"""The run records of `utils.jobs.records`: each written by one type and read back by it, field by
field; a damaged record reads as None, not an exception; and no module of `utils` reads one back
from the words a message shows (a regex on a status slot's text or on the launcher's sentences)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from utils.jobs.records import (MEMORY_KINDS, STATUS_BYTES, Failure, HungRank, MemoryRecord, RankEnd, RankResult,
                                SlotStatus, StatusSlot)
from utils.jobs.rundir import RunDir
from utils.runtime.memory import MemoryMeter

ROOT = Path(__file__).resolve().parents[2]


# --- the status slot ---------------------------------------------------------------------------------
def test_a_status_written_is_read_back_field_by_field(tmp_path):
    path = tmp_path / "status-rank0"
    slot = StatusSlot(path)
    assert StatusSlot.read(path) is None                      # created empty: the rank has not trained yet
    slot.write(step=3, doing="recv_grad", micro_batch=7, chunk=1)
    status = StatusSlot.read(path)
    assert (status.step, status.doing, status.micro_batch, status.chunk, status.detail, status.untraced) == \
        (3, "recv_grad", 7, 1, "", False)
    # timing-claim: construction — age() is arithmetic on the stamp it is handed, no clock is read
    assert status.time is not None and abs(status.age(status.time + 2.5) - 2.5) < 1e-9
    assert status.describe() == "step=3 recv_grad mb=7 chunk=1"
    slot.write(step=2, doing="repartition", detail="building the new engine")   # a shorter status over a longer one
    assert StatusSlot.read(path).describe() == "step=2 repartition: building the new engine"
    slot.write(step=1, doing="CommitP2P", untraced=True)
    assert StatusSlot.read(path).describe() == "step=1 CommitP2P (untraced)"
    slot.write(step=None, doing="restart", detail="x not saved")
    assert StatusSlot.read(path).describe() == "restart: x not saved"
    assert path.stat().st_size == STATUS_BYTES


def test_a_long_detail_is_cut_to_fit_the_slot(tmp_path):
    path = tmp_path / "status-rank1"
    StatusSlot(path).write(step=12345, doing="restart", micro_batch=None, detail="cannot write /" + "very/long/" * 60)
    status = StatusSlot.read(path)
    assert status is not None and status.doing == "restart" and status.detail.endswith("…")
    assert len(StatusSlot.encode(status)) == STATUS_BYTES


@pytest.mark.parametrize("data", [b"", b" " * STATUS_BYTES, b'{"step":1,"doing":"forw', b"\xff\xfe garbage",
                                  b"step=1 recv_grad mb=0 t=1796074413.216", b'["a", "list"]', b'{"step": 1}',
                                  b'{"doing": 3}'])
def test_a_truncated_or_garbage_slot_reads_as_none(tmp_path, data):
    path = tmp_path / "status-rank0"
    path.write_bytes(data.ljust(STATUS_BYTES))
    assert StatusSlot.read(path) is None
    assert StatusSlot.read(tmp_path / "missing") is None


# --- memory ------------------------------------------------------------------------------------------
def test_the_memory_record_round_trips_and_knows_one_vocabulary():
    row = MemoryRecord(kind="cpu_malloc_in_use", peak=900, step=4, base=100, after=(300, 900, 200))
    assert MemoryRecord.from_dict(json.loads(json.dumps(row.to_dict()))) == row
    assert row.added == 800
    peak = MemoryRecord(kind="cpu_max_rss", peak=5)
    assert peak.to_dict() == {"kind": "cpu_max_rss", "peak": 5} and MemoryRecord.from_dict(peak.to_dict()) == peak
    with pytest.raises(ValueError, match="unknown memory kind"):
        MemoryRecord(kind="rss", peak=1)
    assert MemoryRecord.from_dict({"kind": "rss", "peak": 1}) is None
    assert MemoryRecord.from_dict("garbage") is None
    meter = MemoryMeter("cpu")                                  # the writer's kinds are in the vocabulary
    assert meter.kind in MEMORY_KINDS and "cuda_memory_allocated" in MEMORY_KINDS


def test_the_memory_meter_writes_a_memory_record():
    meter = MemoryMeter("cpu")
    if meter.kind == "unavailable":
        pytest.skip("no mallinfo2 here")
    meter.begin_step()
    meter.sample()
    row = meter.end_step(2)
    assert MemoryRecord.from_dict(row).to_dict() == row and row["step"] == 2


# --- a rank's result -----------------------------------------------------------------------------------
def test_the_result_round_trips(tmp_path):
    result = RankResult(rank=3, stage=1, replica=1, device="cpu", parts=(0, 2, 4), layers=(2, 4),
                        peak_memory=MemoryRecord(kind="cpu_max_rss", peak=123), threads=2,
                        layer_fingerprints={"2": [1.0, 2.0]}, record_lines={"events": 10, "progress": 3},
                        comms={"all_reduce": {}})
    rd = RunDir(tmp_path)
    rd.write_result(result)
    assert rd.result(3) == result
    assert RankResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_the_result_reads_an_old_style_dict(tmp_path):
    old = {"rank": 1, "stage": 1, "replica": 0, "parts": [0, 4, 8], "layers": [4, 8], "peak_memory_bytes": 77,
           "memory_kind": "cpu_max_rss", "device": "cpu", "threads": 2, "layer_fingerprints": {},
           "record_lines": {"events": 5}, "future_key": "kept"}
    (tmp_path / "result-rank1.json").write_text(json.dumps(old))
    result = RunDir(tmp_path).result(1)
    assert result.peak_memory == MemoryRecord(kind="cpu_max_rss", peak=77)
    assert (result.parts, result.layers, result.record_lines) == ((0, 4, 8), (4, 8), {"events": 5})
    assert result.extra == {"future_key": "kept"} and result.to_dict()["future_key"] == "kept"
    (tmp_path / "result-rank2.json").write_text("{cut sh")
    assert RunDir(tmp_path).result(2) is None and RankResult.from_dict({"stage": 0}) is None


# --- the watch's facts ------------------------------------------------------------------------------------
def test_the_failure_facts_round_trip_through_status_json(tmp_path):
    hung = HungRank(rank=1, stage=1, status=SlotStatus(step=1, doing="backward", micro_batch=0, time=9.5),
                    steps_done=1, process_state="stopped", stacks="stacks-rank1.txt")
    facts = Failure(kind="hang", ranks=(HungRank(rank=0, stage=0, status=None), hung), frozen=(1,), time=10.0)
    rd = RunDir(tmp_path)
    rd.write_status(state="timeout", error="words for people", started=0.0, finished=10.0, failure=facts)
    assert rd.failure() == facts and facts.stopped_ranks == [1]
    died = Failure(kind="died", rank=2, stage=1, died=RankEnd(rank=2, stage=1, exit_code=-9, signal="SIGKILL"),
                   also=(0, 1))
    rd.write_status(state="failed", error="words", failure=died)
    assert rd.failure() == died and died.died.how == "was killed by SIGKILL (exit code -9)"
    assert RankEnd(rank=0, stage=0, exit_code=3).how == "died with exit code 3" and RankEnd(0, 0).how == "died"
    rd.write_status(state="failed", error="recorded before the facts")
    assert rd.failure() is None
    assert Failure.from_dict({"kind": "hang", "ranks": "garbage", "also": 3}) == Failure(kind="hang")


# --- no reading records back from their words -------------------------------------------------------------
_REGEX_CALLS = {"compile", "search", "match", "fullmatch", "sub", "subn", "findall", "finditer", "split"}
_STRING_READS = {"split", "rsplit", "partition", "rpartition", "startswith", "endswith", "index", "find"}
_MARKERS = ("step=", "t=", "mb=", "died", "killed by", "exit code", "are stopped", "too slow", "(stage")


def _stray_readers(root: Path = ROOT) -> list[str]:
    """Calls in `utils` that read a status slot's text or the watch's sentences back: a regex whose
    pattern, or a string method whose argument, holds one of their words."""
    found = []
    for path in sorted((root / "utils").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            func = node.func
            regex = func.attr in _REGEX_CALLS and isinstance(func.value, ast.Name) and func.value.id == "re"
            if not (regex or func.attr in _STRING_READS):
                continue
            texts = [a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            hits = [m for t in texts for m in _MARKERS if m in t]
            if hits:
                found.append(f"{rel}:{node.lineno} {'re.' if regex else '.'}{func.attr}({texts[0]!r})")
    return found


def test_no_module_reads_a_status_or_the_watchs_sentences_back_from_text():
    assert _stray_readers() == []


def test_the_stray_reader_check_would_find_the_old_ones(tmp_path):
    old = tmp_path / "utils" / "old.py"
    old.parent.mkdir()
    old.write_text('import re\n_DIED = re.compile(r"rank (\\d+) \\(stage (\\d+)\\) died with exit code")\n'
                   'def doing(s):\n    return s.rsplit(" t=", 1)[0]\n')
    assert len(_stray_readers(tmp_path)) == 2
