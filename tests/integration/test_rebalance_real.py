"""Dynamic re-balancing on real DeepSpeed jobs (issue 22): a running job moves to new
boundaries — live, or by checkpoint and restart — and trains on exactly as before.

Exactness is the point: a re-partition that carries every layer's weights, Adam moments and
step, the LR scheduler and the data position gives the same loss at every step as the job
that never moved. Each mode also runs the negative control (optimizer state dropped), so
that it could fail: the moments matter, and a loss that ignores them would show. The control
runs once per mode, on 2 stages: the 4-stage moves carry state by the same code.
"""

from __future__ import annotations

import math
import os
import signal
import time
from functools import cache
from statistics import median

import pytest

from utils.system.procs import job_processes
from utils import Fault, JobFailed, JobSpec, Rebalance, diagnose, run_job, start_job

pytestmark = pytest.mark.integration

MODEL = {"model": "gpt", "model_options": {"blocks": 6, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 32},
         "micro_batch_size": 2}
# Layers: embedding 0, blocks 1-6, head 7. Moves in both directions; in the 4-stage case the
# second move sends layers 1 and 2 from stages 1 and 2 back to stage 0 (across two stages).
CASES = {
    2: ([0, 4, 8], {2: (0, 2, 8), 4: (0, 6, 8)}),
    4: ([0, 2, 4, 6, 8], {2: (0, 1, 2, 6, 8), 4: (0, 3, 5, 7, 8)}),
}
EXACT = 1e-6


def _spec(stages: int, **fields) -> JobSpec:
    base, _ = CASES[stages]
    return JobSpec(**{**MODEL, "num_stages": stages, "micro_batches": 4, "steps": 6, "partition": base,
                      "lr_warmup_steps": 3, "device": "cpu", "timeout": 240, **fields})


@cache
def _static_losses(stages: int, freeze: tuple = ()) -> tuple[float, ...]:
    return tuple(run_job(_spec(stages, freeze_at=dict(freeze), name=f"static-{stages}"), progress=False).losses)


def _relative_gaps(a, b) -> list[float]:
    assert len(a) == len(b)
    return [abs(x - y) / abs(y) for x, y in zip(a, b)]


def _check_moves(run, stages: int) -> None:
    base, moves = CASES[stages]
    assert run.partition_history == [(0, base)] + [(step, list(b)) for step, b in moves.items()]
    for step in moves:
        events = run.timeline.select(step=step, kinds=("repartition",))
        assert sorted(e.rank for e in events) == list(range(stages))  # every rank, real durations
        # timing-claim: construction — each rank really builds the new engine (a positive duration at any
        # speed); no two measurements are compared
        assert all(e.duration > 0 for e in events)
    assert job_processes(run.path) == []


@pytest.mark.parametrize("mode", ["live", "restart"])
@pytest.mark.parametrize("stages", [2, 4])
def test_a_repartitioned_job_trains_exactly_like_the_static_one(runs_root, stages, mode):
    static = _static_losses(stages)
    _, moves = CASES[stages]
    carried = run_job(_spec(stages, repartition_at=moves, repartition_mode=mode, name=f"{mode}-{stages}"),
                      progress=False)
    assert max(_relative_gaps(carried.losses, static)) <= EXACT, (carried.losses, static)
    _check_moves(carried, stages)
    if stages == 4:
        return  # the negative control below runs once per mode, on 2 stages
    # Negative control: the same moves with the optimizer state dropped train differently.
    dropped = run_job(_spec(stages, repartition_at=moves, repartition_mode=mode, repartition_optimizer="drop",
                            name=f"{mode}-{stages}-drop"), progress=False)
    first_move = min(moves)
    assert dropped.losses[:first_move + 1] == list(static[:first_move + 1])  # the move itself changes nothing yet
    assert max(_relative_gaps(dropped.losses, static)) > 1e3 * EXACT, (dropped.losses, static)


