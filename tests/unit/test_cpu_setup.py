"""CPU process setup shared by job ranks and the profiler: per-layer seeding without the
lazy-CUDA traceback, and the allocator that keeps freed memory.

The allocator is changed in child processes only, so this test process keeps its defaults.
"""

import random
import subprocess
import sys
import textwrap
import traceback

import numpy
import pytest
import torch

from utils.system.cpu import rank_threads
from utils.workloads.models import seed_layer


def _draws():
    return random.random(), float(numpy.random.rand()), torch.rand(3).tolist()


def test_seed_layer_leaves_the_generators_as_deepspeed_set_random_seed_does():
    from deepspeed.runtime.utils import set_random_seed

    set_random_seed(1234 + 5)
    expected = _draws()
    seed_layer(1234 + 5)
    assert _draws() == expected


def test_seed_layer_records_no_traceback_where_torch_manual_seed_does(monkeypatch):
    # Checked when the test runs, not at collection: an earlier test may start CUDA.
    if torch.cuda.is_initialized():
        pytest.skip("the lazy CUDA seed only exists before CUDA starts")
    calls = []
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: calls.append(1) or [])
    torch.manual_seed(7)  # queues a lazy CUDA seed with the caller's stack
    assert calls, "torch.manual_seed no longer records a stack: seed_layer's reason is gone"
    calls.clear()
    seed_layer(7)
    assert calls == []


def test_rank_threads_shares_the_cores_and_never_drops_below_one():
    import os

    cores = len(os.sched_getaffinity(0))
    assert rank_threads(1) == cores
    assert rank_threads(cores * 4) == 1


RSS_AFTER_FREE = textwrap.dedent("""
    import sys
    import psutil, torch
    from utils.system.cpu import keep_freed_memory
    tuned = keep_freed_memory() if sys.argv[1] == "tuned" else None
    process = psutil.Process()
    base = process.memory_info().rss
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    del big
    print(tuned, (process.memory_info().rss - base) / 2**20)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_keeps_a_freed_block_that_the_default_returns():
    def kept(mode):
        out = subprocess.run([sys.executable, "-c", RSS_AFTER_FREE, mode], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0], float(out[1])

    assert kept("default")[1] < 16  # served by mmap and unmapped on free
    tuned, mib = kept("tuned")
    assert tuned == "True"
    assert mib > 48  # stayed in the heap for the next step's buffers
