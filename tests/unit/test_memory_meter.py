"""The per-instruction memory meter: it sees what is allocated and freed between samples."""

import pytest
import torch

from utils.runtime.memory import MemoryMeter, cpu_bytes_in_use

pytestmark = pytest.mark.skipif(cpu_bytes_in_use() is None, reason="needs glibc's mallinfo2 (Linux)")


def test_bytes_in_use_follow_a_tensor_allocated_and_freed():
    read = cpu_bytes_in_use()
    before = read()
    held = torch.empty(8 * 2**20, dtype=torch.uint8)
    during = read()
    del held
    after = read()
    assert 8 * 2**20 <= during - before < 9 * 2**20
    assert abs(after - before) < 2**20


def test_a_step_records_base_samples_and_peak():
    meter = MemoryMeter("cpu")
    meter.begin_step()
    kept = []
    for _ in range(3):  # three "instructions", each keeping 4 MiB alive
        kept.append(torch.empty(4 * 2**20, dtype=torch.uint8))
        meter.sample()
    kept.clear()
    meter.sample()
    row = meter.end_step(5)
    assert row["step"] == 5 and row["kind"] == "cpu_malloc_in_use" and len(row["after"]) == 4
    added = [a - row["base"] for a in row["after"]]
    assert [round(a / 2**20) for a in added[:3]] == [4, 8, 12]
    assert abs(added[3]) < 2**20
    assert row["peak"] == max(row["after"])
