"""`easd-local serve`: API key, browser origins (CORS), loading state, a full queue, failures
at start (tiny pair, real llama.cpp, real sockets, a real Chromium where installed)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
import uvicorn
from browser_helpers import chrome, find_browser, wait
from serve_helpers import EXE, http, start_tiny, stop_clean

from easd_local.cli.serve import is_loopback, listen_socket
from easd_local.engine.config import DecodeConfig
from easd_local.engine.pair import open_models
from easd_local.llamacpp.runtime import LoadOptions
from easd_local.server.app import ServeConfig, create_app
from easd_local.server.engine import Engine

KEY = "s3cret-key"
LISTED_ORIGIN = "https://chat.example.org"  # --cors-origin
BROWSER, DRIVER, NO_BROWSER = find_browser()


@pytest.fixture(scope="module")
def keyed_server(tiny_draft, tiny_target, tmp_path_factory):
    # the key through the environment variable (the flag is the same option)
    srv = start_tiny(tiny_draft, tiny_target, tmp_path_factory.mktemp("serve-key"), "--mode", "target", "--ctx", "256",
                     "--threads", "1", "--cors-origin", LISTED_ORIGIN, env={"EASD_LOCAL_API_KEY": KEY})
    yield srv
    stop_clean(srv)


@pytest.mark.parametrize("path", ["/v1/models", "/metrics"])
@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Bearer s3cret-ke", "Basic s3cret-key", KEY])
def test_missing_or_wrong_key_is_401(keyed_server, path, auth):
    status, _, body = http("GET", keyed_server.base + path, headers={"Authorization": auth} if auth else {})
    assert status == 401
    assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == "invalid_api_key"


def test_right_key_is_200_and_health_needs_none(keyed_server, tiny_draft, tiny_target):
    assert http("GET", keyed_server.base + "/health")[0] == 200
    for path in ("/v1/models", "/metrics"):
        assert http("GET", keyed_server.base + path, headers={"Authorization": f"Bearer {KEY}"})[0] == 200
    name = f"{tiny_draft.stem}+{tiny_target.stem}"
    good = openai.OpenAI(base_url=keyed_server.base + "/v1", api_key=KEY, max_retries=0)
    r = good.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.model_extra["timings"]["mode"] == "target"
    bad = openai.OpenAI(base_url=keyed_server.base + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3)


def test_no_max_tokens_on_a_small_context_is_served(keyed_server):
    """--ctx 256 under the built-in default of 512 tokens: a request that gives no max_tokens
    decodes up to the context's end; only a max_tokens the client gave is refused past it."""
    auth = {"Authorization": f"Bearer {KEY}"}
    status, _, body = http("POST", keyed_server.base + "/v1/completions", {"prompt": "Tell me a story"},
                           headers=auth)
    assert status == 200, body
    assert body["usage"]["total_tokens"] <= 256 and body["usage"]["completion_tokens"] >= 1
    status, _, body = http("POST", keyed_server.base + "/v1/completions", {"prompt": "hi", "max_tokens": 512},
                           headers=auth)
    assert status == 400 and body["error"]["param"] == "max_tokens", body


