"""Ctrl-C at moments when a KeyboardInterrupt cannot be raised cleanly.

Python raises KeyboardInterrupt wherever the main thread happens to be. Two places handle
that badly: imports (a traceback from deep inside importlib, or "Exception ignored in" a
module-lock callback, after which the program just goes on), and C code that calls back
into Python (llama.cpp logging while it loads a model: the exception is "ignored" in the
ctypes callback, printed with a traceback, and the load continues). So:

* ``exit_on_interrupt`` (installed by the console script before the heavy imports): Ctrl-C
  before a command starts prints one line and exits 130 at once. Nothing has been written
  by then, so there is nothing to clean up.
* ``raise_on_interrupt`` (when a command starts): back to the ordinary KeyboardInterrupt,
  which the commands turn into a clean stop.
* ``deferred_interrupt`` (around llama.cpp calls that call back into Python): Ctrl-C only
  sets a flag, and KeyboardInterrupt is raised when the call has returned.
* ``cleanup_on_termination`` (around writing a large file): SIGTERM and SIGHUP unwind the
  block like Ctrl-C, so that what it half wrote is removed, and then end the process as they
  would have.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C


def _exit_now(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    try:
        os.write(2, b"interrupted\n")
    finally:
        os._exit(EXIT_INTERRUPTED)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def exit_on_interrupt() -> None:
    if _main_thread():
        signal.signal(signal.SIGINT, _exit_now)


def raise_on_interrupt() -> None:
    """Undo ``exit_on_interrupt`` (and only that: another handler is left alone)."""
    if _main_thread() and signal.getsignal(signal.SIGINT) is _exit_now:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class Deferred:
    """What ``deferred_interrupt`` yields: ``pending`` is set once Ctrl-C was pressed."""

    def __init__(self) -> None:
        self.pending = False


@contextmanager
def deferred_interrupt() -> Iterator[Deferred]:
    """Hold Ctrl-C back for the duration of the block, then raise KeyboardInterrupt.

    Only where the handler in force is Python's ordinary one (a command's handler, or
    ``exit_on_interrupt``'s, is left alone) and only in the main thread."""
    state = Deferred()
    if not _main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield state
        return

    def hold(signum, frame) -> None:  # noqa: ARG001
        state.pending = True

    signal.signal(signal.SIGINT, hold)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if state.pending:
        raise KeyboardInterrupt


class Terminated(BaseException):
    """SIGTERM or SIGHUP inside ``cleanup_on_termination``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_TERMINATING = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)


@contextmanager
def cleanup_on_termination() -> Iterator[None]:
    """SIGTERM or SIGHUP (a service manager, ``timeout``, a closed terminal) raise Terminated
    in the block, so that its ``except``/``finally`` clauses run, and every block around it
    (a progress bar gives the cursor back); the console script then ends by that signal, its
    exit status the one it would have had (``end_terminated``). Only for signals left to their
    default action (a command's own handler is left alone), and only in the main thread."""
    if not _main_thread():
        yield
        return

    def stop(signum, frame) -> None:  # noqa: ARG001
        raise Terminated(signum)

    held = {s: signal.signal(s, stop) for s in _TERMINATING if signal.getsignal(s) == signal.SIG_DFL}
    try:
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)


def end_terminated(t: Terminated) -> None:
    """End this process by the signal that raised ``t``, as if no handler had caught it."""
    signal.signal(t.signum, signal.SIG_DFL)
    signal.raise_signal(t.signum)
