"""`utils.diagnose`'s parts without processes: the known-error patterns against texts recorded
from real DeepSpeed jobs (tests/data/deepspeed_errors.json, see tests/integration/record_errors.py),
stack dumps, status slots and wait-for chains, and the straggler / imbalance / bubble / memory
rules on hand-built timelines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import SMALL_GPT, schedule_events
from utils import Fault, JobSpec
from utils.analysis.diagnosis import Diagnosis, Symptom, Where
from utils.analysis.slowness import STRAGGLER_FACTOR, performance_symptoms, rank_costs
from utils.jobs.diagnose import _chains, diagnose, waits_for
from utils.jobs.errors import PATTERNS, engine_instruction_of, explain
from utils.jobs.records import Failure, RankEnd, SlotStatus, StatusSlot
from utils.jobs.rundir import RunDir
from utils.jobs.stacks import engine_instruction, main_stack, parse_stacks, short_path, stack_summary
from utils.timeline import Timeline

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "data" / "deepspeed_errors.json").read_text())
CONSEQUENCES = {p.code: p.consequence for p in PATTERNS}


def _text(error: dict) -> str:
    return f"{error['type']}: {error['message']}\n{error['traceback']}"


# --- known errors, on the texts real jobs produced ----------------------------------------------------
@pytest.mark.parametrize("case", sorted(RECORDED))
def test_each_recorded_error_is_explained(case):
    record = RECORDED[case]
    if CONSEQUENCES[record["expected"]]:  # a timeout: the ranks that raised are the victims, the cause raised nothing
        explained = [explain(_text(e)) for e in record["errors"]]
        assert explained and all(x is not None and x.code == record["expected"] for x in explained), (case, explained)
        return
    texts = [_text(e) for e in record["errors"]] + list(record.get("logs", {}).values())
    explanations = [x for x in map(explain, texts) if x is not None]
    causes = [x for x in explanations if not x.consequence]
    assert causes, f"{case}: no pattern explains {texts}"
    assert causes[0].code == record["expected"], (case, causes[0])
    assert causes[0].cause and causes[0].fix and "{" not in causes[0].cause + causes[0].fix


def test_the_recorded_cases_cover_every_mistake_of_chapter_25():
    codes = {record["expected"] for record in RECORDED.values()}
    assert {"batch-arithmetic", "empty-stage", "tensor-mismatch", "dtype-mismatch", "loss-not-scalar",
            "scalar-between-stages", "non-tensor-output", "received-activation-without-grad", "tied-weight-attr",
            "tied-forward", "out-of-memory", "zero-with-pipeline", "injected-fault"} <= codes


def test_explanations_carry_the_numbers_of_the_message():
    x = explain("AssertionError: Check batch related parameters. train_batch_size is not equal to "
                "micro_batch_per_gpu * gradient_acc_step * world_size 12 != 2 * 4 * 1")
    assert x.code == "batch-arithmetic" and "12 ≠ 2 × 4 × 1" in x.cause and "train_batch_size=2×4×1" in x.fix
    gloo = explain("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
                   "pair.cc:456] op.preamble.length <= op.nbytes. 16384 vs 8192. Received data size doesn't match")
    assert gloo.code == "tensor-mismatch" and "16384 bytes" in gloo.cause and "8192 bytes" in gloo.cause
    assert explain("RuntimeError: something nobody has seen") is None


def test_a_lost_neighbour_is_a_consequence_not_a_cause():
    for text in ("RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:10659.",
                 "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:48527: Connection reset by peer."):
        assert explain(text).code == "peer-lost" and explain(text).consequence
    assert not explain("RuntimeError: injected fault: stage 1 fails at step 1 in forward").consequence
    assert len({p.code for p in PATTERNS}) == len(PATTERNS)


@pytest.mark.parametrize("text", [
    # torch's own NCCL messages (libtorch_cuda.so of torch 2.11+cu130), as a rank's error would carry them
    "DistBackendError: NCCL error in: ...\nncclRemoteError: A call failed possibly due to a network error or a remote "
    "process exiting prematurely.",
    "DistBackendError: NCCL communicator was aborted on rank 1.",
])
def test_a_neighbour_lost_on_nccl_is_a_consequence_too(text):
    explanation = explain(text)
    assert explanation is not None and explanation.code == "peer-lost" and explanation.consequence


def test_the_instruction_comes_from_the_traceback():
    unused = next(e for e in RECORDED["unused_float"]["errors"] if "send_grads" in e["traceback"])
    assert engine_instruction_of(unused["traceback"]) == "send_grad"
    batch = RECORDED["batch"]["errors"][0]
    assert engine_instruction_of(batch["traceback"]) == "setup"
    assert engine_instruction_of("no frames") is None


# --- stacks ----------------------------------------------------------------------------------------
DUMP = '''Thread 0x00007fdbb25806c0 (most recent call first):
  File "/work/main/utils/runtime/lifecycle.py", line 65 in watch
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007fdbd1e68b80 (most recent call first):
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2799 in recv
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/work/main/.venv/lib/python3.11/site-packages/deepspeed/comm/torch.py", line 477 in recv
  File "/work/main/.venv/lib/python3.11/site-packages/deepspeed/runtime/pipe/p2p.py", line 81 in recv
  File "/work/main/.venv/lib/python3.11/site-packages/deepspeed/runtime/pipe/engine.py", line 1209 in _exec_recv_grads
  File "/work/main/utils/runtime/tracing.py", line 125 in traced
  File "/work/main/utils/runtime/rank.py", line 442 in <module>
  File "<frozen runpy>", line 198 in _run_module_as_main
'''


def test_a_faulthandler_dump_is_read_into_the_training_thread():
    threads = parse_stacks(DUMP)
    assert [len(t.frames) for t in threads] == [2, 8] and threads[1].current
    main = main_stack(threads)
    assert main is threads[1] and engine_instruction(main.frames) == "recv_grad"
    summary = stack_summary(main.frames)
    assert summary.startswith("torch/distributed/distributed_c10d.py:2799 recv ← deepspeed/comm/torch.py:477 recv")
    assert "wrapper" not in summary and summary.endswith("(in DeepSpeed's recv_grad)")
    # A rank asked twice appends a second dump: the last one counts.
    second = DUMP.replace("line 2799 in recv", "line 1 in later")
    assert parse_stacks(DUMP + "\n" + second)[1].frames[0].line == 1
    assert parse_stacks("") == [] and main_stack([]) is None and stack_summary(()) == "no Python stack"
    assert short_path("/x/site-packages/deepspeed/a.py") == "deepspeed/a.py"


# --- status slots and wait-for chains --------------------------------------------------------------
def _slot(rd: RunDir, rank: int, step: int, doing: str, mb: int | None, t: float) -> None:
    """A status slot as the tracer leaves it, stamped at `t`."""
    rd.status_slot(rank).write_bytes(StatusSlot.encode(SlotStatus(step=step, doing=doing, micro_batch=mb, time=t)))


def test_who_waits_for_whom_in_a_pp_by_dp_grid():
    grid = {"num_stages": 3, "data_parallel": 2}  # rank = stage * 2 + replica
    assert waits_for(2, "recv_act", **grid) == [0] and waits_for(3, "recv_act", **grid) == [1]
    assert waits_for(2, "recv_grad", **grid) == [4] and waits_for(5, "send_grad", **grid) == [3]
    assert waits_for(0, "recv_act", **grid) == [] and waits_for(4, "send_act", **grid) == []
    assert waits_for(3, "reduce_grads", **grid) == [2]
    assert waits_for(3, "forward", **grid) == []
    assert waits_for(3, "optimizer_step", in_collective=True, **grid) == [0, 1, 2, 4, 5]


def _state(waits: dict[int, list[int]], instructions: dict[int, str]) -> dict[int, dict]:
    return {r: {"waits": w, "instruction": instructions[r], "done": False} for r, w in waits.items()}


def test_chains_end_at_the_rank_that_holds_everybody_up():
    # 4 stages: 0 and 1 wait for gradients, 3 waits for an activation, 2 is stuck in a forward.
    state = _state({0: [1], 1: [2], 2: [], 3: [2]},
                   {0: "recv_grad", 1: "recv_grad", 2: "forward", 3: "recv_act"})
    chains, culprits, cycle = _chains(state)
    assert culprits == [2] and cycle == []
    assert chains == ["rank 0 (recv_grad) → rank 1 (recv_grad) → rank 2 (forward)", "rank 3 (recv_act) → rank 2 (forward)"]


def test_a_cycle_of_waits_is_a_deadlock():
    state = _state({0: [1], 1: [0]}, {0: "recv_act", 1: "recv_grad"})
    chains, culprits, cycle = _chains(state)
    assert culprits == [] and sorted(cycle) == [0, 1]


# --- a successful run: stragglers, imbalance, bubble, memory -----------------------------------------
def _grid_timeline(p: int, m: int, dp: int, *, slow: dict[int, float] | None = None, steps: int = 3,
                   f: float = 1.0, b: float = 2.0, **meta) -> Timeline:
    """`steps` steps of 1F1B on a p × dp grid; `slow` maps a rank to its slowdown."""
    slow = slow or {}
    events = []
    for step in range(steps):
        for replica in range(dp):
            def rank_of(s, replica=replica):
                return s * dp + replica
            fwd = [f * slow.get(rank_of(s), 1.0) for s in range(p)]
            bwd = [b * slow.get(rank_of(s), 1.0) for s in range(p)]
            events += schedule_events(p, m, f=fwd, b=bwd, step=step, offset=step * 1000.0, rank_of=rank_of)
    return Timeline(events=tuple(events), num_stages=p, num_micro_batches=m, data_parallel=dp, meta=meta)


def test_one_slow_rank_among_four_is_named_by_its_replicas():
    tl = _grid_timeline(2, 4, 2, slow={3: 3.0})
    costs = rank_costs(tl)
    assert costs[3]["forward"] == pytest.approx(3.0) and costs[2]["backward"] == pytest.approx(2.0)
    found = performance_symptoms(tl)
    straggler = found[0]
    assert straggler.code == "straggler" and straggler.where.rank == 3 and straggler.where.stage == 1
    assert straggler.evidence["slowdown"] == pytest.approx(3.0) and straggler.evidence["slow_from_step"] == 0
    assert [s.where.rank for s in found if s.code == "straggler"] == [3]


def test_the_slowest_straggler_comes_first():
    """Before, stragglers came in stage order: a mildly slower rank of stage 0 was the run's
    primary finding ahead of a rank four times as slow in stage 1."""
    tl = _grid_timeline(2, 4, 2, slow={1: 1.6, 3: 4.0})
    found = [s for s in performance_symptoms(tl) if s.code == "straggler"]
    assert [(s.where.rank, s.evidence["slowdown"]) for s in found] == [(3, pytest.approx(4.0)), (1, pytest.approx(1.6))]
    assert performance_symptoms(tl)[0].where.rank == 3  # the primary finding


def test_stages_running_the_same_layers_are_peers_without_replicas():
    tl = _grid_timeline(4, 8, 1, slow={2: 3.0})
    layers = [("Embedding",), ("Block",), ("Block",), ("LMHead",)]
    found = performance_symptoms(tl, stage_layers=layers)
    straggler = found[0]
    assert straggler.code == "straggler" and (straggler.where.rank, straggler.where.stage) == (2, 2)
    assert "same layers (stages [1, 2])" in straggler.what
    assert "straggler" not in [s.code for s in performance_symptoms(tl)]  # without: only an imbalance


def test_a_straggler_from_a_later_step_says_when_it_started():
    tl = _grid_timeline(2, 4, 2, steps=1)
    late = _grid_timeline(2, 4, 2, slow={1: 2.5}, steps=3)
    events = tl.events + tuple(e for e in late.events if e.step > 0)
    found = performance_symptoms(Timeline(events=events, num_stages=2, num_micro_batches=4, data_parallel=2))
    assert found[0].where.rank == 1 and found[0].where.step == 1


def test_a_slow_stage_without_replicas_is_named_against_the_prediction():
    tl = _grid_timeline(4, 8, 1, slow={2: 2.0})
    found = performance_symptoms(tl, predicted_stage_costs=[0.003] * 4)  # any scale: ratios are relative
    straggler = next(s for s in found if s.code == "straggler")
    assert straggler.where.stage == 2 and straggler.where.rank == 2
    imbalance = next(s for s in found if s.code == "imbalance")
    assert imbalance.where.stage == 2 and "slow" in imbalance.cause
    # Predicted heavy: the same timeline is an imbalance of the partition, not a slow rank.
    found = performance_symptoms(tl, predicted_stage_costs=[3.0, 3.0, 6.0, 3.0])
    assert "straggler" not in [s.code for s in found]
    imbalance = next(s for s in found if s.code == "imbalance")
    assert imbalance.where.stage == 2 and "more work" in imbalance.cause and "partition" in imbalance.fix
    assert imbalance.evidence["imbalance"] == pytest.approx(6 * 8 / ((3 * 3 * 8 + 6 * 8) / 4), rel=0.01)


def test_noise_below_the_factor_is_no_straggler():
    tl = _grid_timeline(2, 4, 2, slow={3: STRAGGLER_FACTOR * 0.9})
    assert "straggler" not in [s.code for s in performance_symptoms(tl)]


def test_a_balanced_pipeline_has_a_fill_and_drain_bubble_only():
    tl = _grid_timeline(4, 4, 1)
    found = performance_symptoms(tl)
    assert [s.code for s in found] == ["bubble"]
    bubble = found[0]
    assert bubble.evidence["bubble_ratio"] == pytest.approx(3 / 7, abs=1e-3)
    assert bubble.evidence["fill_and_drain"] == pytest.approx(3 / 7, abs=1e-3)
    assert bubble.evidence["imbalance"] == pytest.approx(0.0) and bubble.evidence["other"] == pytest.approx(0.0)
    assert "fill and drain" in bubble.what and "m ≥ 4p = 16" in bubble.fix


def test_waiting_for_a_slow_stage_is_told_from_fill_and_drain():
    tl = _grid_timeline(2, 16, 1, slow={1: 3.0})
    bubble = next(s for s in performance_symptoms(tl) if s.code == "bubble")
    # timing-claim: construction — a timeline the test built (stage 1 three times slower), no clock read
    assert bubble.evidence["imbalance"] > bubble.evidence["fill_and_drain"] == pytest.approx(1 / 17, abs=1e-3)
    assert bubble.where.stage == 1 and "waits for stage 1" in bubble.cause


def test_idle_time_the_stage_costs_do_not_explain_is_named():
    events = []
    for e in schedule_events(2, 8, f=1.0, b=2.0):  # every compute on stage 1 spaced out by a 2 s gap
        events.append(e if e.stage == 0 else type(e)(**{**{k: getattr(e, k) for k in e.__slots__},
                                                       "start": e.start * 2, "end": e.start * 2 + (e.end - e.start)}))
    tl = Timeline(events=tuple(events), num_stages=2, num_micro_batches=8)
    bubble = next(s for s in performance_symptoms(tl) if s.code == "bubble")
    # timing-claim: construction — events the test crafted (2 s gaps on stage 1), no clock read
    assert bubble.evidence["other"] > max(bubble.evidence["fill_and_drain"], bubble.evidence["imbalance"])
    assert "do not explain" in bubble.what


def test_memory_names_the_stage_that_adds_most_and_why():
    tl = _grid_timeline(2, 4, 1, schedule="1f1b")
    memory = next(s for s in performance_symptoms(tl, step_memory={0: 8 * 2**20, 1: 2 * 2**20})
                  if s.code == "memory")
    assert memory.where.stage == 0 and memory.evidence["step_memory_mb"] == {0: 8.0, 1: 2.0}
    assert "p - s micro-batches" in memory.cause and memory.severity == "info"
    gpipe = next(s for s in performance_symptoms(_grid_timeline(2, 4, 1, schedule="gpipe"), step_memory={0: 1, 1: 2})
                 if s.code == "memory")
    assert gpipe.where.stage == 1 and "GPipe" in gpipe.cause


# --- the rank that did not fail: one finding, whichever way the race went ------------------------------
# Rank 1 raises an injected fault in step 1's forward while rank 0 waits in recv_grad for it. Rank 0
# either notices (its receive fails: a lost connection) or the agent stops it first (SIGTERM). The
# records each outcome leaves, as real jobs wrote them (tests/integration/test_diagnose_real.py):
_SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
forked_main FAILED
------------------------------------------------------------
Failures:
{others}------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_15:41:42
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 12552)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
_STOPPED_RANK_0 = """[1]:
  time      : 2026-12-03_15:41:42
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 12551)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 12551
"""
_TERMINATING = ("W1203 15:41:42.302000 12184 .venv/lib/python3.11/site-packages/torch/multiprocessing/spawn.py:165] "
                "Terminating process 12551 via signal SIGTERM\n")
OUTCOMES = {
    # rank 0 noticed first: its error record is a lost connection
    "noticed": dict(error=True, log=_TERMINATING + _SUMMARY.format(others="  <NO_OTHER_FAILURES>\n"),
                    how="lost-connection", told="its error record"),
    # stopped first, and the launcher's summary says so (torchrun's command: exit code -15)
    "stopped, per the report": dict(error=False, log=_SUMMARY.format(others=_STOPPED_RANK_0), how="stopped",
                                    told="the launcher's report: exit code -15"),
    # stopped first; the summary lists failures only (the warm agent), its log names the pid it stopped
    "stopped, per the log": dict(error=False, log=_TERMINATING + _SUMMARY.format(others="  <NO_OTHER_FAILURES>\n"),
                                 how="stopped", told="the launcher's log"),
    # stopped first, and no word of it anywhere: no error record, no result, no exit code of its own
    "no trace": dict(error=False, log=_SUMMARY.format(others="  <NO_OTHER_FAILURES>\n"), how="stopped",
                     told="no error record, no result and no exit code of its own"),
}


def _failed_run(path: Path, *, error: bool, log: str) -> RunDir:
    """The record of a 2-stage job whose rank 1 raised the injected fault first (at t=100)."""
    spec = JobSpec(**{**SMALL_GPT, "num_stages": 2, "micro_batches": 4, "steps": 3,
                      "fault": Fault(kind="raise", stage=1, step=1, instruction="forward")})
    rd = RunDir(path)
    rd.write_spec(spec.to_dict())
    fault = "injected fault: stage 1 fails at step 1 in forward"
    rd.write_status(state="failed", error=f"rank 1 (stage 1) raised RuntimeError: {fault}", started=90.0,
                    finished=101.0, command="", notes=[])
    rd.write_error(1, {"rank": 1, "stage": 1, "time": 100.0, "type": "RuntimeError", "message": fault,
                       "traceback": f'  File "utils/runtime/faults.py", line 90, in fail\nRuntimeError: {fault}\n'})
    if error:
        lost = "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:48803."
        rd.write_error(0, {"rank": 0, "stage": 0, "time": 100.05, "type": "RuntimeError", "message": lost,
                           "traceback": f"RuntimeError: {lost}\n"})
    for rank, (pid, doing, t) in enumerate([(12551, "recv_grad", 99.9), (12552, "forward", 100.0)]):
        rd.write_placement(rank, {"rank": rank, "node": 0, "host": "vm", "hostname": "vm", "local_rank": rank,
                                  "pid": pid})
        _slot(rd, rank, 1, doing, 0, t)
    rd.launcher_log().write_text(log)
    return rd


@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
def test_the_rank_that_lost_its_peer_is_one_finding_in_every_outcome(tmp_path, outcome):
    case = OUTCOMES[outcome]
    d = diagnose(_failed_run(tmp_path, error=case["error"], log=case["log"]).path)
    assert d.kind == "failed" and d.primary.code == "injected-fault" and d.primary.where.rank == 1, d
    lost = [f for f in d.findings if f.code == "peer-lost"]
    assert len(lost) == 1 and lost[0].evidence["ranks"] == [0], d
    assert lost[0].evidence["how"] == {0: case["how"]}
    assert lost[0].evidence["told_by"][0].startswith(case["told"]), lost[0].evidence
    assert lost[0].evidence["doing"] == {0: "step=1 recv_grad mb=0"}      # its status slot, without the stamp
    w = lost[0].where
    assert (w.rank, w.stage, w.instruction, w.step, w.micro_batch) == (0, 0, "recv_grad", 1, 0)
    assert lost[0].severity == "info" and "not a second problem" in lost[0].cause
    assert ("stopped by the launcher before it noticed" in lost[0].what) == (case["how"] == "stopped")


def test_a_rank_with_an_exit_code_of_its_own_is_no_consequence(tmp_path):
    # No error record, but the launcher reports an exit code that is not its SIGTERM: it died by
    # itself (a second problem), and the consequence finding does not claim it.
    own = _STOPPED_RANK_0.replace("exitcode  : -15", "exitcode  : -9")
    d = diagnose(_failed_run(tmp_path, error=False, log=_SUMMARY.format(others=own)).path)
    assert d.primary.where.rank == 1 and d.find("peer-lost") is None, d
    (tmp_path / "result-rank0.json").write_text("{}")                         # and a rank that finished is none
    d = diagnose(tmp_path)
    assert d.find("peer-lost") is None, d


def test_a_death_the_job_error_could_not_name_is_read_from_the_launchers_summary(tmp_path):
    # The watcher wrote the job's error before the agent's summary (a busy machine): "died", no
    # exit code. The summary the agent wrote afterwards names SIGKILL; the diagnosis reads it.
    killed = _SUMMARY.replace("exitcode  : 1 (pid: 12552)", "exitcode  : -9 (pid: 12552)")
    rd = _failed_run(tmp_path, error=True, log=killed.format(others="  <NO_OTHER_FAILURES>\n"))
    rd.error_file(1).unlink()
    rd.write_spec({**rd.read_spec(), "fault": {"kind": "killed", "stage": 1, "step": 1, "instruction": "forward"}})
    rd.write_status(state="failed", error="rank 1 (stage 1) died while in: step=1 forward mb=0, and no Python error",
                    started=90.0, finished=101.0, command="", notes=[],
                    failure=Failure(kind="died", rank=1, stage=1, died=RankEnd(rank=1, stage=1)))
    d = diagnose(tmp_path)
    assert d.primary.code == "killed" and d.primary.evidence["exit"] == "was killed by SIGKILL", d
    assert d.find("peer-lost").evidence["how"] == {0: "lost-connection"}


# --- the report -------------------------------------------------------------------------------------
def test_a_diagnosis_reads_as_text_markdown_and_json():
    finding = Symptom(code="straggler", what="rank 3 is a straggler", where=Where(rank=3, stage=1, step=0),
                      evidence={"slowdown": 3.01234, "ms": [1.0, 2.0]}, cause="a slow device", fix="move it",
                      severity="warning")
    d = Diagnosis(kind="ok", run="r1", headline="3 steps", findings=(finding,))
    text = str(d)
    assert "[straggler] rank 3 is a straggler" in text and "rank 3 · stage 1 · step 0" in text
    assert "slowdown = 3.01" in text and "fix:      move it" in text
    md = d._repr_markdown_()
    assert "`straggler`" in md and "*cause*: a slow device" in md
    assert json.loads(json.dumps(d.to_dict()))["findings"][0]["where"]["rank"] == 3
    assert d.primary is finding and d.codes == ["straggler"] and d.find("hang") is None
    assert str(Where()) == "the whole job"
    assert "nothing to report" in str(Diagnosis(kind="ok", run="r2", headline="fine"))


# --- NCCL: the host's view of a hang; the flight recorder ------------------------------------------
_SLEEPING = '''Current thread 0x00007fdbd1e68b80 (most recent call first):
  File "/work/main/utils/runtime/faults.py", line 96 in _strike
  File "/work/main/utils/runtime/tracing.py", line 125 in traced
  File "/work/main/.venv/lib/python3.11/site-packages/deepspeed/runtime/pipe/engine.py", line 1387 in _exec_schedule
  File "/work/main/utils/runtime/rank.py", line 442 in <module>
  File "<frozen runpy>", line 198 in _run_module_as_main
'''


def _hung_run(path: Path, device: str) -> RunDir:
    """The record of a 2-stage job stopped by its own timeout: rank 1 sleeps in backward (the injected
    hang), rank 0 waits in recv_grad; `device` as the plan decided it."""
    spec = JobSpec(**{**SMALL_GPT, "num_stages": 2, "micro_batches": 4, "steps": 3, "timeout": 30,
                      "fault": Fault(kind="hang", stage=1, step=1, instruction="backward")})
    path.mkdir()
    rd = RunDir(path)
    rd.write_spec(spec.to_dict())
    rd.write_plan({"device": device, "partition": {"parts": [0, 2, 4]}})
    rd.write_status(state="timeout", error="no progress within timeout=30 s; what each rank was doing when it "
                    "was stopped:", started=70.0, finished=101.0, command="", notes=[])
    for rank, (doing, t, dump) in enumerate([("recv_grad", 80.0, DUMP), ("backward", 79.9, _SLEEPING)]):
        _slot(rd, rank, 1, doing, 0, t)
        rd.stacks_file(rank).write_text(dump)
    return rd


def test_a_hang_on_nccl_says_the_host_view_is_an_upper_bound(tmp_path):
    from utils.jobs.stacks import FLIGHT_RECORDER_DIR, FLIGHT_RECORDER_PREFIX

    gloo = diagnose(_hung_run(tmp_path / "cpu", "cpu").path)
    assert gloo.kind == "hung" and gloo.find("nccl-host-view") is None           # gloo: the host waits where it says
    assert not any("upper bound" in f.cause for f in gloo.findings)
    rd = _hung_run(tmp_path / "cuda", "cuda")
    d = diagnose(rd.path)
    assert d.kind == "hung" and d.primary.code == "hang" and d.primary.where.rank == 1      # the same chain ...
    assert d.codes[1] == "nccl-host-view" and d.findings[1].severity == "warning"        # ... and right after it, why
    caveat = d.findings[1]
    assert "upper bound of where it waits" in caveat.what and "may name the wrong rank" in caveat.what
    assert "returns once it is enqueued" in caveat.cause and "TORCH_NCCL_BLOCKING_WAIT" in caveat.cause
    for tool in ("torchfrtrace", "NCCL_DEBUG=INFO", "TORCH_DISTRIBUTED_DEBUG=DETAIL", "py-spy dump --native"):
        assert tool in caveat.fix, tool
    for finding in d.findings:
        assert ("upper bound" in finding.cause) == (finding.code in ("hang", "waiting")), finding
    assert "no dump" in caveat.evidence["flight_recorder"]
    folder = rd.file(FLIGHT_RECORDER_DIR)
    folder.mkdir()
    for rank in (0, 1):
        (folder / f"{FLIGHT_RECORDER_PREFIX}{rank}").write_bytes(b"pickle")
    dumps = diagnose(rd.path).find("nccl-host-view").evidence["flight_recorder"]
    assert [Path(p).name for p in dumps] == ["nccl_trace_rank_0", "nccl_trace_rank_1"]


def test_a_failure_on_nccl_names_the_flight_recorder_dumps(tmp_path):
    from utils.jobs.stacks import FLIGHT_RECORDER_DIR

    rd = _failed_run(tmp_path, error=True, log=_SUMMARY.format(others="  <NO_OTHER_FAILURES>\n"))
    rd.write_plan({"device": "cuda", "partition": {"parts": [0, 2, 4]}})
    assert "flight_recorder" not in diagnose(rd.path).primary.evidence            # no dump: nothing to name
    rd.file(FLIGHT_RECORDER_DIR).mkdir()
    (rd.file(FLIGHT_RECORDER_DIR) / "nccl_trace_rank_1").write_bytes(b"pickle")
    d = diagnose(rd.path)
    assert d.primary.code == "injected-fault" and d.find("nccl-host-view") is None
    assert [Path(p).name for p in d.primary.evidence["flight_recorder"]] == ["nccl_trace_rank_1"]


def test_an_nccl_job_gets_the_flight_recorder_unless_the_user_set_it(tmp_path):
    import mmap

    import torch

    from utils.jobs.launchers import NCCL_FLIGHT_RECORDER, OLDER_NAMES, nccl_debug_environment
    from utils.jobs.stacks import FLIGHT_RECORDER_DIR, FLIGHT_RECORDER_PREFIX

    # The names, in the installed torch: its NCCL process group, its flight recorder (newer name
    # first, the older one still read), and the dump writer compiled into libtorch_cpu.
    root = Path(torch.__file__).parent
    headers = root / "include" / "torch" / "csrc" / "distributed" / "c10d"
    nccl, recorder = (headers / "ProcessGroupNCCL.hpp").read_text(), (headers / "FlightRecorder.hpp").read_text()
    assert '"TORCH_NCCL_DUMP_ON_TIMEOUT"' in nccl and '"TORCH_NCCL_ENABLE_MONITORING"' in nccl
    assert "TORCH_NCCL_ENABLE_MONITORING=1 and TORCH_NCCL_TRACE_BUFFER_SIZE > 0" in nccl     # what a dump needs
    assert '{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000' in recorder
    assert "filename_ = c10::str(namePrefix, rank);" in recorder                         # the prefix, then the rank
    with open(root / "lib" / "libtorch_cpu.so", "rb") as lib, mmap.mmap(lib.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for name in ("TORCH_FR_DUMP_TEMP_FILE", *OLDER_NAMES.values()):
            assert m.find(name.encode() + b"\0") >= 0, name

    rd = RunDir(tmp_path)
    prefix = str(tmp_path / FLIGHT_RECORDER_DIR / FLIGHT_RECORDER_PREFIX)
    assert nccl_debug_environment(rd, {"PATH": "/bin"}) == {**NCCL_FLIGHT_RECORDER, "TORCH_FR_DUMP_TEMP_FILE": prefix}
    assert (tmp_path / FLIGHT_RECORDER_DIR).is_dir()                     # torch writes the dumps there
    for mine in ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_"},
                 {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_"}):
        env = nccl_debug_environment(rd, mine)                           # the user's settings win, by either name
        assert env == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_ENABLE_MONITORING": "1"}


def _timed_out_run(path: Path) -> RunDir:
    """The record of a 2-stage job whose process-group timeout came first (record_errors.py case
    ``pg_timeout_hang``): rank 1 hangs in backward, rank 0's recv_grad raised gloo's timeout 5 s later."""
    spec = JobSpec(**{**SMALL_GPT, "num_stages": 2, "micro_batches": 4, "steps": 3, "pg_timeout": 5,
                      "fault": Fault(kind="hang", stage=1, step=1, instruction="backward")})
    path.mkdir()
    rd = RunDir(path)
    rd.write_spec(spec.to_dict())
    error = RECORDED["pg_timeout_hang"]["errors"][0]
    rd.write_error(0, {**error, "time": 100.0,
                       "traceback": '  File "deepspeed/runtime/pipe/engine.py", line 1209, in _exec_recv_grads\n'
                                    + error["traceback"]})
    rd.write_status(state="failed", error=f"rank 0 (stage 0) raised RuntimeError: {error['message']}", started=80.0,
                    finished=101.0, command="", notes=[])
    for rank, (doing, t) in enumerate([("recv_grad", 94.9), ("backward", 95.0)]):
        _slot(rd, rank, 1, doing, 0, t)
    rd.launcher_log().write_text("")
    return rd


def test_a_process_group_timeout_points_at_the_rank_that_never_answered(tmp_path):
    assert "Timed out waiting 5000ms for recv operation to complete" in RECORDED["pg_timeout_hang"]["errors"][0]["message"]
    d = diagnose(_timed_out_run(tmp_path / "run").path, reveal_fault=False)
    assert d.kind == "failed" and d.codes == ["hang", "collective-timeout"], d   # no peer-lost: rank 1 is no victim
    suspect, victim = d.findings
    w = suspect.where
    assert (w.rank, w.stage, w.instruction, w.step, w.micro_batch) == (1, 1, "backward", 1, 0)
    assert suspect.evidence == {"doing": "step=1 backward mb=0", "for_s": 5.0, "waited_for_by": 0}
    assert "never answered rank 0's recv_grad" in suspect.what and "pg_timeout=None" in suspect.fix
    assert (victim.where.rank, victim.where.instruction, victim.severity) == (0, "recv_grad", "info")
    assert d.headline == "rank 0 (stage 0) timed out in recv_grad waiting for rank(s) [1]"


def test_nccls_own_timeout_is_a_collective_timeout_too():
    # The watchdog's words, from a real timeout on the lent H200 (torch 2.11.0+cu130, NCCL 2.28.9: an all-reduce
    # queued behind a 15 s kernel, pg timeout 5 s); the same text is what `work.wait()` raises under
    # TORCH_NCCL_BLOCKING_WAIT=1 (DistBackendError). No NCCL job can run here.
    text = ("DistBackendError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, "
            "OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=5000) ran for 5000 milliseconds "
            "before timing out.")
    x = explain(text)
    assert x.code == "collective-timeout" and x.consequence
