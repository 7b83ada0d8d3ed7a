"""Keep one submission contained: every process it starts found and ended, all of them
together within a memory budget, and what they print within bounds.

`sandbox.Limits` are per process (rlimits): they cannot see a process that escaped the
kernel's tree, nor three children that each stay under the limit. This module adds what is
per *submission*:

* **The whole tree, reliably.** A grading worker (one per submission, see `batch`) makes
  itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a process the kernel
  started that double-forks or calls ``setsid`` is re-parented to the worker instead of to
  init, so "every descendant of the worker" is exactly "every process of the submission".
  `Containment.end_all` ends them (SIGTERM, a short grace, SIGKILL, again until none is
  left) and reaps them; the worker calls it after every kernel and at the end. The
  kernel's session and process group (jupyter_client starts it with ``setsid`` and signals
  the group on shutdown) are not enough: any process can leave both with ``setsid``, while
  no process can leave the subreaper's tree.
* **Nothing outlives the grader.** The worker asks for `PARENT_DEATH_SIGNAL` when the batch
  process dies (``PR_SET_PDEATHSIG``; its handler ends every descendant and exits), the
  watchdog thread checks the parent as well, and every kernel is started through this
  file as a script (``containment.py --parent PID -- KERNEL COMMAND``), which asks for
  SIGKILL when the worker dies before it execs the kernel — so a kernel dies with its
  worker even when the worker was SIGKILLed.
* **A memory budget over all processes together** (`Budget.memory_gb`). Where cgroup v2
  with the ``memory`` controller can be delegated this would be a ``memory.max``; on the
  machines this was built on it cannot (``/sys/fs/cgroup`` is cgroup v1 with the
  ``memory`` hierarchy owned by the container runtime, and the v2 mount offers only
  ``hugetlb``: see `cgroup_v2_memory`), so a watchdog thread in the worker sums the memory
  of the tree every `Budget.interval` seconds — RSS first (cheap), and when that is over the
  budget the proportional set size (PSS, shared pages counted once) — and SIGKILLs the
  whole tree when it is over. The cell running then ends with status ``"memory"`` (see
  `execute`), the kernel is restarted as after a crash, and the feedback says why.
* **Bounded disk.** The same thread measures the submission's working folder about once a
  second (`Budget.disk_mib`); over it, every process is killed and the files the submission
  wrote are removed.
* **Bounded output.** Loaded into every kernel as an IPython extension
  (``--IPKernelApp.extensions=utils.grading.kernel_output``), `kernel_output` keeps
  the first `Budget.stream_kib` KiB that a cell writes to stdout/stderr and replaces the
  rest by one line ``[output cut: X MiB more]``, and cuts a display over
  `Budget.output_kib`, so a flood never leaves the kernel; the
  grader bounds what it keeps again on its side (`execute.BoundedClient`), since kernel code
  can undo anything done inside the kernel.

What this does not do: a worker that is itself SIGKILLed (the OOM killer, ``kill -9`` of
its pid) cannot clean up. Its kernel still dies (the parent-death signal), and what else
the submission started is re-parented to the batch process, a subreaper while the batch
runs, which ends it; but if the batch process is SIGKILLed at the same moment, processes
the kernel started may survive. Only a cgroup closes that gap. Kernel code that undoes the
in-kernel output bound meets the grader's socket, which refuses any message over
`Budget.message_mib` unread (the cell then fails with that note and the kernel is replaced).

Run as a script, this file imports nothing outside the standard library (it is started by
path before every kernel, like `sandbox.py`); psutil is imported inside the functions that
need it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

GIB = 1024 ** 3
MIB = 1024 ** 2
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
MEMORY_ENAME = "MemoryBudgetExceeded"
PARENT_DEATH_SIGNAL = signal.SIGUSR2
"""What a grading worker gets when the batch process dies. Not SIGTERM: nbclient installs
its own SIGTERM and SIGINT handlers while a kernel runs and resets them to the default
(die at once, ending nothing) afterwards. Not SIGKILL: the worker must end its tree first."""


@dataclass(frozen=True)
class Budget:
    """What one submission may use in all, across every process it starts.

    The default memory budget keeps two workers (``grade --workers 2``) and the grader
    itself inside a 24 GiB machine with room to spare; a lab's real DeepSpeed job on CPU
    (torchrun and a few ranks, each a few hundred MiB) stays well below it. A value of 0
    switches that bound off.
    """

    memory_gb: float = 8.0
    """All processes of the submission together (PSS, GiB); over it the tree is killed."""
    stream_kib: int = 64
    """stdout + stderr text kept per cell, KiB; the rest becomes one "[output cut: …]" line."""
    output_kib: int = 1024
    """Largest single rich output kept (an image, HTML, a long repr), KiB."""
    total_mib: int = 16
    """All outputs kept for one submission (what the instructor notebook holds), MiB."""
    message_mib: int = 32
    """Largest single message the grader reads from a kernel, MiB: a larger one is refused by
    the grader's socket (ZMQ_MAXMSGSIZE) before it takes any of the grader's memory; the
    kernel bounds its own rich outputs to `output_kib` first, so only kernel code that undid
    that bound meets this wall (its output is lost, the grading goes on)."""
    interval: float = 0.2
    """Seconds between two memory measurements of the tree."""
    disk_mib: int = 2048
    """Bytes the submission may write into its working folder, MiB (the watched folder: see
    `Containment.watch_disk`; the sandbox's private /tmp and /dev/shm are bounded tmpfs
    already). Over it every process is killed and the files it wrote are removed. 0: off."""
    disk_interval: float = 1.0
    """Seconds between two measurements of the working folder (a walk of its files)."""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GIB) if self.memory_gb else 0


# --- prctl ------------------------------------------------------------------------------------
def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)``; False where it does not exist (not Linux) or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0),
                          ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):
        return False


def set_child_subreaper(on: bool = True) -> bool:
    """Make orphaned descendants of this process re-parent to it (not to init)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def is_child_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    value = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(ctypes.c_int(PR_GET_CHILD_SUBREAPER), ctypes.byref(value), ctypes.c_ulong(0),
                        ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):
        return False
    return ok and bool(value.value)