@pytest.mark.parametrize("mode", ["live", "restart"])
def test_frozen_layers_stay_frozen_across_moves(runs_root, mode):
    """Layers 0-2 are frozen from the start (so their weights must end as they began) while
    the boundaries move them from stage 0 to 1 and back; the loss equals the static run's
    with the same freezing, and a stage that holds only frozen layers runs no backward."""
    frozen = {0: 3}
    moves = {2: (0, 2, 8), 4: (0, 5, 8)}
    run = run_job(_spec(2, freeze_at=frozen, repartition_at=moves, repartition_mode=mode,
                        name=f"frozen-moves-{mode}"), progress=False)
    static = _static_losses(2, tuple(frozen.items()))
    assert max(_relative_gaps(run.losses, static)) <= EXACT
    model = run.spec  # the sequential reference starts from the same seeded weights
    from utils import get_model

    initial = get_model(model.model, model.model_options).build_sequential(seed=model.seed)
    final = {int(i): v for result in run.results.values() for i, v in result["layer_fingerprints"].items()}
    for layer in range(8):
        params = list(initial[layer].parameters())
        begun = sum(float(p.detach().double().sum()) for p in params)
        unchanged = math.isclose(final[layer][0], begun, rel_tol=0, abs_tol=1e-9)
        assert unchanged == (layer < 3), (layer, final[layer][0], begun)
    # Steps 2-3: stage 0 holds layers 0-1, both frozen: its BackwardPass instructions return
    # at once (microseconds), while stage 1's compute. Compared as the fastest of stage 0's eight
    # against the median of stage 1's: a stall of a shared core can lengthen any one instruction,
    # but raises the fastest of eight only if it hits all eight.
    backward = {s: [e.duration for e in run.timeline.select(stage=s, kinds=("backward",)) if e.step in (2, 3)]
                for s in (0, 1)}
    assert len(backward[0]) == len(backward[1]) == 8
    idle, busy = min(backward[0]), median(backward[1])
    print(f"steps 2-3 backward: stage 0 (frozen) fastest {idle * 1e6:.0f} us, stage 1 median {busy * 1e6:.0f} us "
          f"(ratio {idle / busy:.4f} on this run)")
    # timing-claim: margin — no work against a backward through 5 blocks and the head: 6-7 us against
    # 8-9 ms (ratio < 0.001) on shared cores, so 2 % is >20x headroom; every rank 3x slower scales
    # both sides, and a stall must hit all eight of stage 0's backwards to raise their minimum
    assert idle < 0.02 * busy, backward


@pytest.mark.parametrize("kind, said", [
    ("raise", "rank 0 (stage 0) raised RuntimeError: injected fault: stage 0 fails at step 2 in repartition"),
    # No Python error: the phase comes from the rank's status slot.
    ("killed", "rank 0 (stage 0) was killed by SIGKILL (exit code -9) while in: step=2 repartition: building the "
               "new engine"),
])
def test_a_rank_failing_during_a_migration_ends_the_job(runs_root, kind, said):
    spec = _spec(2, repartition_at={2: (0, 2, 8)}, timeout=120,
                 fault=Fault(kind=kind, stage=0, step=2, instruction="repartition"), name=f"migration-{kind}")
    with pytest.raises(JobFailed) as caught:
        run_job(spec, progress=False)
    message = str(caught.value)
    assert said in message
    assert "repartition" in message  # the phase it failed in
    assert caught.value.run.state == "failed"
    assert job_processes(caught.value.run.path) == []


def test_a_rank_frozen_during_a_migration_is_found_by_the_watch_not_the_timeout(runs_root, tmp_path):
    """Before: a SIGSTOPped rank in a live move was reported only when the job's timeout (300 s
    by default) ran out, and the report blamed any JIT build lock on the machine. Rank 1 is held
    inside the move (a "hang" fault there), then stopped: the watch ends the job `FROZEN_AFTER`
    seconds later, and a lock held by another process, after every engine exists, is not named."""
    from utils.jobs.launch import FROZEN_AFTER

    spec = _spec(2, repartition_at={2: (0, 2, 8)}, timeout=300, name="migration-frozen",
                 fault=Fault(kind="hang", stage=1, step=2, instruction="repartition"))
    job = start_job(spec)
    status = job.run_dir.status_slot(1)
    while job.poll() == "running" and "repartition" not in (status.read_text() if status.exists() else ""):
        time.sleep(0.1)  # a guard: the job's own timeout ends this loop if the move never comes
    job.launcher.workers()[1].send_signal(signal.SIGSTOP)
    frozen_at = time.time()
    other = tmp_path / "torch_extensions" / "some_op"
    other.mkdir(parents=True)
    held = os.open(other / "lock", os.O_CREAT | os.O_EXCL)  # another job's build, held by this process
    job.launcher.extensions_dir = other.parent
    try:
        with pytest.raises(JobFailed) as caught:
            job.wait()
    finally:
        os.close(held)
    message = str(caught.value)
    print(f"ended {job.ended - frozen_at:.1f} s after SIGSTOP (FROZEN_AFTER={FROZEN_AFTER:g} s, timeout={spec.timeout:g} s)")
    assert f"rank(s) [1] stopped (process state 'stopped') for {FROZEN_AFTER:g} s or more" in message
    assert "Rank(s) [1] are stopped" in message and "repartition" in message
    assert "build lock" not in message
    # timing-claim: construction — the job's timeout is 300 s; only the watch can end it sooner
    assert job.ended - job.started < spec.timeout
    assert job_processes(job.path) == []


