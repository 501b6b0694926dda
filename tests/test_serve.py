"""`easd-local serve` as a real process on a loopback port (tiny pair, real llama.cpp),
driven with the official `openai` client and plain HTTP. One server for the module."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import openai
import pytest
from serve_helpers import http, metric_values, openai_client, start_tiny, stop_clean

from easd_local.engine.config import DecodeConfig
from easd_local.engine.decoding import generate_all
from easd_local.engine.pair import load_pair
from easd_local.store.filehash import hash_file
from easd_local.llamacpp.runtime import LoadOptions

CTX = 1024
MAX_BODY = 65536
BODY_TIMEOUT = 2  # --timeout: seconds a request body may stall
TIMINGS_KEYS = {
    "cache_n", "prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second",
    "queue_ms", "ttft_ms", "draft_n", "draft_n_accepted", "sd_accepted", "sd_rejections", "gate_fires", "bonus",
    "mode", "lossless", "tau_draft", "tau_target", "top_n", "overlap", "penalty", "thresholds_source", "stop_reason",
    "env_id",
}
PROMPTS = ["Tell me a story", "hello there", "What is 2+2?", "abc def", "Write a poem", "ok", "The sky is",
           "Count: one two"]


@pytest.fixture(scope="module")
def server(tiny_draft, tiny_target, tmp_path_factory):
    srv = start_tiny(tiny_draft, tiny_target, tmp_path_factory.mktemp("serve"), "--mode", "sd", "--ctx", str(CTX),
                     "--threads", "1", "--parallel", "4", "--max-body", str(MAX_BODY),
                     "--timeout", str(BODY_TIMEOUT))
    yield srv
    stop_clean(srv)


@pytest.fixture(scope="module")
def model_name(tiny_draft, tiny_target):
    return f"{tiny_draft.stem}+{tiny_target.stem}"


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def _check_timings(t: dict, n_tokens: int, mode: str = "sd") -> None:
    assert TIMINGS_KEYS <= set(t)
    assert t["predicted_n"] == n_tokens and t["mode"] == mode
    if mode == "sd":
        assert t["lossless"] is True
        assert t["draft_n_accepted"] + t["sd_rejections"] + t["gate_fires"] + t["bonus"] == n_tokens
        assert t["draft_n"] >= t["sd_accepted"] >= t["draft_n_accepted"]


def test_health_models_metrics(server, client, model_name, tiny_target):
    status, _, body = http("GET", server.base + "/health")
    assert status == 200 and body == {"status": "ok"}
    models = client.models.list().data
    assert [m.id for m in models] == [model_name]
    # what produced this server's results: the tiny pair's hashes and the environment's id
    prov = models[0].model_extra["meta"]["provenance"]
    assert prov["target"]["sha256"] == hash_file(tiny_target)[1] and prov["env"]["parallel"] == 4
    r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.model_extra["timings"]["env_id"] == prov["env_id"]
    assert "backend CPU" in server.output() and "target layers CPU" in server.output()
    status, headers, text = http("GET", server.base + "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    values = metric_values(text)
    assert values[("easd_slots", frozenset())] >= 1
    assert ("easd_requests_processing", frozenset()) in values


def test_chat_not_streamed(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Tell me a story"}],
                                       max_tokens=12)
    assert r.object == "chat.completion" and r.model == model_name
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    t = r.model_extra["timings"]
    _check_timings(t, r.usage.completion_tokens)
    assert t["cache_n"] + t["prompt_n"] == r.usage.prompt_tokens and t["prompt_n"] >= 1


def test_chat_streamed_equals_not_streamed(client, model_name):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    full = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=16)
    chunks = list(client.chat.completions.create(model=model_name, messages=msgs, max_tokens=16, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == full.choices[0].finish_reason
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == full.usage.completion_tokens
    _check_timings(last.model_extra["timings"], last.usage.completion_tokens)


def test_completions_streamed_and_not(client, model_name):
    r = client.completions.create(model=model_name, prompt="The sky is", max_tokens=10)
    assert r.object == "text_completion" and r.usage.completion_tokens <= 10
    _check_timings(r.model_extra["timings"], r.usage.completion_tokens)
    chunks = list(client.completions.create(model=model_name, prompt="The sky is", max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    _check_timings(chunks[-1].model_extra["timings"], r.usage.completion_tokens)


def test_extension_fields_override_defaults(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Tell me a story"}], max_completion_tokens=20,
        extra_body={"mode": "easd", "tau_draft": 0.0, "tau_target": 0.0, "overlap": 0.0, "gamma": 3})
    t = r.model_extra["timings"]
    assert t["mode"] == "easd" and t["lossless"] is False and t["gamma"] == 3
    assert t["thresholds_source"] == "request" and t["tau_draft"] == 0.0
    assert r.usage.completion_tokens <= 20
    # a gate that always fires: every SD-accepted draft is re-picked by the target
    assert t["draft_n_accepted"] == 0 and t["gate_fires"] == t["sd_accepted"]
    off = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=4, extra_body={"mode": "easd", "tau_draft": "inf"})
    assert off.model_extra["timings"]["lossless"] is True and off.model_extra["timings"]["tau_draft"] == "inf"
    # draft mode has no gate, yet its output is the draft model's, not the target's
    alone = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, extra_body={"mode": "draft"})
    assert alone.model_extra["timings"]["mode"] == "draft" and alone.model_extra["timings"]["lossless"] is False


def test_stop_strings(client, model_name):
    msgs = [{"role": "user", "content": "Write a poem"}]
    text = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=30).choices[0].message.content
    assert len(text) >= 8, text
    stop = text[5:8]
    expected = text[: text.find(stop)]
    r = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=30, stop=[stop, "\x00never"])
    assert r.choices[0].message.content == expected and r.choices[0].finish_reason == "stop"
    t = r.model_extra["timings"]
    # decoding's own statistics of what it decoded: the SD identity holds; the engine keeps
    # stepping until it sees the cut, so it may have decoded some tokens past it
    assert t["stop_reason"] == "stop_string" and t["draft_n"] is not None and t["draft_n"] >= t["sd_accepted"]
    assert t["draft_n_accepted"] + t["sd_rejections"] + t["gate_fires"] + t["bonus"] == t["predicted_n"]
    assert r.usage.completion_tokens <= t["predicted_n"] <= 30
    chunks = list(client.chat.completions.create(model=model_name, messages=msgs, max_tokens=30, stop=stop,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def _first_parting_token(ref_tokens, ref_model, got: str) -> int:
    """Index of the first reference token whose text is not a prefix of ``got``."""
    for i in range(len(ref_tokens)):
        if not got.startswith(ref_model.vocab.detokenize(ref_tokens[: i + 1])):
            return i
    return len(ref_tokens)


def test_eight_concurrent_clients_match_sequential_generate(server, client, model_name, tiny_draft, tiny_target):
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            msgs = [{"role": "user", "content": PROMPTS[i]}]
            if i % 2:
                chunks = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=24, stream=True)
                results[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                r = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=24)
                results[i] = r.choices[0].message.content
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    before = metric_values(http("GET", server.base + "/metrics")[2])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    assert sorted(results) == list(range(8))
    after = metric_values(http("GET", server.base + "/metrics")[2])

    def ended(v):
        return sum(x for (name, _), x in v.items() if name == "easd_requests_total")

    assert ended(after) - ended(before) == 8
    opts = LoadOptions(n_ctx=CTX, n_threads=1)
    with load_pair(tiny_draft, tiny_target, opts) as pair:
        for i, prompt_text in enumerate(PROMPTS):
            prompt = pair.target.vocab.chat_tokens([{"role": "user", "content": prompt_text}])
            fin, _ = generate_all(pair.target, pair.draft, prompt, DecodeConfig(mode="sd", max_tokens=24),
                                n_vocab=pair.n_vocab)
            if results[i] == fin.text:
                continue
            # allowed only where the target's top two logits nearly tie (batched vs single evaluation)
            k = _first_parting_token(fin.tokens, pair.target, results[i])
            pair.target.reset()
            z = pair.target.decode(list(prompt) + fin.tokens[:k], logits_at=(-1,))[0, : pair.n_vocab]
            top = np.sort(z)[-2:]
            assert top[1] - top[0] < 1e-2, (
                f"prompt {i}: server text {results[i]!r} parts from generate's {fin.text!r} at token {k}, where the "
                f"target's top-2 logit gap is {top[1] - top[0]:.4f}: not an argmax near-tie")


def test_disconnect_frees_the_slot(server, client, model_name):
    before = metric_values(http("GET", server.base + "/metrics")[2])
    key = ("easd_requests_total", frozenset({"mode": "sd", "outcome": "cancelled"}.items()))
    stream = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Tell me a story"}],
                                            max_tokens=900, stream=True)
    for n, _ in enumerate(stream):
        if n == 3:
            break
    stream.close()
    values = {}
    for _ in range(200):
        values = metric_values(http("GET", server.base + "/metrics")[2])
        if values.get(key, 0) > before.get(key, 0) and values[("easd_requests_processing", frozenset())] == 0:
            break
        threading.Event().wait(0.05)
    assert values.get(key, 0) == before.get(key, 0) + 1, "the disconnected request was not cancelled"
    assert values[("easd_requests_processing", frozenset())] == 0
    r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "ok"}], max_tokens=5)
    assert r.usage.completion_tokens >= 1


def test_a_client_that_leaves_while_sending_its_body(server):
    """A client gone before its body is all sent (a killed script, a dropped link) costs the
    server nothing: no traceback in its log, and the next request is served."""
    import socket

    for path in ("/v1/chat/completions", "/v1/completions"):
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: 1000\r\n\r\n{\"prompt\": \"hi".encode())
            threading.Event().wait(0.3)  # the server is reading the body when the client goes
    for _ in range(20):  # the server notices the disconnect on its own time: give it a second
        assert "Traceback" not in server.output(), server.output()
        threading.Event().wait(0.05)
    ok, _, out = http("POST", server.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert ok == 200 and out["usage"]["completion_tokens"] >= 1
    assert "Traceback" not in server.output(), server.output()


def _exchange(port: int, head: bytes, body_parts=(), gap: float = 0.0) -> tuple[int, dict, float]:
    """Send ``head``, then each body part ``gap`` seconds apart; (status, JSON body, seconds
    from the first byte sent to the server closing the connection)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(BODY_TIMEOUT + 30)
        t0 = time.monotonic()
        s.sendall(head)
        for part in body_parts:
            time.sleep(gap)
            s.sendall(part)
        data = b""
        while chunk_ := s.recv(65536):
            data += chunk_
        elapsed = time.monotonic() - t0
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2]), elapsed