def set_parent_death_signal(sig: int, parent: int | None = None) -> bool:
    """Get `sig` when the parent dies. With `parent`, also check it is still the parent:
    if it died before the call, the signal would never come, so it is sent now."""
    ok = _prctl(PR_SET_PDEATHSIG, int(sig))
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return ok


def cgroup_v2_memory(root: str | Path = "/sys/fs/cgroup") -> str:
    """Whether this machine offers a cgroup v2 ``memory`` controller, in words (for the
    report in a worker's log; the watchdog is used either way)."""
    root = Path(root)
    for candidate in (root, root / "unified"):
        controllers = candidate / "cgroup.controllers"
        if controllers.exists():
            names = controllers.read_text().split()
            if "memory" in names:
                return f"cgroup v2 at {candidate} has the memory controller"
            return f"cgroup v2 at {candidate} has no memory controller (only: {' '.join(names) or 'none'})"
    return f"no cgroup v2 hierarchy at {root}"


# --- the processes of a submission --------------------------------------------------------------
@dataclass(frozen=True)
class Trip:
    """A budget was exceeded: which (``"memory"`` or ``"disk"``), when, by how much, how many
    processes were killed."""

    at: float
    used: int
    budget: int
    processes: int
    resource: str = "memory"

    def message(self) -> str:
        """Why the cell ended (shown to the student, as a public error would be)."""
        if self.resource == "disk":
            return (f"这份提交在工作目录里写入了 {self.used / MIB:.0f} MiB 文件，超过了每份提交 "
                    f"{self.budget / MIB:g} MiB 的上限，{self.processes} 个进程已全部终止，写入的文件已删除，"
                    "内核随后重启。请不要写大文件（the submission wrote more than its disk budget）。")
        return (f"这份提交的所有进程合计使用了 {self.used / GIB:.1f} GiB 内存，超过了每份提交 "
                f"{self.budget / GIB:g} GiB 的上限，{self.processes} 个进程已全部终止，内核随后重启。"
                "请减少同时存在的大数组或子进程。")


