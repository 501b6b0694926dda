"""The per-mode steps' parts on the tiny pair: the accept-length histogram, a drafter that is
not a model, and the one gate value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from easd_local.engine import decoding
from easd_local.engine.config import DecodeConfig
from easd_local.engine.decoding import BONUS, Stats, TokenEvent
from easd_local.engine.pair import load_pair
from easd_local.llamacpp.runtime import LoadOptions, Part
from easd_local.engine.scheduler import Request, Scheduler
from easd_local.engine.drafters import Counters, Proposal
from easd_local.engine.events import DRAFT, LOOKUP

GATE = dict(tau_draft=0.5, tau_target=0.5, overlap=0.2)
TEXT = "Once upon a time there"


@pytest.fixture(scope="module")
def pair(tiny_draft, tiny_target):
    p = load_pair(tiny_draft, tiny_target, LoadOptions(n_ctx=512, n_threads=1))
    yield p
    p.close()


def run(pair, **kw):
    pair.target.reset()
    pair.draft.reset()
    prompt = pair.target.vocab.tokenize(TEXT)
    return decoding.generate_all(pair.target, pair.draft, prompt, DecodeConfig(max_tokens=40, **kw),
                                 n_vocab=pair.n_vocab)


@pytest.mark.parametrize("mode, temperature", [("sd", 0.0), ("easd", 0.0), ("sd", 0.8), ("easd", 0.8)])
def test_accept_length_histogram(pair, mode, temperature):
    fin, events = run(pair, mode=mode, temperature=temperature, seed=3, **GATE)
    s = fin.stats
    h = s.accept_lengths
    assert sum(h) == s.verify_calls == s.target_calls > 0
    assert sum(k * n for k, n in enumerate(h)) == s.draft_accepted
    assert len(h) <= s.gamma + 1 and h[-1] > 0
    assert len(h) > 1, "some verify call emitted a drafted token"
    # pooled by addition, and through a bench row's dict
    twice = s + s
    assert twice.accept_lengths == [2 * n for n in h]
    assert (s + Stats()).accept_lengths == h
    assert Stats.from_dict(s.to_dict()).accept_lengths == h


def test_no_histogram_without_verify_calls(pair):
    for mode in ("target", "draft", "easd-tf"):
        fin, _ = run(pair, mode=mode, **GATE)
        assert fin.stats.accept_lengths == [] and fin.stats.verify_calls == 0


class NoDrafter:
    """A drafter that proposes nothing and touches no model."""

    kind, model = "ngram-simple", None

    def __init__(self) -> None:
        self.counters = Counters()

    def begin(self, s):
        return
        yield

    def draft(self, s, n_max):
        return Proposal([], None, LOOKUP, self)
        yield  # a generator that asks for nothing

    def accept(self, s, proposal, n_accepted, start):
        pass


class KnownTextDrafter(NoDrafter):
    """A drafter without a model: it proposes the continuation of a known text (as an n-gram
    or prompt-lookup drafter would) wherever the sequence so far is a prefix of it."""

    def __init__(self, text: list[int], rows: bool) -> None:
        super().__init__()
        self.text, self.rows = text, rows
        self.asked = 0

    def draft(self, s, n_max):
        self.asked += 1
        n = len(s.seq)
        ahead = self.text[n:n + min(n_max, 4)] if s.seq == self.text[:n] else []
        V = s.V
        rows = [np.where(np.arange(V) == t, 10.0, 0.0).astype(np.float32) for t in ahead]  # certain: p = 1
        return Proposal(list(ahead), rows if self.rows else None, DRAFT if self.rows else LOOKUP, self)
        yield


def _sd_with(pair, drafter, prompt, cfg):
    pair.target.reset()
    pair.draft.reset()
    pair.use_drafter(cfg.spec_type, drafter)  # the public seam: no private attribute
    sched = Scheduler(pair, 1)
    sched.submit(Request(prompt, cfg))
    events, fin = [], None
    while sched.active:
        for _, ev in sched.step():
            if isinstance(ev, TokenEvent):
                events.append(ev)
            else:
                fin = ev
    return fin, events


@pytest.mark.parametrize("rows", [True, False])
def test_a_drafter_is_an_object_the_step_does_not_know(pair, rows):
    """Another drafter plugs into the sd step unchanged: one that proposes nothing turns sd
    into the target alone (every verify block is the one last token: the same decode as
    target mode's), one that looks tokens up verifies them without a draft call, with or
    without distributions (a point mass each)."""
    prompt = pair.target.vocab.tokenize(TEXT)
    cfg = DecodeConfig(mode="sd", max_tokens=40, spec_type="ngram-simple")
    ref, _ = run(pair, mode="target")
    fin, events = _sd_with(pair, NoDrafter(), prompt, cfg)
    assert fin.tokens == ref.tokens
    assert {e.origin for e in events} == {BONUS} and fin.stats.drafted == fin.stats.draft_calls == 0
    assert fin.stats.accept_lengths == [40]
    known = KnownTextDrafter(list(prompt) + ref.tokens, rows)
    fin, events = _sd_with(pair, known, prompt, cfg)
    assert fin.tokens == ref.tokens
    assert fin.stats.draft_calls == 0 and known.asked == fin.stats.verify_calls
    assert fin.stats.drafted > 0 and fin.stats.drafts_emitted > 0.5 * fin.stats.drafted
    origin = DRAFT if rows else LOOKUP
    assert origin in {e.origin for e in events}
    assert (fin.stats.draft_accepted if rows else fin.stats.lookup_accepted) == fin.stats.drafts_emitted
    assert fin.stats.verify_calls < 40  # several tokens per target call


def test_step_asks_then_emits(pair):
    """A step is a generator: it asks (model, part) and emits only once sent the logits."""
    from easd_local.engine.sequence import Seq
    from easd_local.engine.steps import TargetFirstStep

    prompt = pair.target.vocab.tokenize(TEXT)
    pair.target.reset()
    pair.draft.reset()
    pair.target.decode(prompt[:-1], logits_at=())
    cfg = DecodeConfig(mode="easd-tf", **GATE)
    s = Seq(0, 0, Request(prompt, cfg), pair.target, pair.n_vocab, pair.target.n_ctx)
    s.drafter = pair.drafter(cfg.drafters)
    step = TargetFirstStep()(s)
    model, part = next(step)
    assert model is pair.target and part == Part(0, [prompt[-1]])
    flat = np.zeros((1, pair.n_vocab), np.float32)  # H_t = log V: the gate wants the draft
    model, part = step.send(flat)
    assert model is pair.draft and list(part.tokens) == prompt  # the catch-up: the whole prompt
    assert s.events == []
    with pytest.raises(StopIteration):
        step.send(pair.draft.decode(list(part.tokens))[:, : pair.n_vocab])
    (ev,) = s.events
    assert ev.origin in ("target", "easd") and ev.h_target == pytest.approx(math.log(pair.n_vocab))
    assert (s.stats.target_calls, s.stats.draft_consults, s.stats.draft_calls, s.stats.tokens) == (1, 1, 1, 1)
