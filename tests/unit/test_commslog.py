"""DeepSpeed's comms logger through its own ``timed_op``: its latencies are running sums per op
name (across message sizes), and `utils.analysis.comms` gives each op its own time back."""

import time
import types

import pytest
import torch

from utils.analysis.comms import CommOp, comm_ops
from utils.runtime.commslog import raw_record

SLEEP_S = {1000: 0.01, 3000: 0.03, 2000: 0.02}
"""Each fake receive sleeps this long for its element count: a lower bound on its time."""


@pytest.fixture
def timed_recv(monkeypatch):
    """DeepSpeed's ``@timed_op`` around a receive that only sleeps, with the comms logger on
    (as a ``"comms_logger"`` config section turns it on) and a stand-in backend."""
    from deepspeed.comm import comm

    backend = types.SimpleNamespace(using_mpi=False, is_initialized=lambda: True, get_world_size=lambda group=None: 2)
    monkeypatch.setattr(comm, "cdb", backend)
    logger = comm.comms_logger
    for name in ("enabled", "prof_all", "prof_ops", "verbose", "debug", "comms_dict"):
        monkeypatch.setattr(logger, name, getattr(logger, name))
    logger.comms_dict = {}
    config = types.SimpleNamespace(comms_logger_enabled=True, comms_logger=types.SimpleNamespace(
        verbose=False, debug=False, prof_ops=[], prof_all=True))
    logger.configure(config)
    monkeypatch.setattr(comm.timers, "timers", {})

    @comm.timed_op
    def recv(tensor, src=None, prof=False, log_name="recv", debug=None):
        time.sleep(SLEEP_S[tensor.numel()])

    return recv


def test_deepspeed_records_running_sums_across_message_sizes(timed_recv):
    for n in (1000, 3000, 1000, 2000):
        timed_recv(torch.zeros(n))
    raw = raw_record()
    assert set(raw) == {"recv"} and {size: row["count"] for size, row in raw["recv"].items()} == {
        "4000": 2, "12000": 1, "8000": 1}
    small = raw["recv"]["4000"]["cumulative_ms"]
    # The second 1000-element receive is recorded with the 3000-element one's time added in:
    # the running sum of every "recv", not its own ~10 ms.
    # timing-claim: construction — time.sleep sleeps at least as long as asked: lower bounds only
    assert small[1] - small[0] >= 1e3 * (SLEEP_S[3000] + SLEEP_S[1000])
    ops = comm_ops(raw)
    assert [op.bytes for op in ops] == [4000, 12000, 4000, 8000]  # the order they ran in
    assert [op.index for op in ops] == [0, 1, 2, 3]
    # timing-claim: construction — each fake receive sleeps at least its SLEEP_S
    assert all(op.ms >= 1e3 * SLEEP_S[op.bytes // 4] for op in ops)
    assert sum(op.ms for op in ops) == pytest.approx(raw["recv"]["8000"]["cumulative_ms"][-1])


def test_nothing_is_recorded_with_the_logger_off(monkeypatch):
    from deepspeed.comm import comm

    monkeypatch.setattr(comm.comms_logger, "enabled", False)
    assert raw_record() is None


def test_ops_of_different_names_keep_their_own_sums():
    raw = {"send": {"64": {"count": 2, "cumulative_ms": [1.0, 3.5]}},
           "recv": {"64": {"count": 1, "cumulative_ms": [7.0]}, "16": {"count": 1, "cumulative_ms": [2.0]}}}
    assert comm_ops(raw) == [CommOp("send", 64, 1.0, 0), CommOp("send", 64, 2.5, 1),
                             CommOp("recv", 16, 2.0, 0), CommOp("recv", 64, 5.0, 1)]
