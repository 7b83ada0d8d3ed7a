"""Isolation of grading kernels with bubblewrap (``bwrap``): each submission's kernel, and
everything it starts, runs in namespaces of its own.

What the kernel sees (`Isolation.bwrap_args`, in this order):

* the whole filesystem **read-only** (``--ro-bind / /``), a minimal ``/dev`` (GPU device
  nodes bound back where they exist) and a ``/proc`` of its own pid namespace;
* a private, size-capped ``/tmp`` and ``/dev/shm`` (``tmpfs``; the tempfile directory of
  the grader too, when it is elsewhere) and an empty ``/run`` (no sockets of system
  services: D-Bus, databases, Docker);
* the grader's home directory replaced by an empty one, with only what Python needs from it
  bound back read-only (the project, the interpreter, every ``sys.path`` entry under it);
* made **invisible** (an empty read-only ``tmpfs`` over a directory, ``/dev/null`` over a
  file): the project's ``solutions/``, ``.git``, ``grading-output/``, ``grades/`` and
  ``submissions/`` (`HIDDEN_IN_PROJECT`), and the paths the caller adds (the lab source, the
  submitted notebook, the batch output folder, the submissions folder);
* the submission's scratch directory bound **read-write**: the only writable place besides
  its private ``/tmp``. It holds the notebook's working files, ``runs/`` and what
  `Isolation.prepare` creates there: a fresh ``IPYTHONDIR`` (never the submission's),
  the kernel's connection file and sockets, a home directory and a private copy of the
  JIT-built torch extensions (torch takes a lock file in the op's directory on every load,
  so that directory must be writable, and a shared writable one would let one submission
  plant a library another loads).

Namespaces: pid (the kernel cannot see or signal the grader or other submissions; when the
sandbox's init ends, every process in it ends too), network (a loopback of its own: the
labs' torchrun/gloo jobs work, nothing else is reachable; the grader talks to the kernel
over ZeroMQ ``ipc`` sockets in the scratch directory, or in a short ``/tmp/grading-ipc-*``
folder bound in when the scratch directory is too deep for a socket path, see
`kernel_manager_settings`), IPC, UTS. With ``--die-with-parent`` the sandbox is killed when
the process that launched it (the grading process) dies.

Run as root, the kernel is moreover started as ``nobody`` (uid/gid 65534, no capabilities,
``no_new_privs``) when that works here (checked once, `unprivileged_works`): the sandbox
wrapper `sandbox.py` drops to it after applying the resource limits, and the scratch
directory is handed to that uid (never following a link a previous kernel left there).
Otherwise (or not root) it keeps the grader's uid, without capabilities.

Interrupts. The command is ``sh -c 'trap "" INT; exec "$@"' sh bwrap ... python sandbox.py
... -- python -m ipykernel_launcher ...``. jupyter_client starts it in a new session, so the
pid the KernelManager holds is bwrap's outer (monitor) process, and its process group holds
the sandbox's init and the kernel as well (no ``--new-session``). An interrupt is
``killpg(pgid, SIGINT)``: bwrap's processes ignore SIGINT (inherited from the ``trap``;
otherwise bwrap would die of it and take the kernel along), `sandbox.py` restores the
default before it execs the kernel, so the kernel alone turns it into KeyboardInterrupt.
SIGTERM/SIGKILL to the group end bwrap, and with it the whole namespace. Inside,
``JPY_PARENT_PID`` is 1: the kernel's parent *is* pid 1 there, and ipykernel, given the
grader's pid, would take the difference for a dead parent and exit (1 turns its parent
polling off; ``--die-with-parent`` does that job).

Killing the group kills bwrap and its init together, so the init is re-parented before it
is reaped: in a grading process that is a child subreaper (a `containment.Containment`)
it is reaped at once; elsewhere whoever adopts it (pid 1) reaps it, which can take a second.

This module imports only the standard library.
"""

from __future__ import annotations