def test_a_stalled_body_is_408_and_a_slow_one_is_served(server):
    """uvicorn waits for a declared body for ever: a client that stops sending it (a length or
    chunks) is answered 408 after --timeout seconds without a byte and its connection closed,
    rather than holding both for good; an upload that keeps sending, however slowly, is served."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for framing in (b"Content-Length: 100\r\n\r\n{\"prompt\": \"hi", b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n"):
        status, body, elapsed = _exchange(server.port, head + framing)
        assert status == 408 and body["error"]["code"] == "request_timeout", body
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert BODY_TIMEOUT <= elapsed < BODY_TIMEOUT + 20, elapsed
    whole = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    parts = [whole[i:i + 8] for i in range(0, len(whole), 8)]
    gap = 0.6 * BODY_TIMEOUT  # each part within the timeout, the whole body well past it
    assert gap * len(parts) > 1.5 * BODY_TIMEOUT
    head += b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(whole)
    status, body, _ = _exchange(server.port, head, parts, gap)
    assert status == 200 and body["usage"]["completion_tokens"] >= 1, body
    assert "Traceback" not in server.output(), server.output()


def test_a_stalled_request_head_is_408_and_a_slow_one_is_served(server):
    """uvicorn starts no clock before a request's headers are complete: a client that stops in
    the middle of them is answered 408 (the API's JSON error) after --timeout seconds without a
    byte and its connection closed; a connection that sends nothing is closed without an answer;
    a head that keeps coming, however slowly, is served; an unparseable head gets the JSON 400."""
    status, body, elapsed = _exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    assert status == 408 and body["error"]["code"] == "request_timeout", body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert BODY_TIMEOUT <= elapsed < BODY_TIMEOUT + 20, elapsed
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(BODY_TIMEOUT + 30)
        t0 = time.monotonic()
        assert s.recv(65536) == b""  # closed, nothing said
        assert BODY_TIMEOUT <= time.monotonic() - t0 < BODY_TIMEOUT + 20
    whole = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(whole)) + whole
    parts = [head[i:i + 40] for i in range(0, len(head), 40)]
    gap = 0.6 * BODY_TIMEOUT  # each part within the timeout, the whole head well past it
    assert gap * (len(parts) - 1) > 1.5 * BODY_TIMEOUT
    status, body, _ = _exchange(server.port, parts[0], parts[1:], gap)
    assert status == 200 and body["usage"]["completion_tokens"] >= 1, body
    status, body, _ = _exchange(server.port, b"GET /health HTTP/1.1\r\nHost x\r\n\r\n")
    assert status == 400 and body["error"]["code"] == "invalid_http", body
    ok, _, out = http("GET", server.base + "/health")  # the server goes on
    assert ok == 200 and out == {"status": "ok"}
    assert "Traceback" not in server.output(), server.output()


def test_a_request_joins_the_running_batch(server, client, model_name):
    """With --parallel 4, a short request sent while a long one streams is served at once,
    not after it: right after it returns, the long one still holds its slot."""
    long = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Tell me a story"}],
                                          max_tokens=900, stream=True)
    it = iter(long)
    next(it), next(it)
    short = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "ok"}],
                                           max_tokens=5)
    running = metric_values(http("GET", server.base + "/metrics")[2])[("easd_requests_processing", frozenset())]
    rest = list(it)
    assert short.usage.completion_tokens >= 1
    assert running == 1, "the short request was not served while the long one was decoding"
    long_t = rest[-1].model_extra["timings"]
    assert long_t["predicted_n"] > 100, long_t  # the long one really was long (no early end of text)


BAD = [
    # (name, path, body or raw bytes, status, param, code)
    ("malformed json", "/v1/chat/completions", b'{"messages": [', 400, None, None),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400, None, None),
    ("NaN literal", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', 400, None, None),
    ("messages not a list", "/v1/chat/completions", {"messages": "hi"}, 400, "messages", None),
    ("content wrong type", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content", None),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0].role", None),
    ("max_tokens wrong type", "/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens", None),
    ("temperature bool", "/v1/completions", {"prompt": "hi", "temperature": True}, 400, "temperature", None),
    ("stream wrong type", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream", None),
    ("unknown model", "/v1/completions", {"prompt": "hi", "model": "gpt-4o"}, 400, "model", "model_not_found"),
    ("negative max_tokens", "/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens", None),
    ("zero max_completion_tokens", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, 400, "max_completion_tokens", None),
    ("unknown mode", "/v1/completions", {"prompt": "hi", "mode": "fast"}, 400, "mode", "invalid_value"),
    ("negative tau", "/v1/completions", {"prompt": "hi", "tau_draft": -1}, 400, "tau_draft", "invalid_value"),
    ("overlap > 1", "/v1/completions", {"prompt": "hi", "overlap": 1.5}, 400, "overlap", "invalid_value"),
    ("penalty > 1", "/v1/completions", {"prompt": "hi", "penalty": 2}, 400, "penalty", "invalid_value"),
    ("top_n too big", "/v1/completions", {"prompt": "hi", "top_n": 100000}, 400, "top_n", "invalid_value"),
    ("gamma 0", "/v1/completions", {"prompt": "hi", "gamma": 0}, 400, "gamma", "invalid_value"),
    ("top_p 0", "/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p", "invalid_value"),
    # float32 logits over these overflow: NaN probabilities (a 500), or a numpy warning and a uniform draw
    ("temperature 1e-40", "/v1/completions", {"prompt": "hi", "temperature": 1e-40}, 400, "temperature",
     "invalid_value"),
    ("temperature 1e308", "/v1/completions", {"prompt": "hi", "temperature": 1e308}, 400, "temperature",
     "invalid_value"),
    ("max_tokens over the context", "/v1/completions", {"prompt": "hi", "max_tokens": 10 * CTX}, 400, "max_tokens",
     "invalid_value"),
    ("max_tokens 1e308", "/v1/completions", {"prompt": "hi", "max_tokens": 1e308}, 400, "max_tokens", None),
    ("n > 1", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n", None),
    ("tools", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     400, "tools", None),
    ("empty prompt", "/v1/completions", {"prompt": ""}, 400, "prompt", None),
    ("prompt longer than the context", "/v1/completions", {"prompt": "word " * (2 * CTX)}, 400, "prompt",
     "context_length_exceeded"),
    ("oversized body", "/v1/completions", {"prompt": "x" * (MAX_BODY + 10)}, 413, None, "request_too_large"),
]


@pytest.mark.parametrize("name,path,body,status,param,code", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_openai_error(server, name, path, body, status, param, code):
    raw = body if isinstance(body, bytes) else None
    got, _, resp = http("POST", server.base + path, None if raw else body, raw=raw)
    assert got == status, (name, resp)
    err = resp["error"]
    assert set(err) == {"message", "type", "param", "code"} and 0 < len(err["message"]) < 300, err
    assert err["param"] == param and err["code"] == code, err
    # the server goes on serving
    ok, _, out = http("POST", server.base + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert ok == 200 and out["usage"]["completion_tokens"] >= 1


def test_bad_input_through_the_openai_client(client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "x"}], n=3)
    assert e.value.status_code == 400 and "n=3" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=model_name, input="x")
