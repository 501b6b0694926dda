"""The ``easd_tokens`` stream extension's bookkeeping (server/spans.py) against the real stop
matcher: every token appears, in order, and the records' text is exactly the text sent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from easd_local.engine.decoding import BONUS, DRAFT, EASD, RESAMPLED, TARGET, TokenEvent
from easd_local.server.spans import TokenSpans
from easd_local.server.stops import StopMatcher

ORIGINS = [DRAFT, TARGET, RESAMPLED, EASD, BONUS]


def run(texts: list[str], stops: list[str], tail: str = ""):
    """Feed tokens through the stop matcher as app.Completion does: (chunks of (text,
    records)), the records sent when the request ended, all text sent."""
    stop, spans = StopMatcher(stops), TokenSpans()
    chunks = []
    for k, t in enumerate(texts):
        spans.token(TokenEvent(k, t, ORIGINS[k % len(ORIGINS)], h_draft=0.5 + k, h_target=None, overlap=0.6))
        out = stop.feed(t)
        if out:
            chunks.append((out, spans.take(len(out))))
        if stop.stopped:
            return chunks, spans.finish()
    spans.tail(tail)
    out = stop.feed(tail) + stop.flush()
    if out:
        chunks.append((out, spans.take(len(out))))
    return chunks, spans.finish()


def test_plain_stream_one_record_per_token():
    chunks, last = run(["He", "llo", "", " world"], [])
    assert [c[0] for c in chunks] == ["He", "llo", " world"]
    # the text-less token rides with the next chunk, in order
    assert [[(r["i"], r["text"]) for r in recs] for _, recs in chunks] == [[(0, "He")], [(1, "llo")],
                                                                             [(2, ""), (3, " world")]]
    assert last == []
    r = chunks[0][1][0]
    assert r["origin"] == DRAFT and r["h_draft"] == 0.5 and r["h_target"] is None and r["overlap"] == 0.6


def test_held_back_text_splits_a_token_and_a_stop_cuts_one():
    # stop "lo w": "lo" of "llo" is held back, then the stop string is found
    chunks, last = run(["He", "llo", " wor", "ld"], ["lo w"])
    assert "".join(c[0] for c in chunks) == "Hel"
    recs = [r for _, rs in chunks for r in rs] + last
    assert [(r["i"], r["text"]) for r in recs] == [(0, "He"), (1, "l"), (2, "")]


def test_tail_belongs_to_the_last_token():
    chunks, last = run(["a", ""], [], tail="\ufffd")
    recs = [r for _, rs in chunks for r in rs] + last
    assert [(r["i"], r["text"]) for r in recs] == [(0, "a"), (1, "\ufffd")]
    # the last token's own text went out already: the tail continues it under its index
    chunks, last = run(["a", "b"], [], tail="\ufffd")
    recs = [r for _, rs in chunks for r in rs] + last
    assert [(r["i"], r["text"]) for r in recs] == [(0, "a"), (1, "b"), (1, "\ufffd")]


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.text(alphabet="ab \n\u00e9", max_size=4), max_size=12),
       stops=st.lists(st.text(alphabet="ab \n", min_size=1, max_size=3), max_size=2),
       tail=st.sampled_from(["", "\ufffd"]))
def test_records_cover_exactly_the_text_sent(texts, stops, tail):
    tail = tail if texts else ""  # a tail is the end of some token's text
    chunks, last = run(texts, stops, tail)
    for text, recs in chunks:  # each chunk's records are that chunk's text
        assert "".join(r["text"] for r in recs) == text
    recs = [r for _, rs in chunks for r in rs] + last
    idx = [r["i"] for r in recs]
    assert idx == sorted(idx)
    n = len(set(idx))
    assert set(idx) == set(range(n))  # every token fed, once or split, none skipped
    stopped = StopMatcher(stops)
    fed = 0
    for t in texts:
        fed += 1
        stopped.feed(t)
        if stopped.stopped:
            break
    ran_out = not stopped.stopped
    if ran_out:  # the end of generation: the tail, then what was held back, which may hold a stop
        stopped.feed(tail)  # (texts " ", "a" with stops "a", " aa": " a" is held for " aa", then cut at "a")
        stopped.flush()
    assert n == fed
    full = texts[:-1] + [texts[-1] + tail] if ran_out and texts else texts[:n]
    for i in range(n):  # a token's parts are a prefix of its own text
        assert full[i].startswith("".join(r["text"] for r in recs if r["i"] == i))
    if not stopped.stopped:
        assert "".join(r["text"] for r in recs) == "".join(texts) + tail