import functools
import glob
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from utils.system.extensions import extensions_dir

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MODES = ("bwrap", "none")
"""``Limits.isolation``: ``"bwrap"`` (the default: isolate, or refuse to grade) or ``"none"``."""
HIDDEN_IN_PROJECT = ("solutions", ".git", "grading-output", "grades", "submissions")
"""Always invisible to the kernel: the answers, their history, grading outputs (executed
notebooks with hidden checks, other students' results) and submissions, where the
instructor guide puts them."""
NOBODY = 65534
IPYTHON_DIR = ".grading-ipython"
KERNEL_DIR = ".grading-kernel"
HOME_DIR = ".grading-home"
EXTENSIONS_DIR = ".grading-torch-extensions"
GIB = 1024 ** 3
IPC_PATH_MAX = 100
"""Longest socket path used (the kernel's limit is 107 bytes). A scratch folder deep enough to
exceed it gets its sockets in a short folder ``/tmp/grading-ipc-TOKEN`` instead."""
INTERRUPT_SAFE = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]
"""Runs bwrap with SIGINT ignored: interrupts sent to the process group reach the kernel only."""


class IsolationError(RuntimeError):
    """Isolation was asked for and cannot be had on this machine."""


def _base_args(tmp_bytes: int = GIB) -> list[str]:
    return ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
            "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
            "--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]


