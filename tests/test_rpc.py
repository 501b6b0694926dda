"""The target (and draft) on llama.cpp RPC servers: a real ``rpc-server`` on 127.0.0.1 built by
scripts/build_rpc.py, the tiny pair loaded through it by the real CLI in a subprocess (the
RPC devices and llama.cpp's abort on a lost server are per process).

Tests that need the built RPC backend skip, with the reason in pytest's header and summary,
when it is not built; the endpoint checks run everywhere (they need no backend).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from easd_local.llamacpp import rpc
from easd_local.lifeline import preexec
from easd_local.errors import ConfigError
from conftest import without_repack_note

CLI = [sys.executable, "-c", "from easd_local.cli import main; main()"]
RPC_DIR = rpc.backend_dir()  # resolved before any test moves EASD_LOCAL_HOME
SERVER = RPC_DIR / rpc.SERVER_NAME
BUILT = SERVER.is_file() and (RPC_DIR / rpc.LIB_NAME).is_file()
needs_rpc = pytest.mark.skipif(
    not BUILT, reason=f"no RPC backend built in {RPC_DIR}: run `python scripts/build_rpc.py` to test --rpc")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(args, home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, EASD_LOCAL_HOME=str(home), EASD_LOCAL_RPC_DIR=str(RPC_DIR))
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def start_server(log: Path | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen([str(SERVER), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
                            stdout=out, stderr=subprocess.DEVNULL, preexec_fn=preexec())  # dies with the suite
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"rpc-server exited with {proc.returncode}")
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("rpc-server did not start listening within 30 s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server():
    if not BUILT:
        pytest.skip(f"no RPC backend built in {RPC_DIR}: run `python scripts/build_rpc.py` to test --rpc")
    proc, endpoint = start_server()
    yield endpoint
    stop(proc)


def generate(home, tiny_draft, tiny_target, mode, *extra, max_tokens=48):
    r = cli(["generate", "Once upon a time", "--draft", str(tiny_draft), "--target", str(tiny_target), "--raw",
             "--mode", mode, "--max-tokens", str(max_tokens), "--ctx", "512", "--threads", "1", "--json", *extra],
            home)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def argmax_margin(target: Path, prompt_and_tokens: list[int]) -> float:
    """The local target's top-1 minus top-2 logit after this token sequence."""
    from easd_local.llamacpp.runtime import LoadOptions, Model

    with Model(target, LoadOptions(n_ctx=512, n_threads=1)) as m:
        row = m.decode(prompt_and_tokens)[0]
    top2 = np.sort(row)[-2:]
    return float(top2[1] - top2[0])


# --------------------------------------------------------------------------- everywhere
@pytest.mark.parametrize("text,want", [
    ("10.0.0.2:50052", ("10.0.0.2:50052",)),
    ("a:1, b:2", ("a:1", "b:2")),
    (None, ()),
])
def test_endpoints_parse(text, want):
    assert rpc.parse_endpoints(text) == want


@pytest.mark.parametrize("text", ["host", ":50052", "host:", "host:0", "host:70000", "host:x", "::1:5", "a:1,a:1", ""])
def test_bad_endpoint_is_one_config_error(text):
    with pytest.raises(ConfigError, match="--rpc"):
        rpc.parse_endpoints(text)


@pytest.mark.parametrize("text", ["3,x", "-1,2", "0,0", "nan"])
def test_bad_tensor_split(text):
    with pytest.raises(ConfigError, match="--tensor-split"):
        rpc.parse_tensor_split(text)


def test_tensor_split_forms():
    assert rpc.parse_tensor_split("3,1") == (3.0, 1.0)
    assert rpc.parse_tensor_split("3/1") == (3.0, 1.0)


