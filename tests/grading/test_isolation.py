"""Isolation of grading kernels (utils/grading/isolation.py): what a process or a real kernel
started through the sandbox can read, write, see and signal; that interrupts still reach the
kernel; that a lab's real DeepSpeed job runs inside.

Every command here is built the way the grader builds a kernel's (`Limits.wrapper_args` with
an `Isolation`), without going through the grader, so each test fails without isolation.
Skipped where bubblewrap does not work, except in CI (``CI=true``: .ci/run installs it),
where that is a failure.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from tests.grading.submissions import ROOT
from utils.grading import isolation
from utils.grading.isolation import (IPYTHON_DIR, NOBODY, Isolation, IsolationError, bwrap_problem,
                                     check_mode, unprivileged_works)
from utils.grading.sandbox import Limits

pytestmark = pytest.mark.skipif(bwrap_problem() is not None and not os.environ.get("CI"),
                                reason=f"bubblewrap does not work here: {bwrap_problem()}")

SOLUTION = sorted((ROOT / "solutions").glob("lab*.ipynb"))[0]
ERRORS = (errno.EROFS, errno.EACCES, errno.EPERM)
TIMEOUT_ENAME = "CellTimeout"


@pytest.fixture
def outside():
    """A folder outside /tmp (the sandbox's /tmp is private anyway: hiding must be shown
    where the kernel would otherwise see the real thing)."""
    base = "/var/tmp" if os.path.isdir("/var/tmp") else str(ROOT / "build")
    os.makedirs(base, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="isolation-test-", dir=base))
    path.chmod(0o755)  # readable by any uid: what keeps the kernel out must be the sandbox
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(scratch: Path) -> dict[str, str]:
    """The kernel environment the grader builds (`execute.kernel_env`), with the IPYTHONDIR
    it used to set: inside the submission's own folder."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["WORKBOOK_RUNS"] = str(scratch / "runs")
    env["IPYTHONDIR"] = str(scratch / ".ipython")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _sandboxed(iso: Isolation, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    iso.kernel_manager_settings()
    iso.prepare()
    command = Limits().wrapper_args(iso) + [sys.executable, "-c", code]
    return subprocess.run(command, env=_env(iso.scratch), capture_output=True, text=True, timeout=timeout)


PROBE = r'''
import json, os, socket
args = ARGS
found = {}
def attempt(name, action):
    try:
        found[name] = ["ok", action()]
    except OSError as error:
        found[name] = ["error", error.errno]
attempt("read_solution", lambda: len(open(args["solution"]).read()))
attempt("list_solutions", lambda: os.listdir(args["solutions"]))
attempt("read_git", lambda: len(open(args["git_head"]).read()))
attempt("read_lab", lambda: len(open(args["lab"]).read()))
attempt("read_output", lambda: len(open(args["output_file"]).read()))
attempt("list_other_submission", lambda: os.listdir(args["other"]))
attempt("read_classmate", lambda: len(open(args["classmate"]).read()))
attempt("write_project", lambda: open(os.path.join(args["project"], "isolation-probe"), "w").close())
attempt("write_output", lambda: open(os.path.join(args["output"], "forged.csv"), "w").close())
attempt("write_scratch", lambda: open(os.path.join(args["scratch"], "mine.txt"), "w").write("x"))
attempt("signal_grader", lambda: os.kill(args["grader"], 0))
attempt("connect_grader", lambda: socket.create_connection(("127.0.0.1", args["port"]), timeout=2).close())
found["grader_in_proc"] = os.path.exists("/proc/%d" % args["grader"])
found["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
found["uid"] = os.getuid()
print("PROBE" + json.dumps(found))
'''


def test_a_sandboxed_process_reads_and_writes_only_what_it_may(tmp_path, outside):
    scratch, other = tmp_path / "scratch", tmp_path / "other-submission"
    scratch.mkdir()
    other.mkdir()
    (other / "answers.py").write_text("secret", encoding="utf-8")
    output, lab = outside / "out", outside / "lab01_source.ipynb"
    (output / "instructor").mkdir(parents=True)
    (output / "grades.csv").write_text("student,total\n", encoding="utf-8")
    lab.write_text(SOLUTION.read_text(encoding="utf-8"), encoding="utf-8")
    # The batch's submissions folder, outside /tmp, as `batch` hides it: a classmate's notebook in it.
    classmates = outside / "submissions"
    classmates.mkdir()
    (classmates / "classmate.ipynb").write_text("{}", encoding="utf-8")
    for path in (tmp_path, other, output, output / "instructor"):
        path.chmod(0o777)  # writable by any uid, even the kernel's
    listener = socket.create_server(("127.0.0.1", 0))
    args = {"solution": str(SOLUTION), "solutions": str(SOLUTION.parent), "git_head": str(ROOT / ".git" / "HEAD"),
            "lab": str(lab), "output_file": str(output / "grades.csv"), "output": str(output),
            "other": str(other), "classmate": str(classmates / "classmate.ipynb"), "project": str(ROOT), "scratch": str(scratch), "grader": os.getpid(),
            "port": listener.getsockname()[1]}
    # What the kernel would get without isolation: all of it is there and readable.
    assert SOLUTION.read_text(encoding="utf-8") and lab.stat().st_size > 0 and (output / "grades.csv").exists()
    try:
        done = _sandboxed(Isolation(scratch, hide=(output, lab, classmates)), PROBE.replace("ARGS", repr(args)))
    finally:
        listener.close()
        written = (ROOT / "isolation-probe").exists()
        (ROOT / "isolation-probe").unlink(missing_ok=True)  # only there if the sandbox failed
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.split("PROBE", 1)[1])
    assert found["read_solution"][0] == "error" and found["list_solutions"] == ["ok", []]
    if (ROOT / ".git").exists():
        assert found["read_git"][0] == "error"
    assert found["read_lab"] in (["ok", 0], ["error", errno.EACCES])  # /dev/null (nodev) over it
    assert found["read_output"][0] == "error"
    assert found["list_other_submission"][0] == "error"      # a private /tmp
    assert found["read_classmate"][0] == "error"             # the batch's submissions folder, hidden
    assert found["write_project"][0] == "error" and found["write_project"][1] in ERRORS, found
    assert found["write_output"][0] == "error" and found["write_output"][1] in ERRORS, found
    assert found["write_scratch"][0] == "ok" and (scratch / "mine.txt").read_text() == "x"
    assert found["signal_grader"] == ["error", errno.ESRCH] and not found["grader_in_proc"]
    assert found["connect_grader"][0] == "error"             # a network of its own
    assert max(found["pids"]) < 10, found["pids"]            # only the sandbox's own processes
    assert not written and not (output / "forged.csv").exists()
    if os.geteuid() == 0 and unprivileged_works():
        assert found["uid"] == NOBODY


