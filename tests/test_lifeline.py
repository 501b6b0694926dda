"""Issue 45: nothing the project starts outlives what started it, however that ends.

Real processes throughout: the console script's supervised worker (``python -m easd_local``,
what the ``easd-local`` script runs) under ``serve`` and ``bench`` on the tiny pair, killed with
SIGKILL (which the supervisor cannot pass on), SIGTERM and SIGINT; and ``lifeline`` itself on
a plain child, a program not ours (``sleep``) and the polling watcher of systems without
``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from easd_local.lifeline import PARENT_ENV

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")

EASD = [sys.executable, "-m", "easd_local"]  # the console script's path: the supervising parent
FAST = ["--max-tokens", "12", "--ctx", "1024", "--threads", "1"]


def children(pid: int) -> list[int]:
    """Every thread's children (chromedriver starts Chromium from another thread than its first)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for whoever adopted it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def _end(proc: subprocess.Popen, pids: list[int]) -> None:
    """Leave nothing behind, whatever the test found."""
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


# ------------------------------------------------------------------ lifeline on its own
# a middle process that starts one child and waits: the test kills the middle one
_MIDDLE = """
import os, subprocess, sys, time
from easd_local import lifeline
kind = sys.argv[1]
if kind == "program":
    child = subprocess.Popen(["sleep", "60"], preexec_fn=lifeline.preexec())
else:
    code = ("from easd_local import lifeline; import time; "
            + ("lifeline._kernel_tie = lambda: False; " if kind == "watcher" else "")
            + "lifeline.die_with_parent(); print('tied', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], env=lifeline.child_env(), stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"tied\\n"
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("kind", ["python", "watcher", "program"])
def test_a_child_dies_with_a_parent_killed_by_sigkill(kind):
    """python: prctl in the child; watcher: getppid() polled (macOS's path, here with the
    kernel's tie left out); program: a binary not ours, tied between fork and exec."""
    middle = subprocess.Popen([sys.executable, "-c", _MIDDLE, kind], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    child = int(middle.stdout.readline())
    try:
        assert alive(child)
        middle.send_signal(signal.SIGKILL)
        middle.wait(timeout=10)
        assert gone_within([child], 5), f"{kind}: child {child} outlived its parent"
    finally:
        _end(middle, [child])


_BROWSER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from browser_helpers import chrome, find_browser
d = chrome(*find_browser()[:2])
d.get("data:text/html,<title>up</title>")
print(d.service.process.pid, flush=True)
time.sleep(120)
"""


def test_the_pages_browser_dies_with_the_tests():
    """The chat page's tests drive chromedriver, which starts Chromium: both die with a test
    run killed by SIGKILL (Chromium is tied to chromedriver, chromedriver to the run)."""
    from browser_helpers import find_browser

    browser, driver, why = find_browser()
    if why:
        pytest.skip(why)
    middle = subprocess.Popen([sys.executable, "-c", _BROWSER, str(Path(__file__).parent)], stdout=subprocess.PIPE,
                              stdin=subprocess.DEVNULL)
    driver_pid = int(middle.stdout.readline())
    browsers = children(driver_pid)
    try:
        assert browsers, "chromedriver started no browser"
        middle.send_signal(signal.SIGKILL)
        middle.wait(timeout=10)
        assert gone_within([driver_pid, *browsers], 5), "chromedriver or Chromium outlived the run"
    finally:
        _end(middle, [driver_pid, *browsers])


def test_a_parent_already_gone_is_noticed():
    """The tie is made after the child starts: a parent that died before is caught by the
    check of the parent's PID, and the child ends at once, as the kernel would have ended it."""
    code = "from easd_local.lifeline import die_with_parent; die_with_parent(); print('ran')"
    other = subprocess.Popen(["sleep", "30"])  # a PID that is not this child's parent
    try:
        gone = subprocess.run([sys.executable, "-c", code], env={**os.environ, PARENT_ENV: str(other.pid)},
                              capture_output=True, text=True, timeout=60)
        here = subprocess.run([sys.executable, "-c", code], env={**os.environ, PARENT_ENV: str(os.getpid())},
                              capture_output=True, text=True, timeout=60)
    finally:
        other.kill()
        other.wait()
    assert gone.returncode == -signal.SIGKILL and gone.stdout == ""
    assert here.returncode == 0 and here.stdout == "ran\n"


# ------------------------------------------------------------------ serve
def _serve(tiny_draft, tiny_target, tmp_path) -> tuple[subprocess.Popen, int, int, Path]:
    log = tmp_path / "serve.log"
    env = {**os.environ, "EASD_LOCAL_HOME": str(tmp_path / "home")}
    env.pop("EASD_LOCAL_API_KEY", None)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(EASD + ["serve", "--draft", str(tiny_draft), "--target", str(tiny_target), "--port",
                                        "0", "--threads", "1", "--log-level", "warning"],
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    port = None
    while time.monotonic() < deadline and port is None:
        text = log.read_text(errors="replace")
        if "listening on http://127.0.0.1:" in text:
            port = int(text.split("listening on http://127.0.0.1:", 1)[1].split("/", 1)[0])
        elif proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}:\n{text}")
        time.sleep(0.05)
    assert port, log.read_text(errors="replace")
    while time.monotonic() < deadline and refuses(port):
        time.sleep(0.05)
    workers = children(proc.pid)
    assert len(workers) == 1 and not refuses(port), (workers, log.read_text(errors="replace"))
    return proc, workers[0], port, log


def test_serve_killed_with_sigkill_frees_its_port(tiny_draft, tiny_target, tmp_path):
    proc, worker, port, log = _serve(tiny_draft, tiny_target, tmp_path)
    try:
        proc.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        proc.wait(timeout=10)
        assert gone_within([worker], 5), "the worker outlived the killed supervisor"
        while not refuses(port) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert refuses(port), "the port still answers 5 s after kill -9"
        with socket.socket() as s:  # and a restart could take it at once
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    finally:
        _end(proc, [worker])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_serve_ends_cleanly_on_sigterm_and_sigint(sig, tiny_draft, tiny_target, tmp_path):
    proc, worker, port, log = _serve(tiny_draft, tiny_target, tmp_path)
    try:
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
        assert gone_within([worker], 5) and refuses(port)
    finally:
        _end(proc, [worker])
    out = log.read_text(errors="replace")
    assert "Traceback" not in out and "error:" not in out, out
    assert rc in (0, -sig, 128 + sig), (rc, out)


# ------------------------------------------------------------------ bench
def _bench_args(tiny_draft, tiny_target, out: Path) -> list[str]:
    return ["bench", "--dataset", "gsm8k", "--limit", "10", "--modes", "target,sd", "--draft", str(tiny_draft),
            "--target", str(tiny_target), *FAST, "--out", str(out)]


def _rows(out: Path) -> int:
    return out.read_bytes().count(b"\n") if out.exists() else 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_bench_killed_mid_run_leaves_no_worker_and_resumes(sig, tiny_draft, tiny_target, tmp_path):
    from easd_local.bench.report import load_results

    out = tmp_path / "r.jsonl"
    args = _bench_args(tiny_draft, tiny_target, out)
    env = {**os.environ, "EASD_LOCAL_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(EASD + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _rows(out) < 2:
            workers = workers or children(proc.pid)
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")
            time.sleep(0.005)
        assert workers and _rows(out) < 20, "the run ended before it could be killed"
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert gone_within(workers, 5), f"a worker outlived {sig.name} of the supervisor"
        assert _rows(out) < 20, "the worker finished the run instead of ending with its parent"
    finally:
        _end(proc, workers)
    err = proc.stderr.read().decode(errors="replace")
    assert "Traceback" not in err, err
    resumed = subprocess.run(EASD + args + ["--resume"], capture_output=True, text=True, timeout=300,
                             stdin=subprocess.DEVNULL, env=env)
    assert resumed.returncode == 0, resumed.stderr
    rows = load_results(out)
    assert rows.torn_lines == 0
    keys = [(r["qid"], r["method"]) for r in rows]
    expected = {(f"gsm8k-test-{i:05d}", m) for i in range(10) for m in ("target", "sd")}
    assert set(keys) == expected and len(keys) == len(expected), keys  # every row, once
    assert "already there" in resumed.stderr


# ------------------------------------------------------------------ the crash note
def test_a_supervisor_killed_with_sigkill_leaves_no_file(tiny_draft, tiny_target, tmp_path):
    """The supervisor's crash note has no name in the temporary folder: a ``kill -9`` of the
    supervisor (which runs no clean-up) leaves nothing there, and a crash is still told with
    what llama.cpp was doing."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "EASD_LOCAL_HOME": str(tmp_path / "home"), "TMPDIR": str(tmp)}
    args = ["generate", "Tell me a long story", "--draft", str(tiny_draft), "--target", str(tiny_target), "-n",
            "100000", "--ctx", "100000", "--raw", "--threads", "1"]
    for how in ("supervisor", "worker"):
        proc = subprocess.Popen(EASD + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env)
        workers: list[int] = []
        try:
            assert proc.stdout.read1(1), proc.stderr.read().decode(errors="replace")  # decoding
            workers = children(proc.pid)
            assert workers and list(tmp.iterdir()) == []
            os.kill(proc.pid if how == "supervisor" else workers[0], signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
            assert gone_within(workers, 5)
        finally:
            _end(proc, workers)
        assert list(tmp.iterdir()) == [], how
        if how == "worker":  # the note still reached the supervisor
            assert proc.returncode == 2 and "while decoding with tiny-" in err.decode(), err


def test_a_crash_after_the_load_does_not_say_while_loading(tiny_draft, tiny_target, tmp_path):
    """A server that crashes (or is killed for memory) while idle, its models loaded, is not
    reported as crashing "while loading" one of them."""
    import urllib.request

    proc, worker, port, log = _serve(tiny_draft, tiny_target, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        os.kill(worker, signal.SIGSEGV)
        assert proc.wait(timeout=30) == 2
    finally:
        _end(proc, [worker])
    line = log.read_text(errors="replace").splitlines()[-1]
    assert line.startswith("error: llama.cpp crashed (SIGSEGV, segmentation fault) after loading tiny-"), line
    assert "--no-repack" in line


def test_the_crash_line_offers_only_flags_that_help():
    """No model was loading or decoding (no note): the load flags are not offered, the command
    (``quantize``, ``doctor``) may not take them; --parallel only to the commands that have it."""
    from easd_local.supervise import crash_message

    bare = crash_message(signal.SIGSEGV, "", "quantize")
    assert bare == ("error: easd-local crashed (SIGSEGV, segmentation fault); if it persists, report it with "
                    "the output of `easd-local doctor`")
    assert crash_message(signal.SIGKILL, "", "quantize") == "error: easd-local was killed (SIGKILL)"
    note = "while decoding with m.gguf (layers on CPU 5; weight repacking on)"
    assert crash_message(signal.SIGKILL, note, "generate").endswith("; if memory ran out, try a smaller --ctx")
    assert crash_message(signal.SIGKILL, note, "serve").endswith("; if memory ran out, try a smaller --ctx or --parallel")
    assert "--no-repack" in crash_message(signal.SIGABRT, note, "chat")


def test_the_crash_note_is_read_back_as_written(tmp_path, monkeypatch):
    """The worker's note (``crashnote``: the file mapped shared, written by copies) is what the
    supervisor's ``pread`` reads: nothing before the first note, then each note in full,
    a shorter one leaving nothing of the longer one before it."""
    from easd_local import crashnote
    from easd_local.supervise import _read_note

    fd = os.open(tmp_path / "note", os.O_RDWR | os.O_CREAT)
    monkeypatch.setattr(crashnote, "_fd", None)
    monkeypatch.setattr(crashnote, "_page", None)
    monkeypatch.setattr(crashnote, "_last", "")
    monkeypatch.setenv(crashnote.NOTE_ENV, str(fd))
    try:
        crashnote.adopt()
        assert crashnote._fd == fd and crashnote._page is not None
        assert _read_note(fd) == ""
        crashnote.note("while decoding with a-much-longer-name.gguf (layers on CPU)")
        assert _read_note(fd) == "while decoding with a-much-longer-name.gguf (layers on CPU)"
        crashnote.note("while decoding with b.gguf")
        assert _read_note(fd) == "while decoding with b.gguf"
    finally:
        if crashnote._page is not None:
            crashnote._page.close()
        os.close(fd)
