"""A submission stays inside its grading: no process outlives it, all of its processes
together stay within the memory budget, and a flood of output grows neither the grader nor
the instructor notebook. Each case is a lab 3 submission with one answer cell changed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import fields, replace
from pathlib import Path

import psutil
import pytest

from tests.grading.submissions import ROOT, TEST_TIMEOUT, build, not_passed
from utils.grading.batch import grade_batch
from utils.grading.grade import Options
from utils.grading.notebook_source import LabSource, find_lab
from utils.grading.sandbox import Limits

LAB = LabSource.load(find_lab(ROOT, "lab03"))
GIB = 1024 ** 3
DAEMON_SLEEP = 6.0
"""Seconds the escaping daemon waits before it writes its marker: longer than what is left
of the submission's grading after the cell that starts it."""


def submission(task: str, extra: str, *, replace: bool = False) -> str:
    """The correct lab 3 submission with `extra` code added to the answer cell of `task`
    (or, with `replace`, that cell's function wrapped: `extra` is the body of a new
    function of the same name that calls the original, ``_original``)."""
    nb = json.loads(build(LAB, "correct"))
    cell = next(c for c in nb["cells"] if c.get("metadata", {}).get("grading", {}).get("task") == task
                and c["metadata"]["grading"]["kind"] == "answer")
    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    if replace:
        source += f"\n\n_original = {task}\n\n\n" + extra
    else:
        source += "\n\n" + extra
    cell["source"] = source
    return json.dumps(nb, ensure_ascii=False)


def unisolated() -> Options:
    """Grading options without the kernel isolation, where the sandbox has that setting:
    containment must hold on its own (trusted mode, or where bubblewrap does not work), and
    an isolated kernel could neither write the files this test looks for (its /tmp is
    private) nor signal its grading process (another pid namespace)."""
    limits = Limits()
    if "isolation" in {f.name for f in fields(Limits)}:
        limits = replace(limits, isolation="none")
    return Options(limits=limits)


def _double_fork(pidfile: Path, marker: Path, then: str = "") -> str:
    """Cell code: a daemon (fork, setsid, fork) that records its pid, sleeps, then writes
    `marker` outside the submission's working directory; `then` runs in the kernel after."""
    return textwrap.dedent(f"""
        import os as _os, time as _time
        _first = _os.fork()
        if _first == 0:
            _os.setsid()
            if _os.fork() == 0:
                with open({str(pidfile)!r}, "w") as _f:
                    _f.write(str(_os.getpid()))
                _time.sleep({DAEMON_SLEEP})
                with open({str(marker)!r}, "w") as _f:
                    _f.write("escaped")
            _os._exit(0)
        _os.waitpid(_first, 0)
        while not _os.path.exists({str(pidfile)!r}):
            _time.sleep(0.01)
        """) + then


def test_a_double_forked_daemon_is_ended_with_its_submission(tmp_path):
    """Attack A: a daemon escaped the kernel's process tree and wrote files after the batch.
    Also the variant that kills its own grading process after starting the daemon (the
    daemon is then re-parented to the batch process, which ends it)."""
    tag = uuid.uuid4().hex[:12]
    files = {kind: (Path(f"/tmp/grading-daemon-{tag}-{kind}.pid"), Path(f"/tmp/grading-daemon-{tag}-{kind}.marker"))
             for kind in ("daemon", "kills_grader")}
    then = {"daemon": "", "kills_grader": "\nimport signal as _signal\n_os.kill(_os.getppid(), _signal.SIGKILL)\n"}
    folder = tmp_path / "submissions"
    folder.mkdir()
    for kind, (pidfile, marker) in files.items():
        (folder / f"{kind}.ipynb").write_text(
            submission("speedup_over_uniform", _double_fork(pidfile, marker, then[kind])), encoding="utf-8")
    # Children this process had before (multiprocessing's resource tracker, started by an
    # earlier test that profiled layers in-process) are not the batch's.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        results = {r.student: r for r in grade_batch(LAB, folder, tmp_path / "out", workers=2,
                                                     options=unisolated(), echo=lambda text: None)}
        returned = time.monotonic()
        assert results["daemon"].total == 10, not_passed(results["daemon"])
        assert "评分进程异常退出" in (results["kills_grader"].error or "")
        pids = {}
        for kind, (pidfile, _) in files.items():
            assert pidfile.exists(), f"{kind}: the daemon never started"
            pids[kind] = int(pidfile.read_text())
        # Gone at once, not only before the marker would be written.
        assert not [kind for kind, pid in pids.items() if _alive(pid)], "a daemon outlived the batch"
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        assert not left, f"the batch left processes behind: {left}"
        time.sleep(max(0.0, DAEMON_SLEEP + 1.5 - (time.monotonic() - returned)))
        assert not [kind for kind, (_, marker) in files.items() if marker.exists()], "a daemon wrote after the batch"
    finally:
        for pidfile, marker in files.values():
            if pidfile.exists() and _alive(int(pidfile.read_text() or 0)):
                os.kill(int(pidfile.read_text()), 9)
            pidfile.unlink(missing_ok=True)
            marker.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