@functools.lru_cache(maxsize=None)
def bwrap_problem() -> str | None:
    """None when bubblewrap works on this machine (tried once per process); else why not."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap (bubblewrap) is not installed; on Debian/Ubuntu: apt-get install bubblewrap"
    try:
        done = subprocess.run([exe, *_base_args(), "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return f"bwrap could not be run: {error}"
    if done.returncode != 0:
        return (f"bwrap does not work here (exit {done.returncode}: {done.stderr.strip()[:300]}); "
                "it needs unprivileged user namespaces, or root")
    return None


def bwrap_available() -> bool:
    """Whether bubblewrap works on this machine (cached)."""
    return bwrap_problem() is None


def check_mode(mode: str) -> bool:
    """Whether `mode` asks for isolation; raises `IsolationError` when it does and bubblewrap
    does not work here (the grader never grades untrusted work unprotected by surprise)."""
    if mode not in MODES:
        raise ValueError(f"isolation must be one of {MODES}, not {mode!r}")
    if mode == "none":
        return False
    problem = bwrap_problem()
    if problem is not None:
        raise IsolationError(
            f"cannot isolate grading kernels: {problem}. Install bubblewrap, or grade without "
            "isolation knowingly (Limits(isolation='none'), command line --isolation none): "
            "then submissions can read solutions/ and write wherever you can.")
    if os.geteuid() == 0:
        unprivileged_works()  # decided once, before a batch forks its grading processes
    return True


def _under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


@dataclass(frozen=True)
class Isolation:
    """How one submission's kernel is isolated; `scratch` is its working directory."""

    scratch: Path
    hide: tuple[Path, ...] = ()
    """Further paths the kernel must not see (the lab source, output and submissions folders)."""
    uid: int | None = None
    """Run the kernel as this uid (and gid); None: `NOBODY` when root and that works, else unchanged."""
    tmp_gb: float = 1.0
    """Size of the private ``/tmp`` (memory-backed)."""
    shm_gb: float = 2.0
    """Size of the private ``/dev/shm`` (DeepSpeed's CPU comm op and torch use it)."""
    extensions: Path = field(default_factory=extensions_dir)
    """Built torch extensions copied into the scratch directory (read here, never written)."""
    token: str = field(default_factory=lambda: secrets.token_hex(4))
    """Names this kernel's connection file and sockets."""

    def __post_init__(self):
        object.__setattr__(self, "scratch", Path(os.path.realpath(self.scratch)))
        object.__setattr__(self, "hide", tuple(Path(p) for p in self.hide))

    # --- paths inside the scratch directory ---------------------------------------------------
    @property
    def ipython_dir(self) -> Path:
        return self.scratch / IPYTHON_DIR

    @property
    def kernel_dir(self) -> Path:
        return self.scratch / KERNEL_DIR

    @property
    def home(self) -> Path:
        return self.scratch / HOME_DIR

    @property
    def extensions_copy(self) -> Path:
        return self.scratch / EXTENSIONS_DIR

    @property
    def socket_dir(self) -> Path:
        """Where the connection file and the ZeroMQ sockets are: the scratch folder's
        `KERNEL_DIR`, unless its socket paths would be too long for the kernel."""
        if len(str(self.kernel_dir / f"kernel-{self.token}-ipc")) + 6 <= IPC_PATH_MAX:
            return self.kernel_dir
        return Path("/tmp") / f"grading-ipc-{self.token}"

    @property
    def connection_file(self) -> Path:
        return self.socket_dir / f"kernel-{self.token}.json"

    @property
    def run_as(self) -> int | None:
        """The uid the kernel runs as, when it changes."""
        if self.uid is not None:
            return self.uid
        return NOBODY if os.geteuid() == 0 and unprivileged_works() else None

    def kernel_manager_settings(self) -> dict:
        """Keyword arguments of the KernelManager: ZeroMQ over ``ipc`` sockets next to a
        connection file in the scratch directory (the kernel has a network of its own, so
        TCP on the grader's loopback does not reach it; the file and sockets are readable
        by the kernel's uid). Empties the folder of the connection file, which the
        KernelManager writes before the command (and so `prepare`) is built; a short socket
        folder outside the scratch folder is removed by `cleanup`, or when this object goes."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        _fresh_dir(self.kernel_dir)
        if self.socket_dir != self.kernel_dir:
            self.socket_dir.mkdir(mode=0o700)  # a new token each time: never someone else's folder
            weakref.finalize(self, shutil.rmtree, str(self.socket_dir), True)
        return {"transport": "ipc", "connection_file": str(self.connection_file)}

    def cleanup(self) -> None:
        """Remove the short socket folder, if this kernel had one (after it stopped)."""
        if self.socket_dir != self.kernel_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def environment(self) -> dict[str, str | None]:
        """Variables set (None: unset) inside the sandbox."""
        cache = self.home / ".cache"
        return {"HOME": str(self.home), "IPYTHONDIR": str(self.ipython_dir),
                "TORCH_EXTENSIONS_DIR": str(self.extensions_copy), "TMPDIR": "/tmp",
                "XDG_CACHE_HOME": str(cache), "XDG_CONFIG_HOME": str(self.home / ".config"),
                "XDG_DATA_HOME": str(self.home / ".local" / "share"),
                "JPY_PARENT_PID": "1", "XDG_RUNTIME_DIR": None, "MPLCONFIGDIR": None}

    # --- setting up ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create (again, before every kernel start) what the sandbox needs in the scratch
        directory: a fresh IPYTHONDIR, home, kernel folder, the extensions copy; then hand
        the scratch directory to the kernel's uid. Call it after the connection file is
        written (`LimitedKernelManager.format_kernel_cmd` is that moment)."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        _fresh_dir(self.ipython_dir)  # never a profile (or startup file) anyone left there
        for folder in (self.home, self.kernel_dir):
            if folder.is_symlink() or not folder.is_dir():
                _fresh_dir(folder)
        if not self.extensions_copy.exists() and not self.extensions_copy.is_symlink():
            if self.extensions.is_dir():
                shutil.copytree(self.extensions, self.extensions_copy, symlinks=True,
                                ignore=shutil.ignore_patterns("lock"))
            else:
                self.extensions_copy.mkdir()
        uid = self.run_as
        if uid is not None and uid != os.geteuid():
            _hand_over(self.scratch, uid)
            if self.socket_dir != self.kernel_dir:
                _hand_over(self.socket_dir, uid)

    def hidden_paths(self) -> list[Path]:
        """What the kernel must not see, outermost first; paths under the private ``/tmp`` (unless
        bound back into it: a project cloned there), the scratch directory, or another hidden
        path are left out (already unseen), as are paths that do not exist."""
        wanted = [PROJECT_ROOT / name for name in HIDDEN_IN_PROJECT] + list(self.hide)
        found: list[Path] = []
        for path in wanted:
            for variant in {Path(os.path.abspath(path)), Path(os.path.realpath(path))}:
                if os.path.lexists(variant) and variant not in found:
                    found.append(variant)
        needed = {PROJECT_ROOT, Path(os.path.realpath(sys.prefix)), Path(os.path.realpath(sys.base_prefix))}
        for path in found:
            if any(_under(n, path) for n in needed):
                raise IsolationError(f"cannot hide {path} from the kernel: it holds {PROJECT_ROOT} or the "
                                     "Python installation the kernel runs on")
        private = [Path("/tmp"), Path(os.path.realpath(tempfile.gettempdir()))]
        rebound = [p for top in private for p in _outermost_under(top)]  # the project under /tmp?
        found.sort(key=lambda p: len(p.parts))
        kept: list[Path] = []
        for path in found:
            unseen = any(_under(path, p) for p in private) and not any(_under(path, r) for r in rebound)
            if unseen or any(_under(path, k) for k in kept) or _under(path, self.scratch):
                continue
            kept.append(path)
        return kept

    def bwrap_args(self) -> list[str]:
        """The bwrap command line up to the sandboxed command."""
        tmp_bytes, shm_bytes = (max(1 << 20, int(gb * GIB)) for gb in (self.tmp_gb, self.shm_gb))
        args = [shutil.which("bwrap") or "bwrap", *_base_args(tmp_bytes)]
        read_only: list[str] = []  # tmpfs mounts made read-only once everything is mounted
        temp = Path(os.path.realpath(tempfile.gettempdir()))
        if not _under(temp, Path("/tmp")):
            args += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", str(temp)]
        args += ["--perms", "1777", "--size", str(shm_bytes), "--tmpfs", "/dev/shm"]
        # A project or interpreter under the private /tmp (a checkout or CI clone there) is
        # bound back read-only over it; nothing else of the real /tmp is.
        for top in sorted({Path("/tmp"), temp}):
            for path in _outermost_under(top):
                args += _ancestors(path, top) + ["--ro-bind", str(path), str(path)]
        for device in sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/dri")):
            args += ["--dev-bind", device, device]
        if os.path.isdir("/run"):
            args += ["--tmpfs", "/run"]
            read_only.append("/run")
        home, kept = self._home()
        if home is not None:
            args += ["--perms", "0755", "--tmpfs", str(home)]
            for path in kept:
                args += _ancestors(path, home) + ["--ro-bind", str(path), str(path)]
            read_only.append(str(home))
        hidden = self.hidden_paths()
        for path in hidden:
            if path.is_dir() and not path.is_symlink():
                args += ["--perms", "0755", "--tmpfs", str(path)]
                read_only.append(str(path))
            else:
                args += ["--ro-bind", "/dev/null", str(path)]
        below = next((m for m in [temp, Path("/tmp"), *hidden] if _under(self.scratch, m)), None)
        if below is not None:  # its folders on the way are created in a tmpfs: traversable by all
            args += _ancestors(self.scratch, below)
        args += ["--bind", str(self.scratch), str(self.scratch)]
        if self.socket_dir != self.kernel_dir:
            args += ["--bind", str(self.socket_dir), str(self.socket_dir)]
        for path in read_only:
            args += ["--remount-ro", path]
        if self.run_as is None and os.geteuid() == 0:
            args += ["--cap-drop", "ALL"]
        for name, value in self.environment().items():
            args += ["--unsetenv", name] if value is None else ["--setenv", name, value]
        args += ["--chdir", str(self.scratch)]
        return args

    def _home(self) -> tuple[Path | None, list[Path]]:
        """The grader's home directory, to be replaced by an empty one, and what the
        kernel's Python needs from it (bound back read-only); (None, []) to leave it."""
        home = Path(os.path.realpath(os.path.expanduser("~")))
        if home == Path("/") or not home.is_dir():
            return None, []
        if any(path == home for path in _needed_paths()):  # the home is itself needed (the project?)
            return None, []
        return home, _outermost_under(home)

    def prefix(self) -> list[str]:
        """The command that runs what follows it (the sandbox wrapper) inside the sandbox."""
        return INTERRUPT_SAFE + self.bwrap_args()

    def wrapper_options(self) -> list[str]:
        """Options of `sandbox.py` inside the sandbox: the uid to drop to, if any."""
        uid = self.run_as
        return [] if uid is None or uid == os.geteuid() else ["--uid", str(uid), "--gid", str(uid)]