def test_deepspeeds_own_optimizer_loader_fails_or_silently_mismatches_after_a_move(runs_root):
    """The pitfall `remap` avoids, on a real restart: stages 0 and 2 change their parameter
    count (torch refuses the state), stage 1 keeps its count with other layers (3-5 become
    2-4) and loads the saved moments without a word."""
    spec = JobSpec(**MODEL, num_stages=3, micro_batches=4, steps=3, partition=[0, 3, 6, 8], device="cpu",
                   repartition_at={2: (0, 2, 5, 8)}, repartition_mode="restart", repartition_optimizer="deepspeed",
                   timeout=120, name="deepspeed-loader")
    with pytest.raises(JobFailed) as caught:
        run_job(spec, progress=False)
    run = caught.value.run
    refused = {r for r in run.ranks if "doesn't match the size of optimizer's group" in
               ((run.run_dir.error(r) or {}).get("message") or "")}
    assert refused == {0, 2}
    assert "restart: checkpoint loaded" in run.run_dir.slot(1).describe()
    assert diagnose(run).primary.code == "optimizer-state-mismatch"
    assert job_processes(run.path) == []


def test_the_policy_moves_a_freezing_job_and_records_why(runs_root):
    """With the first half frozen, stage 0 only runs forwards; the policy measures that in
    the job, predicts the gain, moves the boundary right, and the loss stays exact.

    A model this small saves a few ms per step against a migration of about 0.2 s, so over
    14 steps no move pays back at the default `payback`; this test lowers the threshold to
    check the mechanics (measure, predict, decide, move, record). Declining a move that does
    not pay is tested on the policy itself (tests/unit/test_rebalance_policy.py)."""
    model = {**MODEL, "model_options": {**MODEL["model_options"], "blocks": 10, "hidden": 96}}
    fields = dict(num_stages=2, micro_batches=4, steps=14, partition=[0, 6, 12], freeze_at={2: 6}, device="cpu",
                  timeout=300)
    policy = Rebalance(every=2, window=2, min_gain=0.05, payback=0.02)
    run = run_job(JobSpec(**model, **fields, rebalance=policy, name="policy"), progress=False)
    static = run_job(JobSpec(**model, **fields, name="policy-static"), progress=False)
    assert max(_relative_gaps(run.losses, static.losses)) <= EXACT
    decisions = run.rebalance_decisions
    assert [d.step for d in decisions] == list(range(2, 14, 2))
    moved = [d for d in decisions if d.migrate]
    assert moved, [d.reason for d in decisions]
    first = moved[0]
    # timing-claim: margin — frozen layers' measured backward is 0 (asserted below: no backward runs), so
    # stage 0 (6 frozen layers) costs about a third of stage 1 (6 trained layers, forward + backward):
    # the min-max boundary moves right unless that 3x flips, which slowing every rank alike does not do
    assert first.candidate[1] > 6
    # timing-claim: construction — the policy migrates only when its predicted step is at least min_gain
    # (5 %) below the measured one (utils.planning.rebalance.look): predicted < measured by its rule
    assert first.predicted_step_seconds < first.measured_step_seconds
    assert run.partition_history[1] == (first.step, list(first.candidate))
    assert run.partition_history[0] == (0, [0, 6, 12])
    assert run.layer_costs and all(len(layers) == 12 for layers in run.layer_costs.values())
    # Frozen layers' measured backward is zero; trained ones' is not.
    last = run.layer_costs[max(run.layer_costs)]
    assert all(last[i][1] == 0.0 for i in range(6)) and all(last[i][1] > 0 for i in range(6, 12))


def test_a_sequence_length_curriculum_runs_and_can_move(runs_root):
    """Samples of 8 tokens, then 32 from step 3: DeepSpeed's stages re-learn the activation
    shape they exchange (it caches the first one), and a move after the switch still works.
    The first three steps train on other data than the static run (shorter samples), from
    step 0 on."""
    run = run_job(_spec(2, seq_len_at={0: 8, 3: 32}, repartition_at={4: (0, 3, 8)}, name="curriculum"),
                  progress=False)
    assert len(run.losses) == 6 and all(math.isfinite(x) for x in run.losses)
    assert run.partition_history[-1] == (4, [0, 3, 8])
    assert all(gap > 1e-3 for gap in _relative_gaps(run.losses, _static_losses(2)))


def test_data_parallel_replicas_each_move_their_own_copy(runs_root):
    """2 stages × 2 replicas (4 ranks): each replica's layers move within the replica, and
    the averaged gradients, the freezing and the clipping collectives stay in line."""
    fields = dict(data_parallel=2, micro_batches=2, steps=5, freeze_at={1: 2})
    static = run_job(_spec(2, **fields, name="dp-static"), progress=False)
    moved = run_job(_spec(2, **fields, repartition_at={2: (0, 2, 8), 3: (0, 6, 8)}, name="dp-live"),
                    progress=False)
    assert max(_relative_gaps(moved.losses, static.losses)) <= EXACT
    assert sorted(e.rank for e in moved.timeline.select(step=3, kinds=("repartition",))) == [0, 1, 2, 3]
