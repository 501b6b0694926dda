"""The prompt cache of `easd-local serve` across requests: a real server process on loopback
(tiny pair, two slots), the official `openai` client, and the short soak
(scripts/soak_serve.py). Every request loop is bounded in count and time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import openai
import pytest
from serve_helpers import http, metric_values, openai_client, start_tiny, stop_clean

from easd_local.engine.config import DecodeConfig
from easd_local.engine.decoding import generate_all
from easd_local.engine.pair import load_pair
from easd_local.llamacpp.runtime import LoadOptions

CTX = 2048
ROOT = Path(__file__).resolve().parents[1]
QUESTION = ("Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
            "for her friends every day with four. How many are left?")
SYSTEM = {"role": "system", "content": "You are a careful math tutor who explains each step."}
TIE = 1e-2  # logits: a target top-2 gap this small is an argmax near-tie


def _server(tiny_draft, tiny_target, tmp, *extra):
    return start_tiny(tiny_draft, tiny_target, tmp, "--mode", "sd", "--ctx", str(CTX), "--threads", "1",
                      "--parallel", "2", *extra)


@pytest.fixture(scope="module")
def server(tiny_draft, tiny_target, tmp_path_factory):
    srv = _server(tiny_draft, tiny_target, tmp_path_factory.mktemp("serve_cache"))
    yield srv
    stop_clean(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def model_name(tiny_draft, tiny_target):
    return f"{tiny_draft.stem}+{tiny_target.stem}"


@pytest.fixture(scope="module")
def ref_pair(tiny_draft, tiny_target):
    with load_pair(tiny_draft, tiny_target, LoadOptions(n_ctx=CTX, n_threads=1)) as p:
        yield p


def _chat(client, model, msgs, max_tokens=16, **extra):
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, temperature=0,
                                       extra_body=extra or None)
    return r, r.model_extra["timings"]


def _metrics(server) -> dict:
    return metric_values(http("GET", server.base + "/metrics")[2])


def _total(values: dict, name: str) -> float:
    return sum(v for (n, _), v in values.items() if n == name)


def _wait_idle(server, limit_s: float = 20.0) -> float:
    t_end = time.monotonic() + limit_s
    while True:
        busy = _metrics(server)[("easd_requests_processing", frozenset())]
        if busy == 0 or time.monotonic() > t_end:
            return busy
        time.sleep(0.05)


def assert_same_or_near_tie(ref_pair, msgs, mode: str, max_tokens: int, texts: dict[str, str]) -> None:
    """Each of ``texts`` (label -> server text) is the greedy text decoded from empty caches
    in this process, or parts from it where the target's top two logits nearly tie."""
    prompt = ref_pair.target.vocab.chat_tokens(msgs)
    ref_pair.target.reset()
    ref_pair.draft.reset()
    fin, _ = generate_all(ref_pair.target, ref_pair.draft, prompt, DecodeConfig(mode=mode, max_tokens=max_tokens),
                          n_vocab=ref_pair.n_vocab)
    for label, got in texts.items():
        if got == fin.text:
            continue
        k = next((i for i in range(len(fin.tokens))
                  if not got.startswith(ref_pair.target.vocab.detokenize(fin.tokens[: i + 1]))), len(fin.tokens))
        ref_pair.target.reset()
        z = ref_pair.target.decode(list(prompt) + fin.tokens[:k], logits_at=(-1,))[0, : ref_pair.n_vocab]
        top = np.sort(z)[-2:]
        assert top[1] - top[0] < TIE, (
            f"{label}: {got!r} parts from {fin.text!r} at token {k}, where the target's top-2 gap is "
            f"{top[1] - top[0]:.4f}: not an argmax near-tie")


def test_next_turn_reuses_the_conversation(server, client, model_name):
    before = _metrics(server)
    msgs = [SYSTEM, {"role": "user", "content": QUESTION}]
    r1, t1 = _chat(client, model_name, msgs)
    n1 = r1.usage.prompt_tokens
    assert t1["cache_n"] + t1["prompt_n"] == n1
    msgs2 = msgs + [{"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": "And then?"}]
    r2, t2 = _chat(client, model_name, msgs2)
    assert t2["cache_n"] >= n1, (t1, t2)
    assert t2["prompt_n"] < n1 and t2["prompt_n"] < t1["prompt_n"]
    assert t2["cache_n"] + t2["prompt_n"] == r2.usage.prompt_tokens
    after = _metrics(server)
    reused = _total(after, "easd_prompt_cached_tokens_total") - _total(before, "easd_prompt_cached_tokens_total")
    evaluated = _total(after, "easd_prompt_evaluated_tokens_total") - _total(before, "easd_prompt_evaluated_tokens_total")
    assert reused == t1["cache_n"] + t2["cache_n"] and evaluated == t1["prompt_n"] + t2["prompt_n"]


