"""Prompt lookup in `serve`: a real process on loopback, the official openai client, two slots.
Looked-up tokens are counted in timings' draft_n / draft_n_accepted, marked `lookup` in the
stream's token records and in /metrics, and no draft model is loaded."""

from __future__ import annotations

import concurrent.futures as cf

from serve_helpers import http, openai_client, start_tiny, stop_clean

PROMPT = "one two three four five six one two three four five six one two three four five six one two"


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_lookup_in_two_slots(tiny_draft, tiny_target, tmp_path):
    srv = start_tiny(tiny_draft, tiny_target, tmp_path, "--mode", "sd", "--spec-type", "ngram-simple",
                     "--parallel", "2", "--threads", "1")
    try:
        client = openai_client(srv)
        model = client.models.list().data[0].id

        def ask(i):
            return client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0,
                                             extra_body={"seed": i})

        with cf.ThreadPoolExecutor(2) as ex:
            rs = list(ex.map(ask, range(2)))
        for r in rs:
            t = r.model_extra["timings"]
            assert t["draft_n"] >= t["draft_n_accepted"] > 0, t
        status, _, text = http("GET", srv.base + "/metrics")
        assert status == 200 and _metric(text, "easd_lookup_accepted_tokens_total") > 0
        assert _metric(text, "easd_draft_accepted_tokens_total") == 0
        # easd needs the draft model, which this server's own way does not: the first request
        # that asks for it loads it, and the page offers the modes that use it
        status, _, props = http("GET", srv.base + "/props")
        assert status == 200 and "easd" in {m["name"] for m in props["modes"]}
        status, _, body = http("POST", srv.base + "/v1/completions",
                               {"prompt": PROMPT, "max_tokens": 4, "mode": "easd", "temperature": 0})
        assert status == 200 and body["timings"]["draft_n"] > 0, body
    finally:
        stop_clean(srv)
