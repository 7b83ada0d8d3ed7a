"""Live moves leave nothing behind (issue 41, point 5): a real job that re-partitions itself
three times ends each move with the process groups it had before the first one, no engine an
earlier move replaced is still alive, and it trains exactly like the sequential model.

Every rebuild of the engine makes new process groups (``PipelineModule.__init__``: a world
group and a `PipelineParallelGrid`, whose constructor calls ``dist.new_group`` several times);
`utils.runtime.migrate.repartition_live` destroys the old engine's. On NCCL each group left
behind is a communicator (device memory, set-up time), so the count is what the ranks
themselves report: each rank writes every move's record (`migrate.MOVES`: torch's registry of
live groups, counted before and after) into its result. One job of 7 steps and the sequential
reference: about 8 s on 2 idle cores (25-57 s measured while other jobs shared them).
"""

from __future__ import annotations

import pytest

from utils import JobSpec, run_job
from utils.runtime.migrate import MOVE_PHASES
from utils.system.procs import job_processes
from utils.workloads.reference import train_sequential

pytestmark = pytest.mark.integration

MODEL = {"model": "gpt", "model_options": {"blocks": 6, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 32},
         "micro_batch_size": 2}
# Layers: embedding 0, blocks 1-6, head 7. Three moves, both directions, and a layer that
# leaves stage 0 and comes back (1 and 2 move out at step 2, 2..5 come in at step 4).
MOVES = {2: [0, 2, 8], 4: [0, 6, 8], 5: [0, 3, 8]}


def test_live_moves_leave_the_process_groups_as_they_found_them(runs_root):
    # No warm-up: the sequential reference runs torch's AdamW at the job's constant rate.
    spec = JobSpec(**MODEL, num_stages=2, micro_batches=4, steps=7, partition=[0, 4, 8], device="cpu", timeout=240,
                   repartition_at=MOVES, name="live-move-groups")
    run = run_job(spec, progress=False)
    assert run.partition_history == [(0, [0, 4, 8])] + [(step, b) for step, b in MOVES.items()]
    assert run.losses == pytest.approx(train_sequential(spec), rel=1e-5, abs=1e-7)
    for rank, result in sorted(run.results.items()):
        moves = result["live_moves"]
        assert [(m["old"], m["new"]) for m in moves] == [([0, 4, 8], [0, 2, 8]), ([0, 2, 8], [0, 6, 8]),
                                                         ([0, 6, 8], [0, 3, 8])]
        found = moves[0]["groups_before"]
        # the default group plus the old engine's (PipelineModule's world group and the grid's)
        assert found > 1 and all(m["groups_destroyed"] > 0 for m in moves), moves
        assert [m["groups_after"] for m in moves] == [found] * len(moves), (rank, moves)
        assert [m["groups_before"] for m in moves] == [found] * len(moves), (rank, moves)
        assert [m["earlier_engines_alive"] for m in moves] == [0] * len(moves), (rank, moves)
        for m in moves:  # a memory sample at every phase (the CPU meter: malloc's bytes in use)
            assert m["phases"] == list(MOVE_PHASES) and len(m["memory"]["after"]) == len(MOVE_PHASES)
            print(f"rank {rank} {m['old']} -> {m['new']}: groups {m['groups_before']} -> {m['groups_after']}; "
                  f"memory above the move's start (MiB) at {dict(zip(m['phases'], _mib(m['memory'])))}")
    assert job_processes(run.path) == []


def _mib(memory: dict) -> list[float]:
    return [round((after - memory["base"]) / 2**20, 1) for after in memory["after"]]
