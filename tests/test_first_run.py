"""Issue 44: what a newcomer sees in the first ten minutes, on the tiny real GGUF pair through
the real ``easd-local`` command: the repacking line once per machine (an AMX machine simulated
with EASD_LOCAL_REPACK_PROBE=crash), a busy CPU named (the load injected with
EASD_LOCAL_LOADAVG: the CPU is not spun), chat's two-line banner and /about, and the auto
mode's reason in ``generate --json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from easd_local import host  # noqa: E402
from easd_local.llamacpp.devices import gpu_offload_supported  # noqa: E402
from easd_local.engine.ways import auto_mode  # noqa: E402
from conftest import tiny_repack_off  # noqa: E402

EASD = [sys.executable, "-m", "easd_local"]
REPACK_LINE = "weight repacking off: llama.cpp's repacked-weight kernels crashed on this CPU in a self-test"


def _cli(args, home: Path, stdin: str = "", **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "EASD_LOCAL_HOME": str(home), **env}
    return subprocess.run(EASD + [str(a) for a in args], capture_output=True, text=True, timeout=300, env=full,
                          input=stdin)


@pytest.fixture
def pair(tiny_draft, tiny_target):
    return ["-md", tiny_draft, "-m", tiny_target, "--threads", "1", "-n", "4"]


def test_the_repacking_line_is_shown_once_per_machine(easd_home, pair):
    crash = {"EASD_LOCAL_REPACK_PROBE": "crash"}
    first = _cli(["generate", "Hi", *pair], easd_home, **crash)
    assert first.returncode == 0, first.stderr
    assert REPACK_LINE in first.stderr
    second = _cli(["generate", "Hi", *pair], easd_home, **crash)
    assert second.returncode == 0 and "repacking" not in second.stderr, second.stderr
    chat = _cli(["chat", *pair], easd_home, stdin="/about\n", **crash)
    banner = chat.stderr.split("the pair, the mode")[0]
    assert chat.returncode == 0 and "repacking" not in chat.stderr.splitlines()[2], chat.stderr
    assert REPACK_LINE in chat.stderr and "repacking" not in banner.splitlines()[0]  # /about still has it
    # where it is asked for, it is always there
    verbose = _cli(["generate", "Hi", *pair, "--verbose"], easd_home, **crash)
    assert REPACK_LINE in verbose.stderr
    js = json.loads(_cli(["generate", "Hi", *pair, "--json"], easd_home, **crash).stdout)
    assert js["placement"]["repack_note"].startswith(REPACK_LINE)
    check = _cli(["models", "check", pair[1], pair[3], "--load"], easd_home, **crash)
    assert check.returncode == 0 and REPACK_LINE in check.stdout, check.stdout
    # another home is another machine: news again
    again = _cli(["generate", "Hi", *pair], easd_home.parent / "other", **crash)
    assert REPACK_LINE in again.stderr


def test_a_busy_cpu_is_named(easd_home, pair):
    n = host.cores()
    busy = f"{n + 1.9:.1f}"
    words = f"CPU busy: load {busy} on {n} core{'s' if n != 1 else ''}"
    r = _cli(["generate", "Hi", *pair], easd_home, EASD_LOCAL_LOADAVG=busy)
    assert r.returncode == 0 and r.stderr.strip().splitlines()[-1].endswith(words), r.stderr
    js = json.loads(_cli(["generate", "Hi", *pair, "--json"], easd_home, EASD_LOCAL_LOADAVG=busy).stdout)
    assert js["cpu_load"] == {"before": float(busy), "after": float(busy), "cores": n, "busy": words}
    chat = _cli(["chat", *pair], easd_home, stdin="hi\n", EASD_LOCAL_LOADAVG=busy)
    stats = [ln for ln in chat.stderr.splitlines() if " tokens · " in ln and "tok/s" in ln]
    assert stats and stats[0].endswith(words), chat.stderr
    doctor = json.loads(_cli(["doctor", "--json", "--no-self-test"], easd_home, EASD_LOCAL_LOADAVG=busy).stdout)
    assert doctor["load"].startswith(words) and "threads by default" in doctor["load"]
    # a reading at the cores is not busy: nothing said (our own threads count in it after a reply)
    calm = _cli(["generate", "Hi", *pair], easd_home, EASD_LOCAL_LOADAVG=str(n))
    assert calm.returncode == 0 and "CPU busy" not in calm.stderr


def test_busy_counts_our_own_threads_only_after_a_reply(monkeypatch):
    monkeypatch.setattr(host, "cores", lambda: 2)
    assert host.busy_note((2.3, False)) == "CPU busy: load 2.3 on 2 cores"  # before loading: others only
    assert host.busy_note((2.3, True)) == ""  # after a reply: our own 2 threads are in it
    assert host.busy_note((2.3, False), (3.9, True)) == "CPU busy: load 3.9 on 2 cores"
    assert host.busy_note((None, False)) == ""


def test_generate_json_gives_the_auto_modes_reason(easd_home, pair):
    js = json.loads(_cli(["generate", "Hi", *pair, "--json"], easd_home).stdout)
    c = auto_mode(gpu_offload_supported(), True)
    mode, why = c.mode, c.why
    assert js["mode"] == mode and js["auto_mode_reason"] == why and why
    flagged = json.loads(_cli(["generate", "Hi", *pair, "--json", "--mode", "sd"], easd_home).stdout)
    assert flagged["auto_mode_reason"] is None  # --mode chose it


@pytest.mark.parametrize("mode", ["easd-tf", "sd"])
def test_chat_banner_is_two_lines_within_100_columns_and_about_has_the_rest(easd_home, pair, mode):
    r = _cli(["chat", *pair, "--mode", mode], easd_home, stdin="/mode sd\n/about\n", COLUMNS="100")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    if tiny_repack_off():  # the once-shown note follows the banner here (an AMX CPU); /about repeats it
        assert "weight repacking off" in lines.pop(2), lines
    assert lines[0].startswith("easd-local chat · ") and f"mode {mode} · context" in lines[0]
    assert lines[1].startswith("note: not lossless" if mode == "easd-tf" else "/about") and "/about" in lines[1]
    assert all(len(ln) <= 100 for ln in lines[:2]), lines[:2]
    assert lines[2].startswith("mode sd")  # the /mode answer: nothing else came between
    about = "\n".join(lines[3:])
    assert "mode sd · context" in about and "sampling: temperature 0.7" in about and "backend " in about