@pytest.mark.parametrize("mode", ["target", "sd"])
def test_greedy_text_with_the_cache_equals_without(server, client, model_name, ref_pair, mode):
    """Turn 2 of a conversation, with turn 1 in a slot's cache, and again with
    ``cache_prompt: false``: the same text as decoding from empty caches, or parted from it
    at a named near-tie."""
    msgs = [SYSTEM, {"role": "user", "content": f"{QUESTION} ({mode})"}]
    r1, _ = _chat(client, model_name, msgs, mode=mode)
    msgs2 = msgs + [{"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": "Explain the second step again, please."}]
    cached, tc = _chat(client, model_name, msgs2, max_tokens=24, mode=mode)
    fresh, tf = _chat(client, model_name, msgs2, max_tokens=24, mode=mode, cache_prompt=False)
    assert tc["cache_n"] >= r1.usage.prompt_tokens and tf["cache_n"] == 0
    assert tf["prompt_n"] == fresh.usage.prompt_tokens
    assert_same_or_near_tie(ref_pair, msgs2, mode, 24, {"cached": cached.choices[0].message.content,
                                                        "cache_prompt false": fresh.choices[0].message.content})


def test_cache_prompt_false_reuses_nothing(server, client, model_name):
    msgs = [SYSTEM, {"role": "user", "content": "What is 12 * 7?"}]
    _chat(client, model_name, msgs, max_tokens=4)
    again, t_again = _chat(client, model_name, msgs, max_tokens=4)
    assert t_again["cache_n"] == again.usage.prompt_tokens - 1  # all but the last token, as llama-server
    off, t_off = _chat(client, model_name, msgs, max_tokens=4, cache_prompt=False)
    assert t_off["cache_n"] == 0 and t_off["prompt_n"] == off.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, model_name, msgs, max_tokens=4, cache_prompt="no")
    assert e.value.body["param"] == "cache_prompt"


def test_no_cache_prompt_flag(tiny_draft, tiny_target, tmp_path, ref_pair):
    srv = _server(tiny_draft, tiny_target, tmp_path, "--no-cache-prompt")
    try:
        assert "prompt cache off" in srv.output()
        cl = openai_client(srv)
        name = f"{tiny_draft.stem}+{tiny_target.stem}"
        msgs = [SYSTEM, {"role": "user", "content": QUESTION}]
        texts = {}
        for k in range(2):
            r, t = _chat(cl, name, msgs, max_tokens=12)
            assert t["cache_n"] == 0 and t["prompt_n"] == r.usage.prompt_tokens
            texts[f"request {k}"] = r.choices[0].message.content
        assert_same_or_near_tie(ref_pair, msgs, "sd", 12, texts)
        assert _total(metric_values(http("GET", srv.base + "/metrics")[2]), "easd_prompt_cached_tokens_total") == 0
    finally:
        out = srv.stop()
    assert "Traceback" not in out, out


def test_a_cancelled_stream_leaves_a_slot_to_use_and_reuse(server, client, model_name, ref_pair):
    msgs = [SYSTEM, {"role": "user", "content": QUESTION + " Tell me a long story about it."}]
    stream = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=600, temperature=0,
                                            stream=True)
    for n, _ in enumerate(stream):
        if n == 4:
            break
    stream.close()
    assert _wait_idle(server) == 0, "the cancelled request still holds its slot"
    # the same conversation again (a retry): its whole prompt is still in that slot's cells
    r, t = _chat(client, model_name, msgs, max_tokens=16)
    assert t["cache_n"] == r.usage.prompt_tokens - 1, t
    # and the next turn after the cut reply (what a chat UI sends after "stop") reuses it too
    msgs2 = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                    {"role": "user", "content": "Shorter, please."}]
    r2, t2 = _chat(client, model_name, msgs2, max_tokens=16)
    assert t2["cache_n"] >= r.usage.prompt_tokens
    assert_same_or_near_tie(ref_pair, msgs, "sd", 16, {"retry after a cancel": r.choices[0].message.content})
    assert _wait_idle(server) == 0


def test_max_tokens_over_the_context_is_refused(server, client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt="hi", max_tokens=10**9)
    assert "larger than the context" in e.value.message and e.value.param == "max_tokens"
    r = client.completions.create(model=model_name, prompt="hi", max_tokens=3)
    assert r.usage.completion_tokens >= 1


