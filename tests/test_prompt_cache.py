"""The prompt cache across requests: which slot a request goes to (prompt_cache.pick_slot,
pure) and what the scheduler reuses there, on the tiny pair in real llama.cpp.

Reuse changes llama.cpp's batch shapes (the prompt's suffix is evaluated on its own, after
the cached prefix), so greedy output with the cache equals output without it up to a
near-tie, which ``why_parted`` must name."""

from __future__ import annotations

import pytest

from easd_local.engine.decoding import Finished, TokenEvent
from easd_local.engine.pair import load_pair
from easd_local.engine.prompt_cache import SlotView, pick_slot
from easd_local.llamacpp.runtime import LoadOptions, Model
from easd_local.engine.scheduler import Request, Scheduler

from test_decoding import check_stats
from test_scheduler import MODES, TEXTS, cfg_of, solo, why_parted


# --------------------------------------------------------------------------- the rule (pure)
def test_pick_slot_longest_prefix_above_the_similarity():
    idle = [SlotView(0, cached=100, common=40, last_used=5), SlotView(1, cached=100, common=90, last_used=9),
            SlotView(2, cached=0, common=0, last_used=-1)]
    assert pick_slot(idle, n_prompt=120) == 1
    # at or below the similarity (a share of the prompt): least recently used, an empty slot first
    assert pick_slot(idle, n_prompt=120, similarity=0.8) == 2
    assert pick_slot(idle, n_prompt=120, similarity=0.0) == 2  # 0: the search is off
    assert pick_slot(idle, n_prompt=120, reuse=False) == 2  # the request opted out of the cache
    assert pick_slot(idle[:2], n_prompt=120, similarity=0.8) == 0  # LRU: used at 5, before 9
    with pytest.raises(ValueError):
        pick_slot([], n_prompt=5)


def test_pick_slot_keeps_a_long_conversation_from_an_unrelated_request():
    """An unrelated request that shares only the template's system prompt (30 tokens) with a
    500-token conversation goes to the idle empty slot, not the conversation's."""
    conv = SlotView(0, cached=500, common=30, last_used=3)
    empty = SlotView(1, cached=0, common=0, last_used=-1)
    assert pick_slot([conv, empty], n_prompt=60) == 1
    # the conversation's next turn keeps all of it
    assert pick_slot([SlotView(0, 500, 500, 3), SlotView(1, 90, 30, 4)], n_prompt=560) == 0
    # a retry of a prompt whose cells hold it and a long reply: its whole prompt is there
    assert pick_slot([SlotView(0, 900, 200, 3), empty], n_prompt=200) == 0
    assert pick_slot([SlotView(0, 900, 199, 3), empty], n_prompt=200) == 0  # all but the last token
    assert pick_slot([SlotView(0, 900, 150, 3), empty], n_prompt=200) == 1


def test_pick_slot_never_by_prefix_across_scopes():
    idle = [SlotView(0, 100, 100, 7, same_scope=False), SlotView(1, 50, 0, 2)]
    assert pick_slot(idle, n_prompt=110) == 1


# --------------------------------------------------------------------------- the scheduler
@pytest.fixture(scope="module")
def pair(tiny_draft, tiny_target):
    p = load_pair(tiny_draft, tiny_target, LoadOptions(n_ctx=512, n_threads=1, n_seq=2))
    yield p
    p.close()


def run_one(sched: Scheduler, req: Request) -> tuple[Finished, list[TokenEvent], int]:
    """Submit ``req`` alone and drain it: its Finished, events and slot."""
    rid = sched.submit(req)
    slot = next(s.slot for s in sched._slots if s is not None and s.rid == rid)
    events, fin = [], None
    for _ in range(10_000):
        for r, ev in sched.step():
            assert r == rid
            if isinstance(ev, TokenEvent):
                events.append(ev)
            else:
                fin = ev
        if not sched.active:
            break
    assert isinstance(fin, Finished), fin
    return fin, events, slot


class Counting:
    """Tokens each model evaluates (every decode_batch)."""

    def __init__(self, monkeypatch, pair):
        self.n = {"target": 0, "draft": 0}
        real = Model.decode_batch
        names = {id(pair.target): "target", id(pair.draft): "draft"}

        def counting(model, parts, **kw):
            self.n[names[id(model)]] += sum(len(p.tokens) for p in parts)
            return real(model, parts, **kw)

        monkeypatch.setattr(Model, "decode_batch", counting)


