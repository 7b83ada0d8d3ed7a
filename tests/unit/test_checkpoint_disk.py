"""Restart-mode checkpoints on a full or unwritable disk (issue 38, cases 4 and 5).

Before, a full disk during the save gave torch's ``RuntimeError: [enforce fail at
inline_container.cc:672] . unexpected pos 2752 vs 2640`` (no "no space left", no path, no fix)
and left partial files; a read-only checkpoint folder gave DeepSpeed's raw PermissionError.
Here the save runs in this process on a small stand-in engine that writes what DeepSpeed's
pipeline engine writes (layer files, the stage file with the optimizer state, ``latest``);
the disk is made full or unwritable by monkeypatching (``shutil.disk_usage``, ``torch.save``,
the probe's write): tests run as root here, and root writes into a ``chmod 0o555`` folder.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import SMALL_GPT
from utils import JobSpec, plan_job
from utils.jobs.rundir import RunDir
from utils.runtime import restart
from utils.runtime.lifecycle import RankExit
from utils.system import diskspace
from utils.system.diskspace import CheckpointDiskError

ENFORCE = "[enforce fail at inline_container.cc:672] . unexpected pos 2752 vs 2640"


class Engine:
    """Two layers and Adam, one step taken; `save_checkpoint` writes DeepSpeed's pipeline files."""

    def __init__(self):
        torch.manual_seed(0)
        self.module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
        self.optimizer = torch.optim.Adam(self.module.parameters())
        self.module(torch.randn(4, 64)).sum().backward()
        self.optimizer.step()
        self.saves = 0

    def save_checkpoint(self, save_dir: str, tag: str) -> None:
        self.saves += 1
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True, exist_ok=True)
        for index, layer in enumerate(self.module):
            torch.save(layer.state_dict(), folder / f"layer_{index:02d}-model_states.pt")
        torch.save({"module": None, "optimizer": self.optimizer.state_dict()}, folder / "mp_rank_00_model_states.pt")
        (Path(save_dir) / "latest").write_text(tag)


def _state(tmp_path: Path) -> SimpleNamespace:
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    said = []
    return SimpleNamespace(run_dir=run_dir, engine=Engine(), rank=0, device="cpu", boundaries=[0, 1, 2],
                           origin_wall=None, data=SimpleNamespace(state=lambda: {"position": 3}),
                           status=lambda doing, *, step, detail="": said.append(f"{doing}: {detail}"), said=said)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def test_a_save_that_fits_writes_the_checkpoint(tmp_path):
    state = _state(tmp_path)
    restart.save_checkpoint(state, 2)
    assert _files(state.run_dir.checkpoints) == [
        "latest", "step2", "step2/data-rank0.pt", "step2/layer_00-model_states.pt",
        "step2/layer_01-model_states.pt", "step2/mp_rank_00_model_states.pt"]  # no probe file left


def test_the_estimate_covers_what_the_save_writes(tmp_path):
    state = _state(tmp_path)
    params = sum(p.numel() * 4 for p in state.engine.module.parameters())
    estimate = restart.checkpoint_bytes(state.engine)
    steps = 4 * len(list(state.engine.module.parameters()))  # Adam's step counter: a 0-d fp32 tensor each
    assert estimate == 3 * params + steps  # the weights and Adam's two moments, fp32
    restart.save_checkpoint(state, 2)
    written = sum(p.stat().st_size for p in (state.run_dir.checkpoints / "step2").iterdir())
    assert estimate <= written <= estimate * restart.SPACE_MARGIN + restart.SPACE_SLACK
    # the second replica of a stage writes neither (the first writes the stage's files)
    assert restart.checkpoint_bytes(state.engine, replica=1) == 0


def test_too_little_free_space_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    state = _state(tmp_path)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=50_000))
    with pytest.raises(CheckpointDiskError) as caught:
        restart.save_checkpoint(state, 2)
    message = str(caught.value)
    checkpoints = state.run_dir.checkpoints
    assert "磁盘空间不足" in message and "not enough disk space" in message
    assert f"the disk of {checkpoints} has 50.0 KB free" in message and "needs about" in message
    assert "WORKBOOK_RUNS" in message and "repartition_mode='live'" in message and "free space" in message
    assert caught.value.reason == "full" and caught.value.path == str(checkpoints)
    assert state.engine.saves == 0 and not checkpoints.exists()


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), RuntimeError(ENFORCE)],
                         ids=["ENOSPC", "torch-short-write"])
