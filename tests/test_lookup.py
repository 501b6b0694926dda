"""Prompt-lookup drafters (ngram-simple, ngram-mod) on the tiny pair in real llama.cpp, the
length policy's maths, and the point-mass SD rule's law on a numpy fake."""

from __future__ import annotations

import numpy as np
import pytest

from easd_local.engine import decoding
from easd_local.llamacpp import runtime
from easd_local.engine import rules as R
from easd_local.engine.config import DecodeConfig
from easd_local.engine.drafters import lookup as L
from easd_local.engine.drafters import policy as P
from easd_local.engine.events import LOOKUP, BONUS, RESAMPLED
from easd_local.engine.gate import Gate
from easd_local.engine.pair import Pair
from easd_local.llamacpp.runtime import LoadOptions, Model
from easd_local.engine.scheduler import Request, Scheduler
from easd_local.errors import ConfigError

from fake_models import chi2_stat, chi2_threshold  # tests/ is on sys.path
from test_scheduler import why_parted

# prompts whose text repeats itself, as code to be edited does: lookups find matches
REPEATS = ["one two three four five six seven eight one two three four five six seven eight one two",
           "def f(x): return x + 1\ndef g(x): return x + 1\ndef h(x): return",
           "the cat sat on the mat. the cat sat on the mat. the cat sat on"]


@pytest.fixture(scope="module")
def target(tiny_target):
    m = Model(tiny_target, LoadOptions(n_ctx=512, n_threads=1, n_seq=2))
    yield m
    m.close()


def _greedy(target, prompt, **kw):
    target.reset()
    return decoding.generate_all(target, None, prompt, DecodeConfig(max_tokens=48, **kw), n_vocab=target.n_vocab)


@pytest.mark.parametrize("spec_type", ["ngram-simple", "ngram-mod"])
def test_greedy_lookup_is_the_targets_output(target, spec_type):
    """Lossless: greedy sd with a lookup drafter emits the target's own tokens (up to a
    near-tie between a one-token decode and a verify block's row, which must be named), with
    no draft model loaded at all, and some looked-up tokens were accepted."""
    looked_up, parted = 0, []
    for text in REPEATS:
        prompt = target.vocab.tokenize(text)
        ref, _ = _greedy(target, prompt, mode="target")
        fin, ev = _greedy(target, prompt, mode="sd", spec_type=spec_type, spec_ngram_mod_n_match=2)
        assert fin.stats.draft_calls == 0
        looked_up += fin.stats.lookup_accepted
        assert fin.stats.lookup_accepted == sum(e.origin == LOOKUP for e in ev)
        assert {e.origin for e in ev} <= {LOOKUP, BONUS, RESAMPLED}
        if fin.tokens != ref.tokens:
            why = why_parted(Pair(None, target, target.n_vocab), prompt, DecodeConfig(mode="target"), ref, [], fin, ev)
            assert why, f"{spec_type} on {text!r} parted from the target with no near-tie"
            parted.append(why)
    assert looked_up > 0, "the repeating prompts gave no accepted lookup"
    assert len(parted) <= 1, parted


def _counting_decodes(monkeypatch) -> list[int]:
    """From now on, the token count of every llama_decode call, in order."""
    calls: list[int] = []
    real = runtime._ll.llama_decode

    def counting(ctx, batch):
        calls.append(batch.n_tokens)
        return real(ctx, batch)

    monkeypatch.setattr(runtime._ll, "llama_decode", counting)
    return calls


def test_a_step_with_no_match_is_one_decode(target, monkeypatch):
    """A prompt with no repeated n-gram: every sd step with ngram-simple is exactly one
    llama_decode of one token on the target, as target mode's."""
    prompt = list(range(10, 40))  # 30 distinct ids: nothing to look up in the prompt
    target.reset()
    pair = Pair(draft=None, target=target, n_vocab=target.n_vocab)
    sched = Scheduler(pair, 1)
    # the draft min keeps any chance match of the generated text from proposing
    sched.submit(Request(prompt, DecodeConfig(mode="sd", spec_type="ngram-simple", max_tokens=6, draft_min=64)))
    sched.step()  # prefill and the first step
    calls = _counting_decodes(monkeypatch)
    for _ in range(4):
        before = len(calls)
        sched.step()
        assert calls[before:] == [1], calls


