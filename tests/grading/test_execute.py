"""The executor on its own, with tiny cells: timeouts, a loop that ignores interrupts, a
kernel that dies, the memory limit. Every case ends with the notebook still running."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.grading.submissions import ROOT
from utils.grading.execute import Cell, kernel_env, run_cells
from utils.grading.sandbox import Limits

STUBBORN = """
import time
while True:
    try:
        time.sleep(0.1)
    except BaseException:
        pass
"""


def _run(cells, tmp_path, limits=Limits(), log=None):
    return asyncio.run(run_cells(cells, tmp_path, kernel_env(tmp_path, ROOT), limits,
                                 log=log.append if log is not None else lambda text: None))


def _printed(outcomes):
    return ["".join(out.get("text", "") for out in o.outputs) for o in outcomes]


def test_cells_after_timeouts_and_crashes_still_run(tmp_path):
    cells = [Cell("x = 41", 30),
             Cell("while True:\n    pass", 2),              # interrupted: state survives
             Cell("x += 1\nprint(x)", 30),
             Cell(STUBBORN, 2),                              # interrupt ignored: restart + replay
             Cell("print('after restart', x)", 30),
             Cell("import os\nos._exit(3)", 30),             # the kernel dies: restart + replay
             Cell("print('alive', x)", 30)]
    log: list[str] = []
    outcomes = _run(cells, tmp_path, log=log)
    statuses = [o.status for o in outcomes]
    assert statuses == ["ok", "timeout", "ok", "timeout", "ok", "dead", "ok"], statuses
    printed = _printed(outcomes)
    assert printed[2] == "42\n"
    assert printed[4] == "after restart 42\n"  # replayed: x = 41, then x += 1
    assert printed[6] == "alive 42\n"
    assert sum("restarting" in line for line in log) == 2


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"),
                    reason="the sandbox skips the address-space limit where an NVIDIA driver is present")
def test_the_memory_limit_gives_a_memory_error_and_the_kernel_lives_on(tmp_path):
    cells = [Cell("x = 41", 30),
             Cell("b = bytearray(3 * 1024 ** 3)", 30),       # over the 2 GiB address-space limit
             Cell("print('alive', x)", 30)]
    outcomes = _run(cells, tmp_path, Limits(memory_gb=2))
    assert [o.status for o in outcomes] == ["ok", "error", "ok"]
    assert outcomes[1].ename == "MemoryError"
    assert _printed(outcomes)[2] == "alive 41\n"


def test_a_cell_that_dies_in_replay_is_dropped_and_the_replay_starts_over(tmp_path):
    marker = tmp_path / "replayed"
    cells = [Cell("x = 41", 30),
             Cell(f"import os\nif os.path.exists({str(marker)!r}):\n    os._exit(1)\n"   # ok now,
                  f"open({str(marker)!r}, 'w').close()", 30),                            # dies in replay
             Cell("y = 1", 30),
             Cell("import os\nos._exit(3)", 30),             # restart: the replay kills a kernel too
             Cell("print('state', x, y)", 30)]
    log: list[str] = []
    outcomes = _run(cells, tmp_path, log=log)
    assert [o.status for o in outcomes] == ["ok", "ok", "ok", "dead", "ok"]
    assert _printed(outcomes)[4] == "state 41 1\n"  # x was set before the dropped cell: replayed again
    assert sum("restarting" in line for line in log) == 1
    assert sum("replay:" in line and "dead" in line for line in log) == 1
