"""An n-gram table that learns across requests and slots (``--spec-type ngram-mod``, after
llama.cpp's ngram-mod): every ``spec_ngram_mod_n_match``-token n-gram of every prompt and
every accepted text maps to the token that last followed it, in one table the drafter's
slots share, kept for the drafter's life (a chat's turns, a server's requests). A draft
follows the table from the text's last n-gram, token by token, as far as it knows a next
token; the ``AcceptanceBook`` decides how far of it to propose.
"""

from __future__ import annotations

from typing import Generator

import numpy as np

from ..sequence import Seq
from .base import Ask, Counters, DraftGen, Proposal, looked_up
from .policy import AcceptanceBook, Ledgers

MAX_ENTRIES = 1 << 20  # as llama.cpp resets its pool when it fills: start again past this


class NgramModDrafter:
    kind = "ngram-mod"
    model = None

    def __init__(self, book: AcceptanceBook) -> None:
        self.book = book
        self.counters = Counters()
        self.table: dict[tuple[int, ...], int] = {}
        # slot -> (the sequence, n, how many of its tokens are in the table): request ids restart
        # with every scheduler, a slot's next sequence is another object
        self._seen: dict[int, tuple[object, int, int]] = {}
        self.ledgers = Ledgers()

    def _learn(self, s: Seq, upto: int) -> int:
        n = s.cfg.spec_ngram_mod_n_match
        owner, n_was, done = self._seen.get(s.slot, (None, n, 0))
        if owner is not s or n_was != n:
            done = 0
        if len(self.table) > MAX_ENTRIES:
            self.table.clear()
        seq, table = s.seq, self.table
        for e in range(max(n, done), upto):
            table[tuple(seq[e - n:e])] = seq[e]
        self._seen[s.slot] = (s, n, max(done, upto))
        return n

    def begin(self, s: Seq) -> Generator[Ask, np.ndarray, None]:
        self._learn(s, len(s.seq) - 1)
        return
        yield

    def draft(self, s: Seq, n_max: int) -> DraftGen:
        self.counters.calls += 1
        n = self._learn(s, len(s.seq))
        cap = min(n_max, s.cfg.spec_ngram_size_m)
        chain = list(s.seq[-n:]) if len(s.seq) >= n else []
        found: list[int] = []
        while chain and len(found) < cap:
            t = self.table.get(tuple(chain[-n:]))
            if t is None:
                break
            found.append(t)
            chain.append(t)
            if t in s.eog:
                break
        # the table's chain has no match length: its bucket is the key's length
        k = self.book.length(n, len(found), ledger=self.ledgers.of(s.slot, s)) if found else 0
        return looked_up(self, found[:k], s.cfg.draft_min)
        yield

    def accept(self, s: Seq, proposal: Proposal, n_accepted: int, start: int) -> None:
        if proposal.drafter is self:
            self.counters.add(len(proposal.tokens), n_accepted)
            self.book.record(s.cfg.spec_ngram_mod_n_match, len(proposal.tokens), n_accepted,
                             ledger=self.ledgers.of(s.slot, s))