CHILD = """
import time
kept = []
for _ in range(24):  # 1.5 GiB in 64 MiB steps, as a program that grows would
    b = bytearray(64 * 2 ** 20)
    b[::4096] = b"\\x01" * (len(b) // 4096)  # touched: resident, not just reserved
    kept.append(b)
    time.sleep(0.05)
time.sleep(60)
"""

HOG = f"""
def stage_loads(costs, parts):
    # The first call starts three processes of 1.5 GiB each and waits for them: 4.5 GiB
    # together, each far below the per-process limit.
    import os, subprocess, sys
    if not os.path.exists("hogged"):
        open("hogged", "w").close()
        children = [subprocess.Popen([sys.executable, "-c", {CHILD!r}]) for _ in range(3)]
        for child in children:
            child.wait()
    return _original(costs, parts)
"""

BATCH_SCRIPT = """
import json, sys
from utils.grading.batch import grade_batch
from utils.grading.containment import Budget
from utils.grading.grade import Options
results = grade_batch(sys.argv[1], sys.argv[2], sys.argv[3], workers=1, budget=Budget(memory_gb=float(sys.argv[4])),
                      options=Options(timeout=float(sys.argv[5])), echo=lambda text: None)
print(json.dumps([r.to_dict() for r in results]))
"""


def _tree_rss(top: psutil.Process) -> int:
    """RSS of everything below the grading processes (the kernels and their children)."""
    try:
        workers = top.children()
    except psutil.Error:
        return 0
    total = 0
    for worker in workers:
        try:
            below = worker.children(recursive=True)
        except psutil.Error:
            continue
        for p in below:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
    return total


def _workers_rss(top: psutil.Process) -> int:
    """Largest RSS among the grading processes themselves (the batch process's children)."""
    try:
        return max([0] + [w.memory_info().rss for w in top.children()])
    except psutil.Error:
        return 0


