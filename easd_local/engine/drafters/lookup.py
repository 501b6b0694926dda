"""Prompt lookup (``--spec-type ngram-simple``, llama.cpp's idea): find the last earlier place
where the text so far (prompt and generated tokens) ended as it ends now, and propose the
tokens that followed there. It costs no decode: a step with no match is the target's own
one-token decode.

Per slot it keeps an index from each ``spec_ngram_size_n``-token n-gram to where it last
ended, grown as the sequence grows (a sequence only ever appends), so a lookup is one dict
read and a short backward comparison that measures how long the match is. How many of the
tokens that followed are proposed is the ``AcceptanceBook``'s choice: what pays on this
machine's verify costs at the acceptance seen after matches that long.
"""

from __future__ import annotations

from typing import Generator

import numpy as np

from ..sequence import Seq
from .base import Ask, Counters, DraftGen, Proposal, looked_up
from .policy import AcceptanceBook

MAX_MATCH = 32  # a match is measured back this far at most (confidence saturates well before)


class _SlotIndex:
    __slots__ = ("owner", "n", "ends", "indexed", "last_match")

    def __init__(self, owner: object, n: int) -> None:
        # the sequence it indexes: request ids restart with every scheduler, a slot's next
        # sequence is another object
        self.owner, self.n = owner, n
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> position just after its last occurrence
        self.indexed = 0  # n-grams ending before this position are in ``ends``
        self.last_match = 0

    def grow(self, seq: list[int], upto: int) -> None:
        """Index every n-gram that ends before ``upto`` and is followed by a token."""
        n = self.n
        for e in range(max(n, self.indexed), upto):
            self.ends[tuple(seq[e - n:e])] = e
        self.indexed = max(self.indexed, upto)


def match(seq: list[int], idx: _SlotIndex) -> tuple[int, int]:
    """(where the continuation starts, match length) of the last earlier occurrence of the
    sequence's final n-gram; (-1, 0) when there is none."""
    n, L = idx.n, len(seq)
    if L <= n:
        return -1, 0
    idx.grow(seq, L)  # every n-gram whose next token is known: all but the current one
    e = idx.ends.get(tuple(seq[L - n:]))
    if e is None:
        return -1, 0
    length = n
    while length < MAX_MATCH and e - length - 1 >= 0 and seq[e - length - 1] == seq[L - length - 1]:
        length += 1
    return e, length


class LookupDrafter:
    kind = "ngram-simple"
    model = None

    def __init__(self, book: AcceptanceBook) -> None:
        self.book = book
        self.counters = Counters()
        self._slots: dict[int, _SlotIndex] = {}

    def _index(self, s: Seq) -> _SlotIndex:
        idx = self._slots.get(s.slot)
        if idx is None or idx.owner is not s or idx.n != s.cfg.spec_ngram_size_n:
            idx = self._slots[s.slot] = _SlotIndex(s, s.cfg.spec_ngram_size_n)
        return idx

    def begin(self, s: Seq) -> Generator[Ask, np.ndarray, None]:
        self._index(s).grow(s.seq, len(s.seq))
        return
        yield

    def draft(self, s: Seq, n_max: int) -> DraftGen:
        self.counters.calls += 1
        idx = self._index(s)
        seq = s.seq
        e, length = match(seq, idx)
        idx.last_match = length
        tokens: list[int] = []
        if e >= 0:
            cap = min(n_max, s.cfg.spec_ngram_size_m, len(seq) - e)
            k = self.book.length(length, cap)
            tokens = seq[e:e + k]
            for i, t in enumerate(tokens):  # nothing after an end-of-generation token
                if t in s.eog:
                    tokens = tokens[:i + 1]
                    break
        return looked_up(self, tokens, s.cfg.draft_min)
        yield

    def accept(self, s: Seq, proposal: Proposal, n_accepted: int, start: int) -> None:
        if proposal.drafter is self:
            self.counters.add(len(proposal.tokens), n_accepted)
            self.book.record(self._index(s).last_match, len(proposal.tokens), n_accepted)
