"""`easd-local quantize` (issue 39): llama.cpp's quantizer on the realistic tiny pair's F16
source, into the cache, registered under a name from source and type; a quantized source is
refused without --allow-requantize; Ctrl-C leaves no file and registers nothing."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from easd_local import paths
from easd_local.cli import app
from easd_local.llamacpp.runtime import LoadOptions, Model
from easd_local.store.catalog import load_catalog
from easd_local.store.quantized import quantized_name

runner = CliRunner()


@pytest.fixture(scope="module")
def real(tiny_spec, tmp_path_factory):
    return tiny_spec.write_realistic_models(tmp_path_factory.mktemp("real"))


def quantize(*args):
    return runner.invoke(app, ["quantize", *[str(a) for a in args]])


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def user_models() -> dict:
    p = paths.user_catalog_path()
    return json.loads(p.read_text())["models"] if p.exists() else {}


def test_names():
    assert quantized_name("x-f16", "F16", "Q4_K_M") == "x-q4_k_m"
    assert quantized_name("x_BF16", "BF16", "q8_0") == "x-q8_0"
    assert quantized_name("x-q4_k_m", "Q4_K_M", "Q8_0") == "x-q4_k_m-q8_0"  # says what it was made from
    assert quantized_name("my model", "F16", "Q8_0") == "my-model-q8_0"


def test_quantize_writes_a_loadable_registered_model(real, easd_home):
    src = real["draft_f16"]
    r = quantize(src, "--type", "Q8_0,q4_k_m", "-t", 1)
    assert r.exit_code == 0, r.output
    cat = load_catalog()
    for t in ("q8_0", "q4_k_m"):
        name = f"real-draft-{t}"
        entry = cat.models[name]
        path = paths.models_dir() / f"{name}.gguf"
        assert entry.path == path and entry.size == path.stat().st_size and entry.sha256 == sha256(path)
        rec = user_models()[name]
        assert rec["quantized_from"]["sha256"] == sha256(src) and rec["quant_type"] == t.upper()
        assert rec["quantized_from"]["file_type"] == "F16"
        with Model(path, LoadOptions(n_ctx=256, n_threads=1)) as m:  # llama.cpp loads it and decodes
            assert m.facts().file_type.upper().endswith(t.upper())
            assert m.decode([m.vocab.tokenize("hello", add_special=False)[0]]).shape == (1, m.n_vocab)
    assert not list(paths.models_dir().glob("*.part-*"))
    # the same again: there already, not redone
    mtime = (paths.models_dir() / "real-draft-q8_0.gguf").stat().st_mtime_ns
    r = quantize(src, "--type", "Q8_0")
    assert r.exit_code == 0 and "already there" in r.output
    assert (paths.models_dir() / "real-draft-q8_0.gguf").stat().st_mtime_ns == mtime
    # usable by name: models list, and pair score beside the draft it was made from
    r = runner.invoke(app, ["models", "list"])
    assert "real-draft-q8_0 (user)" in r.output
    r = runner.invoke(app, ["pair", "score", "-m", str(real["target"]), "-md", str(real["draft"]), "-md",
                            "real-draft-q8_0", "--dataset", "gsm8k", "--limit", "1", "--no-probe", "--ctx", "1024",
                            "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert [d["draft"] for d in res["drafts"]] == ["real-draft-q5_0", "real-draft-q8_0"]


def test_a_quantized_source_needs_allow_requantize(real, easd_home):
    src = real["draft"]  # Q5_0
    r = quantize(src, "--type", "Q8_0")
    assert r.exit_code == 2
    assert "already quantized (Q5_0)" in r.output and "--allow-requantize" in r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1
    assert not list(paths.models_dir().glob("*.gguf*")) and "real-draft-q5_0-q8_0" not in user_models()
    r = quantize(src, "--type", "Q8_0", "--allow-requantize", "-t", 1)
    assert r.exit_code == 0, r.output
    assert "reduce quality" in r.output  # llama.cpp's warning, said anyway
    rec = user_models()["real-draft-q5_0-q8_0"]
    assert rec["quantized_from"]["sha256"] == sha256(src) and rec["quantized_from"]["file_type"] == "Q5_0"


@pytest.mark.parametrize("args, says", [
    (["--type", "Q9_X"], "unknown quantization type 'Q9_X'"),
    (["--type", ","], "--type names no type"),
])
def test_bad_types_are_one_line(real, easd_home, args, says):
    r = quantize(real["draft_f16"], *args)
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output


def _quantizing(real, easd_home) -> subprocess.Popen:
    """``quantize`` as the console script runs it, once llama.cpp has started writing."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    # IQ4_XS with one thread: about 3 s for the 25 MB source, time enough to interrupt it
    p = subprocess.Popen([sys.executable, "-m", "easd_local", "quantize", str(real["target_f16"]), "--type", "IQ4_XS",
                          "-t", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         # as a terminal's command has them: a suite run under nohup would pass SIGHUP on ignored
                         preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGHUP, signal.SIGTERM)])
    deadline = time.monotonic() + 60
    while not list((easd_home / "models").glob("*.part-*")):
        assert p.poll() is None, p.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return p


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_ctrl_c_or_sigterm_leaves_nothing(sig, real, easd_home):
    """SIGINT while llama.cpp quantizes (a long C call in a child process): exit 130 at once,
    no part file, no output, nothing registered. SIGTERM and SIGHUP (a service manager,
    ``timeout``, a closed terminal) as well, ending by that signal as a process does."""
    p = _quantizing(real, easd_home)
    try:
        p.send_signal(sig)
        t0 = time.monotonic()
        rc = p.wait(timeout=30)
        took = time.monotonic() - t0
        err = p.stderr.read().decode()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if sig == signal.SIGINT:
        assert rc == 130, err
        assert err.strip().splitlines()[-1] == "interrupted"
    else:
        assert rc == -sig, err
    assert "Traceback" not in err and "error" not in err, err
    assert took < 2.0
    models = easd_home / "models"
    assert not list(models.glob("*")), list(models.glob("*"))
    assert "real-target-iq4_xs" not in user_models()