def _preflight(base: str, origin: str) -> tuple[int, dict]:
    status, headers, _ = http("OPTIONS", base + "/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    return status, headers


@pytest.mark.parametrize("origin", ["http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8000",
                                    LISTED_ORIGIN])
def test_a_page_of_an_allowed_origin_may_call_the_api(keyed_server, origin):
    """As llama-server does, a browser page from another origin (a local UI, or one --cors-origin
    names) has its preflight answered without the key, and every answer names the origin, the
    401 too (the page can read why)."""
    status, headers = _preflight(keyed_server.base, origin)
    assert status == 200 and headers["access-control-allow-origin"] == origin, headers
    assert "authorization" in headers["access-control-allow-headers"] and "POST" in headers[
        "access-control-allow-methods"]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for auth, want in ((f"Bearer {KEY}", 200), ("Bearer wrong", 401)):
        status, headers, _ = http("POST", keyed_server.base + "/v1/chat/completions", body,
                                  headers={"Origin": origin, "Authorization": auth})
        assert status == want and headers["access-control-allow-origin"] == origin, headers


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null"])
def test_a_page_of_another_origin_may_not_read_the_api(keyed_server, origin):
    status, headers = _preflight(keyed_server.base, origin)
    assert status != 200 and "access-control-allow-origin" not in headers
    _, headers, _ = http("GET", keyed_server.base + "/v1/models",
                         headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
    assert "access-control-allow-origin" not in headers
    # nor run a generation it cannot read: a page can POST text/plain without a preflight
    status, _, body = http("POST", keyed_server.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                           headers={"Origin": origin, "Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed", body
    assert f"--cors-origin {origin}" in body["error"]["message"]


@pytest.mark.skipif(bool(NO_BROWSER), reason=NO_BROWSER or "")
def test_a_browser_page_on_another_port_streams_a_reply(keyed_server):
    """A real Chromium, a page served from another loopback port (another origin) calling the API
    with the key, as a chat UI run next to the server does: the preflight and the stream pass."""
    page = ("<!doctype html><script>fetch(%r, {method: 'POST', headers: {'Authorization': 'Bearer %s', "
            "'Content-Type': 'application/json'}, body: JSON.stringify({messages: [{role: 'user', content: 'hi'}], "
            "max_tokens: 3, stream: true})}).then(r => r.text()).then(t => document.title = 'ok ' + t, "
            "e => document.title = 'failed ' + e)</script>") % (keyed_server.base + "/v1/chat/completions", KEY)

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page.encode())

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    d = chrome(BROWSER, DRIVER)
    try:
        d.get(f"http://localhost:{other.server_address[1]}/")
        title = wait(d, "document.title", 60, what="the page's fetch")
        assert title.startswith("ok ") and "data: [DONE]" in title, title
    finally:
        d.quit()
        other.shutdown()


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")


class InProcessServer:
    """The real app and engine on a real loopback socket, uvicorn in a thread: lets a test
    hold the model load (a gate) and see the server while it loads."""

    def __init__(self, load, *, n_parallel=1, queue=0):
        self.engine = Engine(load, n_parallel, queue)
        conf = ServeConfig(model_name="tiny", base=DecodeConfig(mode="target"), thresholds_source="default")
        self.sock = listen_socket("127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(self.engine, conf), log_level="warning",
                                                    lifespan="off", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.engine.start()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.engine.stop()
        self.sock.close()


def test_health_503_while_loading_then_200(tiny_draft, tiny_target):
    gate = threading.Event()

    def load():
        gate.wait(30)
        return open_models(tiny_draft, tiny_target, LoadOptions(n_ctx=256, n_threads=1))

    with InProcessServer(load) as s:
        for _ in range(100):  # until uvicorn answers
            try:
                status, _, body = http("GET", s.base + "/health", timeout=5)
                break
            except OSError:
                time.sleep(0.05)
        assert status == 503 and body == {"status": "loading"}
        status, headers, body = http("POST", s.base + "/v1/completions", {"prompt": "hi"})
        assert status == 503 and body["error"]["code"] == "loading" and headers["retry-after"]
        gate.set()
        assert s.engine.wait_loaded(30)
        assert http("GET", s.base + "/health")[0] == 200
        status, _, body = http("POST", s.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 200 and body["usage"]["completion_tokens"] >= 1


def test_full_queue_is_503_with_retry_after(tiny_draft, tiny_target):
    def load():
        return open_models(tiny_draft, tiny_target, LoadOptions(n_ctx=1024, n_threads=1))

    with InProcessServer(load, n_parallel=1, queue=0) as s:
        assert s.engine.wait_loaded(30)
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="x", max_retries=0)
        stream = client.completions.create(model="tiny", prompt="Tell me a story", max_tokens=900, stream=True)
        next(iter(stream))  # the one slot is taken
        status, headers, body = http("POST", s.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        stream.close()
        assert status == 503 and body["error"]["code"] == "queue_full" and int(headers["retry-after"]) >= 1
        for _ in range(100):  # the closed stream frees the slot; then requests are served again
            status, _, body = http("POST", s.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            if status == 200:
                break
            time.sleep(0.05)
        assert status == 200


def _serve(args, tmp_path, timeout=60):
    return subprocess.run(EXE + ["serve", "--port", "0", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env={**__import__("os").environ,
                                                         "EASD_LOCAL_HOME": str(tmp_path / "home")})


def test_corrupt_model_ends_with_one_line(tiny_draft, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    r = _serve(["--draft", str(tiny_draft), "--target", str(bad), "--threads", "1"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr and "Traceback" not in r.stderr + r.stdout


def test_taken_port_is_one_clear_error(tiny_draft, tiny_target, tmp_path):
    taken = listen_socket("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        r = subprocess.run(EXE + ["serve", "--draft", str(tiny_draft), "--target", str(tiny_target), "--port",
                                  str(port)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        taken.close()
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("flag,value,message", [("--parallel", "0", "--parallel must be between 1 and 256"),
                                                ("--queue", "-1", "--queue must be >= 0"),
                                                ("--api-key", " ", "is empty"),
                                                ("--timeout", "0", "--timeout must be a number of seconds > 0"),
                                                ("--cors-origin", "https://chat.example.org/", "no path")])
def test_bad_server_flags(flag, value, message, tmp_path):
    r = _serve([flag, value, "--draft", str(tmp_path / "x.gguf"), "--target", str(tmp_path / "y.gguf")], tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_stopping_the_server_answers_its_requests(tiny_draft, tiny_target, tmp_path):
    """SIGTERM (Ctrl-C, a service manager) while requests decode and wait: each is answered with
    a 503 error (a stream: an error event, then [DONE]) rather than a cut connection, a bare
    "Internal Server Error" or a stream that just stops, and the server exits at once with no
    traceback."""
    from serve_helpers import metric_values

    srv = start_tiny(tiny_draft, tiny_target, tmp_path, "--mode", "target", "--ctx", "4096", "--threads", "1",
                     "--parallel", "2")
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 4000}
    results: dict = {}

    def send(name: str, stream: bool) -> None:
        try:
            results[name] = http("POST", srv.base + "/v1/chat/completions", {**body, "stream": stream}, timeout=60)
        except OSError as e:  # the connection cut without an answer
            results[name] = (None, {}, repr(e))

    threads = [threading.Thread(target=send, args=(name, name == "streamed"))
               for name in ("streamed", "running", "waiting")]
    try:
        for t in threads:
            t.start()
            time.sleep(0.2)  # in this order: the third waits for a slot
        for _ in range(200):
            m = metric_values(http("GET", srv.base + "/metrics")[2])
            if m[("easd_requests_processing", frozenset())] == 2 and m[("easd_requests_waiting", frozenset())] == 1:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the requests were not admitted as expected: {m}")
        t0 = time.monotonic()
        stop_clean(srv)  # SIGTERM; no traceback
        assert time.monotonic() - t0 < 5, "the server waited for its requests instead of ending them"
    finally:
        srv.stop()
        for t in threads:
            t.join(30)
    status, _, text = results["streamed"]
    assert status == 200, text
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", text[-500:]
    err = json.loads(events[-2])["error"]
    assert err["code"] == "shutting_down" and "shutting down" in err["message"], err
    for name in ("running", "waiting"):
        status, headers, out = results[name]
        assert status == 503 and out["error"]["code"] == "shutting_down", (name, status, out)
