"""Issue 38: llama.cpp's extra buffer types (repacked weights, AMX) on every CPU.

Real llama.cpp throughout. The realistic-shape pair (scripts/make_tiny_pair.py --realistic:
512 wide, Q4_K_M / Q5_0 / Q8_0) takes the kernels real models take: on x86 with AVX2 its
Q4_K target is repacked (CPU_REPACK), on an AMX CPU its weights go to the AMX buffer. An AMX
machine is simulated with EASD_LOCAL_REPACK_PROBE=crash, or with a self-test child that
really dies by SIGSEGV.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from easd_local.llamacpp import devices, repack
from easd_local.llamacpp.runtime import LoadOptions, Model

EASD = [sys.executable, "-m", "easd_local"]  # the console script's own path: the supervising parent

# Logits with extra buffer types on and off, realistic target (Q4_K repacked on this x86 CPU),
# a 32-token prefill, one single-token decode and a 5-token verify block, 2 threads: measured
# max |Δz| 0.416 and mean |Δz| 0.044 on logits of std 7.4 (2026-12-05, AMD EPYC, AVX-512),
# argmax equal at 37 of 38 positions. The repacked kernel sums the same quantized products in
# another order. Tolerances ~2.4× the measurement:
MAX_ABS_TOL = 1.0
MEAN_ABS_TOL = 0.1


@pytest.fixture
def probing(easd_home, monkeypatch):
    """The real self-test, its verdicts kept in this test's own home (not the session's file)."""
    monkeypatch.delenv(repack.FORCE_ENV, raising=False)
    monkeypatch.delenv(repack.VERDICTS_ENV, raising=False)
    return easd_home


def _verdicts(home: Path) -> dict:
    return json.loads((home / repack.VERDICTS_NAME).read_text())


def test_self_test_runs_in_a_child_once_and_is_remembered(probing, realistic_models, monkeypatch):
    target = realistic_models["target"]
    calls = []
    real = repack.self_test
    monkeypatch.setattr(repack, "self_test", lambda *a, **k: calls.append(a) or real(*a, **k))
    with Model(target, LoadOptions(n_ctx=256, n_threads=2)) as m:
        first = m.repack
    assert len(calls) == 1 and not first.cached and first.seconds is not None
    # "crash" on a CPU whose kernels die (an AMX Xeon of llama.cpp #20824): then repacking is off
    assert first.verdict in ("ok", "crash") and first.extra_bufts == (first.verdict == "ok")
    assert len(_verdicts(probing)) == 1
    with Model(target, LoadOptions(n_ctx=256, n_threads=2)) as m:  # a second start: no self-test
        assert m.repack.cached and m.repack.verdict == first.verdict
    assert len(calls) == 1
    # another CPU (or build) is another key: tested again
    monkeypatch.setattr(repack, "cpu_name", lambda: "Intel(R) Xeon(R) Platinum 8480+")
    with Model(target, LoadOptions(n_ctx=256, n_threads=2)) as m:
        assert not m.repack.cached
    assert len(calls) == 2 and len(_verdicts(probing)) == 2


def test_a_self_test_that_dies_by_a_signal_turns_repacking_off(probing, realistic_models, monkeypatch, tmp_path):
    """A child that really dies by SIGSEGV after loading (what the AMX kernels do on a
    multi-token decode): the parent lives, loads without extra buffers and says why."""
    crasher = tmp_path / "crasher.py"
    crasher.write_text(textwrap.dedent("""
        import json, os, signal
        print(json.dumps({"extra_buffers": ["AMX"]}), flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    """))
    monkeypatch.setattr(repack, "CHILD", (sys.executable, str(crasher)))
    with Model(realistic_models["target"], LoadOptions(n_ctx=256, n_threads=2)) as m:
        assert m.repack.verdict == "crash" and not m.repack.extra_bufts
        assert "AMX" in m.repack.detail and "SIGSEGV" in m.repack.detail
        assert m.repack.note == ("weight repacking off: llama.cpp's AMX kernels crashed on this CPU in a self-test "
                                 "(llama.cpp #20824)")
        assert not repack.extra_buffers(m.memory.model_buffers)  # llama.cpp was told: no extra buffers
        m.decode(m.vocab.tokenize("one two three four five six", add_special=False))  # and it decodes
    with Model(realistic_models["target"], LoadOptions(n_ctx=256, n_threads=2)) as m:
        assert m.repack.cached and m.repack.verdict == "crash"  # remembered: no second crash


# a self-test child that dies as an AMX Xeon's does (llama.cpp #20824) for models with Q8_0
# weights, and runs the real self-test for the others
_CRASH_ON_Q8_0 = """
import json, os, signal, sys
from easd_local.llamacpp.gguf_info import read_gguf_info
if "Q8_0" in read_gguf_info(sys.argv[1]).tensor_types:
    print(json.dumps({"extra_buffers": ["AMX"]}), flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)
os.execv(sys.executable, [sys.executable, "-m", "easd_local.llamacpp.repack_child", *sys.argv[1:]])
"""


def test_the_suites_direct_loads_take_a_crash_verdict(tiny_models, tmp_path, monkeypatch):
    """Issue 43: the suite's helper for llama-cpp-python's own Llama applies the verdict. With
    a self-test child that dies by SIGSEGV for the tiny pair's Q8_0 models, they load and decode
    with repacking off; before, the suite forced 'ok' and loaded them with it on."""
    from direct_llama import load_llama

    crasher = tmp_path / "crasher.py"
    crasher.write_text(_CRASH_ON_Q8_0)
    monkeypatch.setattr(repack, "CHILD", (sys.executable, str(crasher)))
    monkeypatch.delenv(repack.FORCE_ENV, raising=False)
    monkeypatch.setenv(repack.VERDICTS_ENV, str(tmp_path / "verdicts.json"))  # not the session's verdicts
    for key in ("target", "draft"):
        llm = load_llama(tiny_models[key], n_ctx=256, n_threads=1, logits_all=True, verbose=False)
        assert llm.repack.verdict == "crash" and "AMX" in llm.repack.detail and "SIGSEGV" in llm.repack.detail
        assert llm.model_params.use_extra_bufts is False  # what llama.cpp was given
        toks = llm.tokenize(b"Once upon a time, there was a cat", add_bos=False)
        llm.eval(toks)  # a multi-token batch: what the AMX kernels crash on
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        assert llm.n_tokens == len(toks) + 1 and np.isfinite(llm.scores[:llm.n_tokens]).all()
    crashed = json.loads((tmp_path / "verdicts.json").read_text())
    assert {v["verdict"] for v in crashed.values()} == {"crash"}
    q4 = load_llama(tiny_models["target_q4"], n_ctx=256, n_threads=1, verbose=False)  # no Q8_0: the real self-test
    assert q4.repack.verdict in ("ok", "crash") and not q4.repack.cached
    assert q4.model_params.use_extra_bufts is (q4.repack.verdict == "ok")
    # the project's own loader takes the same remembered verdict
    with Model(tiny_models["target"], LoadOptions(n_ctx=256, n_threads=1)) as m:
        assert m.repack.cached and m.repack.verdict == "crash" and not repack.extra_buffers(m.memory.model_buffers)
        assert m.decode(m.vocab.tokenize("one two three four", add_special=False)).shape[-1] == m.n_vocab


def _cli(args, home: Path, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "EASD_LOCAL_HOME": str(home), **env}
    return subprocess.run(EASD + [str(a) for a in args], capture_output=True, text=True, timeout=300, env=full,
                          stdin=subprocess.DEVNULL)


def test_simulated_crash_reaches_json_and_the_load(realistic_models, easd_home):
    r = _cli(["generate", "Hello there", "-md", realistic_models["draft"], "-m", realistic_models["target"],
              "-n", "6", "--json", "--threads", "2", "--mode", "sd"], easd_home, EASD_LOCAL_REPACK_PROBE="crash")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    note = out["placement"]["repack_note"]
    assert note.startswith("weight repacking off: llama.cpp's repacked-weight kernels crashed on this CPU in a "
                           "self-test (llama.cpp #20824)")
    for role in ("target", "draft"):
        assert out["placement"][role]["repack"]["extra_bufts"] is False


def test_no_repack_reaches_llama_cpp(realistic_models, probing):
    args = ["generate", "Hello", "-md", realistic_models["draft"], "-m", realistic_models["target"], "-n", "2",
            "--threads", "2", "--verbose", "--raw"]
    on = _cli(args, probing)  # the real self-test decides
    off = _cli(args + ["--no-repack"], probing)
    assert on.returncode == 0 and off.returncode == 0, (on.stderr[-2000:], off.stderr[-2000:])
    loaded = [ln for ln in off.stderr.splitlines() if "model buffer size" in ln]
    assert loaded and not any("REPACK" in ln or "AMX" in ln for ln in loaded), loaded
    assert "weight repacking off (--no-repack)" in off.stderr
    if "REPACK = 1" in devices.system_info() and "weight repacking off" not in on.stderr:
        # this build repacks and the self-test let it: the flag changed something
        assert any("REPACK" in ln or "AMX" in ln for ln in on.stderr.splitlines() if "model buffer size" in ln)
    r = _cli(["models", "check", realistic_models["draft"], realistic_models["target"], "--load", "-nr"], probing)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "weight repacking off (--no-repack)", r.stdout


_LOGITS_CHILD = """
import sys, numpy as np
from easd_local.llamacpp.runtime import LoadOptions, Model
path, extra, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
with Model(path, LoadOptions(n_ctx=512, n_threads=2, extra_bufts=extra)) as m:
    toks = m.vocab.tokenize("The quick brown fox jumps over the lazy dog. " * 6, add_special=False)[:38]
    a = m.decode(toks[:32], logits_at=list(range(32)))       # a multi-token prefill
    b = m.decode([toks[32]])                                  # a one-token decode
    c = m.decode(toks[33:38], logits_at=list(range(5)))       # an SD verify block
    np.save(out, np.vstack([a, b, c]))
    print(",".join(m.memory.model_buffers))
"""


@pytest.mark.parametrize("key", ["target", "draft", "draft_q8"])
def test_realistic_pair_agrees_with_extra_buffers_on_and_off(realistic_models, tmp_path, key):
    """In children, so that a crash of the extra-buffer kernels (an AMX CPU) fails this test
    instead of killing the suite."""
    path = realistic_models[key]
    got = {}
    for extra in (True, False):
        out = tmp_path / f"{key}-{int(extra)}.npy"
        p = subprocess.run([sys.executable, "-c", _LOGITS_CHILD, str(path), "1" if extra else "0", str(out)],
                           capture_output=True, text=True, timeout=300)
        if extra and p.returncode < 0:
            # the extra-buffer kernels die on this CPU (llama.cpp #20824): the product's answer is
            # the self-test, which must say so, and the plain kernels, which must work
            verdict = repack.self_test(path, threads=2, n_gpu_layers=0)
            assert verdict.verdict == "crash" and not verdict.extra_bufts, verdict
            crashed = f"extra buffer types crash on this CPU (signal {-p.returncode}); the self-test turns them off"
            continue
        assert p.returncode == 0, f"extra buffers {'on' if extra else 'off'}: exit {p.returncode}\n{p.stderr[-2000:]}"
        got[extra] = (np.load(out), p.stdout.strip().split(","))
    if True not in got:
        pytest.skip(crashed)
    assert not repack.extra_buffers(got[False][1])
    diff = np.abs(got[True][0] - got[False][0])
    assert diff.max() <= MAX_ABS_TOL and diff.mean() <= MEAN_ABS_TOL, (diff.max(), diff.mean(), got[True][1])
    if key == "target" and "REPACK = 1" in devices.system_info() and "AVX2 = 1" in devices.system_info():
        assert repack.extra_buffers(got[True][1]), got[True][1]  # Q4_K is repacked on AVX2 x86: the path was taken


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.skipif(sys.platform != "linux", reason="finds the child through /proc")
def test_a_crash_while_decoding_is_one_line(tiny_draft, tiny_target, easd_home):
    """llama.cpp killing the process mid-decode (here: SIGSEGV sent to the child) ends in one
    line naming the model and what to try, exit 2; no bare 'Segmentation fault'."""
    proc = subprocess.Popen(EASD + ["generate", "Tell me a long story", "-md", str(tiny_draft), "-m", str(tiny_target),
                                    "-n", "100000", "--ctx", "100000", "--raw",
                                    "--threads", "1", "--mode", "sd"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env={**os.environ, "EASD_LOCAL_HOME": str(easd_home)})
    try:
        deadline = time.monotonic() + 60
        child = []
        while time.monotonic() < deadline:
            child = _children(proc.pid)
            if child and proc.stdout.read1(1):  # tokens are coming: it is decoding
                break
            time.sleep(0.05)
        assert child, "no child process"
        os.kill(child[0], signal.SIGSEGV)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("error: llama.cpp crashed (SIGSEGV, segmentation fault) while decoding with ")
    assert tiny_target.name in line or tiny_draft.name in line
    assert "layers on CPU" in line and "--no-repack" in line and "-ngl 0" in line and "easd-local doctor" in line


@pytest.mark.skipif(sys.platform != "linux", reason="finds the child through /proc")
def test_sigterm_to_the_parent_reaches_the_child(tiny_draft, tiny_target, easd_home):
    proc = subprocess.Popen(EASD + ["generate", "Tell me a long story", "-md", str(tiny_draft), "-m", str(tiny_target),
                                    "-n", "100000", "--ctx", "100000", "--raw", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env={**os.environ, "EASD_LOCAL_HOME": str(easd_home)})
    try:
        assert proc.stdout.read1(1)  # decoding
        child = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM
    assert child and not Path(f"/proc/{child[0]}").exists()


def _tiny_catalog(tmp_path: Path, draft: Path, target: Path) -> Path:
    import hashlib

    lines = ["schema = 1", 'default_pair = "tiny"', ""]
    for name, f in (("tiny-draft", draft), ("tiny-target", target)):
        data = f.read_bytes()
        lines += [f'[models."{name}"]', f'file = "{name}.gguf"', f"size = {len(data)}",
                  f'sha256 = "{hashlib.sha256(data).hexdigest()}"', "",
                  f'[[models."{name}".sources]]', 'kind = "path"', f'path = "{f}"', ""]
    lines += ["[pairs.tiny]", 'draft = "tiny-draft"', 'target = "tiny-target"']
    cat = tmp_path / "catalog.toml"
    cat.write_text("\n".join(lines) + "\n")
    return cat


def test_doctor(realistic_models, tmp_path, probing):
    cat = _tiny_catalog(tmp_path, realistic_models["draft"], realistic_models["target"])
    env = {"EASD_LOCAL_CATALOG": str(cat)}
    r = _cli(["doctor"], probing, **env)
    assert r.returncode == 2 and "to do: tiny-draft is not downloaded: run `easd-local pull`" in r.stderr, r.stderr
    assert "ready: no" in r.stdout
    assert _cli(["pull", "--yes"], probing, **env).returncode == 0
    r = _cli(["doctor"], probing, **env)
    assert r.returncode == 0, r.stderr
    keys = [ln.split(":", 1)[0] for ln in r.stdout.splitlines() if not ln.startswith(" ")]
    assert keys == ["easd-local", "llama-cpp-python", "ggml", "python", "cpu", "load", "llama.cpp system info", "backends",
                    "gpu offload", "devices", "rpc backend", "home", "free space", "models", "default pair",
                    "default mode", "self-test", "verdicts file", "ready"]
    assert "tiny-target" in r.stdout and "self-test took" in r.stdout and ", run now" in r.stdout
    again = json.loads(_cli(["doctor", "--json"], probing, **env).stdout)
    assert again["ready"] is True and all("remembered" in t for t in again["self-test"])
    r = _cli(["doctor"], probing, EASD_LOCAL_REPACK_PROBE="crash", **env)
    assert r.returncode == 0 and "forced-crash · weight repacking off" in r.stdout
