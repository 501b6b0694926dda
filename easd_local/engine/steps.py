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
from .drafter import Ask, Drafter, ModelDrafter
from .events import DRAFT_ONLY, TARGET
from .rules import Pick
from .runtime import Model, Part
from .sequence import Seq

StepGen = Generator[Ask, np.ndarray, None]


class Step:
    """One mode's step over the pair's models; speculation drafts through ``drafter`` (by
    default a ``ModelDrafter`` of ``draft``)."""

    def __init__(self, target: Model | None, draft: Model | None, drafter: Drafter | None = None) -> None:
        self.target, self.draft = target, draft
        self.drafter = drafter if drafter is not None else ModelDrafter(draft) if draft is not None else None

    def __call__(self, s: Seq) -> StepGen:  # pragma: no cover - each mode defines it
        raise NotImplementedError


class TargetStep(Step):
    """mode target: one token from the target."""

    def __call__(self, s: Seq) -> StepGen:
        z = yield self.target, Part(s.slot, [s.seq[-1]])
        s.stats.target_calls += 1
        s.accept([Pick(s.sample(z[0]), TARGET)])


class DraftStep(Step):
    """mode draft: one token from the draft model alone (its cells hold ``seq[:-1]``)."""

    def __call__(self, s: Seq) -> StepGen:
        z = yield self.draft, Part(s.slot, [s.seq[-1]])
        s.stats.draft_calls += 1
        s.accept([Pick(s.sample(z[0]), DRAFT_ONLY)])


class SpecStep(Step):
    """modes sd / easd: draft up to gamma tokens, verify them on the target in one block,
    accept and gate them, roll both caches back to what was emitted."""

    def __call__(self, s: Seq) -> StepGen:
        n_old = len(s.seq)
        # drafting stops early at the context's end and the token budget (and in the drafter)
        n_max = max(0, min(s.cfg.gamma, s.ctx_limit - n_old - 1, s.budget))
        drafts, z_draft = yield from self.drafter.draft(s, n_max)
        z_target = yield self.target, Part(s.slot, [s.seq[-1], *drafts], range(len(drafts) + 1))
        picks = rules.verify(drafts, z_draft, z_target, s.cfg, s.gate, s.rng)  # the rows, not stacked
        kept = s.accept(picks)
        s.stats.count_verify(len(drafts), [p.origin for p in picks], kept)
        # both caches back to the emitted prefix: the target keeps seq[:-1]
        self.target.rollback(n_old + kept - 1, s.slot)
        self.drafter.rewind(s, start=n_old - 1)


class TargetFirstStep(Step):
    """mode easd-tf: the target picks every token; the draft is caught up and consulted only
    where the target's entropy lets the gate fire."""

    def __call__(self, s: Seq) -> StepGen:
        z_t = (yield self.target, Part(s.slot, [s.seq[-1]]))[0]
        s.stats.target_calls += 1
        h_t = s.gate.screen(z_t)
        z_d = None
        if s.gate.wants_draft(h_t):
            z_d = yield from self.drafter.consult(s)
            s.stats.draft_consults += 1
        s.accept([rules.target_first(z_t, z_d, s.cfg, s.gate, s.rng, h_t)])
        s.stats.target_first_tokens += 1


STEPS: dict[str, type[Step]] = {"target": TargetStep, "draft": DraftStep, "sd": SpecStep, "easd": SpecStep,
                                "easd-tf": TargetFirstStep}
