"""Ctrl-C at any moment of a command's start (imports, argument parsing, model loading,
first tokens) ends in one line and exit status 130, never a traceback (issue 13, item 6).

Real processes on the tiny pair; SIGINT is sent at delays spread over the first second."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import sys
import time

import pytest

# What the console script does (``from easd_local.__main__ import main; main()``), plus one
# byte on stderr once the Ctrl-C handler is in place: main() installs it as its first
# statement (test_main_installs_the_handler_first); a signal before that lands in Python's own
# start-up (site, .pth files) or in the few bytecodes before main's first line, which no
# program can guard, and which a test could only hit by a race.
LAUNCHER = ("import sys; from easd_local.__main__ import main; from easd_local.interrupts import exit_on_interrupt; "
            "exit_on_interrupt(); sys.stderr.write('>'); sys.stderr.flush(); main()")


@pytest.fixture(autouse=True)
def python_handles_sigint():
    """Python's own SIGINT handler in this process, as in a terminal. A shell starts a
    background job (``cmd &``) with SIGINT ignored, and Python then installs no handler: the
    SIGINT these tests send themselves would be lost, and their children would start ignoring
    it too."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _interrupt_after(args: list[str], delay: float, stdin=subprocess.DEVNULL) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], stdin=stdin, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env)
    try:
        assert p.stderr.read(1) == b">"
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        err = p.stderr.read().decode(errors="replace")
        return p.wait(timeout=60), err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_ctrl_c_while_starting_is_one_line(command, tiny_draft, tiny_target, tmp_path, monkeypatch):
    args = [command, *(["Tell me a long story"] if command == "generate" else []),
            "--draft", str(tiny_draft), "--target", str(tiny_target), "--max-tokens", "4000", "--ctx", "4096",
            "--threads", "1"]
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))  # chat's transcript goes there
    stdin = subprocess.PIPE if command == "chat" else subprocess.DEVNULL
    for delay in (0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.25, 0.4, 0.6, 0.9):
        rc, err = _interrupt_after(args, delay, stdin=stdin)
        assert "Traceback" not in err and "Exception ignored" not in err, (delay, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if command == "chat" and rc == 0:
            # the chat had started and was waiting for a message: Ctrl-C there leaves it
            assert lines[0].startswith("easd-local chat · "), (delay, err)
            continue
        # 130, or ended by SIGINT itself (the supervisor ends as its child did: a shell reads
        # both as 130); either way after the one line
        assert rc in (130, -signal.SIGINT), (delay, rc, err)
        assert lines and lines[-1] == "interrupted", (delay, err)


def test_ctrl_c_while_llama_cpp_loads_is_raised_after_the_call(tiny_target, capfd):
    """llama.cpp logs through a Python callback while it loads; a KeyboardInterrupt raised
    in there would be printed as "Exception ignored" and lost. Loading again and again until
    a SIGINT lands, it must come out of Model() as a plain KeyboardInterrupt."""
    from easd_local.llamacpp.runtime import LoadOptions, Model

    raised = 0
    for attempt in range(5):
        timer = threading.Timer(0.02 + 0.01 * attempt, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            for _ in range(10_000):
                Model(tiny_target, LoadOptions(n_ctx=64, n_threads=1)).close()
        except KeyboardInterrupt:
            raised += 1
        timer.join()
        err = capfd.readouterr().err
        # a SIGINT that lands in the garbage collector's weakref callbacks is dropped by Python
        # itself ("Exception ignored in: <function WeakKeyDictionary...remove>"), whatever the
        # program: that attempt says nothing of llama.cpp's log callback, ours
        if "Exception ignored" in err and \
                err.count("Exception ignored") == err.count("WeakKeyDictionary.__init__.<locals>.remove"):
            continue
        assert "Exception ignored" not in err and "Traceback" not in err, err
    assert raised >= 3, f"only {raised} of 5 interrupts came out of Model()"


def test_deferred_interrupt_holds_ctrl_c_until_the_block_ends():
    from easd_local.interrupts import deferred_interrupt

    reached_end = False
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupt() as state:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler has run by now
            assert state.pending
            reached_end = True
    assert reached_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_main_installs_the_handler_first(monkeypatch):
    """The heavy imports (the whole CLI) happen with the one-line handler in force."""
    import types

    import easd_local.__main__ as entry
    from easd_local import interrupts

    seen = {}
    fake_cli = types.ModuleType("easd_local.cli")
    fake_cli.main = lambda: seen.setdefault("handler", signal.getsignal(signal.SIGINT))
    monkeypatch.setitem(sys.modules, "easd_local.cli", fake_cli)
    monkeypatch.setenv("EASD_LOCAL_SUPERVISED", "0")  # in this process, not under a supervising parent
    try:
        entry.main()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert seen["handler"] is interrupts._exit_now