def test_lookup_in_two_slots_is_one_batch(target, monkeypatch):
    """Two sequences drafting by lookup share each step's one target batch."""
    target.reset()
    pair = Pair(draft=None, target=target, n_vocab=target.n_vocab)
    sched = Scheduler(pair, 2)
    cfg = DecodeConfig(mode="sd", spec_type="ngram-simple", max_tokens=24)
    for text in REPEATS[:2]:
        sched.submit(Request(target.vocab.tokenize(text), cfg, reuse_cache=False))
    sched.step()
    calls = _counting_decodes(monkeypatch)
    steps = 0
    while sched.active == 2:
        before = len(calls)
        sched.step()
        steps += 1
        assert len(calls) - before == 1, "one target batch per step for both slots"
    assert steps > 0 and max(calls) > 2, "some step verified looked-up tokens"


def test_gated_modes_use_the_draft_model_and_sd_needs_none():
    assert DecodeConfig(mode="sd", spec_type="ngram-simple").needs_draft_model is False
    assert DecodeConfig(mode="sd", spec_type="ngram-simple,draft").needs_draft_model is True
    assert DecodeConfig(mode="easd", spec_type="ngram-simple").drafters == ("draft",)
    assert DecodeConfig(mode="sd", spec_type="ngram-mod,draft").drafters == ("ngram-mod", "draft")
    assert DecodeConfig(mode="target", spec_type="ngram-simple").drafters == ()
    for bad in ("", "ngram-bogus", "draft,draft"):
        with pytest.raises(ConfigError):
            DecodeConfig(mode="sd", spec_type=bad).validate()


def test_sd_with_lookup_needs_no_draft_model_but_the_model_drafter_does(target):
    pair = Pair(draft=None, target=target, n_vocab=target.n_vocab)
    sched = Scheduler(pair, 1)
    prompt = target.vocab.tokenize(REPEATS[0])
    with pytest.raises(ConfigError, match="needs a draft model"):
        sched.submit(Request(prompt, DecodeConfig(mode="sd", spec_type="draft")))
    sched.submit(Request(prompt, DecodeConfig(mode="sd", spec_type="ngram-simple", max_tokens=2)))


# ------------------------------------------------------------------ the maths, no model


def test_match_finds_the_last_earlier_occurrence_and_its_length():
    seq = [1, 2, 3, 4, 9, 1, 2, 3, 4, 7, 5, 2, 3, 4]
    idx = L._SlotIndex(0, 2)
    e, length = L.match(seq, idx)
    assert seq[e] == 7 and length == 3  # "2 3 4" matched at its latest place (after "1", not "5"), followed by 7
    e, _ = L.match([5, 6, 7, 8], L._SlotIndex(0, 2))
    assert e == -1


def test_match_prefers_the_place_that_matches_longer():
    # "3 4" ends the text; its latest earlier place (after "5", followed by 8) matches 2 tokens,
    # an older one (after "1 2", followed by 7) matches 4: the longer match is followed
    seq = [9, 1, 2, 3, 4, 7, 5, 3, 4, 8, 1, 2, 3, 4]
    idx = L._SlotIndex(0, 2)
    e, length = L.match(seq, idx)
    assert seq[e] == 7 and length == 4
    # an index entry that points at the wrong place (a hash collision) is not followed: the
    # tokens are compared, and a shorter n-gram answers
    idx.ends[4][hash(tuple(seq[-4:]))] = 9
    e, length = L.match(seq, idx)
    assert seq[e] in (7, 8) and length >= 2 and seq[e - 2:e] == [3, 4]


def test_match_says_what_the_occurrence_before_witnesses():
    """The n-gram matched at its latest place; the place before that was followed by the same
    token (AGREE), by another (DISAGREE), or there was none (ONCE)."""
    idx = L._SlotIndex(0, 2)
    assert L.witnessed_match([9, 1, 2, 7, 5, 1, 2, 7, 6, 1, 2], idx)[2] == P.AGREE
    e, length, w = L.witnessed_match([9, 1, 2, 7, 5, 1, 2, 8, 6, 1, 2], L._SlotIndex(0, 2))
    assert w == P.DISAGREE and [9, 1, 2, 7, 5, 1, 2, 8, 6, 1, 2][e] == 8  # the latest place still leads
    assert L.witnessed_match([9, 1, 2, 7, 6, 1, 2], L._SlotIndex(0, 2))[2] == P.ONCE
    assert L.witnessed_match([9, 1, 2, 7, 6, 1, 2], L._SlotIndex(0, 2))[:2] == L.match([9, 1, 2, 7, 6, 1, 2],
                                                                                   L._SlotIndex(0, 2))
    # the index grows with the sequence: a third occurrence makes the second the witness
    seq = [9, 1, 2, 7, 5, 1, 2, 8]
    idx = L._SlotIndex(0, 2)
    L.witnessed_match(seq, idx)
    seq += [6, 1, 2]
    assert L.witnessed_match(seq, idx)[2] == P.DISAGREE
    seq += [8, 3, 1, 2]
    assert L.witnessed_match(seq, idx)[2] == P.AGREE  # "1 2" -> 8 at the last two places


