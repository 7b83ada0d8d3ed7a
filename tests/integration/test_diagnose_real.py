"""`utils.diagnose` on real jobs: one per fault the workbook can inject, a straggler among the
four ranks of a 2 × 2 PP × DP job, a hang whose stacks the launcher collects, and a config
mistake DeepSpeed itself rejects. Each names the rank, stage, instruction and cause, ends
within its limits and leaves no process behind."""

from __future__ import annotations

import time

import pytest

from tests.helpers import SMALL_GPT
from utils.system.procs import job_processes
from utils import Fault, JobFailed, JobSpec, run_job
from utils.jobs.diagnose import diagnose
from utils.jobs.exitreport import recorded_exit_report
from utils.jobs.stacks import main_stack, parse_stacks

pytestmark = pytest.mark.integration


def _spec(fault: Fault | None = None, **extra) -> JobSpec:
    return JobSpec(**{**SMALL_GPT, "num_stages": 2, "micro_batches": 4, "steps": 3, "timeout": 120, "fault": fault,
                      **extra})


def _failed(spec: JobSpec):
    with pytest.raises(JobFailed) as caught:
        run_job(spec, progress=False)
    run = caught.value.run
    assert job_processes(run.path) == []
    return run, diagnose(run)


def _where(finding) -> tuple:
    w = finding.where
    return w.rank, w.stage, w.instruction, w.step, w.micro_batch


@pytest.mark.parametrize("kind, code", [("raise", "injected-fault"), ("exit", "exited"), ("killed", "killed")])
def test_a_rank_that_fails_is_named_with_its_instruction(runs_root, kind, code):
    run, d = _failed(_spec(Fault(kind=kind, stage=1, step=1, instruction="forward")))
    assert d.kind == "failed" and d.primary.code == code, d
    assert _where(d.primary) == (1, 1, "forward", 1, 0)
    assert d.primary.cause and d.primary.fix
    assert d.find("injected-fault").where.rank == 1
    # Rank 0 ended only because rank 1 did, and one finding says so whichever way the race went
    # (chapter 25): it noticed (its receive failed: an error record of a lost connection), or the
    # agent stopped it first (no error record: the launcher's report, its log, or nothing at all).
    lost = d.find("peer-lost")
    assert lost is not None and lost.evidence["ranks"] == [0], d
    noticed = run.run_dir.error(0) is not None
    assert lost.evidence["how"] == {0: "lost-connection" if noticed else "stopped"}, lost
    assert _where(lost)[:2] == (0, 0) and lost.severity == "info"
    report = recorded_exit_report(run.run_dir)
    if report.stopped_by_launcher(0) and not noticed:
        assert "launcher's" in lost.evidence["told_by"][0], lost
    print(f"[observation] {kind}: rank 0 {lost.evidence['how'][0]}; told by {lost.evidence['told_by'][0]!r}; {report}")
    if kind == "killed":
        assert "out-of-memory killer" in d.primary.cause


def test_a_tensor_mismatch_names_the_receiver_and_its_sender(runs_root):
    run, d = _failed(_spec(Fault(kind="mismatch", stage=0, step=1)))
    assert d.primary.code == "tensor-mismatch", d
    assert _where(d.primary) == (1, 1, "recv_act", 1, 0)
    assert "came from rank 0 (stage 0)" in d.primary.cause and "dynamic_shape" in d.primary.fix
    assert "Received data size doesn't match" in run.log(1)  # gloo's own words, in the receiver's log


def test_a_memory_cap_gives_a_real_out_of_memory(runs_root):
    options = {**SMALL_GPT["model_options"], "vocab": 4096, "seq_len": 32}
    run, d = _failed(_spec(Fault(kind="memory", stage=1, cap_mb=1), model_options=options))
    assert d.primary.code == "out-of-memory", d
    rank, stage, instruction, step, _ = _where(d.primary)
    assert (rank, stage, step) == (1, 1, 0) and instruction in ("forward", "backward", "optimizer_step")
    assert "can't allocate memory" in d.primary.evidence["error"]
    assert d.primary.evidence["memory_limit_mb"] > 0
    assert "checkpoint" in d.primary.fix