_ACTIVE: Containment | None = None


def active() -> Containment | None:
    """The `Containment` this process runs under (a grading worker), or None."""
    return _ACTIVE


class Containment:
    """The submission graded in this process: its processes, its memory, its end.

    Use as a context manager in a grading worker (one process per submission)::

        with Containment(budget, parent=os.getppid()):
            grade_notebook(...)

    On entry this process becomes a child subreaper, asks for `PARENT_DEATH_SIGNAL` when
    `parent` dies and starts the watchdog thread; on exit every descendant is ended and
    reaped.
    """

    def __init__(self, budget: Budget | None = None, *, parent: int | None = None,
                 log=lambda text: None):
        self.budget = budget or Budget()
        self.parent = parent
        self.log = log
        self.peak = 0
        """Largest memory of the tree measured (bytes; RSS, or PSS once RSS was over)."""
        self.trips: list[Trip] = []
        self._unclaimed: Trip | None = None
        self._owned: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subreaper = False
        self._disk: tuple[Path, set[str]] | None = None
        self._disk_checked = 0.0

    # entering and leaving
    def __enter__(self) -> Containment:
        global _ACTIVE
        self._subreaper = set_child_subreaper(True)
        if self.parent is not None:
            # The batch process died (even SIGKILLed): end the submission, then this process.
            signal.signal(PARENT_DEATH_SIGNAL, lambda signum, frame: self._abandon("the batch process is gone"))
            set_parent_death_signal(PARENT_DEATH_SIGNAL, self.parent)
        self._thread = threading.Thread(target=self._watch, name="grading-watchdog", daemon=True)
        self._thread.start()
        _ACTIVE = self
        self.log(f"containment: subreaper {'on' if self._subreaper else 'NOT available'}; memory budget "
                 f"{self.budget.memory_gb:g} GiB by watchdog ({cgroup_v2_memory()})")
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.end_all()
        _ACTIVE = None

    def _abandon(self, why: str) -> None:
        """End everything and exit at once, writing no result (the batch is gone)."""
        self._stop.set()
        try:
            try:  # a signal handler may interrupt a write to the same log: never let that stop us
                self.log(f"containment: {why}; ending the submission's processes")
            except Exception:
                pass
            self.end_all(grace=0)
        finally:
            os._exit(1)

    # the tree
    def own(self, pid: int | None) -> None:
        """A child this process started and waits for itself (a kernel): never reaped here."""
        if pid:
            with self._lock:
                self._owned.add(pid)

    def descendants(self) -> list:
        """Every live process below this one (all of the submission's, thanks to the
        subreaper), zombies left out."""
        import psutil
        try:
            procs = psutil.Process().children(recursive=True)
        except psutil.Error:
            return []
        alive = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        return alive

    def reap(self, *, owned: bool = False) -> None:
        """Collect exited children that no one else waits for: orphans re-parented here
        (and with `owned`, the kernels too)."""
        import psutil
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return
        with self._lock:
            skip = set() if owned else set(self._owned)
        for child in children:
            if child.pid in skip:
                continue
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError, OSError):
                pass

    def kill_all(self) -> int:
        """SIGKILL every descendant now, without waiting (the kernel's own waiter collects
        it); how many were signalled."""
        import psutil
        procs = self.descendants()
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        return len(procs)

    def end_all(self, grace: float = 1.0, *, deadline: float = 10.0) -> int:
        """End every descendant: SIGTERM, `grace` seconds, SIGKILL; repeated until none is
        left (a process may fork while it is being ended), then reap them all. Returns how
        many were ended."""
        # Imported here: this file also runs as a bare script before every kernel (see above).
        from utils.system.procs import end_process_tree

        ended: set[int] = set()
        give_up = time.monotonic() + grace + deadline
        first = True
        while True:
            procs = self.descendants()
            if not procs or time.monotonic() > give_up:
                break
            ended.update(p.pid for p in procs)
            end_process_tree(procs, grace=grace if first else 0, reap=1.0)  # TERM, grace, KILL; then KILL only
            first = False
        self.reap(owned=True)
        return len(ended)

    # memory
    def measure(self, procs: list) -> int:
        """Memory of `procs` together: their RSS, or their PSS when the RSS sum is over the
        budget (RSS counts a page shared by forked processes once per process)."""
        import psutil
        rss = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        budget = self.budget.memory_bytes
        if not budget or rss <= budget:
            return rss
        pss = 0
        for p in procs:
            try:
                pss += p.memory_full_info().pss
            except psutil.AccessDenied:
                try:
                    pss += p.memory_info().rss
                except psutil.Error:
                    pass
            except psutil.Error:
                pass
        return pss

    def watch_disk(self, folder: Path | None) -> None:
        """Bound what the submission writes under `folder` (its working folder) by
        `Budget.disk_mib`; the files there now are the grader's and are kept on a trip.
        None stops watching."""
        if folder is None:
            self._disk = None
            return
        kept = {os.path.join(root, name) for root, _, names in os.walk(folder) for name in names}
        self._disk = (Path(folder), kept)

    def _check_disk(self) -> None:
        watched, budget = self._disk, self.budget.disk_mib * MIB
        now = time.monotonic()
        if watched is None or not budget or now - self._disk_checked < self.budget.disk_interval:
            return
        self._disk_checked = now
        from utils.system.diskspace import folder_bytes  # here: this file also runs as a bare script

        folder, kept = watched
        used = folder_bytes(folder)
        if used <= budget:
            return
        killed = self.kill_all()
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                if path not in kept:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
        self._trip(Trip(now, used, budget, killed, resource="disk"))

    def _trip(self, trip: Trip) -> None:
        with self._lock:
            self.trips.append(trip)
            self._unclaimed = trip
        unit, scale = ("GiB", GIB) if trip.resource == "memory" else ("MiB", MIB)
        self.log(f"containment: {trip.resource} budget exceeded ({trip.used / scale:.2f} {unit} > "
                 f"{trip.budget / scale:g} {unit}); killed {trip.processes} process(es)")

    def claim_trip(self) -> Trip | None:
        """The budget trip not yet reported, if any: it explains the cell that found its
        kernel dead (each trip explains one cell)."""
        with self._lock:
            trip = self._unclaimed
            if trip is not None:
                self._unclaimed = None
            return trip

    def _watch(self) -> None:
        """The watchdog: parent alive? tree within budget? orphans reaped?"""
        while not self._stop.wait(self.budget.interval):
            try:
                if self.parent is not None and os.getppid() != self.parent:
                    self._abandon("the batch process is gone (watchdog)")
                procs = self.descendants()
                used = self.measure(procs)
                self.peak = max(self.peak, used)
                budget = self.budget.memory_bytes
                if budget and used > budget:
                    self._trip(Trip(time.monotonic(), used, budget, self.kill_all()))
                self._check_disk()
                self.reap()
            except Exception as error:  # the watchdog must outlive anything it meets
                self.log(f"containment: watchdog error {error!r}")


# --- the kernel launch wrapper ----------------------------------------------------------------------
def wrapper_args(parent: int | None = None) -> list[str]:
    """The command up to and including ``--`` that starts a kernel with SIGKILL as its
    parent-death signal and its stdout on /dev/null (what cells print reaches the notebook
    through ipykernel; a copy in the worker's log would only grow it). ``-S``: the
    standard library is all it needs.

    The kernel gets the signal when the *thread* that started it ends (Linux ties the
    parent-death signal to the thread), so start kernels from a thread that outlives them,
    as `execute.run_cells` does (the event loop's thread)."""
    return [sys.executable, "-S", os.path.abspath(__file__),
            "--parent", str(os.getpid() if parent is None else parent), "--"]


def main(argv: list[str] | None = None) -> None:
    """``containment.py [--parent PID] -- COMMAND ...``: set the parent-death signal, put
    stdout on /dev/null and exec COMMAND (which keeps this pid and the signal)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or not argv[argv.index("--") + 1:]:
        raise SystemExit("usage: containment.py [--parent PID] -- COMMAND ...")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    parent = int(options[options.index("--parent") + 1]) if "--parent" in options else None
    set_parent_death_signal(signal.SIGKILL, parent)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