def _needed_paths() -> set[Path]:
    """What the kernel's Python needs to see: the project, the interpreter and its prefixes,
    every ``sys.path`` and ``PYTHONPATH`` entry (real paths)."""
    needed = {PROJECT_ROOT, Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent}
    needed |= {Path(p) for p in sys.path if p and os.path.isdir(p)}
    needed |= {Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p)}
    return {Path(os.path.realpath(p)) for p in needed}


def _outermost_under(top: Path) -> list[Path]:
    """The needed paths strictly below `top`, without those inside another one (to bind back
    read-only over a tmpfs mounted on `top`)."""
    inside = sorted((p for p in _needed_paths() if _under(p, top) and p != top), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in inside:
        if not any(_under(path, k) for k in kept):
            kept.append(path)
    return kept


def _ancestors(path: Path, top: Path) -> list[str]:
    """bwrap options creating the folders between `top` (excluded) and `path` (excluded)
    with mode 0755: bwrap would make them 0700, which a dropped uid cannot traverse."""
    args: list[str] = []
    for folder in reversed(path.parents):
        if _under(folder, top) and folder != top:
            args += ["--perms", "0755", "--dir", str(folder)]
    return args


def _fresh_dir(path: Path) -> None:
    """An empty folder at `path` (a symbolic link there is removed, never followed)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir()


def _hand_over(root: Path, uid: int) -> None:
    """chown `root` and everything below it to `uid`, never following a symbolic link (the
    previous kernel of this submission may have left some: fwalk and dir_fd keep a link
    swapped in meanwhile from redirecting the chown)."""
    os.chown(root, uid, uid, follow_symlinks=False)
    for _, dirs, files, fd in os.fwalk(root, follow_symlinks=False):
        for name in dirs + files:
            try:
                if os.stat(name, dir_fd=fd, follow_symlinks=False).st_uid != uid:
                    os.chown(name, uid, uid, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue


@functools.lru_cache(maxsize=None)
def unprivileged_works() -> bool:
    """Whether, as root, a kernel dropped to `NOBODY` inside the sandbox can start Python and
    import ipykernel and the project (the interpreter may live where nobody may read it)."""
    if os.geteuid() != 0 or not bwrap_available():
        return False
    scratch = Path(tempfile.mkdtemp(prefix="grading-probe-"))
    try:
        probe = Isolation(scratch, uid=NOBODY)
        probe.prepare()
        code = ("import os, ipykernel, utils.grading.student_side; assert os.getuid() == %d; "
                "open(os.path.join(os.environ['HOME'], 'ok'), 'w').close()" % NOBODY)
        command = probe.prefix() + [sys.executable, str(Path(__file__).with_name("sandbox.py")),
                                    *probe.wrapper_options(), "--", sys.executable, "-c", code]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
        done = subprocess.run(command, env=env, capture_output=True, timeout=60)
        return done.returncode == 0 and (probe.home / "ok").exists()
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def isolation_for(mode: str, scratch: Path, hide=()) -> Isolation | None:
    """The `Isolation` of a kernel working in `scratch`, or None for ``mode="none"``; raises
    `IsolationError` when isolation is asked for and bubblewrap does not work here."""
    return Isolation(Path(scratch), tuple(Path(p) for p in hide)) if check_mode(mode) else None