def test_one_slow_rank_among_four_is_the_straggler(runs_root):
    # factor 6, not 3: a micro-batch computes in ~2 ms here, so a 3x fault measured only 2.6x
    # on an idle machine, close to the 2.0 asserted below; with 4 ranks on 2 cores, contention
    # slows the healthy replica too (this test failed once in CI with factor 3). The measured
    # slowdown is an observation of the fault; 6 keeps it 3x above the 2.0 on a shared machine.
    run = run_job(_spec(Fault(kind="slow", stage=1, replica=1, factor=6.0), data_parallel=2, micro_batches=4),
                  progress=False)
    d = diagnose(run)
    assert d.kind == "ok" and d.primary.code == "straggler", d
    assert (d.primary.where.rank, d.primary.where.stage) == (3, 1), d
    print(f"[observation] the injected 6x fault measured {d.primary.evidence['slowdown']:.1f}x")
    assert d.primary.evidence["slowdown"] > 2.0
    # 4 ranks share 2 cores here: a healthy rank may measure slower than its peer too (a full
    # run once flagged rank 1, and listed it first), never nearly as slow as the injected one.
    others = [f for f in d.findings if f.code == "straggler" and f is not d.primary]
    assert all(f.evidence["slowdown"] < d.primary.evidence["slowdown"] / 1.5 for f in others), others
    assert not diagnose(run, reveal_fault=False).find("injected-fault")
    assert job_processes(run.path) == []


def test_one_slow_stage_among_four_is_found_by_its_peer(runs_root):
    # 4 stages of 1 layer each (embedding, block, block, head): stage 2 runs what stage 1 runs.
    # Factor 6 against the straggler rule's 1.5: the fault sleeps in proportion to the rank's own
    # measured compute, but 4 ranks sharing 2 busy cores inflate the peer's compute with waits
    # for a core (with factor 3 a run beside a CPU hog measured under 1.5 and found no straggler).
    run = run_job(_spec(Fault(kind="slow", stage=2, factor=6.0), num_stages=4, partition="uniform"), progress=False)
    d = diagnose(run, reveal_fault=False)
    assert d.primary.code == "straggler", d
    assert (d.primary.where.rank, d.primary.where.stage) == (2, 2)
    assert job_processes(run.path) == []


def test_a_hang_ends_within_its_timeout_with_every_ranks_stacks(runs_root):
    # 30 s: the ranks must reach the hang (step 1) before the timeout, counted from the start; a
    # 2-rank job gets there in ~4 s on an idle machine, 3-4x that on a busy one (15 s was too short
    # once: both ranks were still importing when it ran out).
    timeout = 30
    started = time.time()
    with pytest.raises(JobFailed) as caught:
        run_job(_spec(Fault(kind="hang", stage=1, step=1), timeout=timeout), progress=False)
    took = time.time() - started
    print(f"[observation] the hung job ended {took - timeout:.1f} s after its {timeout} s timeout")
    # timing-claim: margin — the watcher ends the job at `timeout` by its own clock; what follows is
    # bounded by constants, not by the ranks' speed: ≤ 2 s waiting for stacks, SIGTERM with 3 s of
    # grace then SIGKILL; 10 s covers that with room for a slow planning step before the start.
    assert took < timeout + 10
    run = caught.value.run
    assert run.state == "timeout" and job_processes(run.path) == []
    message = str(caught.value)
    assert "timeout" in message
    assert "rank 1 (stage 1): step=1 forward mb=0" in message
    # Its neighbour waits for the gradient of a micro-batch stage 1 never finishes.
    assert "rank 0 (stage 0): step=1 recv_grad" in message
    assert "stack: utils/runtime/faults.py" in message and "(in DeepSpeed's recv_grad)" in message
    for rank in run.ranks:  # every rank answered: its stacks are in the run directory
        assert main_stack(parse_stacks(run.run_dir.stacks(rank))) is not None
    d = diagnose(run)
    assert d.kind == "hung" and d.primary.code == "hang", d
    assert _where(d.primary) == (1, 1, "forward", 1, 0)
    assert "injected hang" in d.primary.cause
    waiting = d.find("waiting")
    assert _where(waiting) == (0, 0, "recv_grad", 1, 0) and "for rank 1" in waiting.what
    assert d.primary.evidence["chains"] == ["rank 0 (recv_grad) → rank 1 (forward)"]


