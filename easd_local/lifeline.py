"""A child process that ends when the process that started it ends.

Why: a parent killed with SIGKILL (``kill -9``, a service manager's last resort, the kernel's
out-of-memory killer) runs no code, so it cannot stop its children; without a tie they run on
as orphans: a ``serve`` worker holding its port, a ``bench`` worker writing rows that a resumed
run writes again.

The child gets SIGKILL, not SIGTERM: "now". A bench row is written whole or not at all, so the
rows already written stay and ``--resume`` drops at most a torn last line; a handler would only
run Python in a process whose parent (and terminal) are gone.

Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, the kernel's own tie, set before the child does
any work and then checked against the parent's PID (the parent may have died before the tie
was made). Other POSIX systems (macOS): a daemon thread polls ``getppid()`` once a second.

Imports stay light (no ctypes until it is used): the supervised worker calls this first.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

PARENT_ENV = "EASD_LOCAL_PARENT_PID"  # the starter's PID, for a Python child to check against
_PR_SET_PDEATHSIG = 1


def child_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) for a Python child that calls :func:`die_with_parent`."""
    return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def die_with_parent(parent_pid: int | None = None) -> None:
    """In a child, first thing: end by SIGKILL when ``parent_pid`` ends (now, if it has).
    Without ``parent_pid``, the one :func:`child_env` passed (nothing happens if none was)."""
    if parent_pid is None:
        given = os.environ.pop(PARENT_ENV, "")  # not inherited by this process's own children
        if not given.isdigit():
            return
        parent_pid = int(given)
    if os.name != "posix":
        return
    if not _kernel_tie():
        threading.Thread(target=_watch, args=(parent_pid,), name="lifeline", daemon=True).start()
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def preexec(parent_pid: int | None = None):
    """A ``preexec_fn`` for ``subprocess.Popen`` of a program that is not ours (``rpc-server``,
    ``chromedriver``): the tie is made between fork and exec and survives the exec. Linux only
    (elsewhere it does nothing); libc is looked up here, in the parent, not after the fork."""
    parent = os.getpid() if parent_pid is None else parent_pid
    prctl = _prctl()

    def tie() -> None:
        if prctl is not None and prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0 \
                and os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return tie


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _kernel_tie() -> bool:
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)