def test_book_counts_each_witness_apart():
    """Rejections after disagreeing witnesses stop proposals there, not after agreeing ones."""
    book = P.AcceptanceBook(P.linear_costs(16, 0.29))
    for _ in range(30):
        book.record(2, 1, 0, P.DISAGREE)
    assert book.length(2, 10, P.DISAGREE) == 0
    assert book.length(2, 10, P.AGREE) >= 1 and book.length(2, 10, P.ONCE) >= 1
    assert book.length(2, 10) == book.length(2, 10, P.ONCE)


def test_simulate_blind_to_the_witness_counts_every_match_once():
    from easd_local.pairscore.lookup import simulate
    text = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 1, 2, 3, 5] * 4
    costs = P.linear_costs(64, 0.29)
    seen, blind = P.AcceptanceBook(costs), P.AcceptanceBook(costs)
    simulate([9, 1, 2, 3, 4], text, seen)
    simulate([9, 1, 2, 3, 4], text, blind, witnessed=False)
    n = len(P.BUCKETS)
    fresh = P.AcceptanceBook(costs)
    assert blind.accepted[n:] == fresh.accepted[n:] and blind.rejected[n:] == fresh.rejected[n:]
    assert seen.accepted[n:] != fresh.accepted[n:] or seen.rejected[n:] != fresh.rejected[n:]


def test_best_length_follows_acceptance_and_costs():
    costs = P.linear_costs(16, 0.29)
    assert P.best_length(0.1, costs, 16) == 0  # seldom right: the target's own decode
    assert P.best_length(0.5, costs, 16) == 1
    assert P.best_length(0.95, costs, 16) >= 8
    assert P.best_length(0.95, P.linear_costs(16, 1.0), 16) == 0  # a verify as dear as decodes never pays
    assert P.extend_costs([0.1, 0.2], 4) == pytest.approx((1.0, 2.0, 3.0, 4.0, 5.0))


def test_costs_go_on_at_their_mean_slope_not_the_last_steps():
    # a record whose last step timed cheaper than the one before (7.31, 7.27 on 2026-12-06):
    # longer proposals cost the mean drafted token, not next to nothing
    rec = [1.0, 1.67, 2.24, 2.37, 2.97, 3.63, 4.06, 7.31, 7.27]
    c = P.extend_costs(rec, 16)
    assert c[:9] == pytest.approx(rec)
    assert c[16] == pytest.approx(7.27 + 8 * (7.27 - 1.0) / 8)
    # so a bucket that copies (a = 0.97) proposes within the measured lengths (here 3), not all 16
    assert P.best_length(0.97, c, 16) <= 8


def test_book_stops_proposing_after_rejections_and_explores():
    book = P.AcceptanceBook(P.linear_costs(16, 0.29))
    assert book.length(2, 10) >= 1  # the prior: worth one token
    for _ in range(20):
        book.record(2, 1, 0)
    ks = [book.length(2, 10) for _ in range(P.EXPLORE * 2)]
    assert ks.count(0) == len(ks) - 2 and ks.count(1) == 2  # one exploring token every EXPLORE-th
    for _ in range(50):
        book.record(16, 8, 8)
    assert book.length(16, 16) >= 8


def test_ledger_holds_back_a_sequence_whose_drafting_has_lost_its_slack():
    costs = P.linear_costs(16, 0.29)
    led = P.Ledger()
    for _ in range(3):  # 3 verifies of 4 tokens, none accepted: 3 tokens for 6.48 decodes
        assert led.allows()  # under LEDGER_WARM decodes: not judged yet
        led.record(4, 0, costs)
    led.record(4, 0, costs)  # 4 tokens for 8.64 decodes: 4.64 behind
    assert led.cost >= P.LEDGER_WARM and led.cost - led.tokens > P.LEDGER_SLACK
    ks = [led.allows() for _ in range(P.EXPLORE * 2)]
    assert ks.count(True) == 2  # held back, all but one in EXPLORE
    led.record(4, 4, costs)  # a text that starts to repeat: 9 tokens for 10.8 decodes
    assert led.cost - led.tokens <= P.LEDGER_SLACK and led.allows()  # behind, but within the slack
    led.record(0, 0, costs)  # no proposal: nothing to count
    assert (led.tokens, led.cost) == (9.0, pytest.approx(10.8))


