"""Restart mode on a checkpoint folder that refuses the save, on a real 2-rank CPU job (issue 38,
case 5 and the partial files of case 4).

Before: DeepSpeed's raw traceback (a PermissionError, or torch's ``[enforce fail at
inline_container.cc]``) and the files written before the failure left behind. The folder is
made unusable as the run directory is created, before any rank starts (tests run as root, and
root writes into a ``chmod 0o555`` folder, so something is put in the way instead): a file
where the checkpoint folder goes (the ranks' check refuses it, nothing is written), or a folder
where stage 0's optimizer file goes (the check passes, both stages write their layer files,
then stage 0's save fails: what was written must go).
"""

from __future__ import annotations

import pytest

from tests.helpers import SMALL_GPT
from utils import JobFailed, JobSpec, run_job
from utils.jobs.rundir import RunDir
from utils.runtime.restart import SPACE_MARGIN
from utils.system.procs import job_processes

pytestmark = pytest.mark.integration

SPEC = dict(**SMALL_GPT, num_stages=2, micro_batches=2, steps=4, device="cpu", partition=[0, 2, 4],
            repartition_at={2: (0, 1, 4)}, repartition_mode="restart", timeout=240)


def _blocked(monkeypatch, block) -> None:
    """Run `block(run_dir)` on the job's run directory as `start_job` creates it."""
    create = RunDir.create

    def create_blocked(*args, **kwargs):
        run_dir = create(*args, **kwargs)
        block(run_dir)
        return run_dir

    monkeypatch.setattr(RunDir, "create", create_blocked)


@pytest.mark.parametrize("where", ["folder", "stage-file"])
def test_an_unusable_checkpoint_folder_fails_the_job_clearly_and_leaves_no_partial_files(
        runs_root, monkeypatch, where):
    def block(run_dir: RunDir) -> None:
        if where == "folder":
            run_dir.checkpoints.write_text("in the way\n")
        else:
            (run_dir.checkpoints / "step2" / "mp_rank_00_model_states.pt").mkdir(parents=True)

    _blocked(monkeypatch, block)
    with pytest.raises(JobFailed) as caught:
        run_job(JobSpec(**SPEC, name=f"ckpt-{where}"), progress=False)
    message, run = str(caught.value), caught.value.run
    checkpoints = run.path / RunDir.CHECKPOINTS
    assert "raised CheckpointDiskError" in message, message
    assert f"检查点目录 {checkpoints} 不可写" in message and f"the checkpoint folder {checkpoints} is not writable" \
        in message, message
    assert "make it writable" in message and "WORKBOOK_RUNS" in message and "repartition_mode='live'" in message
    assert "During handling" not in message and "direct cause" not in message  # ours alone, not DeepSpeed's
    if where == "folder":
        assert "NotADirectoryError" in message and "nothing was written" in message, message
        assert checkpoints.read_text() == "in the way\n"  # what was there stays, nothing was added
    else:
        assert "open file failed" in message and "its partial files were removed" in message, message
        assert not checkpoints.exists(), sorted(p.name for p in checkpoints.rglob("*"))
    errors = [RunDir(run.path).error(r) for r in range(2)]
    reported = [e for e in errors if e is not None]
    assert reported and all(e["type"] == "CheckpointDiskError" for e in reported), reported
    assert str(checkpoints) in reported[0]["message"]
    assert not (run.path / RunDir.RESTART).exists()  # never resumed from
    assert job_processes(run.path) == []


def test_the_space_estimate_covers_deepspeeds_checkpoint(runs_root):
    # The ranks' check asks for their tensors' bytes (restart.json keeps the sum) plus a margin:
    # what DeepSpeed then writes (layer files, stage files with the optimizer state, and the
    # data positions) must fit in it, or the check would pass a save that fills the disk.
    run = run_job(JobSpec(**SPEC, name="ckpt-estimate"), progress=False)
    estimate = RunDir(run.path).read_restart()["checkpoint_bytes"]
    files = list((run.path / RunDir.CHECKPOINTS / "step2").iterdir())
    written = sum(p.stat().st_size for p in files)
    assert {p.name for p in files} >= {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt", "data-rank1.pt"}
    print(f"estimate {estimate} B, written {written} B in {len(files)} files")
    assert written <= estimate * SPACE_MARGIN  # even without the per-rank slack (SPACE_SLACK)
    assert estimate <= 1.5 * written  # an estimate, not a refusal of every disk: within 50 % above
