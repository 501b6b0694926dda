"""Bring your own pair: model names wherever a model path goes, `models add-pair` (the pair
check runs and its verdict is stored), `models inspect` without llama.cpp, and
`pull hf:ORG/REPO[:QUANT|/FILE]` against a local stand-in for the Hugging Face Hub (a
loopback HTTP server speaking the hub's JSON; no real network)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from typer.testing import CliRunner  # noqa: E402

from easd_local.store.catalog import load_catalog, read_user_catalog  # noqa: E402
from easd_local.cli import app  # noqa: E402
from easd_local.llamacpp import repack  # noqa: E402
from easd_local.errors import PullError  # noqa: E402
from easd_local.store.hub import HubRef, parse_hub_ref, pick_file  # noqa: E402

runner = CliRunner()
REPO = "Org/Tiny-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def home(easd_home) -> Path:
    return easd_home


def cli(*args: str):
    return runner.invoke(app, [str(a) for a in args])


# ------------------------------------------------------------------ the stand-in hub
class Hub:
    """Serves repos {repo: {filename: bytes}}: HEAD/GET /api/models/REPO (with blobs: size
    and LFS sha256 per file) and GET /REPO/resolve/REV/FILE. ``lie`` maps a file to bytes
    served instead of the listed ones."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.lie: dict[str, bytes] = {}
        self.downloads: list[str] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _listing(self):
                path = self.path.split("?", 1)[0]
                repo = path.removeprefix("/api/models/").split("/revision/")[0]
                return repo, hub.repos.get(repo)

            def do_HEAD(self):
                _, files = self._listing()
                self.send_response(200 if files is not None else 404)
                self.end_headers()

            def do_GET(self):
                if self.path.startswith("/api/models/"):
                    repo, files = self._listing()
                    if files is None:
                        self.send_error(404)
                        return
                    sib = [{"rfilename": f, "size": len(b), "blobId": hashlib.sha1(b).hexdigest(),
                            "lfs": {"size": len(b), "sha256": hashlib.sha256(b).hexdigest(), "pointerSize": 134}}
                           for f, b in files.items()]
                    body = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                       "siblings": sib}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                head, sep, rest = self.path.partition("/resolve/")
                repo = head.lstrip("/")
                filename = rest.split("/", 1)[1] if "/" in rest else ""
                files = hub.repos.get(repo, {})
                if not sep or filename not in files:
                    self.send_error(404)
                    return
                hub.downloads.append(filename)
                data = hub.lie.get(filename, files[filename])
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def hub(tiny_models):
    pytest.importorskip("huggingface_hub")
    h = Hub()
    h.repos[REPO] = {"tiny-target-Q8_0.gguf": tiny_models["target"].read_bytes(),
                     "tiny-target-Q4_0.gguf": tiny_models["target_q4"].read_bytes(),
                     "README.md": b"# tiny\n"}
    h.repos["Org/Tiny-Draft-GGUF"] = {"tiny-draft-Q8_0.gguf": tiny_models["draft"].read_bytes()}
    yield h
    h.close()