class _IsolatedKernelManager(AsyncKernelManager):
    """What `execute.LimitedKernelManager` does with an isolation: prepare the scratch
    folder once the connection file is written, then sandbox + limits + kernel."""

    isolation: Isolation | None = None

    def format_kernel_cmd(self, extra_arguments=None):
        self.isolation.prepare()
        return Limits().wrapper_args(self.isolation) + super().format_kernel_cmd(extra_arguments)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        self.isolation.cleanup()


async def _run_in_kernel(scratch: Path, cells: list[tuple[str, float]], seen: dict | None = None):
    """Run `cells` (source, timeout) in one isolated kernel the way `execute.KernelSession`
    does (nbclient, interrupt on timeout); return each cell's (seconds, outputs)."""
    iso = Isolation(scratch)
    km = _IsolatedKernelManager(kernel_name="python3", **iso.kernel_manager_settings())
    km.isolation = iso
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
    client = NotebookClient(
        notebook, km=km, timeout=60, allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": "cell timed out", "traceback": []},
        startup_timeout=60, shutdown_kernel="immediate", resources={"metadata": {"path": str(scratch)}})
    results = []
    if seen is not None:
        seen["sockets"] = iso.socket_dir
    async with client.async_setup_kernel(env=_env(scratch), cleanup_kc=True):
        if seen is not None:
            seen["name"] = psutil.Process(km.provisioner.pid).name()
            seen["tree"] = [(p.pid, p.name()) for p in psutil.Process(km.provisioner.pid).children(recursive=True)]
        for source, timeout in cells:
            cell = nbformat.v4.new_code_cell(source)
            client.nb.cells[0] = cell
            client.timeout = timeout
            started = time.monotonic()
            cell = await client.async_execute_cell(cell, 0)
            results.append((time.monotonic() - started, list(cell.outputs)))
    return results