def test_a_process_group_timeout_first_points_at_the_rank_that_never_answered(runs_root):
    # JobSpec.pg_timeout = 5 s, shorter than the job's own timeout: rank 0's recv_grad raises gloo's own
    # timeout error ~5 s after rank 1 hung in its backward; the job fails instead of timing out.
    run, d = _failed(_spec(Fault(kind="hang", stage=1, step=1, instruction="backward"), pg_timeout=5, timeout=120))
    assert run.state == "failed" and not any(run.run_dir.stacks(r) for r in run.ranks)   # no stacks: no outer timeout
    error = run.run_dir.error(0)
    assert "gloo" in error["message"] and "Timed out waiting 5000ms for recv operation to complete" in error["message"]
    assert run.run_dir.error(1) is None
    assert d.codes[:2] == ["hang", "collective-timeout"] and d.find("peer-lost") is None, d
    assert _where(d.primary) == (1, 1, "backward", 1, 0) and d.primary.evidence["waited_for_by"] == 0
    # timing-claim: margin — about pg_timeout: rank 0 gave up 5 s after posting its receive, which is near
    # rank 1's start of backward (on either side, by the scheduling of a few instructions); loose bounds
    assert 3.0 < d.primary.evidence["for_s"] < 60
    assert _where(d.find("collective-timeout"))[:3] == (0, 0, "recv_grad")


def test_a_collective_on_one_rank_only_is_a_deadlock(runs_root):
    # Rank 0 alone enters an all-reduce at the start of its step-1 forward; rank 1 waits for its
    # activation: each waits for the other until the job's timeout (30 s: as the hang above).
    with pytest.raises(JobFailed) as caught:
        run_job(_spec(Fault(kind="collective", stage=0, step=1), timeout=30), progress=False)
    run = caught.value.run
    assert run.state == "timeout" and job_processes(run.path) == []
    d = diagnose(run)
    assert d.kind == "hung" and d.primary.code == "deadlock", d
    assert sorted(d.primary.evidence["cycle"]) == [0, 1] and d.primary.evidence["in_collective"] == [0]
    assert _where(d.primary)[:4] == (0, 0, "forward", 1)
    assert "all_reduce" in d.primary.cause and "on every rank of its group" in d.primary.fix
    waiting = {f.where.rank: f for f in d.findings if f.code == "waiting"}
    assert _where(waiting[1]) == (1, 1, "recv_act", 1, 0) and "for rank 0" in waiting[1].what


def test_a_config_deepspeed_rejects_is_explained(runs_root):
    # strict=False launches although the linter objects, so DeepSpeed's own assertion is what fails.
    run, d = _failed(_spec(strict=False, deepspeed_config={"train_batch_size": 12}, steps=1))
    assert d.primary.code == "batch-arithmetic", d
    assert d.primary.where.instruction == "setup" and d.primary.where.stage in (0, 1)
    assert "12 ≠ 2 × 4 × 1" in d.primary.cause
    # Every rank that left an error record raised this assertion; a rank slower to reach it can be
    # stopped by torchrun first (a busy machine), and then has no record of its own.
    recorded = [r for r in run.ranks if run.run_dir.error(r)]
    failed = d.primary.evidence.get("same_error_on_ranks", [d.primary.where.rank])
    assert failed == recorded
    # ... and diagnose names that one as stopped before it got there: every rank is accounted for.
    lost = d.find("peer-lost")
    stopped = [r for r, how in lost.evidence["how"].items() if how == "stopped"] if lost else []
    assert sorted(failed + stopped) == list(run.ranks), d