def _run_sampling(batch: subprocess.Popen, measure, *, every: float, timeout: float) -> tuple[str, int]:
    """Wait for `batch` while a thread samples ``measure(batch process)`` every `every`
    seconds; its stdout and the largest sample. The batch is killed if it outlives `timeout`."""
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        top = psutil.Process(batch.pid)
        while not done.is_set():
            peak = max(peak, measure(top))
            time.sleep(every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, _ = batch.communicate(timeout=timeout)
    finally:
        done.set()
        sampler.join()
        if batch.poll() is None:
            batch.kill()
    return stdout, peak


def test_the_memory_budget_covers_all_processes_of_a_submission_together(tmp_path):
    """Attack C: three children of 1.5 GiB each under a 3 GiB budget for the submission."""
    budget_gb = 3.0
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "hog.ipynb").write_text(submission("stage_loads", HOG, replace=True), encoding="utf-8")
    out = tmp_path / "out"
    batch = subprocess.Popen([sys.executable, "-c", BATCH_SCRIPT, str(LAB.path), str(folder), str(out),
                              str(budget_gb), str(TEST_TIMEOUT)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    stdout, peak = _run_sampling(batch, _tree_rss, every=0.02, timeout=240)
    assert batch.returncode == 0
    hog = json.loads(stdout.splitlines()[-1])[0]
    assert hog["error"] is None  # the grader survived and graded the rest
    statuses = {c["id"]: c["status"] for c in hog["checks"]}
    assert statuses["loads_public"] == "memory", statuses
    assert all(s == "passed" for cid, s in statuses.items() if cid != "loads_public"), statuses
    message = next(c["message"] for c in hog["checks"] if c["id"] == "loads_public")
    assert "超过了每份提交 3 GiB 的上限" in message and "已全部终止" in message, message  # feedback explains it
    log = (out / "instructor" / "hog.log").read_text(encoding="utf-8")
    assert "memory budget exceeded" in log
    # Sampled every 20 ms: at most one watchdog interval of allocation over the budget.
    assert peak < (budget_gb + 1.0) * GIB, f"the submission's processes reached {peak / GIB:.2f} GiB"
    assert peak > 2.0 * GIB  # the sampler did see the allocation


DISK_WRITER = """
def stage_loads(costs, parts):
    import time
    with open("big.bin", "wb") as f:   # the kernel's working folder: the submission's own
        for _ in range(64):
            f.write(b"x" * 2 ** 20)
    time.sleep(4)                      # the watchdog looks about once a second
    return _original(costs, parts)
"""


def test_a_submission_that_fills_the_disk_is_stopped_and_the_batch_goes_on(tmp_path):
    """Issue 37, point 6: 64 MiB written into the working folder under a 16 MiB disk budget:
    the processes are killed, the file removed, the feedback says why, the next submission
    is graded in full."""
    from utils.grading.containment import Budget

    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "filler.ipynb").write_text(submission("stage_loads", DISK_WRITER, replace=True), encoding="utf-8")
    (folder / "honest.ipynb").write_text(build(LAB, "correct"), encoding="utf-8")
    results = {r.student: r for r in grade_batch(LAB.path, folder, tmp_path / "out", workers=1,
                                                  budget=Budget(disk_mib=16), options=Options(timeout=TEST_TIMEOUT),
                                                  echo=lambda text: None)}
    filler = {c.id: c for c in results["filler"].checks}
    assert filler["loads_public"].status == "memory", not_passed(results["filler"])
    assert "超过了每份提交 16 MiB 的上限" in filler["loads_public"].message and "写入的文件已删除" in \
        filler["loads_public"].message
    assert results["honest"].total == 10, not_passed(results["honest"])
    log = (tmp_path / "out" / "instructor" / "filler.log").read_text(encoding="utf-8")
    assert "disk budget exceeded" in log


def _graded_through_the_command_line(tmp_path, name: str, extra: str) -> tuple[str, float, Path]:
    """A correct lab 3 submission with `extra` in the stage_loads answer cell, graded as an
    instructor types it, one worker: what it printed, the grading process's peak memory (MiB;
    sampled every 10 ms and its own ru_maxrss from the log, the larger) and the output folder."""
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / f"{name}.ipynb").write_text(submission("stage_loads", extra), encoding="utf-8")
    out = tmp_path / "out"
    batch = subprocess.Popen([sys.executable, "-m", "utils.grading", "grade", "lab03", str(folder), "--out", str(out),
                              "--workers", "1", "--timeout", str(TEST_TIMEOUT)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stdout, sampled = _run_sampling(batch, _workers_rss, every=0.01, timeout=300)
    assert batch.returncode == 0, stdout
    log = (out / "instructor" / f"{name}.log").read_text(encoding="utf-8")
    logged = re.search(r"grading process peak RSS (\d+) MiB", log)  # the grading process's own ru_maxrss
    return stdout, max(sampled / 1024 ** 2, float(logged.group(1)) if logged else 0.0), out


FLOOD = 'for _ in range(200):\n    print("x" * 10 ** 6)\n'


def test_an_output_flood_grows_neither_the_grader_nor_the_instructor_notebook(tmp_path):
    """Attack D: 200 MiB printed by one cell."""
    stdout, peak, out = _graded_through_the_command_line(tmp_path, "flood", FLOOD)
    assert "flood: 10/10" in stdout
    assert peak < 300, f"the grading process reached {peak:.0f} MiB"
    executed = out / "instructor" / "flood.ipynb"
    assert executed.stat().st_size < 1024 ** 2
    text = executed.read_text(encoding="utf-8")
    assert re.search(r"\[output cut: 19\d\.\d MiB more\]", text)
    assert (out / "instructor" / "flood.log").stat().st_size < 64 * 1024


@pytest.mark.parametrize("size", [10 ** 7])
def test_a_large_rich_output_is_replaced_by_a_note(tmp_path, size):
    """One ``execute_result`` of 10 MB (a long repr) is not kept whole."""
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "rich.ipynb").write_text(submission("stage_loads", f"'y' * {size}\n"), encoding="utf-8")
    results = grade_batch(LAB, folder, tmp_path / "out", workers=1, echo=lambda text: None)
    assert results[0].total == 10
    executed = tmp_path / "out" / "instructor" / "rich.ipynb"
    assert executed.stat().st_size < 1024 ** 2
    assert "not kept]" in executed.read_text(encoding="utf-8")


HOSTILE_DISPLAY = """
_ip = get_ipython()
# Around the kernel's own bound on rich output: the publisher's class method, not the instance's.
type(_ip.display_pub).publish(_ip.display_pub, {"text/html": "z" * (300 * 2 ** 20)})
"""


def test_a_huge_display_that_undoes_the_kernels_bound_never_reaches_the_grader(tmp_path):
    """Issue 37, point 8: 300 MiB in one display, sent around the kernel's bound. Before: the
    grading process read it whole (~960 MiB); now its socket refuses the message unread."""
    _, peak, out = _graded_through_the_command_line(tmp_path, "display", HOSTILE_DISPLAY)
    result = json.loads((out / "instructor" / "display.result.json").read_text(encoding="utf-8"))["result"]
    # The cell that sent it fails with a clear note (its function is lost with the kernel, which is
    # replaced); the grading goes on: the other tasks' checks pass.
    assert any("超过了每条消息 32 MiB 的上限" in issue["message"] for issue in result["issues"]), result["issues"]
    statuses = {c["id"]: c["status"] for c in result["checks"]}
    assert all(status == "passed" for cid, status in statuses.items() if cid.startswith("balanced")), statuses
    assert peak < 300, f"the grading process reached {peak:.0f} MiB"
    assert (out / "instructor" / "display.ipynb").stat().st_size < 1024 ** 2


def test_the_kernel_cuts_a_large_display_before_sending_it():
    from utils.grading.kernel_output import REPLY_MIME, bounded_bundle

    small = {"text/plain": "x"}
    assert bounded_bundle(small, 100) is small
    cut = bounded_bundle({"text/plain": "p" * 5000, "text/html": "h" * 5000}, 1000)
    assert cut["text/plain"].startswith("p" * 1000) and "not kept]" in cut["text/plain"] and len(cut) == 1
    reply = {REPLY_MIME: {"value": "v" * 5000}}
    assert bounded_bundle(reply, 1000) is reply  # the grader's own replies are never cut


def _msg(kind: str, **content) -> dict:
    return {"msg_type": kind, "header": {"msg_type": kind}, "parent_header": {"msg_id": "cell"},
            "metadata": {}, "content": content}


def test_the_client_keeps_a_bounded_part_of_every_kind_of_output():
    """No kernel: messages fed to the client's output hook, as nbclient does."""
    import nbformat

    from utils.grading.containment import Budget
    from utils.grading.execute import BoundedClient, OutputBudget

    budget = OutputBudget(Budget(stream_kib=1, output_kib=4, total_mib=1))
    client = BoundedClient(nbformat.v4.new_notebook())
    client.output_budget = budget
    client.clear_before_next_output = False  # set by nbclient when a cell starts
    outs: list = []
    for _ in range(10):  # 10 KiB of stream text: 1 KiB (+1 KiB for the kernel's note) kept
        client.output(outs, _msg("stream", name="stdout", text="z" * 1024), None, 0)
    client.output(outs, _msg("execute_result", data={"text/plain": "r" * 10_000}, metadata={},
                             execution_count=1), None, 0)
    client.output(outs, _msg("display_data", data={"image/png": "i" * 1000, "text/plain": "<Figure>"},
                             metadata={}), None, 0)
    client.output(outs, _msg("error", ename="ValueError", evalue="v" * 10 ** 6, traceback=["line"] * 1000),
                  None, 0)
    stream = "".join(o["text"] for o in outs if o["output_type"] == "stream" and o["name"] == "stdout")
    assert len(stream) == 2048
    notes = [o["text"] for o in outs if o["output_type"] == "stream" and o["name"] == "stderr"]
    assert notes == ["[output cut: 8 KiB more]\n"]
    result = next(o for o in outs if o["output_type"] == "execute_result")
    assert result["data"]["text/plain"].endswith("[output cut: execute_result of 10 KiB not kept]")
    assert next(o for o in outs if o["output_type"] == "display_data")["data"]["image/png"] == "i" * 1000
    error = next(o for o in outs if o["output_type"] == "error")
    assert len(error["evalue"]) <= 4096 and len(error["traceback"]) <= 40
    budget.commit()
    # The submission's total: once it is spent, rich outputs are replaced by a note.
    budget.committed = budget.total_limit
    outs = []
    client.output(outs, _msg("display_data", data={"text/html": "<b>x</b>", "text/plain": "x"}, metadata={}),
                  None, 1)
    client.output(outs, _msg("stream", name="stdout", text="more"), None, 1)
    assert "not kept]" in outs[0]["data"]["text/plain"]
    assert outs[-1]["text"] == "[output cut: 4 B more]\n"