def test_short_soak(tiny_draft, tiny_target, tmp_path):
    """scripts/soak_serve.py on the tiny pair, a short run: no 5xx, every slot idle at the
    end, the server alive; every outcome of the mix was seen."""
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "soak_serve.py"), "--draft", str(tiny_draft), "--target",
           str(tiny_target), "--requests", "80", "--clients", "6", "--time-limit", "150", "--ctx", "4096",
           "--threads", "1", "--max-tokens", "8", "--request-timeout", "60", "--json", str(out),
           "--log", str(tmp_path / "server.log")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400,
                       env={**__import__("os").environ, "EASD_LOCAL_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert rep["sent"] == 80 and rep["ok"] is True
    assert not any(rep["failures"].values()) and rep["slots_busy_end"] == 0 and rep["waiting_end"] == 0
    assert rep["alive"] and rep["health"] == 200 and rep["server_log_tracebacks"] == 0
    got = rep["outcomes"]
    assert got.get("disconnect", 0) == 8 and got.get("2xx", 0) >= 60
    assert sum(v for k, v in got.items() if k.startswith("4xx")) >= 6
    assert got.get("4xx:400:context_length_exceeded", 0) >= 1 and got.get("4xx:404", 0) >= 1
    assert rep["prompt_cached_tokens"] > 0 and rep["rss_end"] > 0
    assert "slots busy at the end: 0 of 2" in r.stdout
    # conversations outnumber the slots: the host-memory store holds some and gave some back
    assert rep["store_end"] > 0 and rep["store_restored_tokens"] > 0 and "RSS less the store" in r.stdout


def test_bench_serve_multi_turn_mode(tiny_draft, tiny_target, tmp_path):
    """scripts/bench_serve.py --multi-turn on the tiny pair (easd-local only): every turn
    after the first reuses the previous turn's prompt; the --no-cache-prompt baseline none."""
    out = tmp_path / "mt.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_serve.py"), "--multi-turn", "3", "--parallel", "2",
           "--modes", "sd", "--max-tokens", "6", "--threads", "1", "--ctx", str(CTX), "--draft", str(tiny_draft),
           "--target", str(tiny_target), "--no-llama-server", "--cache-off-baseline", "--json", str(out),
           "--log-dir", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "EASD_LOCAL_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stdout + r.stderr
    on, off = json.loads(out.read_text())
    assert on["system"] == "easd-local" and off["system"] == "easd-local cache off"
    for prev, turn in zip(on["turns"], on["turns"][1:]):
        assert turn["cache_n"] >= prev["prompt_tokens"] and turn["cache_n"] + turn["prompt_n"] == turn["prompt_tokens"]
    assert all(t["cache_n"] == 0 for t in off["turns"])
    assert len(on["unrelated"]) == 3 and "last/first" in r.stdout


@pytest.mark.parametrize("cache_ram", ["64", "0"])
def test_cache_ram_gives_a_conversation_its_prompt_back(tiny_draft, tiny_target, tmp_path, model_name, cache_ram):
    """One slot, two conversations taking turns (more conversations than slots, as behind a
    web front-end): with --cache-ram each turn's history comes back from host memory
    (cache_n covers the previous turn; /metrics counts what was loaded back); with
    --cache-ram 0 every turn evaluates its history again."""
    srv = _server(tiny_draft, tiny_target, tmp_path, "--parallel", "1", "--cache-ram", cache_ram)
    try:
        cl = openai_client(srv)
        # each history more than twice the system prompt they share: the other's request
        # discards most of the slot's cells, which is when they are saved (llama-server's rule)
        convs = [[SYSTEM, {"role": "user", "content": q}]
                 for q in (QUESTION, "Name three colours, then explain why the sky looks blue at noon and red at dusk.")]
        seen = []
        for turn in range(2):
            for c in convs:
                r, t = _chat(cl, model_name, c)
                assert t["cache_n"] + t["prompt_n"] == r.usage.prompt_tokens
                seen.append((turn, r.usage.prompt_tokens, t["cache_n"]))
                c += [{"role": "assistant", "content": r.choices[0].message.content},
                      {"role": "user", "content": "And then?"}]
        first = {i: n for i, (turn, n, _) in enumerate(seen) if turn == 0}
        second = [cache_n for turn, _, cache_n in seen if turn == 1]
        restored = _total(_metrics(srv), "easd_prompt_cache_ram_restored_tokens")
        if cache_ram != "0":
            assert second[0] >= first[0] and second[1] >= first[1], seen
            assert restored >= first[0] + first[1]
        else:
            assert all(cache_n < first[0] // 2 for cache_n in second), seen
            assert restored == 0
    finally:
        stop_clean(srv)