def run_cli(home: Path, hub_url: str, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a real process: huggingface_hub reads HF_ENDPOINT when it is imported."""
    env = {**os.environ, "EASD_LOCAL_HOME": str(home), "HF_ENDPOINT": hub_url, "COLUMNS": "200"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("EASD_LOCAL_CATALOG", None)
    code = "import sys; from easd_local.cli import main; sys.argv[0] = 'easd-local'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env)


# ------------------------------------------------------------------ hf: references
@pytest.mark.parametrize("text,want", [
    ("hf:Org/Repo-GGUF", HubRef("Org/Repo-GGUF")),
    ("hf:Org/Repo-GGUF:q8_0", HubRef("Org/Repo-GGUF", quant="q8_0")),
    ("hf:Org/Repo-GGUF/sub/file.gguf", HubRef("Org/Repo-GGUF", filename="sub/file.gguf")),
])
def test_parse_hub_ref(text, want):
    assert parse_hub_ref(text) == want


@pytest.mark.parametrize("bad", ["hf:", "hf:Org", "hf:/Repo", "hf:Org/", "hf:Org/:Q8_0"])
def test_parse_hub_ref_rejects(bad):
    from easd_local.errors import ConfigError

    with pytest.raises(ConfigError, match="expected hf:ORG/REPO"):
        parse_hub_ref(bad)


FILES = ["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-q4_k_s.gguf", "mmproj-m-f16.gguf"]


@pytest.mark.parametrize("ref,want", [
    (HubRef("o/r"), "m-Q4_K_M.gguf"),  # llama.cpp's default quantization
    (HubRef("o/r", quant="q8_0"), "m-Q8_0.gguf"),  # case-insensitive
    (HubRef("o/r", quant="Q4_K_S"), "m-q4_k_s.gguf"),
    (HubRef("o/r", filename="m-Q8_0.gguf"), "m-Q8_0.gguf"),
])
def test_pick_file_as_llama_cpp_does(ref, want):
    assert pick_file(ref, FILES) == want


def test_pick_file_falls_back_and_refuses():
    assert pick_file(HubRef("o/r"), ["b-Q8_0.gguf", "a-F16.gguf"]) == "a-F16.gguf"  # no Q4_K_M: the first GGUF
    with pytest.raises(PullError, match="no Q5_K_M file; quantizations there: Q4_K_M, Q4_K_S, Q8_0"):
        pick_file(HubRef("o/r", quant="Q5_K_M"), FILES)
    with pytest.raises(PullError, match="split GGUF"):
        pick_file(HubRef("o/r"), ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"])
    with pytest.raises(PullError, match="has no file x.gguf"):
        pick_file(HubRef("o/r", filename="x.gguf"), FILES)


def test_pull_hf_downloads_verifies_and_registers(home, hub, tiny_models):
    r = run_cli(home, hub.url, "pull", f"hf:{REPO}:Q8_0")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    # one clear plan: file, size, source, destination
    assert "download 1 file" in r.stderr and "tiny-target-Q8_0.gguf" in r.stderr
    assert f"Hugging Face {REPO}/tiny-target-Q8_0.gguf" in r.stderr and str(home / "models") in r.stderr
    path = home / "models" / "tiny-target-Q8_0.gguf"
    assert path.read_bytes() == tiny_models["target"].read_bytes()
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny-target-Q8_0.gguf"]
    assert "tiny-target-q8_0" in r.stdout and "verified" in r.stdout
    rec = read_user_catalog()["models"]["tiny-target-q8_0"]  # the home fixture set EASD_LOCAL_HOME
    assert rec["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert rec["sources"] == [{"kind": "hf", "repo": REPO, "filename": "tiny-target-Q8_0.gguf", "revision": COMMIT}]
    assert "path" not in rec  # it lives in the cache, like the built-in models
    # a second pull downloads nothing
    r2 = run_cli(home, hub.url, "pull", f"hf:{REPO}:Q8_0")
    assert r2.returncode == 0, r2.stderr
    assert hub.downloads == ["tiny-target-Q8_0.gguf"]
    # and the name works where a model path does
    r3 = cli("generate", "hi", "-m", "tiny-target-q8_0", "--mode", "target", "-n", "3", "-t", "1", "--json")
    assert r3.exit_code == 0, r3.output
    assert Path(json.loads(r3.stdout.splitlines()[-1])["target_path"]) == path


def test_pull_hf_wrong_bytes_leave_nothing(home, hub, tiny_models):
    hub.lie["tiny-target-Q8_0.gguf"] = tiny_models["draft"].read_bytes()[: tiny_models["target"].stat().st_size]
    r = run_cli(home, hub.url, "pull", f"hf:{REPO}/tiny-target-Q8_0.gguf", "--yes")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "could not pull" in r.stderr and "mismatch" in r.stderr
    models = home / "models"
    assert not models.exists() or list(models.iterdir()) == []
    assert not (home / "user-catalog.json").exists()


@pytest.mark.parametrize("ref,msg", [(f"hf:{REPO}:Q5_K_M", "no Q5_K_M file; quantizations there: Q4_0, Q8_0"),
                                     ("hf:Org/Nothing", "the hub is not usable"),
                                     (f"hf:{REPO}/nope.gguf", "has no file nope.gguf")])
def test_pull_hf_errors_are_one_line(home, hub, ref, msg):
    r = run_cli(home, hub.url, "pull", ref)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr


def test_pull_hf_hub_down_is_one_line(home, tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = run_cli(home, f"http://127.0.0.1:{port}", "pull", f"hf:{REPO}")
    assert r.returncode == 2 and "the hub is not usable" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ add-pair and names
def test_add_pair_by_path_then_use_it_by_name(home, tiny_draft, tiny_target):
    r = cli("models", "add-pair", "tiny", "--draft", tiny_draft, "--target", tiny_target)
    assert r.exit_code == 0, r.output
    assert "added pair tiny" in r.stdout and "306 tokens" in r.stdout
    cat = load_catalog()
    pr = cat.pair("tiny")
    assert pr.user and pr.draft.name == tiny_draft.stem and pr.target.name == tiny_target.stem
    assert pr.check["compatible"] is True and pr.check["shared_vocab"] == 306 and pr.check["checked"]
    assert pr.draft.path == tiny_draft.resolve() and pr.draft.role == "draft"
    # the verdict shows in the list
    r = cli("models", "list")
    assert "tiny (user)" in r.stdout and "compatible, 306 shared tokens" in r.stdout
    # the pair by name, end to end through llama.cpp
    r = cli("generate", "Tell me a story", "--pair", "tiny", "--mode", "sd", "-n", "8", "-t", "1", "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.splitlines()[-1])
    assert obj["pair"] == "tiny" and obj["tokens"] == 8
    assert Path(obj["draft_path"]) == tiny_draft.resolve()
    # the model names where paths go: generate, chat, models inspect/check
    r = cli("generate", "hi", "-md", tiny_draft.stem, "-m", tiny_target.stem, "--mode", "sd", "-n", "4", "-t", "1")
    assert r.exit_code == 0, r.output
    r = cli("chat", "--pair", "tiny", "-n", "3", "-t", "1", "--mode", "sd")
    assert r.exit_code == 0 and "easd-local chat · tiny" in r.stderr
    r = cli("models", "inspect", tiny_target.stem)
    assert r.exit_code == 0 and "306 tokens (bpe)" in r.stdout
    r = cli("models", "check", tiny_draft.stem, tiny_target.stem)
    assert r.exit_code == 0 and "compatible" in r.stdout
    # adding it again (same files) reuses the registered models
    r = cli("models", "add-pair", "tiny2", "-md", tiny_draft, "-m", tiny_target.stem)
    assert r.exit_code == 0, r.output
    assert load_catalog().pair("tiny2").draft.name == tiny_draft.stem


def test_add_pair_again_says_what_it_replaced(home, tiny_draft, tiny_target, tiny_target_q4):
    assert cli("models", "add-pair", "p1", "-md", tiny_draft, "-m", tiny_target).exit_code == 0
    r = cli("models", "add-pair", "p1", "-md", tiny_draft.stem, "-m", tiny_target_q4)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == f"replaced pair p1 (was {tiny_draft.stem} -> {tiny_target.stem})"
    assert load_catalog().pair("p1").target.name == tiny_target_q4.stem


def test_models_add_keeps_the_user_pairs_that_use_the_name_right(home, tiny_draft, tiny_target, tiny_target_q4,
                                                                   tiny_odd):
    """Re-pointing a model that a pair uses: refused, naming the pair, when the new file breaks
    the pair (else `models list` says compatible and `generate --pair` fails); else the pair's
    stored check is made again."""
    assert cli("models", "add-pair", "p1", "-md", tiny_draft, "-m", tiny_target).exit_code == 0
    before = (home / "user-catalog.json").read_bytes()
    r = cli("models", "add", tiny_draft.stem, tiny_odd)
    assert r.exit_code == 2
    assert r.stderr.strip() == (f"error: {tiny_draft.stem} not replaced: pair p1 ({tiny_draft.stem} -> "
                                f"{tiny_target.stem}) would break: vocabularies differ at token id 267: draft 'ly' "
                                "vs target 'ou'; add the file under another name")
    assert (home / "user-catalog.json").read_bytes() == before
    data = read_user_catalog()
    data["pairs"]["p1"]["check"]["checked"] = "then"
    (home / "user-catalog.json").write_text(json.dumps(data))
    r = cli("models", "add", tiny_draft.stem, tiny_target_q4)  # same vocabulary: the pair holds
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == f"replaced model {tiny_draft.stem} (was {tiny_draft.resolve()})"
    assert "pair p1 checked again: compatible, shared vocabulary 306 tokens" in r.stdout
    pr = load_catalog().pair("p1")
    assert pr.draft.path == tiny_target_q4.resolve() and pr.check["checked"] != "then"
    assert pr.check["shared_vocab"] == 306 and pr.description == data["pairs"]["p1"]["description"]


def test_add_pair_refuses_an_incompatible_pair_and_stores_nothing(home, tiny_odd, tiny_target):
    r = cli("models", "add-pair", "bad", "--draft", tiny_odd, "--target", tiny_target)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pair bad not added" in lines[0] and "vocabularies differ at token id 267" in lines[0]
    assert not (home / "user-catalog.json").exists()


@pytest.mark.parametrize("args,msg", [
    (["default", "--draft", "X", "--target", "Y"], "no such file"),
    (["p", "--draft", "no-such-model", "--target", "x.gguf"], "no model of that name"),
])
def test_add_pair_bad_input_is_one_line(home, args, msg):
    r = cli("models", "add-pair", *args)
    assert r.exit_code == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unknown_name_or_missing_file_is_one_line(home):
    r = cli("generate", "hi", "-m", "no-such-model", "--mode", "target")
    assert r.exit_code == 2 and "no model of that name in the catalog" in r.stderr
    r = cli("models", "inspect", "qwen2.5-coder-1.5b-instruct-q4_k_m")  # built in, not pulled here
    assert r.exit_code == 2 and "not downloaded yet: easd-local pull qwen2.5-coder-1.5b-instruct-q4_k_m" in r.stderr


def test_inspect_never_loads_llama_cpp(home, tiny_target, monkeypatch):
    import easd_local.llamacpp.runtime as rt

    def no_load(*a, **kw):
        raise AssertionError("models inspect loaded the model in llama.cpp")

    monkeypatch.setattr(rt.Model, "__init__", no_load)
    r = cli("models", "inspect", tiny_target)
    assert r.exit_code == 0, r.output
    assert "722.94 kB (722,944 bytes)" in r.stdout or "bytes)" in r.stdout
    assert "1 GB = 10^9 bytes" in r.stdout


def test_check_load_says_where_layers_went(home, tiny_draft, tiny_target):
    from easd_local.llamacpp.devices import gpu_offload_supported

    r = cli("models", "check", tiny_draft, tiny_target, "--load", "--json", "-c", "512")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["compatible"] is True and obj["shared_vocab"] == 306
    where = obj["placement"]
    assert where["target"]["layers_total"] == 5 and where["draft"]["layers_total"] == 3  # blocks + output layer
    assert where["target"]["kv_bytes"] == 512 * 4 * 2 * 64 * 2  # n_ctx × layers × (K, V) × 2 heads × 32 dims × f16
    if not gpu_offload_supported():
        assert where["backend"] == "CPU" and where["target"]["layers_gpu"] == 0
    r = cli("models", "check", tiny_draft, tiny_target, "--load")
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[1].startswith(f"backend {where['backend']} · target: model ")
    if not gpu_offload_supported():
        assert lines[2:4] == ["target layers: 5/5 on CPU", "draft layers: 3/3 on CPU"], lines
    # whatever this CPU's self-test said (issue 43): the verdict the loader applied, and its line
    # last when repacking is off
    for role, path in (("target", tiny_target), ("draft", tiny_draft)):
        verdict = repack.decide(path, requested=None, threads=1, n_gpu_layers=0)
        assert where[role]["repack"]["verdict"] == verdict.verdict
        assert where[role]["repack"]["extra_bufts"] is verdict.extra_bufts
    off = [role for role in ("target", "draft") if not where[role]["repack"]["extra_bufts"]]
    if off:
        assert where["repack_note"] and "weight repacking off" in where["repack_note"]
        assert lines[-1] == where["repack_note"] and len(lines) == 5, lines
    else:
        assert where["repack_note"] is None and len(lines) == 4, lines


@pytest.mark.parametrize("key", ["draft", "target", "target_q4", "odd"])
def test_header_reader_agrees_with_the_gguf_package(tiny_models, key):
    """Our header reader (fast on a 152k vocabulary) against gguf.GGUFReader (slow there)."""
    import gguf

    from easd_local.llamacpp.gguf_info import read_gguf_info

    path = tiny_models[key]
    ref = gguf.GGUFReader(str(path))
    info = read_gguf_info(path)
    assert info.n_vocab == len(ref.fields["tokenizer.ggml.tokens"].data)
    assert info.n_params == sum(int(t.n_elements) for t in ref.tensors)
    assert info.architecture == ref.fields["general.architecture"].contents()
    assert info.n_layers == ref.fields["llama.block_count"].contents()
    assert info.n_ctx_train == ref.fields["llama.context_length"].contents()
    hist = {}
    for t in ref.tensors:
        name = gguf.GGMLQuantizationType(t.tensor_type).name
        hist[name] = hist.get(name, 0) + 1
    assert info.tensor_types == hist
    assert info.chat_template == ("tokenizer.chat_template" in ref.fields)
