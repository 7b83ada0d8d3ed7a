"""Stale JIT build locks (utils.system.extensions) on a temporary extensions directory."""

import os

from utils.system.extensions import build_locks, remove_stale_build_locks


def _lock(root, op="deepspeed_shm_comm"):
    (root / op).mkdir()
    return root / op / "lock"


def test_a_lock_no_process_holds_is_stale_and_removed(tmp_path):
    lock = _lock(tmp_path)
    # As torch's FileBaton creates it, by a process that then died without removing it.
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))
    (found,) = build_locks(tmp_path)
    assert found.path == lock and found.stale and found.holders == ()
    assert remove_stale_build_locks(tmp_path, settle=0.05) == [lock]
    assert not lock.exists()
    assert (tmp_path / "deepspeed_shm_comm").is_dir()  # the built op stays
    assert build_locks(tmp_path) == []


def test_a_lock_held_open_is_kept_and_its_holder_reported(tmp_path):
    held, stale = _lock(tmp_path, "held_op"), _lock(tmp_path, "stale_op")
    fd = os.open(held, os.O_CREAT | os.O_EXCL)  # FileBaton keeps this fd open while it builds
    try:
        os.close(os.open(stale, os.O_CREAT | os.O_EXCL))
        locks = {lock.path: lock for lock in build_locks(tmp_path)}
        assert locks[held].holders == (os.getpid(),) and not locks[held].stale
        assert locks[stale].stale
        assert remove_stale_build_locks(tmp_path, settle=0.05) == [stale]
        assert held.exists() and not stale.exists()
    finally:
        os.close(fd)


def test_a_directory_without_locks_or_missing_costs_nothing(tmp_path):
    (tmp_path / "some_op").mkdir()
    assert build_locks(tmp_path) == [] and remove_stale_build_locks(tmp_path) == []
    assert build_locks(tmp_path / "missing") == [] and remove_stale_build_locks(tmp_path / "missing") == []


def test_a_lock_released_while_settling_is_not_removed_twice(tmp_path, monkeypatch):
    """FileBaton.release closes its fd and then deletes the file: unheld for an instant.
    A lock gone by the second look is left alone (nothing to remove, nothing reported)."""
    import utils.system.extensions as extensions

    lock = _lock(tmp_path)
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))
    monkeypatch.setattr(extensions.time, "sleep", lambda seconds: lock.unlink())
    assert remove_stale_build_locks(tmp_path) == []
