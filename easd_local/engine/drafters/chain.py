"""Several drafters tried in order (``--spec-type ngram-simple,draft``): the first that proposes
something drafts the block, as llama.cpp gives a draftless drafter precedence over the draft
model. Each is told of the outcome of its own proposals only."""

from __future__ import annotations

from typing import Generator

import numpy as np

from ..sequence import Seq
from .base import Ask, Counters, DraftGen, Drafter, Proposal


class ChainDrafter:
    def __init__(self, drafters: list[Drafter]) -> None:
        self.drafters = drafters
        self.kind = ",".join(d.kind for d in drafters)
        models = [d.model for d in drafters if d.model is not None]
        self.model = models[0] if models else None
        self.counters = Counters()

    def begin(self, s: Seq) -> Generator[Ask, np.ndarray, None]:
        for d in self.drafters:
            yield from d.begin(s)

    def draft(self, s: Seq, n_max: int) -> DraftGen:
        self.counters.calls += 1
        p = None
        for d in self.drafters:
            p = yield from d.draft(s, n_max)
            if p.tokens:
                break
        return p

    def accept(self, s: Seq, proposal: Proposal, n_accepted: int, start: int) -> None:
        self.counters.add(len(proposal.tokens), n_accepted)
        for d in self.drafters:  # a model drafter also rolls its cells back to the path
            d.accept(s, proposal, n_accepted, start)
