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
        # easd needs the draft model, which this server did not load: a clear 4xx
        status, _, body = http("POST", srv.base + "/v1/completions",
                               {"prompt": "hi", "max_tokens": 2, "mode": "easd"})
        assert 400 <= status < 500 and "draft" in str(body)
    finally:
        stop_clean(srv)
