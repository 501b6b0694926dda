"""One step of each decoding mode, for one sequence, each read top to bottom.

A step is a generator (``Step.__call__``): it yields an ``Ask`` (a model and the part of its
next batch the sequence needs) each time it needs logits, and is sent back that part's
rows. The scheduler drives every sequence's step at once and packs what they ask of one
model into one llama.cpp batch: the draft's asks first (drafting rounds; draft mode's
token), then the target's (verify blocks and single tokens), then the draft's again
(easd-tf's consults). A step's state is its local variables; the random draws happen in
the order of its lines, the maths is ``rules``'; tokens leave through ``Seq.accept``.

Cache invariant (per sequence, every mode): before a step the emitting model's cells hold
``seq[:-1]`` and the step evaluates ``seq[-1]`` (alone, or followed by the drafted tokens
in one verify block); the drafter's cells hold a prefix of ``seq``.
"""

from __future__ import annotations

from typing import Generator

import numpy as np

from . import rules
from .drafters import Ask, Proposal
from .events import DRAFT, DRAFT_ONLY, TARGET
from .rules import Pick
from ..llamacpp.runtime import Part
from .sequence import Seq

StepGen = Generator[Ask, np.ndarray, None]


class Step:
    """One mode's step. A step knows the model whose tokens the sequence emits
    (``s.main``) and, where the mode drafts, the sequence's drafter (``s.drafter``), never
    which kind of drafter that is."""

    def __call__(self, s: Seq) -> StepGen:  # pragma: no cover - each mode defines it
        raise NotImplementedError


class TargetStep(Step):
    """mode target: one token from the target."""

    def __call__(self, s: Seq) -> StepGen:
        z = yield s.main, Part(s.slot, [s.seq[-1]])
        s.stats.target_calls += 1
        s.accept([Pick(s.sample(z[0]), TARGET)])


class DraftStep(Step):
    """mode draft: one token from the draft model alone (its cells hold ``seq[:-1]``)."""

    def __call__(self, s: Seq) -> StepGen:
        z = yield s.main, Part(s.slot, [s.seq[-1]])
        s.stats.draft_calls += 1
        s.accept([Pick(s.sample(z[0]), DRAFT_ONLY)])


class SpecStep(Step):
    """modes sd / easd: the drafter proposes up to as many tokens as fit, the target
    verifies them in one block, the SD test accepts them (and the gate, easd), both caches
    go back to what was emitted. A proposal of no tokens makes the block the last token
    alone: the target's ordinary one-token decode."""

    def __call__(self, s: Seq) -> StepGen:
        n_old = len(s.seq)
        # proposals stop at the context's end and the token budget (and in the drafter)
        n_max = max(0, min(s.ctx_limit - n_old - 1, s.budget))
        prop: Proposal = yield from s.drafter.draft(s, n_max)
        drafts = prop.tokens
        z_target = yield s.main, Part(s.slot, [s.seq[-1], *drafts], range(len(drafts) + 1))
        # the drafter's rows as a list, not stacked; None: point masses (a lookup)
        picks = rules.verify(drafts, prop.rows, z_target, s.cfg, s.gate, s.rng, q_draft=prop.dists)
        if prop.origin != DRAFT:
            picks = [p._replace(origin=prop.origin) if p.origin == DRAFT else p for p in picks]
        kept = s.accept(picks)
        s.stats.count_verify(len(drafts), [p.origin for p in picks], kept)
        # the target keeps seq[:-1]; the drafter keeps what is still on the path
        s.main.rollback(n_old + kept - 1, s.slot)
        n_accepted = sum(p.origin == prop.origin for p in picks[:kept])
        s.drafter.accept(s, prop, n_accepted, start=n_old - 1)


class TargetFirstStep(Step):
    """mode easd-tf: the target picks every token; the draft is caught up and consulted only
    where the target's entropy lets the gate fire."""

    def __call__(self, s: Seq) -> StepGen:
        z_t = (yield s.main, Part(s.slot, [s.seq[-1]]))[0]
        s.stats.target_calls += 1
        # greedy: the target's pick first; its logit is the row's maximum, which the screen
        # would otherwise take in a pass of its own
        a = rules.best(z_t) if s.cfg.greedy else None
        h_t = s.gate.screen(z_t, None if a is None else z_t[a])
        z_d = None
        if s.gate.wants_draft(h_t):
            z_d = yield from s.drafter.consult(s)
            s.stats.draft_consults += 1
        s.accept([rules.target_first(z_t, z_d, s.cfg, s.gate, s.rng, h_t, best_t=a)])
        s.stats.target_first_tokens += 1


STEPS: dict[str, Step] = {"target": TargetStep(), "draft": DraftStep(), "sd": SpecStep(), "easd": SpecStep(),
                          "easd-tf": TargetFirstStep()}