def test_a_quantizer_that_crashes_is_named(real, easd_home):
    """llama.cpp's quantizer dying by a signal (a crash; the OOM killer) is said as such, not
    as whatever its log's last lines happened to hold; no part file."""
    p = _quantizing(real, easd_home)
    try:
        workers = [int(c) for c in open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()]
        quantizer = [int(c) for c in open(f"/proc/{workers[0]}/task/{workers[0]}/children").read().split()]
        os.kill(quantizer[0], signal.SIGSEGV)
        rc = p.wait(timeout=30)
        err = p.stderr.read().decode()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc == 2, err
    assert err.strip().splitlines()[-1] == (
        "error: real-target-f16.gguf: quantization to IQ4_XS failed: llama.cpp's quantizer crashed (SIGSEGV); "
        "if it persists, report it with the output of `easd-local doctor`"), err
    assert not list((easd_home / "models").glob("*"))


def test_a_home_that_cannot_be_written_is_one_line(real, easd_home):
    easd_home.mkdir(parents=True, exist_ok=True)
    (easd_home / "locks").write_text("")  # a file where the lock folder goes: mkdir fails as on a read-only home
    r = quantize(real["draft_f16"], "--type", "Q8_0")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"cannot quantize into {easd_home / 'models'}: {easd_home / 'locks'} is a file, not a folder" in r.output


def test_name_and_conflicts(real, easd_home):
    src = real["draft_f16"]
    r = quantize(src, "--type", "Q8_0,Q4_0", "--name", "mine")
    assert r.exit_code == 2 and "--name names one output" in r.output
    r = quantize(src, "--type", "Q4_0", "--name", "mine", "-t", 1)
    assert r.exit_code == 0, r.output
    assert user_models()["mine"]["quant_type"] == "Q4_0"
    # a name taken by another model (a built-in one here) is refused before anything is written
    builtin = next(n for n, e in load_catalog().models.items() if not e.user)
    r = quantize(src, "--type", "Q8_0", "--name", builtin)
    assert r.exit_code == 2 and "a different model is already named" in r.output
    assert not (paths.models_dir() / f"{builtin}.gguf").exists()


def test_a_disk_too_small_is_refused_before_writing(real, easd_home, monkeypatch):
    """Too little free space: one line and exit 2 before llama.cpp writes anything, nothing
    registered."""
    import shutil

    real_usage = shutil.disk_usage
    src = real["draft_f16"]
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real_usage(p)._replace(free=src.stat().st_size // 2))
    r = quantize(src, "--type", "Q8_0")
    assert r.exit_code == 2 and "not enough free space" in r.output and "Traceback" not in r.output
    assert not list((easd_home / "models").glob("*"))  # no output, no part file
    assert "real-draft-q8_0" not in user_models()