def test_unreachable_server_is_one_line_and_quick(tmp_path, tiny_draft, tiny_target):
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    r = cli(["generate", "hi", "--draft", str(tiny_draft), "--target", str(tiny_target), "--raw", "--max-tokens", "4",
             "--ctx", "128", "--rpc", f"127.0.0.1:{port}"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: RPC server 127.0.0.1:{port}: cannot connect (Connection refused); "
                                             "is rpc-server running there?"]
    assert r.stdout == ""
    assert time.monotonic() - t0 < 60


def _listener(reply_hello: bool):
    """A TCP server on 127.0.0.1 that is not an rpc-server (silent), or a fake one that only
    answers HELLO like protocol 7.0.0."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    stop_ = threading.Event()

    def serve():
        sock.settimeout(0.2)
        conns = []
        while not stop_.is_set():
            try:
                c, _ = sock.accept()
            except OSError:
                continue
            conns.append(c)
            if reply_hello:
                c.recv(1 + 8 + rpc.RPC_CONN_CAPS_SIZE, socket.MSG_WAITALL)
                c.sendall(struct.pack("<Q", 4 + rpc.RPC_CONN_CAPS_SIZE) + bytes([7, 0, 0, 0]) + bytes(rpc.RPC_CONN_CAPS_SIZE))
                c.close()
        for c in conns:
            c.close()
        sock.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    return f"127.0.0.1:{sock.getsockname()[1]}", stop_


def test_silent_server_times_out_with_one_line():
    endpoint, stop_ = _listener(reply_hello=False)
    try:
        t0 = time.monotonic()
        with pytest.raises(rpc.RpcError, match="no HELLO reply within 1 s"):
            rpc.probe(endpoint, timeout=1.0)
        assert time.monotonic() - t0 < 10
    finally:
        stop_.set()


def test_missing_backend_says_how_to_get_it(tmp_path, tiny_target):
    endpoint, stop_ = _listener(reply_hello=True)
    try:
        env = dict(os.environ, EASD_LOCAL_HOME=str(tmp_path), EASD_LOCAL_RPC_DIR=str(tmp_path / "none"))
        r = subprocess.run([*CLI, "generate", "hi", "--target", str(tiny_target), "--mode", "target", "--raw",
                            "--max-tokens", "4", "--ctx", "128", "--rpc", endpoint],
                           capture_output=True, text=True, timeout=300, env=env)
    finally:
        stop_.set()
    lines = r.stderr.strip().splitlines()
    if len(lines) == 1 and "this llama-cpp-python has no RPC backend" not in lines[0]:
        pytest.skip(f"this llama-cpp-python has its own RPC backend: {lines[0]}")
    assert r.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("error: this llama-cpp-python has no RPC backend: build it with "
                                                   "`python scripts/build_rpc.py`"), r.stderr
    assert 'CMAKE_ARGS="-DGGML_RPC=on"' in lines[0]


# --------------------------------------------------------------------------- a real rpc-server
@needs_rpc
@pytest.mark.parametrize("mode", ["target", "sd"])
def test_target_through_rpc_equals_local(server, tmp_path, tiny_draft, tiny_target, mode):
    local = generate(tmp_path, tiny_draft, tiny_target, mode)
    remote = generate(tmp_path, tiny_draft, tiny_target, mode, "--rpc", server)
    assert remote["provenance"]["env"]["rpc"] == [server]
    assert "rpc" not in local["provenance"]["env"]
    a, b = local["completion_tokens"], remote["completion_tokens"]
    i = first_difference(a, b)
    if i is not None:
        # the same CPU code computes both sides; only an argmax near-tie may part them
        from easd_local.llamacpp.runtime import ModelFile

        with ModelFile(tiny_target) as m:
            prompt = m.vocab.tokenize("Once upon a time", add_special=True, parse_special=False)
        margin = argmax_margin(tiny_target, prompt + a[:i])
        assert margin < 1e-3, f"{mode}: texts part at token {i} where the argmax margin is {margin:g}"


@needs_rpc
def test_models_check_lists_layers_by_device(server, tmp_path, tiny_draft, tiny_target):
    r = cli(["models", "check", str(tiny_draft), str(tiny_target), "--rpc", server], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = without_repack_note(r.stdout.strip().splitlines())
    # the tiny target has 4 blocks + the output layer, the draft 2 + 1; the draft stays local
    assert lines[-2:] == [f"target layers: 5/5 on RPC0 ({server})", "draft layers: 3/3 on CPU"]


@needs_rpc
def test_tensor_split_and_partial_offload(server, tmp_path, tiny_draft, tiny_target):
    r = cli(["models", "check", str(tiny_draft), str(tiny_target), "--rpc", server, "--n-gpu-layers", "2"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"target layers: 3/5 on CPU, 2/5 on RPC0 ({server})" in r.stdout
    r = cli(["models", "check", str(tiny_draft), str(tiny_target), "--rpc", server, "--tensor-split", "1,1"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --tensor-split gives 2 shares, but there is 1 device to split over"


@needs_rpc
def test_status_line_names_the_server(server, tmp_path, tiny_draft, tiny_target):
    r = cli(["generate", "hi", "--draft", str(tiny_draft), "--target", str(tiny_target), "--raw", "--mode", "sd",
             "--max-tokens", "4", "--ctx", "128", "--threads", "1", "--rpc", server], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"layers: target RPC0 ({server}) 5/5 · draft CPU 3/3" in r.stderr


@needs_rpc
@pytest.mark.parametrize("json_out", [True, False])
def test_server_killed_mid_generation_is_one_clear_error(tmp_path, tiny_target, json_out):
    log = tmp_path / "rpc-server.log"
    proc, endpoint = start_server(log)
    gen = None
    try:
        env = dict(os.environ, EASD_LOCAL_HOME=str(tmp_path), EASD_LOCAL_RPC_DIR=str(RPC_DIR))
        # a long run: the context (64k positions) fills only after many seconds even on a fast machine
        gen = subprocess.Popen(
            [*CLI, "generate", "Once upon a time", "--target", str(tiny_target), "--mode", "target", "--raw",
             "--max-tokens", "100000", "--ctx", "65536", "--threads", "1", "--rpc", endpoint,
             *(["--json"] if json_out else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        if json_out:
            # nothing streams: wait for llama.cpp's own connection (after the probe's), then decode a while
            deadline = time.monotonic() + 120
            while log.read_text().count("Accepted client connection") < 2 and time.monotonic() < deadline:
                assert gen.poll() is None, gen.communicate()[1]
                time.sleep(0.1)
            time.sleep(2)
        else:
            assert gen.stdout.read(20), "no text streamed"
        assert gen.poll() is None, "the run ended before the server was killed"
        proc.send_signal(signal.SIGKILL)
        out, err = gen.communicate(timeout=60)
    finally:
        stop(proc)
        if gen is not None and gen.poll() is None:
            gen.kill()
    text = err.decode()
    assert gen.returncode == 2, text
    assert text.strip().splitlines()[-1] == (
        f"error: lost the RPC server ({endpoint}): Remote RPC server crashed or returned malformed response; "
        "the run was abandoned")
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text
    if json_out:
        assert out == b""  # nothing half-written


def test_a_decode_through_rpc_waits_for_the_server_on_its_own_clock(server, tiny_target):
    """Off the CPU ``llama_decode`` only queues the work (llama.cpp waits when the logits are
    read): a model with layers on an RPC server waits inside its decode's clock
    (``llama_synchronize``), so ``seconds_controller`` does not hold the device's compute; a
    local model makes no such call."""
    from easd_local.llamacpp.runtime import LoadOptions, Model, Part

    with Model(tiny_target, LoadOptions(n_ctx=512, n_threads=1, rpc=(server,), n_gpu_layers=-1)) as m:
        assert any(dev.startswith("RPC") for dev in m.placement), m.placement
        assert m._sync is not None
        toks = m.vocab.tokenize("Once upon a time")
        remote = m.decode_batch([Part(0, toks)], lend=True)[0].copy()
        assert m.seconds_decode > 0
    with Model(tiny_target, LoadOptions(n_ctx=512, n_threads=1)) as m:
        assert set(m.placement) == {"CPU"} and m._sync is None
        local = m.decode_batch([Part(0, toks)])[0]
    np.testing.assert_allclose(remote, local, rtol=1e-4, atol=1e-4)
