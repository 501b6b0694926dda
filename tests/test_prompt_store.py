"""The host-memory prompt store (llama-server's --cache-ram) on the tiny pair in real llama.cpp:
a conversation whose slot another request took gets its cells back from host memory on both
models, decodes what it would have decoded with its cells never gone, within a byte budget,
never across scopes."""

from __future__ import annotations

import pytest

from easd_local.engine.pair import load_pair
from easd_local.engine.prompt_store import PromptStore
from easd_local.llamacpp.runtime import LoadOptions
from easd_local.engine.scheduler import Request, Scheduler

from test_prompt_cache import Counting, run_one
from test_scheduler import MODES, TEXTS, cfg_of


@pytest.fixture(scope="module")
def pair(tiny_draft, tiny_target):
    p = load_pair(tiny_draft, tiny_target, LoadOptions(n_ctx=512, n_threads=1, n_seq=2))
    yield p
    p.close()


def _fresh(pair):
    pair.target.reset()
    pair.draft.reset()


def test_save_and_load_a_sequence_round_trip(pair):
    """save_seq / load_seq move a sequence's cells: loaded back, the logits after them are
    the original's bit for bit; loaded into another sequence, those of the same tokens
    evaluated there (llama.cpp's numerics depend a little on what else the cache holds:
    0.18 logits here with the other sequence full or empty, so each is compared with the
    same cache around it)."""
    from easd_local.llamacpp.runtime import Part

    _fresh(pair)
    t = pair.target
    toks = t.vocab.tokenize(TEXTS[0] * 4)

    def next_logits(seq: int):
        out = t.decode_batch([Part(seq, toks[-1:], (0,))])[0].copy()
        t.rollback(len(toks) - 1, seq)
        return out

    t.decode_batch([Part(0, toks[:-1], ())])
    want0 = next_logits(0)
    saved_tokens, data = t.save_seq(0)
    assert saved_tokens == toks[:-1] and len(data) > 0
    assert t.load_seq(0, saved_tokens, data) and t.seq_tokens(0) == toks[:-1]
    assert (next_logits(0) == want0).all()
    assert t.load_seq(1, saved_tokens, data) and t.seq_tokens(1) == toks[:-1]
    loaded1 = next_logits(1)
    t.reset_seq(1)
    t.decode_batch([Part(1, toks[:-1], ())])
    assert (loaded1 == next_logits(1)).all()
    assert t.load_seq(1, [], data) and t.seq_len(1) == 0  # an empty state empties the sequence


@pytest.mark.parametrize("mode", MODES)
def test_a_conversation_gets_its_cells_back_after_another_took_its_slot(pair, mode, monkeypatch):
    """One slot: turn 1 of a conversation, an unrelated request (it discards the slot's cells:
    they go to host memory), then turn 2: its cells come back from host memory, on both
    models, so it evaluates only its new tokens, and it emits what it emits when its cells
    never left the slot (the same cells: bit for bit, no near-tie to allow)."""
    tok = pair.target.vocab.tokenize
    cfg = cfg_of(mode, max_tokens=16)
    p1 = tok(TEXTS[3] * 3)
    other = tok(TEXTS[1] * 2)

    def conversation(store: bool):
        _fresh(pair)
        sched = Scheduler(pair, 1, cache_ram=(64 << 20) if store else 0)
        fin1, _, _ = run_one(sched, Request(p1, cfg))
        p2 = p1 + fin1.tokens + tok(" And what comes next?")
        if store:
            run_one(sched, Request(other, cfg))
            assert len(sched.store) == 1 and sched.store.saved == 1
        count = Counting(monkeypatch, pair)
        fin2, ev2, _ = run_one(sched, Request(p2, cfg))
        monkeypatch.undo()
        return fin1, fin2, ev2, count.n, sched

    fin1, kept, kept_ev, kept_n, _ = conversation(store=False)  # the slot never served anything else
    _, back, back_ev, back_n, sched = conversation(store=True)
    assert back.stats.prompt_cached == kept.stats.prompt_cached == len(p1) + len(fin1.tokens) - 1
    assert sched.store.restored == 1 and sched.store.restored_tokens == back.stats.prompt_cached
    assert back.tokens == kept.tokens
    assert [e.origin for e in back_ev] == [e.origin for e in kept_ev]
    assert back_n == kept_n  # both models evaluated only the new tokens, as with the cells kept
    assert len(sched.store) == 1  # the unrelated request's cells went to host memory in turn


