"""The server's pure parts: stop strings over streamed pieces, request parsing, timings."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from easd_local.engine.config import DecodeConfig
from easd_local.engine.decoding import Stats
from easd_local.server.protocol import ApiError, parse_request, request_config
from easd_local.server.responses import finish_reason, timings_from_stats
from easd_local.server.stops import StopMatcher


def _expected(text: str, stops: list[str]) -> str:
    hits = [text.find(s) for s in stops if s and s in text]
    return text[: min(hits)] if hits else text


@settings(max_examples=1000, deadline=None)
@given(text=st.text(alphabet="abc\n", max_size=40), stops=st.lists(st.text(alphabet="abc\n", max_size=4), max_size=3),
       cuts=st.lists(st.integers(0, 40), max_size=12))
def test_stop_matcher_equals_cutting_the_whole_text(text, stops, cuts):
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces) + m.flush()
    assert out == _expected(text, stops)
    assert m.stopped == (out != text or any(s and s in text for s in stops))


def test_stop_matcher_waits_for_a_longer_stop_that_began_first():
    # "\n" completes first, but "a\na" began earlier and completes with the next piece
    m = StopMatcher(["a\na", "\n"])
    assert m.feed("a\n") == "" and not m.stopped
    assert m.feed("a") == "" and m.stopped
    m = StopMatcher(["a\na", "\n"])
    assert m.feed("a\n") == "" and m.feed("b") == "a" and m.stopped


def test_stop_matcher_holds_back_a_possible_start():
    m = StopMatcher(["</end>"])
    assert m.feed("hello </e") == "hello "
    assert m.feed("nd> more") == "" and m.stopped
    m = StopMatcher(["</end>"])
    assert m.feed("a </e") == "a " and m.feed("x") == "</ex" and m.flush() == ""


def test_parse_chat_request_fields():
    r = parse_request("chat", {
        "model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "be "},
                                                                      {"type": "text", "text": "brief"}]},
                                   {"role": "user", "content": "hi"}, {"role": "assistant", "content": None}],
        "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3,
        "stop": "x", "stream": True, "stream_options": {"include_usage": True}, "n": 1,
        "mode": "sd", "tau_draft": "inf", "top_k": 4, "user": "ignored",
        # what clients send by default asks for nothing this server cannot do
        "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}, "best_of": 1, "suffix": None})
    assert r.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": ""})
    assert r.overrides == {"max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3, "mode": "sd",
                           "tau_draft": math.inf, "top_k": 4}
    assert r.stop == ("x",) and r.stream and r.include_usage


@pytest.mark.parametrize("body,param", [
    ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [1, 2]}, "prompt"), ({"prompt": "a", "seed": 1.5}, "seed"),
    ({"prompt": "a", "stop": [1]}, "stop"), ({"prompt": "a", "stream_options": 3}, "stream_options"),
    ({"prompt": "a", "logprobs": 2}, "logprobs"), ({"prompt": "a", "response_format": {"type": "json_object"}},
                                                   "response_format"),
    ({"prompt": "a", "model": 3}, "model"), ({"prompt": "a", "n": "2"}, "n"),
    # sampling fields with no counterpart here: ignoring them would change the answer silently
    ({"prompt": "a", "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"prompt": "a", "presence_penalty": -1}, "presence_penalty"),
    ({"prompt": "a", "logit_bias": {"5": -100}}, "logit_bias"), ({"prompt": "a", "best_of": 3}, "best_of"),
    ({"prompt": "a", "suffix": "end"}, "suffix"),
    ({"prompt": "a", "mode": "sd:nope"}, "mode"), ({"prompt": "a", "mode": "sd:ngram-simple", "spec_type": "draft"}, "mode"),
])
def test_parse_refusals(body, param):
    with pytest.raises(ApiError) as e:
        parse_request("completion", body)
    assert e.value.status == 400 and e.value.param == param


def test_a_missing_prompt_is_named_as_missing():
    """not as a prompt of the wrong type; a chat body sent to /v1/completions is told where it belongs"""
    for body, hint in (({}, False), ({"messages": [{"role": "user", "content": "x"}]}, True)):
        with pytest.raises(ApiError) as e:
            parse_request("completion", body)
        assert e.value.param == "prompt" and "'prompt' is required" in e.value.message, e.value.message
        assert ("/v1/chat/completions" in e.value.message) == hint


def test_mode_takes_the_way_label_the_server_prints():
    """The load line and /props name the default way ``sd:ngram-simple``: a request may too."""
    for mode in ("sd:ngram-simple", "SD:ngram-simple"):
        assert parse_request("completion", {"prompt": "a", "mode": mode}).overrides == {
            "mode": "sd", "spec_type": "ngram-simple"}
    assert parse_request("completion", {"prompt": "a", "mode": "sd:ngram-simple+draft"}).overrides[
        "spec_type"] == "ngram-simple,draft"
    assert parse_request("completion", {"prompt": "a", "mode": "easd-tf"}).overrides == {"mode": "easd-tf"}


def test_request_config_source_and_param():
    base = DecodeConfig(mode="easd")
    cfg, src = request_config(base, "profile", {"temperature": 0.3})
    assert cfg.temperature == 0.3 and src == "profile"
    cfg, src = request_config(base, "profile", {"tau_target": 1.0})
    assert src == "request"
    with pytest.raises(ApiError) as e:
        request_config(base, "profile", {"top_n": 500}, n_vocab=306)
    assert e.value.param == "top_n" and "vocabulary size 306" in e.value.message


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens", "seed", "gamma", "top_k"])
def test_an_integer_past_64_bits_is_refused_in_few_words(name):
    """1e308 is an integer to JSON: it was taken, and echoed as 309 digits in errors and timings."""
    with pytest.raises(ApiError) as e:
        parse_request("completion", {"prompt": "a", name: 1e308})
    assert e.value.param == name and "1e+308" in e.value.message and len(e.value.message) < 100
    assert parse_request("completion", {"prompt": "a", name: 2**63 - 1}).overrides


@pytest.mark.parametrize("temperature", [1e-40, 5e-324, 1e39, 1e308])
def test_a_temperature_float32_cannot_take_is_refused(temperature):
    with pytest.raises(ApiError) as e:
        request_config(DecodeConfig(mode="sd"), "default", {"temperature": temperature})
    assert e.value.param == "temperature" and "temperature must be 0 (greedy) or between" in e.value.message
    for fine in (0.0, 1e-6, 0.7, 2.0, 1e6):
        assert request_config(DecodeConfig(mode="sd"), "default", {"temperature": fine})[0].temperature == fine


def test_timings_and_finish_reason():
    s = Stats(mode="sd", prompt_tokens=10, tokens=8, drafted=12, accepted=6, draft_accepted=6, sd_rejections=1,
              bonus=1, seconds_prompt=0.5, seconds_total=2.5, thresholds_source="profile",
              stop_reason="eos")
    t = timings_from_stats(s, DecodeConfig(mode="sd"), queue_s=0.25)
    assert t["prompt_ms"] == 500.0 and t["predicted_ms"] == 2000.0 and t["queue_ms"] == 250.0
    assert t["prompt_per_second"] == 20.0 and t["draft_n"] == 12 and t["lossless"] is True
    assert [finish_reason(r) for r in ("eos", "length", "context")] == ["stop", "length", "length"]
