"""`easd-local models inspect` / `models check` through the CLI, good and bad files.

Every bad input must give exactly one line on stderr that names the file and the
problem, exit code 2, and never a Python traceback."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from easd_local.cli import app

pytest.importorskip("llama_cpp")

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def _assert_one_line_error(result, path: Path, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: ") and str(path) in line, line
    for frag in fragments:
        assert frag in line, line
    return line


# --------------------------------------------------------------------------- good files
@pytest.mark.parametrize("key,quant", [("target", "Q8_0"), ("target_q4", "Q4_0")])
def test_inspect_shows_facts(tiny_models, key, quant):
    r = _invoke("models", "inspect", tiny_models[key])
    assert r.exit_code == 0, r.output
    rows = {}
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    assert rows["architecture"] == "llama"
    assert rows["quantization"] == quant
    assert rows["tensor types"].startswith(f"{quant}×30")
    assert "F32×9" in rows["tensor types"]
    assert rows["vocabulary"] == "306 tokens (bpe)"
    assert rows["context (trained)"] == "2,048"
    assert rows["chat template"] == "yes" and rows["KV rollback"] == "yes"
    assert r.stderr == ""


def test_check_accepts_the_pair(tiny_draft, tiny_target, tiny_target_q4):
    r = _invoke("models", "check", tiny_draft, tiny_target)
    assert r.exit_code == 0, r.output
    assert "compatible" in r.stdout and "306 tokens" in r.stdout
    assert _invoke("models", "check", tiny_target, tiny_target_q4).exit_code == 0


def test_check_rejects_the_odd_vocabulary(tiny_target, tiny_odd):
    r = _invoke("models", "check", tiny_odd, tiny_target)
    assert r.exit_code == 2
    assert r.stderr.strip() == "error: vocabularies differ at token id 267: draft 'ly' vs target 'ou'"
    assert "Traceback" not in r.output and r.stdout == ""


# --------------------------------------------------------------------------- bad files
def _unsupported_arch(path: Path) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "notanarch")
    w.add_name("not an arch")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 16), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(16, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _make_bad(kind: str, tmp: Path, good: Path) -> tuple[Path, tuple[str, ...]]:
    """Write the bad file of ``kind``; return its path and the fragments its message needs."""
    p = tmp / f"{kind}.gguf"
    data = good.read_bytes()
    if kind == "missing":
        return p, ("file not found",)
    if kind == "directory":
        p.mkdir()
        return p, ("is a directory",)
    if kind == "text":
        p.write_text("this is a text file, not a model\n" * 20)
        return p, ("not a GGUF file",)
    if kind == "empty":
        p.write_bytes(b"")
        return p, ("empty file",)
    if kind == "magic-only":
        p.write_bytes(b"GGUF")
        return p, ("truncated GGUF (4 bytes",)
    if kind == "cut-in-header":
        p.write_bytes(data[:100])
        return p, ("100 bytes", "truncated or corrupt", "failed to read key-value pairs")
    if kind == "cut-in-half":
        p.write_bytes(data[: len(data) // 2])
        return p, (f"truncated or corrupt GGUF ({len(data) // 2:,} bytes)", "not within the file bounds")
    if kind == "garbage-after-magic":
        p.write_bytes(data[:8] + bytes(range(256)) * 40)
        return p, ("GGUF (10,248 bytes)",)  # the header reader and llama.cpp word it each their way
    if kind == "newer-version":
        p.write_bytes(b"GGUF" + (99).to_bytes(4, "little") + data[8:])
        return p, ("version 99", "only supports up to version 3")
    if kind == "unsupported-arch":
        _unsupported_arch(p)
        return p, ("unsupported architecture 'notanarch'",)
    raise AssertionError(kind)


BAD_KINDS = [
    "missing", "directory", "text", "empty", "magic-only", "cut-in-header", "cut-in-half",
    "garbage-after-magic", "newer-version", "unsupported-arch",
]


@pytest.mark.parametrize("kind", BAD_KINDS)
@pytest.mark.parametrize("how", ["inspect", "check-draft", "check-target"])
def test_bad_file_gives_one_line(tmp_path, tiny_target, kind, how):
    bad, fragments = _make_bad(kind, tmp_path, tiny_target)
    if how == "inspect":
        r = _invoke("models", "inspect", bad)
    elif how == "check-draft":
        r = _invoke("models", "check", bad, tiny_target)
    else:
        r = _invoke("models", "check", tiny_target, bad)
    _assert_one_line_error(r, bad, *fragments)


@pytest.mark.parametrize("kind", ["magic-only", "cut-in-header", "cut-in-half", "garbage-after-magic",
                                  "newer-version"])
def test_models_add_refuses_a_file_whose_header_does_not_parse(easd_home, tmp_path, tiny_target, kind):
    """Refused when added, in one line, rather than registered and failing at every load."""
    bad, fragments = _make_bad(kind, tmp_path, tiny_target)
    _assert_one_line_error(_invoke("models", "add", "x", bad), bad, *fragments)
    assert not (easd_home / "user-catalog.json").exists()


def test_models_add_takes_an_architecture_the_gguf_package_does_not_know(easd_home, tmp_path):
    """A newer llama.cpp may know it: `models add` does not judge, `models inspect` says it."""
    p = tmp_path / "new-arch.gguf"
    _unsupported_arch(p)
    r = _invoke("models", "add", "x", p)
    assert r.exit_code == 0 and "added x" in r.stdout, r.output


def test_console_script_shows_no_traceback(tmp_path, tiny_target):
    """The installed `easd-local` script, in a real process: llama.cpp's own log stays
    quiet and the user sees one line per bad file."""
    exe = shutil.which("easd-local")
    cmd = [exe] if exe else [sys.executable, "-c", "from easd_local.cli import main; main()"]
    half, _ = _make_bad("cut-in-half", tmp_path, tiny_target)
    env = {**os.environ, "COLUMNS": "300"}
    r = subprocess.run(cmd + ["models", "inspect", str(half)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {half}: truncated or corrupt GGUF"), r.stderr
