"""The executor on its own, with tiny cells: timeouts, a loop that ignores interrupts, a
kernel that dies, the memory limit. Every case ends with the notebook still running."""

from __future__ import annotations

import asyncio

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


def test_cells_after_timeouts_crashes_and_memory_errors_still_run(tmp_path):
    cells = [Cell("x = 41", 30),
             Cell("while True:\n    pass", 2),              # interrupted: state survives
             Cell("x += 1\nprint(x)", 30),
             Cell(STUBBORN, 2),                              # interrupt ignored: restart + replay
             Cell("print('after restart', x)", 30),
             Cell("b = bytearray(3 * 1024 ** 3)", 30),       # over the 2 GiB address-space limit
             Cell("import os\nos._exit(3)", 30),             # the kernel dies: restart + replay
             Cell("print('alive', x)", 30)]
    log: list[str] = []
    outcomes = asyncio.run(run_cells(cells, tmp_path, kernel_env(tmp_path, ROOT), Limits(memory_gb=2),
                                     log=log.append))
    statuses = [o.status for o in outcomes]
    assert statuses == ["ok", "timeout", "ok", "timeout", "ok", "error", "dead", "ok"], statuses
    printed = ["".join(out.get("text", "") for out in o.outputs) for o in outcomes]
    assert printed[2] == "42\n"
    assert printed[4] == "after restart 42\n"  # replayed: x = 41, then x += 1
    assert outcomes[5].ename == "MemoryError"
    assert printed[7] == "alive 42\n"
    assert sum("restarting" in line for line in log) == 2
