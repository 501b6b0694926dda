"""What every drafter is: the interface the steps and the scheduler call, as llama.cpp's
``common_speculative`` (begin / draft / accept), and what a drafting round returns.

A drafter's methods that may need a model are generators, like the steps that call them
(``yield from``): each ``yield`` asks for one part of one model's next batch and is sent that
part's logits rows, so the scheduler batches the drafting of every sequence. A drafter
without a model never yields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Protocol

import numpy as np

from ...llamacpp.runtime import Model, Part
from ..events import LOOKUP
from ..sequence import Seq

# What a step or a drafter asks the scheduler for: one part of one model's next batch. The
# reply sent back is that part's logits rows (the shared vocabulary's columns).
Ask = tuple[Model, Part]
DraftGen = Generator[Ask, np.ndarray, "Proposal"]


@dataclass
class Proposal:
    """One drafting round: the tokens to verify, in the target's vocabulary; the logits row
    each was picked from (``rows``: what the EASD gate reads), and the distribution each was
    sampled from (``dists``: the SD test's q, so that the verify does not compute it again),
    each None where the drafter has none or the verify will not read it. With neither, each
    token is a point mass (``rules.verify``). ``origin`` is what an accepted one is called
    (``events.DRAFT`` or ``events.LOOKUP``)."""

    tokens: list[int]
    rows: list[np.ndarray] | None
    origin: str
    drafter: "Drafter | None" = field(default=None, repr=False)  # who proposed it (told of the outcome)
    dists: list | None = None  # rules.distribution of each token's row (sampling only)


def looked_up(drafter: "Drafter", tokens: list[int], draft_min: int) -> Proposal:
    """A lookup drafter's proposal (no distributions: point masses), dropped whole when it is
    shorter than ``--draft-min``."""
    return Proposal(tokens if len(tokens) >= draft_min else [], None, LOOKUP, drafter)


@dataclass
class Counters:
    """A drafter's own figures over its life (llama.cpp keeps them on the drafter too):
    rounds asked, rounds that proposed something, tokens proposed and accepted."""

    calls: int = 0
    proposals: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.proposals += drafted > 0
        self.drafted += drafted
        self.accepted += accepted


class Drafter(Protocol):
    """What proposes the tokens the target verifies (sd, easd) and, for a model drafter, gives
    the draft's view of a position (easd-tf)."""

    kind: str  # modes.DRAFTER_TABLE's name
    model: Model | None  # the draft model whose cells it keeps (None: it needs no model)
    counters: Counters

    def begin(self, s: Seq) -> Generator[Ask, np.ndarray, None]:
        """A new sequence in slot ``s.slot``: read its prompt (a model drafter evaluates
        ``prompt[:-1]`` into its cells, reusing what they hold)."""

    def draft(self, s: Seq, n_max: int) -> DraftGen:
        """Up to ``n_max`` tokens to follow ``s.seq``."""

    def accept(self, s: Seq, proposal: Proposal, n_accepted: int, start: int) -> None:
        """After the verify of ``proposal``: ``n_accepted`` of its tokens were emitted and
        ``s.seq`` is the sequence now (its first ``start`` tokens were there before)."""


class Consulting(Drafter, Protocol):
    """A drafter with the draft model's distributions (easd-tf asks it at one position)."""

    def consult(self, s: Seq) -> Generator[Ask, np.ndarray, np.ndarray]:
        """The draft's logits row after ``s.seq``."""
