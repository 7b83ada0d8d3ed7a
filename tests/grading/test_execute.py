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


def test_the_kernel_cannot_write_into_the_graders_log(tmp_path):
    """Issue 37, point 7: a grading worker sends its stdout and stderr to the instructor's log
    (`batch._child`), and a kernel started with inherited descriptors 1 and 2 could append a
    forged line to it. The kernel's own descriptors 1 and 2 now lead nowhere the grader reads."""
    import subprocess
    import sys
    import textwrap

    log, result = tmp_path / "instructor.log", tmp_path / "result.txt"
    script = textwrap.dedent(f"""
        import asyncio, os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from utils.grading.execute import Cell, kernel_env, run_cells
        from utils.grading.sandbox import Limits
        log = open({str(log)!r}, "a", buffering=1)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        print("grader: started", flush=True)
        code = ("import os\\n"
                "os.write(1, b'FORGED: no errors\\\\n'); os.write(2, b'FORGED: no errors\\\\n')\\n"
                "print(sorted(os.readlink(f'/proc/self/fd/{{fd}}') for fd in (0, 1, 2)))")
        work = {str(tmp_path / "work")!r}
        os.makedirs(work)
        outcome, = asyncio.run(run_cells([Cell(code, 60)], __import__("pathlib").Path(work),
                                         kernel_env(__import__("pathlib").Path(work), {str(ROOT)!r}), Limits()))
        open({str(result)!r}, "w").write(outcome.status + "\\n" + "".join(o.get("text", "") for o in outcome.outputs))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, log.read_text()[-3000:]
    status, fds = result.read_text().split("\n", 1)
    print("the kernel's descriptors 0-2:", fds.strip())
    assert status == "ok" and str(log) not in fds
    assert "FORGED" not in log.read_text() and "grader: started" in log.read_text()