def test_a_disk_that_fills_during_the_save_is_named_and_the_partial_files_removed(tmp_path, monkeypatch, failure):
    state = _state(tmp_path)
    real_save, calls = torch.save, []

    def save_until_full(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) < 3:  # the two layer files fit, the stage file does not: half of it is written
            return real_save(obj, path, *args, **kwargs)
        Path(path).write_bytes(b"PK\x03\x04" + b"\0" * 2000)
        raise failure

    monkeypatch.setattr(torch, "save", save_until_full)
    with pytest.raises(CheckpointDiskError) as caught:
        restart.save_checkpoint(state, 2)
    message = str(caught.value)
    checkpoints = state.run_dir.checkpoints
    assert "磁盘已满" in message and f"no space left on the disk of {checkpoints}" in message
    assert "the restart-mode checkpoint step2 could not be written" in message
    assert ("No space left on device" if isinstance(failure, OSError) else "unexpected pos 2752 vs 2640") in message
    assert "its partial files were removed" in message and "WORKBOOK_RUNS" in message
    assert "repartition_mode='live'" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # not torch's traceback
    assert len(calls) == 3 and not checkpoints.exists(), _files(checkpoints)


def test_an_earlier_checkpoint_stays_when_a_later_save_fails(tmp_path, monkeypatch):
    state = _state(tmp_path)
    restart.save_checkpoint(state, 2)
    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(RuntimeError(ENFORCE)))
    with pytest.raises(CheckpointDiskError):
        restart.save_checkpoint(state, 4)
    # step4 and its `latest` are gone; step2 (a restart that happened) is untouched
    assert "step4" not in _files(state.run_dir.checkpoints)
    assert "step2/mp_rank_00_model_states.pt" in _files(state.run_dir.checkpoints)


def test_an_error_that_is_not_the_disk_passes_through_and_still_removes_the_partial_files(tmp_path, monkeypatch):
    state = _state(tmp_path)
    real_save = torch.save

    def peer_lost(obj, path, *args, **kwargs):
        if "mp_rank" in str(path):
            raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", peer_lost)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        restart.save_checkpoint(state, 2)
    assert not state.run_dir.checkpoints.exists()


def test_a_rank_whose_checkpoint_another_rank_removed_ends_quietly(tmp_path, monkeypatch):
    # The rank whose save failed removed the whole checkpoint and reports why; a rank still
    # writing then fails to open its file, and must not add a second, misleading error.
    state = _state(tmp_path)

    def removed_meanwhile(obj, path, *args, **kwargs):
        shutil.rmtree(Path(path).parent)
        raise RuntimeError("[enforce fail at inline_container.cc:747] . open file failed with strerror: "
                           "No such file or directory")

    monkeypatch.setattr(torch, "save", removed_meanwhile)
    with pytest.raises(RankExit):
        restart.save_checkpoint(state, 2)
    assert not state.run_dir.checkpoints.exists()
    assert "another rank's save failed" in state.said[-1]


def test_a_read_only_checkpoint_folder_is_reported_like_a_read_only_run_folder(tmp_path, monkeypatch):
    # Root ignores a chmod 0o555 folder (and os.access says yes), so the probe's write gets the
    # error a read-only mount gives.
    state = _state(tmp_path)
    real_write = Path.write_bytes

    def read_only(self, data):
        if self.name.startswith(".writable"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", read_only)
    with pytest.raises(CheckpointDiskError) as caught:
        restart.save_checkpoint(state, 2)
    message = str(caught.value)
    checkpoints = state.run_dir.checkpoints
    assert f"检查点目录 {checkpoints} 不可写" in message and f"the checkpoint folder {checkpoints} is not writable" in message
    assert "Read-only file system" in message and "nothing was written" in message
    assert "make it writable" in message and "WORKBOOK_RUNS" in message and "repartition_mode='live'" in message
    assert caught.value.reason == "unwritable" and state.engine.saves == 0


def test_a_checkpoint_folder_blocked_by_a_file_is_reported(tmp_path):
    state = _state(tmp_path)
    state.run_dir.checkpoints.write_text("not a folder")
    with pytest.raises(CheckpointDiskError, match=r"is not writable, so the restart-mode checkpoint .*NotADirectory"):
        restart.save_checkpoint(state, 2)
    assert state.engine.saves == 0 and state.run_dir.checkpoints.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o555 folder: the test above covers it")
def test_a_chmod_read_only_run_folder_is_reported(tmp_path):
    state = _state(tmp_path)
    state.run_dir.path.chmod(0o555)
    try:
        with pytest.raises(CheckpointDiskError, match="Permission denied"):
            restart.save_checkpoint(state, 2)
    finally:
        state.run_dir.path.chmod(0o755)


def test_a_restart_record_that_cannot_be_written_removes_the_checkpoint(tmp_path, monkeypatch):
    state = _state(tmp_path)
    monkeypatch.setattr(restart.dist, "barrier", lambda: None)

    def full(self, record):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.file(RunDir.RESTART)))

    monkeypatch.setattr(RunDir, "write_restart", full)
    with pytest.raises(CheckpointDiskError, match=r"no space left on the disk of .*run: .*its record restart\.json"):
        restart.request_restart(state, 2, [0, 2, 2])
    assert not state.run_dir.checkpoints.exists()


