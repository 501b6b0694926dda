"""Prompt lookup (``--spec-type ngram-simple``, llama.cpp's idea): find the last earlier place
where the text so far (prompt and generated tokens) ended as it ends now, and propose the
tokens that followed there. It costs no decode: a step with no match is the target's own
one-token decode.

Per slot it keeps an index from each ``spec_ngram_size_n``-token n-gram (and each longer
one of ``LONGER``) to where it last ended, grown as the sequence grows (a sequence only ever
appends), so a lookup is a few dict reads, longest n-gram first, and a short backward
comparison that measures how long the match is. How many of the
tokens that followed are proposed is the ``AcceptanceBook``'s choice: what pays on this
machine's verify costs at the acceptance seen after matches that long and that witnessed
(the index keeps each n-gram's occurrence before its last one too: whether it was followed
by the same token is ``policy``'s witness).
"""

from __future__ import annotations

from typing import Generator

import numpy as np

from ..sequence import Seq
from .base import Ask, Counters, DraftGen, Proposal, looked_up
from .policy import AGREE, DISAGREE, ONCE, AcceptanceBook, Ledger, Ledgers

MAX_MATCH = 32  # a match is measured back this far at most (confidence saturates well before)
# n-gram lengths indexed above ``spec_ngram_size_n``: the lookup tries the longest first, so
# that of two earlier places the one that matches more of the text is followed
LONGER = (3, 4, 6, 8, 12, 16)


class _SlotIndex:
    __slots__ = ("owner", "n", "levels", "ends", "before", "indexed", "last_match", "last_witness")

    def __init__(self, owner: object, n: int) -> None:
        # the sequence it indexes: request ids restart with every scheduler, a slot's next
        # sequence is another object
        self.owner, self.n = owner, n
        self.levels = (n,) + tuple(lv for lv in LONGER if lv > n)
        # per level: hash of an n-gram -> position just after its last occurrence (a hash, not
        # the tuple, keeps a long context's index small; a collision is caught by ``match``,
        # which compares the tokens)
        self.ends: dict[int, dict[int, int]] = {lv: {} for lv in self.levels}
        self.before: dict[int, dict[int, int]] = {lv: {} for lv in self.levels}  # the end before that
        self.indexed = 0  # n-grams ending before this position are in ``ends``
        self.last_match = 0
        self.last_witness = ONCE

    def grow(self, seq: list[int], upto: int) -> None:
        """Index every n-gram that ends before ``upto`` and is followed by a token."""
        for lv in self.levels:
            ends, before = self.ends[lv], self.before[lv]
            for e in range(max(lv, self.indexed), upto):
                h = hash(tuple(seq[e - lv:e]))
                last = ends.get(h)
                if last is not None:
                    before[h] = last
                ends[h] = e
        self.indexed = max(self.indexed, upto)


def _length(seq: list[int], e: int, most: int) -> int:
    """How many tokens before position ``e`` equal the sequence's last ones (at most ``most``)."""
    L, length = len(seq), 0
    while length < most and e - length - 1 >= 0 and seq[e - length - 1] == seq[L - length - 1]:
        length += 1
    return length


def match(seq: list[int], idx: _SlotIndex) -> tuple[int, int]:
    """(where the continuation starts, match length) of the last earlier occurrence of the
    longest indexed n-gram the sequence ends with; (-1, 0) when not even its last
    ``spec_ngram_size_n`` tokens occurred before."""
    e, length, _ = witnessed_match(seq, idx)
    return e, length


def witnessed_match(seq: list[int], idx: _SlotIndex) -> tuple[int, int, int]:
    """``match`` and its witness (``policy.WITNESSES``): whether the matched n-gram's occurrence
    before that one was followed by the same token (ONCE when there was none)."""
    L = len(seq)
    if L <= idx.n:
        return -1, 0, ONCE
    idx.grow(seq, L)  # every n-gram whose next token is known: all but the current one
    for lv in reversed(idx.levels):
        if L <= lv:
            continue
        h = hash(tuple(seq[L - lv:]))
        e = idx.ends[lv].get(h)
        if e is None:
            continue
        length = _length(seq, e, MAX_MATCH)
        if length >= lv:  # else a hash collision: try a shorter n-gram
            p = idx.before[lv].get(h)
            if p is None or seq[p - lv:p] != seq[L - lv:]:  # none, or a collision
                return e, length, ONCE
            return e, length, AGREE if seq[p] == seq[e] else DISAGREE
    return -1, 0, ONCE


class LookupDrafter:
    kind = "ngram-simple"
    model = None

    def __init__(self, book: AcceptanceBook, witnessed: bool = True, stop_loss: bool = True) -> None:
        self.book = book
        # for comparisons (scripts/lookup_witness_ab.py; pairscore.lookup.simulate has the same
        # switches): witnessed False, every match counted as ONCE, the policy before the
        # witness; stop_loss False, no ledger per sequence (``policy.Ledger``)
        self.witnessed = witnessed
        self.stop_loss = stop_loss
        self.counters = Counters()
        self._slots: dict[int, _SlotIndex] = {}
        self.ledgers = Ledgers()

    def _index(self, s: Seq) -> _SlotIndex:
        idx = self._slots.get(s.slot)
        if idx is None or idx.owner is not s or idx.n != s.cfg.spec_ngram_size_n:
            idx = self._slots[s.slot] = _SlotIndex(s, s.cfg.spec_ngram_size_n)
        return idx

    def _ledger(self, s: Seq) -> Ledger | None:
        return self.ledgers.of(s.slot, s) if self.stop_loss else None

    def begin(self, s: Seq) -> Generator[Ask, np.ndarray, None]:
        self._index(s).grow(s.seq, len(s.seq))
        return
        yield

    def draft(self, s: Seq, n_max: int) -> DraftGen:
        self.counters.calls += 1
        idx = self._index(s)
        seq = s.seq
        e, length, witness = witnessed_match(seq, idx)
        if not self.witnessed:
            witness = ONCE
        idx.last_match, idx.last_witness = length, witness
        tokens: list[int] = []
        if e >= 0:
            cap = min(n_max, s.cfg.spec_ngram_size_m, len(seq) - e)
            k = self.book.length(length, cap, witness, self._ledger(s))
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
            idx = self._index(s)
            self.book.record(idx.last_match, len(proposal.tokens), n_accepted, idx.last_witness, self._ledger(s))