def test_ledger_first_form_waits_for_its_warm_up_then_holds_back_at_break_even():
    costs = P.linear_costs(16, 0.29)
    led = P.Ledger(slack=0.0, warm=8.0)
    for _ in range(3):  # 3 tokens for 6.48 decodes: behind, but under the warm-up
        assert led.allows()
        led.record(4, 0, costs)
    led.record(4, 0, costs)  # 4 tokens for 8.64 decodes
    assert [led.allows() for _ in range(P.EXPLORE)].count(True) == 1


class _Seq:
    """What a lookup drafter reads of a sequence (no model: the drafters that need none)."""

    def __init__(self, slot, seq, **cfg):
        self.slot, self.seq, self.eog = slot, seq, set()
        self.cfg = DecodeConfig(mode="sd", spec_type="ngram-simple", **cfg)


def _drafted(drafter, s, n_max=8):
    gen = drafter.draft(s, n_max)
    try:
        next(gen)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("a lookup drafter asked for a decode")


@pytest.mark.parametrize("kind", [L.LookupDrafter, __import__("easd_local.engine.drafters.ngram_mod",
                                                              fromlist=["NgramModDrafter"]).NgramModDrafter])
def test_a_drafter_holds_back_per_sequence_not_for_its_book(kind):
    """A book that learnt copying pays (a server's, after code edits) still proposes for a text
    that does not repeat until that sequence's own ledger says its drafting has not paid;
    another sequence (slot, or the next request in the same slot) starts a fresh ledger."""
    costs = P.linear_costs(16, 0.29)
    book = P.AcceptanceBook(costs)
    for b in range(len(P.BUCKETS)):
        book.accepted[b] += 200  # every match has been followed (ONCE witness)
    d = kind(book)
    s = _Seq(0, [7, 1, 2, 3, 1, 2], spec_ngram_mod_n_match=2)
    proposed = []
    for _ in range(12):
        prop = _drafted(d, s)
        proposed.append(len(prop.tokens))
        d.accept(s, prop, 0, start=len(s.seq) - 1)  # all rejected: the text goes elsewhere
    # proposes through its warm-up, then holds back, all but one in EXPLORE
    assert all(proposed[:2]) and proposed[-8:].count(0) >= 7
    other = _Seq(1, list(s.seq), spec_ngram_mod_n_match=2)
    assert _drafted(d, other).tokens  # another slot: its own ledger
    again = _Seq(0, list(s.seq), spec_ngram_mod_n_match=2)
    assert _drafted(d, again).tokens  # the slot's next sequence: a fresh ledger
    if kind is L.LookupDrafter:  # the switch scripts/lookup_witness_ab.py compares with
        loose, s2 = L.LookupDrafter(book, stop_loss=False), _Seq(0, list(again.seq))
        for _ in range(12):
            prop = _drafted(loose, s2)
            assert prop.tokens
            loose.accept(s2, prop, 0, start=len(s2.seq) - 1)


def test_simulate_holds_back_a_text_that_does_not_repeat():
    from easd_local.pairscore.lookup import simulate
    costs = P.linear_costs(64, 0.29)

    def learnt():
        book = P.AcceptanceBook(costs)
        simulate(list(range(100, 160)), list(range(100, 160)) * 3, book)  # copying paid
        return book
    prompt = [1, 2, 3, 4, 5, 6]
    text = [t for i in range(40) for t in (1, 2, 10 + i)]  # every match on (1, 2) is wrong
    held, loose = simulate(prompt, text, learnt()), simulate(prompt, text, learnt(), ledger=False)
    assert held.drafted < loose.drafted and held.speedup > loose.speedup