def test_a_successful_restart_request_ends_the_rank(tmp_path, monkeypatch):
    state = _state(tmp_path)
    monkeypatch.setattr(restart.dist, "barrier", lambda: None)
    with pytest.raises(RankExit):
        restart.request_restart(state, 2, [0, 2, 2])
    assert state.run_dir.read_restart()["tag"] == "step2"
    assert any("checking the checkpoint folder" in s for s in state.said)


def test_write_problems_are_read_from_errno_and_torchs_text():
    assert diskspace.write_problem(OSError(errno.ENOSPC, "No space left on device")) == "full"
    assert diskspace.write_problem(OSError(errno.EDQUOT, "Disk quota exceeded")) == "full"
    assert diskspace.write_problem(RuntimeError(ENFORCE)) == "full"
    assert diskspace.write_problem(RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")) \
        == "full"
    assert diskspace.write_problem(PermissionError(errno.EACCES, "Permission denied")) == "unwritable"
    assert diskspace.write_problem(OSError(errno.EROFS, "Read-only file system")) == "unwritable"
    assert diskspace.write_problem(RuntimeError("File /x/y.pt cannot be opened.")) == "unwritable"
    assert diskspace.write_problem(RuntimeError("Connection closed by peer")) is None
    assert diskspace.write_problem(ValueError("No space left")) is None
    assert diskspace.human(50_000) == "50.0 KB" and diskspace.human(3.2e9) == "3.2 GB" and diskspace.human(12) == "12 B"


# --- before launch --------------------------------------------------------------------------
RESTART = dict(**SMALL_GPT, num_stages=2, steps=4, device="cpu", repartition_mode="restart",
               partition=[0, 2, 4], repartition_at={2: (0, 1, 4)})


def test_a_disk_too_small_for_the_checkpoints_is_refused_before_launch(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10_000))
    with pytest.raises(CheckpointDiskError) as caught:
        plan_job(JobSpec(**RESTART), directory=tmp_path / "runs")
    message = str(caught.value)
    assert "磁盘空间不足" in message and f"the disk of {tmp_path} has 10.0 KB free" in message
    assert "1 restart(s) write at least" in message and "12 bytes each" in message  # fp32 weight + Adam's 2 moments
    assert "nothing was started" in message and "repartition_mode='live'" in message


def test_the_launch_check_counts_only_moves_and_only_restart_mode(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10_000))
    plan_job(JobSpec(**{**RESTART, "repartition_mode": "live"}), directory=tmp_path)
    plan_job(JobSpec(**{**RESTART, "repartition_at": {2: (0, 2, 4)}}), directory=tmp_path)  # no move
    plan_job(JobSpec(**{**RESTART, "repartition_at": {}}), directory=tmp_path)
    monkeypatch.undo()
    plan_job(JobSpec(**RESTART), directory=tmp_path)  # a real disk holds a few MB


@pytest.mark.parametrize("exc, failed, expected", [
    (PermissionError(13, "Permission denied"), None, "the checkpoint folder"),
    (PermissionError(13, "Permission denied"), "restart.json", "the run directory"),
    (OSError(errno.ENOSPC, "No space left on device"), None, "no space left on the disk of"),
])
def test_diagnose_names_a_checkpoint_disk_error(tmp_path, exc, failed, expected):
    """`utils.diagnose` explains the error a rank leaves (type and message) with its own code."""
    from utils.jobs.errors import explain

    error = restart._disk_error(exc, tmp_path / "checkpoints", "step2", failed=failed and tmp_path / failed)
    found = explain(f"{type(error).__name__}: {error}\nTraceback ...")
    assert found.code == "checkpoint-disk" and found.cause.count(expected) == 1, found