@pytest.mark.parametrize("mode", MODES)
def test_next_turn_reuses_the_conversation_and_equals_a_fresh_run(pair, mode, monkeypatch):
    """Turn 2 (turn 1's prompt, its reply and a new message) reuses every cell turn 1 left
    on the model that emits (its prompt and its reply but the last token), evaluates fewer
    tokens on both models, and emits what a run from empty caches emits, up to a named
    near-tie. easd-tf's lagging draft included."""
    tok = pair.target.vocab.tokenize
    cfg = cfg_of(mode, max_tokens=24)
    p1 = tok(TEXTS[3] * 3)
    pair.target.reset()
    pair.draft.reset()
    sched = Scheduler(pair, 2)
    fin1, _, slot1 = run_one(sched, Request(p1, cfg))
    assert fin1.stats.prompt_cached == 0
    assert [(p.cached, p.evaluated) for p in sched.take_prefills()] == [(0, len(p1))]
    p2 = p1 + fin1.tokens + tok(" And what comes next?")
    count = Counting(monkeypatch, pair)
    fin2, ev2, slot2 = run_one(sched, Request(p2, cfg))
    reused = dict(count.n)
    monkeypatch.undo()
    check_stats(fin2, ev2)
    assert slot2 == slot1
    assert fin2.stats.prompt_cached == len(p1) + len(fin1.tokens) - 1
    assert [(p.cached, p.evaluated) for p in sched.take_prefills()] == [
        (fin2.stats.prompt_cached, len(p2) - fin2.stats.prompt_cached)]
    count = Counting(monkeypatch, pair)
    ref, ref_ev = solo(pair, p2, cfg, 0)  # empty caches: the whole prompt evaluated
    fresh = dict(count.n)
    monkeypatch.undo()
    # (the generations' own decodes may differ a little where a near-tie parts them)
    for who in {"target": ["target"], "draft": ["draft"]}.get(mode, ["target", "draft"]):
        assert reused[who] < fresh[who] - len(p1) // 2, (who, reused, fresh)
    why = why_parted(pair, p2, cfg, ref, ref_ev, fin2, ev2)
    assert why is None or why, f"{mode}: the cached run differs from a fresh one with no near-tie to explain it"


def test_unrelated_requests_leave_a_conversation_its_slot(pair):
    """Two slots; an eight-turn conversation interleaved with unrelated requests that share a
    'system prompt' with it: every turn after the first reuses the whole previous turn."""
    tok = pair.target.vocab.tokenize
    system = tok("You are a helpful assistant. ")
    cfg = cfg_of("sd", max_tokens=8)
    pair.target.reset()
    pair.draft.reset()
    sched = Scheduler(pair, 2)
    history: list[int] = list(system)
    prev = 0
    for turn in range(8):
        history = history + tok(f" Question {turn}: {TEXTS[turn % 4]}?")
        fin, _, slot = run_one(sched, Request(history, cfg))
        if turn:
            assert fin.stats.prompt_cached >= prev, (turn, fin.stats.prompt_cached, prev)
        prev = len(history)
        history = history + fin.tokens
        _, _, other_slot = run_one(sched, Request(system + tok(f" Unrelated {turn}: {TEXTS[(turn + 1) % 4]}"), cfg))
        assert other_slot != slot


def test_cancelled_sequence_keeps_valid_cells_for_the_next_request(pair):
    tok = pair.target.vocab.tokenize
    cfg = cfg_of("sd", max_tokens=200)
    p = tok(TEXTS[1] * 4)
    pair.target.reset()
    pair.draft.reset()
    sched = Scheduler(pair, 2)
    rid = sched.submit(Request(p, cfg))
    for _ in range(3):
        sched.step()
    slot = next(s.slot for s in sched._slots if s is not None)
    sched.cancel(rid, keep_cache=True)
    assert sched.active == 0
    held = pair.target.seq_tokens(slot)
    assert len(held) > len(p) and held[: len(p)] == p
    # the retry finds its whole prompt in that slot and decodes what a fresh run does
    fin, ev, slot2 = run_one(sched, Request(p, cfg.replace(max_tokens=24)))
    assert slot2 == slot and fin.stats.prompt_cached == len(p) - 1
    ref, ref_ev = solo(pair, p, cfg.replace(max_tokens=24), 0)
    why = why_parted(pair, p, cfg, ref, ref_ev, fin, ev)
    assert why is None or why, "the retry after a cancel differs from a fresh run with no near-tie"
    # cancel without keep_cache clears the slot
    rid = sched.submit(Request(p, cfg))
    sched.step()
    sched.cancel(rid)
    assert pair.target.seq_len(slot) == 0 and pair.draft.seq_len(slot) == 0


def test_opting_out_and_other_scopes_reuse_nothing(pair):
    tok = pair.target.vocab.tokenize
    cfg = cfg_of("target", max_tokens=4)
    p = tok(TEXTS[2] * 3)
    pair.target.reset()
    pair.draft.reset()
    sched = Scheduler(pair, 1)
    run_one(sched, Request(p, cfg, cache_scope="key-a"))
    assert run_one(sched, Request(p, cfg, cache_scope="key-a"))[0].stats.prompt_cached == len(p) - 1
    assert run_one(sched, Request(p, cfg, cache_scope="key-a", reuse_cache=False))[0].stats.prompt_cached == 0
    # another scope: the cells are cleared, not reused (not even as a faster first token)
    assert run_one(sched, Request(p, cfg, cache_scope="key-b"))[0].stats.prompt_cached == 0
    assert run_one(sched, Request(p, cfg, cache_scope="key-b"))[0].stats.prompt_cached == len(p) - 1


def test_chat_turns_reuse_through_the_same_mechanism(tiny_draft, tiny_target, tmp_path):
    """`chat` and `serve` share one prompt cache: a chat turn goes through the scheduler's
    prefill (one slot) and reports what it reused in the same ``Stats.prompt_cached``."""
    from test_chat import _drain, _session

    pair, s = _session(tiny_draft, tiny_target, tmp_path, mode="sd", max_tokens=8, temperature=0.0)
    with pair:
        _, r1 = _drain(s.send("Please tell me about the weather in the mountains in the early spring."))
        assert r1.stats.prompt_cached == 0
        _, r2 = _drain(s.send("And in summer?"))
        assert r2.stats.prompt_cached >= r1.stats.prompt_tokens
        assert r2.stats.prompt_cached < r2.stats.prompt_tokens
        s.close()
