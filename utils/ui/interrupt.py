"""Jupyter's ■ (interrupt the kernel) stops the jobs panels started, as it stops `run_job`.

A `RunPanel` job is watched by a background thread, and the cell that pressed Run has long
finished: ■ sends SIGINT to an idle kernel, which ipykernel ignores (SIG_IGN between
requests; it installs Python's ``default_int_handler`` only while it handles one). So:

* **idle kernel**: a SIGINT handler is installed *between* requests — scheduled on the
  kernel's event loop (``kernel.io_loop.add_callback``), so ipykernel saves and restores it
  around every request like its own. It calls the registered stoppers, then whatever
  handler was there before (SIG_IGN in a kernel: nothing else happens).
* **busy kernel** (a cell is running): ipykernel's ``default_int_handler`` raises
  KeyboardInterrupt in the cell; an IPython ``post_run_cell`` hook sees the cell end with
  it and calls the stoppers too.
* **no kernel** (a script, a test) on the main thread: the handler is installed at once
  and chains to the previous one (Ctrl-C stops the jobs, then raises KeyboardInterrupt).
* anywhere else (a thread of a script): ■ cannot reach the job; `watch` says so and the
  panel tells the learner that only its Stop button does.

A stopper only sets a flag (a signal handler must not do more): the panel's own thread then
stops the job, as for Stop.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

__all__ = ["watch", "unwatch", "fire", "installed"]

_stoppers: dict[int, Callable[[], None]] = {}
_lock = threading.Lock()
_previous: object = signal.SIG_IGN
_handler_installed = False
_hooked_shells: set[int] = set()


def fire() -> int:
    """Call every registered stopper (what ■ does); returns how many there were."""
    with _lock:
        stoppers = list(_stoppers.values())
    for stop in stoppers:
        stop()
    return len(stoppers)


def _on_sigint(signum, frame) -> None:
    fire()
    previous = _previous
    if callable(previous):
        previous(signum, frame)  # e.g. default_int_handler outside a kernel: KeyboardInterrupt


def _install_handler(loop=None) -> None:
    """Install `_on_sigint` (main thread only), remembering the handler it replaces.

    With the kernel's `loop`: if a request is being handled after all (ipykernel's
    ``default_int_handler`` is in place, and it will put the idle handler back when the
    request ends), try again shortly instead."""
    global _previous, _handler_installed
    current = signal.getsignal(signal.SIGINT)
    if current is _on_sigint:
        _handler_installed = True
        return
    if loop is not None and current is signal.default_int_handler:
        loop.call_later(0.05, _install_handler, loop)
        return
    _previous = current
    signal.signal(signal.SIGINT, _on_sigint)
    _handler_installed = True


def _after_cell(result) -> None:
    if isinstance(getattr(result, "error_in_exec", None), KeyboardInterrupt):
        fire()


def _kernel_shell():
    """The IPython shell of a Jupyter kernel this process runs, or None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if shell is None or kernel is None or getattr(kernel, "io_loop", None) is None:
        return None
    return shell


def _ensure_installed() -> str | None:
    """Make ■ reach the stoppers; returns how (``"kernel"``, ``"signal"``) or None."""
    shell = _kernel_shell()
    if shell is not None:
        if id(shell) not in _hooked_shells:
            shell.events.register("post_run_cell", _after_cell)
            _hooked_shells.add(id(shell))
        # Between requests, on the kernel's own loop: ipykernel keeps it as the idle handler.
        loop = shell.kernel.io_loop
        loop.add_callback(_install_handler, loop)
        return "kernel"
    if threading.current_thread() is threading.main_thread():
        _install_handler()
        return "signal"
    return None


def watch(key: int, stopper: Callable[[], None]) -> str | None:
    """Call `stopper` when ■ (SIGINT) arrives, until `unwatch(key)`.

    Returns ``"kernel"`` (inside a Jupyter kernel), ``"signal"`` (a plain process, main
    thread) or None when ■ cannot reach this process's jobs from here (the stopper is then
    not registered)."""
    how = _ensure_installed()
    if how is not None:
        with _lock:
            _stoppers[key] = stopper
    return how


def unwatch(key: int) -> None:
    """Forget the stopper registered under `key` (nothing if there is none)."""
    with _lock:
        _stoppers.pop(key, None)


def installed() -> bool:
    """Whether the SIGINT handler has been installed in this process."""
    return _handler_installed


def uninstall() -> None:
    """Put the previous SIGINT handler back (main thread; for tests)."""
    global _handler_installed
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, _previous)
    _handler_installed = False
