"""The console script's supervising parent: the command runs in a child process, and a child
that llama.cpp kills with a signal (a segfault in a CPU kernel, an abort) is reported in one
line instead of the shell's bare ``Segmentation fault``.

Why a parent and not ``faulthandler``: a crashed process cannot be trusted to print anything
clean, and faulthandler prints a Python traceback, not a message a user can act on. The
parent costs one small extra process at start-up and nothing while decoding: it sleeps in
``sigwaitinfo`` until the child ends.

Signals. The child stays in the terminal's process group, so a Ctrl-C typed at the terminal
reaches it directly (the kernel sends it to the whole group): the parent must not pass it on
a second time. A signal sent to the parent alone with ``kill`` (a test, a service manager's
SIGTERM) is passed on. ``sigwaitinfo`` tells the two apart by ``si_code``: the kernel's
(terminal) signals have si_code > 0, kill()'s have si_code <= 0. The child starts with these
signals blocked and unblocks them once its own Ctrl-C handler is in place
(``child_ready``), so a signal passed on during its start-up waits instead of landing in
Python's own start-up as a traceback.

A supervisor killed with SIGKILL passes nothing on: the child ties its life to the parent's
itself, first thing (``lifeline.die_with_parent``, given this process's PID).

What the child was doing when it died comes from ``crashnote``: the runtime writes there
which model it is loading or decoding, on which device, with weight repacking on or off.

Imports stay light (no typer, numpy or llama.cpp): this runs before every command.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile

from .crashnote import NOTE_ENV
from .lifeline import child_env

SUPERVISED_ENV = "EASD_LOCAL_SUPERVISED"  # set in the child; "0" in the environment turns supervision off
_PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# signals that mean the child crashed rather than was told to stop
CRASH_SIGNALS = {signal.SIGSEGV: "segmentation fault", signal.SIGBUS: "bus error",
                 signal.SIGILL: "illegal instruction", signal.SIGFPE: "floating-point exception",
                 signal.SIGABRT: "abort", signal.SIGSYS: "bad system call", signal.SIGTRAP: "trap"}
EXIT_CRASHED = 2
_TAKE_PARALLEL = ("serve", "bench", "calibrate")  # the commands with a --parallel to lower


def wanted() -> bool:
    """Whether this process should run the command in a supervised child."""
    return os.name == "posix" and hasattr(signal, "sigwaitinfo") and not os.environ.get(SUPERVISED_ENV)


def child_ready() -> None:
    """In the child, once its Ctrl-C handler is in place: take the signals the parent blocked."""
    if os.environ.get(SUPERVISED_ENV) == "1" and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _PASSED_ON)


def crash_message(signum: int, note: str, command: str = "") -> str:
    """The one line a user sees when llama.cpp (or anything else) killed the child running
    ``command`` (its first word). Without a note the child was not loading or decoding a model,
    so the load flags are not offered: that command may not even take them (``quantize``)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    what = CRASH_SIGNALS.get(signum)
    where = f" {note}" if note else ""
    if signum == signal.SIGKILL:
        smaller = "--ctx or --parallel" if command in _TAKE_PARALLEL else "--ctx"
        return f"error: easd-local was killed ({name}){where}" + (
            f"; if memory ran out, try a smaller {smaller}" if note else "")
    if not note:
        head = f"error: easd-local crashed ({name}, {what})" if what else f"error: easd-local died ({name})"
        return f"{head}; if it persists, report it with the output of `easd-local doctor`"
    head = f"error: llama.cpp crashed ({name}, {what})" if what else f"error: easd-local died ({name})"
    return (f"{head}{where}. Try --no-repack (llama.cpp's repacked-weight kernels off) or -ngl 0 (no GPU "
            "offload); if it persists, report it with the output of `easd-local doctor`")


def run(argv: list[str]) -> int:
    """Run ``easd-local ARGV`` in a child and return the exit status to exit with."""
    note_fd = _note_file()
    env = {**child_env(), SUPERVISED_ENV: "1"}
    if note_fd is not None:
        env[NOTE_ENV] = str(note_fd)
    waited = set(_PASSED_ON) | {signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    try:
        # the child keeps _PASSED_ON blocked until child_ready(); SIGCHLD as it was
        child_mask = (set(before) | set(_PASSED_ON)) - {signal.SIGCHLD}
        pid = os.posix_spawn(sys.executable, [sys.executable, "-m", "easd_local", *argv], env,
                             setsigmask=child_mask, setsigdef=(signal.SIGPIPE,))
        status = _wait(pid, waited)
        note = _read_note(note_fd)
    finally:
        if note_fd is not None:
            os.close(note_fd)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    signum = os.WTERMSIG(status)
    if signum in CRASH_SIGNALS or signum == signal.SIGKILL:
        try:
            sys.stderr.write(crash_message(signum, note, argv[0] if argv else "") + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        return EXIT_CRASHED
    # stopped by a signal it was sent (SIGTERM, SIGHUP...): end the same way
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    return 128 + signum


def _wait(pid: int, waited: set) -> int:
    while True:
        info = signal.sigwaitinfo(waited)
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return status
            continue
        if info.si_code <= 0:  # sent with kill() to the parent alone; the terminal's reach the child itself
            try:
                os.kill(pid, info.si_signo)
            except ProcessLookupError:
                pass


def _note_file() -> int | None:
    """The crash note: a temporary file already unlinked (see ``crashnote``), its descriptor
    inherited by the child; None where no temporary file can be made (the command runs all the
    same, its crash told without the note). Never descriptor 0, 1 or 2: started with one of
    those closed (``<&-``), the note would become the child's standard stream."""
    import fcntl  # POSIX, as supervising is

    try:
        fd, path = tempfile.mkstemp(prefix="easd-local-", suffix=".crashnote")
        os.unlink(path)
        if fd < 3:
            low, fd = fd, fcntl.fcntl(fd, fcntl.F_DUPFD, 3)
            os.close(low)
        os.set_inheritable(fd, True)
    except OSError:
        return None
    return fd


def _read_note(note_fd: int | None) -> str:
    if note_fd is None:
        return ""
    try:
        return os.pread(note_fd, 4096, 0).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""