def test_point_mass_sd_keeps_the_targets_law():
    """Sampled SD with a proposal that has no distribution (a point mass on d) emits tokens
    distributed as p, whether or not d is p's likely token; a rule that skips the residual
    (resamples from p on rejection, d included) fails the same check."""
    rng = np.random.default_rng(1)
    V = 12
    z = rng.normal(size=(2, V)).astype(np.float32)
    cfg = DecodeConfig(mode="sd", temperature=0.9, spec_type="ngram-simple")
    p = R.sampling_probs(z[:1].astype(np.float64), 0.9, 0, 1.0)[0]
    gate = Gate.of(cfg)
    n = 20000
    for d in (int(np.argmax(p)), int(np.argmin(p))):
        counts = np.zeros(V)
        broken = np.zeros(V)
        for _ in range(n):
            first = R.verify([d], None, z, cfg, gate, rng)[0]
            counts[first.token] += 1
            # broken: accept with p(d), else sample p itself
            broken[d if rng.random() < p[d] else R.sample(p, rng)] += 1
        stat, df = chi2_stat(counts, p)
        assert stat < chi2_threshold(df), (d, stat)
        bstat, bdf = chi2_stat(broken, p)
        assert bstat > chi2_threshold(bdf), (d, bstat)


def test_point_mass_cannot_be_gated():
    cfg = DecodeConfig(mode="easd", tau_draft=0.0, tau_target=0.0, overlap=0.0)
    z = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="distributions"):
        R.verify([1], None, z, cfg, Gate.of(cfg), np.random.default_rng(0))


def test_pair_score_lookup_prediction_replays_the_drafter_along_a_text():
    from easd_local.pairscore.lookup import simulate

    book = P.AcceptanceBook(P.linear_costs(64, 0.29))
    code = list(range(100, 160))
    sim = simulate(code, code, book)  # the text is the prompt again: long matches, long proposals
    assert sim.tokens == len(code) and sim.accepted > 0.8 * len(code) and sim.speedup > 1.5
    fresh = simulate(list(range(100, 160)), list(range(200, 260)), P.AcceptanceBook(P.linear_costs(64, 0.29)))
    assert fresh.drafted == 0 and fresh.speedup == pytest.approx(1.0)  # nothing to look up: the target alone


@pytest.mark.parametrize("spec_type", ["ngram-simple", "ngram-mod"])
def test_a_pair_kept_across_generations_starts_each_sequence_afresh(target, spec_type):
    """A chat or a benchmark keeps one pair (and its drafters) across generations, each with a
    scheduler of its own whose request ids start again at 0: a long sequence's index must not
    be read for the shorter one that follows it in the same slot."""
    pair = Pair(draft=None, target=target, n_vocab=target.n_vocab)
    cfg = DecodeConfig(mode="sd", spec_type=spec_type, max_tokens=24, spec_ngram_mod_n_match=2)
    for text in (REPEATS[0] * 3, "one two one two", REPEATS[2]):
        prompt = target.vocab.tokenize(text)
        target.reset()
        ref, _ = decoding.generate_all(target, None, prompt, cfg.replace(mode="target"), n_vocab=target.n_vocab)
        target.reset()
        fin, _ = decoding.generate_all(target, None, prompt, cfg, n_vocab=target.n_vocab, pair=pair)
        assert fin.tokens == ref.tokens or why_parted(pair, prompt, cfg.replace(mode="target"), ref, [], fin, [])


def test_the_model_drafter_keeps_its_rows_only_where_the_verify_reads_them(target, tiny_draft, monkeypatch):
    """Greedy sd reads no draft row (its proposal is tokens: a copy of each 152k-wide row is
    spared); sampled sd gets the q each token was drawn from (not its row: q is not computed
    twice), easd one row per drafted token (the gate), and sampled easd both."""
    draft = Model(tiny_draft, LoadOptions(n_ctx=512, n_threads=1))
    seen: list[object] = []
    real = R.verify

    def spy(drafts, rows, *a, q_draft=None, **kw):
        seen.append((None if rows is None else len(rows) == len(drafts),
                     None if q_draft is None else len(q_draft) == len(drafts)))
        return real(drafts, rows, *a, q_draft=q_draft, **kw)

    monkeypatch.setattr(R, "verify", spy)
    try:
        prompt = target.vocab.tokenize(REPEATS[1])
        gate = dict(tau_draft=0.0, tau_target=0.0)
        for kw, want in ((dict(mode="sd"), {(None, None)}), (dict(mode="sd", temperature=0.8), {(None, True)}),
                         (dict(mode="easd", **gate), {(True, None)}),
                         (dict(mode="easd", temperature=0.8, **gate), {(True, True)})):
            seen.clear()
            target.reset()
            draft.reset()
            decoding.generate_all(target, draft, prompt, DecodeConfig(max_tokens=12, **kw), n_vocab=target.n_vocab)
            assert seen and set(seen) == want, (kw, seen)
    finally:
        draft.close()
