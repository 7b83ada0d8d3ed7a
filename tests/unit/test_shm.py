"""DeepSpeed's shared-memory buffers (`utils.system.shm`, issue 38 point 1) without a job:
their size from the installed source, which are stale, and the refusal before launch."""

import re
import subprocess
import sys

import pytest

import deepspeed
from utils import JobSpec, start_job
from utils.system import shm

SPEC = {"model": "gpt", "micro_batch_size": 2, "num_stages": 2, "micro_batches": 2, "steps": 2, "device": "cpu",
        "model_options": {"blocks": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 16}}


def test_the_buffer_size_is_read_from_the_installed_source():
    source = shm._shm_source()
    text = source.read_text()
    print(*re.findall(r"^#define (?:MAX_BUF_SIZE|NAIVE_ALLREDUCE_THRESHOLD|SHM_BUFFER_NAME) .*$", text, flags=re.M),
          sep="\n")
    assert f'#define SHM_BUFFER_NAME "{shm.BUFFER_PREFIX}"' in text
    assert '"%s_%d_%s_%s",\n             SHM_BUFFER_NAME,\n             getuid(),' in text  # the name's parts
    if deepspeed.__version__ == "0.19.8":
        assert shm.buffer_bytes() == shm.WORKSPACE_BYTES_0_19_8 == 69206024


def test_a_buffer_no_process_holds_is_stale_and_a_held_one_is_not(tmp_path):
    prefix = f"{shm.BUFFER_PREFIX}_{shm.os.getuid()}_127.0.0.1_"
    for name in (f"{prefix}4000_0", f"{prefix}4000_1", f"{prefix}5000_0", "someone_elses_file"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    # a live process maps 5000_0, as a running rank does
    holder = subprocess.Popen([sys.executable, "-c", (
        "import mmap, sys; f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 4096); f.close(); "
        "print('mapped', flush=True); sys.stdin.read()"), str(tmp_path / f"{prefix}5000_0")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        assert [p.name for p in shm.stale_buffers(shm_dir=tmp_path)] == [f"{prefix}4000_0", f"{prefix}4000_1"]
        assert [p.name for p in shm.job_buffers("127.0.0.1", 5000, shm_dir=tmp_path)] == [f"{prefix}5000_0"]
        names, freed = shm.remove_stale_buffers(shm_dir=tmp_path)
        assert names == [f"{prefix}4000_0", f"{prefix}4000_1"] and freed == 2 * 4096
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"{prefix}5000_0", "someone_elses_file"]
    finally:
        holder.communicate("")
    assert [p.name for p in shm.stale_buffers(shm_dir=tmp_path)] == [f"{prefix}5000_0"]  # its holder ended
    assert shm.remove_job_buffers("127.0.0.1", 5000, shm_dir=tmp_path) == 4096


def test_too_little_shared_memory_is_refused_before_launch(tmp_path, monkeypatch):
    """A container's default /dev/shm is 64 MB; two ranks need 132 MiB. Refused with the
    numbers and the fix before any process or run directory exists."""
    class Small:
        f_frsize = 4096
        f_bavail = 64 * 2 ** 20 // 4096

    monkeypatch.setattr(shm.os, "statvfs", lambda path: Small())
    monkeypatch.setattr(shm, "stale_buffers", lambda **_: [])
    with pytest.raises(ValueError, match=r"not enough room in /dev/shm.*132 MiB in all.*64 MiB free.*--shm-size"):
        start_job(JobSpec(**SPEC, launcher="deepspeed"), directory=tmp_path)
    assert list(tmp_path.iterdir()) == []