def test_no_store_means_the_history_is_evaluated_again(pair):
    tok = pair.target.vocab.tokenize
    cfg = cfg_of("sd", max_tokens=8)
    p1 = tok(TEXTS[3] * 3)
    _fresh(pair)
    sched = Scheduler(pair, 1)
    fin1, _, _ = run_one(sched, Request(p1, cfg))
    run_one(sched, Request(tok(TEXTS[1] * 2), cfg))
    fin2, _, _ = run_one(sched, Request(p1 + fin1.tokens, cfg))
    assert sched.store is None and fin2.stats.prompt_cached < 8  # the shared start of the texts at most


def test_the_budget_holds_and_scopes_stay_apart(pair):
    tok = pair.target.vocab.tokenize
    cfg = cfg_of("target", max_tokens=4)
    prompts = [tok(t * 3) for t in TEXTS]
    _fresh(pair)
    sched = Scheduler(pair, 1, cache_ram=64 << 20)
    run_one(sched, Request(prompts[0], cfg, cache_scope="a"))
    one = None
    for p in prompts[1:]:
        run_one(sched, Request(p, cfg, cache_scope="a"))
        one = one or sched.store.bytes
    assert len(sched.store) == 3 and sched.store.bytes > 0
    # another key's request that repeats key a's first prompt: nothing of a's is given to it
    fin, _, _ = run_one(sched, Request(prompts[0], cfg, cache_scope="b"))
    assert fin.stats.prompt_cached == 0 and sched.store.restored == 0
    # key a's repeat gets its cells back
    fin, _, _ = run_one(sched, Request(prompts[0], cfg, cache_scope="a"))
    assert fin.stats.prompt_cached == len(prompts[0]) - 1 and sched.store.restored == 1
    # a budget of about two entries keeps the latest two, within the budget
    _fresh(pair)
    small = Scheduler(pair, 1, cache_ram=int(2.5 * one))
    for p in prompts:
        run_one(small, Request(p, cfg))
    assert len(small.store) == 2 and small.store.bytes <= small.store.budget
    fin, _, _ = run_one(small, Request(prompts[0], cfg))  # the oldest was dropped
    assert fin.stats.prompt_cached < 8


def test_store_unit_all_or_nothing():
    """A model that cannot place the saved cells leaves the slot empty on every model."""
    import ctypes

    class Fake:
        def __init__(self, fits: bool):
            self.seq = {0: [1, 2, 3, 4]}
            self.fits = fits

        def seq_len(self, slot):
            return len(self.seq.get(slot, []))

        def common_prefix(self, tokens, seq=0):
            mine = self.seq.get(seq, [])
            n = 0
            while n < min(len(mine), len(tokens)) and mine[n] == tokens[n]:
                n += 1
            return n

        def save_seq(self, slot):
            return list(self.seq[slot]), (ctypes.c_uint8 * 8)()

        def load_seq(self, slot, tokens, data):
            self.seq[slot] = list(tokens) if self.fits else []
            return self.fits

        def reset_seq(self, slot):
            self.seq[slot] = []

    t, d = Fake(True), Fake(False)
    store = PromptStore(1 << 20)
    assert not store.swap((t, d), 0, 0, [9, 9], slot_scope="", scope="", reuse=True)  # saved, nothing to load
    assert len(store) == 1
    t.seq[0], d.seq[0] = [9], [9]  # the request that took the slot
    assert not store.swap((t, d), 0, 0, [1, 2, 3, 4, 5], slot_scope="", scope="", reuse=True)
    assert t.seq[0] == [] and d.seq[0] == []


def test_a_state_llama_cpp_cannot_save_is_not_kept(pair, monkeypatch):
    """The store is an optimization: a save that fails leaves the request to run as without
    it (the history evaluated again), never fails it."""
    from easd_local.llamacpp.runtime import Model
    from easd_local.errors import RuntimeFailure

    tok = pair.target.vocab.tokenize
    cfg = cfg_of("sd", max_tokens=8)
    _fresh(pair)
    sched = Scheduler(pair, 1, cache_ram=64 << 20)
    fin1, _, _ = run_one(sched, Request(tok(TEXTS[3] * 3), cfg))

    def broken(self, seq):
        raise RuntimeFailure("no")

    monkeypatch.setattr(Model, "save_seq", broken)
    fin, _, _ = run_one(sched, Request(tok(TEXTS[1] * 2), cfg))
    assert fin.stats.tokens == 8 and len(sched.store) == 0