def _text(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def test_a_startup_file_in_a_submission_folder_does_not_run(tmp_path):
    folder, scratch = tmp_path / "submission", tmp_path / "scratch"
    evil = ("import pathlib\nSTARTUP_RAN = True\n"
            f"pathlib.Path({str(scratch / 'STARTUP_RAN')!r}).write_text('ran')\n")
    for profile in (".ipython", IPYTHON_DIR):  # the old IPYTHONDIR, and the new one's name
        startup = folder / profile / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-evil.py").write_text(evil, encoding="utf-8")
    # Copied as the grader copied a submission folder, dot-folders included (the worst case).
    shutil.copytree(folder, scratch, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.ipynb"))
    (_, outputs), = asyncio.run(_run_in_kernel(scratch, [(
        "import os\nprint('STARTUP_RAN' in globals(), os.environ['IPYTHONDIR'])", 30)]))
    assert _text(outputs) == f"False {scratch / IPYTHON_DIR}\n", outputs
    assert not (scratch / "STARTUP_RAN").exists()
    assert not any((scratch / IPYTHON_DIR).rglob("00-evil.py"))


def test_a_kernel_in_a_deep_scratch_folder_gets_short_socket_paths(tmp_path):
    scratch = tmp_path / ("deep-" * 12) / "grading-scratch"  # too long for a unix socket's path
    scratch.mkdir(parents=True)
    seen: dict = {}
    (_, outputs), = asyncio.run(_run_in_kernel(scratch, [("import os\nprint(os.getcwd())", 30)], seen))
    assert _text(outputs) == f"{scratch}\n"
    assert not str(seen["sockets"]).startswith(str(scratch)) and len(str(seen["sockets"])) < 60
    assert not seen["sockets"].exists()                      # removed with the kernel


def test_a_sleeping_cell_is_interrupted_through_the_sandbox_and_the_kernel_lives_on(tmp_path):
    seen: dict = {}
    results = asyncio.run(_run_in_kernel(tmp_path, [
        ("x = 41", 30),
        ("import time\ntime.sleep(60)\nslept_out = True", 2),   # the grader's per-cell timeout: interrupt_kernel
        ("import os\nprint(x + 1, os.getpid(), 'slept_out' in globals())", 30)], seen))
    (_, first), (slept, interrupted), (_, after) = results
    assert any(o.get("ename") == "KeyboardInterrupt" for o in interrupted), interrupted  # reached the kernel
    # timing-claim: margin — cut at its fixed 2 s timeout plus the interrupt's delivery (0.4 s measured here): 3x slower
    # that is 1.2 s, and 15 s leaves 13 s for it (10x); a sleep waited out would take 60 s, 4x the bound
    assert slept < 15, slept                         # interrupted, not waited out
    # By construction, not by the clock: the sleep never finished (slept_out unset), and the same kernel
    # kept its state (x) -- not a restarted one; pid 2 in its namespace.
    assert _text(after) == "42 2 False\n"
    # The KernelManager holds bwrap's outer process; below it bwrap's init, and below that the kernel.
    assert seen["name"] == "bwrap" and [name for _, name in seen["tree"]][0] == "bwrap"
    assert seen["tree"][-1][1].startswith("python"), seen["tree"]


def test_a_real_pipeline_job_runs_inside_the_sandbox(tmp_path):
    code = ("import utils\n"
            "run = utils.run_job(utils.JobSpec(num_stages=2, steps=1, model_options={'blocks': 2, 'hidden': 64, "
            "'heads': 4, 'vocab': 512, 'seq_len': 16}, micro_batch_size=2), progress=False)\n"
            "print('JOB', run.state)")
    iso = Isolation(tmp_path)
    done = _sandboxed(iso, code, timeout=300)
    assert done.returncode == 0 and "JOB succeeded" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(list((tmp_path / "runs").iterdir())) == 1                  # recorded in the scratch folder
    assert (iso.extensions_copy / "deepspeed_shm_comm").is_dir() or not iso.extensions.is_dir()


def test_the_sandbox_ends_with_the_process_that_started_it(tmp_path):
    iso = Isolation(tmp_path)
    iso.kernel_manager_settings()
    iso.prepare()
    inner = ("import subprocess, sys, time\n"
             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
             "time.sleep(60)")
    command = Limits().wrapper_args(iso) + [sys.executable, "-c", inner]
    grader = subprocess.Popen([sys.executable, "-c", f"import subprocess, time\nsubprocess.Popen({command!r})\n"
                               "time.sleep(60)"], env=_env(tmp_path))
    try:
        deadline = time.monotonic() + 20
        while len(tree := psutil.Process(grader.pid).children(recursive=True)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(tree) >= 4, tree                  # bwrap, its init, the "kernel", its child
    finally:
        grader.send_signal(signal.SIGKILL)
        grader.wait()
    _, alive = psutil.wait_procs(tree, timeout=5)
    survivors = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in survivors:  # only without a sandbox: leave nothing behind
        p.kill()
    assert not survivors, survivors


@pytest.mark.skipif(os.geteuid() != 0, reason="the scratch folder is handed to another uid only by root")
def test_handing_the_scratch_folder_over_never_follows_a_link(tmp_path, outside):
    target = outside / "root-only"
    target.write_text("x", encoding="utf-8")
    target.chmod(0o600)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "link").symlink_to(target)
    (tmp_path / IPYTHON_DIR).symlink_to(outside, target_is_directory=True)
    iso = Isolation(tmp_path, uid=NOBODY)
    iso.kernel_manager_settings()
    iso.prepare()
    assert target.stat().st_uid == 0 and outside.stat().st_uid == 0 and target.read_text() == "x"
    assert (tmp_path / IPYTHON_DIR).is_dir() and not (tmp_path / IPYTHON_DIR).is_symlink()
    assert (tmp_path / "runs").stat().st_uid == NOBODY


def test_isolation_is_required_unless_explicitly_turned_off(monkeypatch, tmp_path):
    assert Limits().isolation == "bwrap"
    assert check_mode("none") is False and isolation.isolation_for("none", tmp_path) is None
    monkeypatch.setattr(isolation, "bwrap_problem", lambda: "bwrap (bubblewrap) is not installed")
    with pytest.raises(IsolationError, match="isolation='none'"):
        check_mode("bwrap")
    with pytest.raises(ValueError):
        check_mode("docker")
    with pytest.raises(IsolationError, match="cannot hide"):
        Isolation(tmp_path, hide=(ROOT.parent,)).hidden_paths()


def test_a_submission_cannot_change_how_the_next_one_is_graded(tmp_path):
    """Before, the lab source was read again from disk for every submission: one that rewrote
    the test cells gave the next student's untouched copy 10/10, and the source stayed modified.
    The attack targets a copy of the source (the test must never touch the real one)."""
    import hashlib

    from tests.grading.submissions import build
    from utils.grading import grade_batch
    from utils.grading.notebook_source import LabSource, find_lab

    copy = tmp_path / "source" / "lab03_balanced_partition.ipynb"
    copy.parent.mkdir()
    shutil.copy(find_lab(ROOT, "lab03"), copy)
    lab = LabSource.load(copy)
    before = hashlib.sha256(copy.read_bytes()).hexdigest()
    attack = json.loads(build(lab, "empty"))
    code = [c for c in attack["cells"] if c["cell_type"] == "code"]
    code[0]["source"] = (  # every test of the source becomes `pass`
        "import json, pathlib\n"
        f"path = pathlib.Path({str(copy)!r})\n"
        "try:\n"
        "    nb = json.loads(path.read_text())\n"
        "    for c in nb['cells']:\n"
        "        if c.get('metadata', {}).get('grading', {}).get('kind') == 'test':\n"
        "            c['source'] = 'pass'\n"
        "    path.write_text(json.dumps(nb))\n"
        "except OSError:\n"
        "    pass\n")
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    (submissions / "a_attacker.ipynb").write_text(json.dumps(attack), encoding="utf-8")
    (submissions / "b_untouched.ipynb").write_text(build(lab, "empty"), encoding="utf-8")
    results = {r.student: r for r in grade_batch(lab, submissions, tmp_path / "out", workers=1,
                                                 echo=lambda text: None)}
    assert results["b_untouched"].total == 0 and results["a_attacker"].total == 0
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == before  # hidden from the kernel


def test_a_project_under_tmp_is_bound_back_and_its_solutions_still_hidden(tmp_path, monkeypatch):
    """A checkout (or CI clone) under /tmp: the sandbox's private /tmp must not hide the
    project and interpreter, and must not stop hiding the project's solutions/ either."""
    project = Path(tempfile.mkdtemp(prefix="project-", dir="/tmp"))
    try:
        (project / "solutions").mkdir()
        monkeypatch.setattr(isolation, "PROJECT_ROOT", project)
        args = Isolation(tmp_path / "scratch").bwrap_args()
        text = " ".join(args)
        assert f"--ro-bind {project} {project}" in text
        assert f"--tmpfs {project / 'solutions'}" in text
        assert text.index(f"--ro-bind {project} {project}") < text.index(f"--tmpfs {project / 'solutions'}")
    finally:
        shutil.rmtree(project, ignore_errors=True)
