"""Prompts kept in host memory after their slot moves on (llama-server's ``--cache-ram``).

A slot's KV cells serve the next request only if it continues what they hold. With more
conversations than slots, as behind any web front-end, each slot is soon taken by another
conversation, which discards the cells, and the first conversation's next turn evaluates its
whole history again. So, as llama-server does, before a request throws away most of a slot's
cells (it keeps less than half), they are saved here, on every model the slot holds (the
draft and the target: their token lists may differ, easd-tf's draft lags), and a request whose
prompt shares a longer prefix with a saved entry than with its slot's cells gets that entry
loaded into its slot first. The entries are bounded in bytes; the least recently saved or used
go first. An entry is only given to a request of the scope that wrote it (one per API key).
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from ..errors import RuntimeFailure
from .prompt_cache import common_prefix_len

DEFAULT_CACHE_RAM_MIB = 2048


@dataclass
class Entry:
    scope: str
    states: list[tuple[list[int], ctypes.Array] | None]  # per model of the scheduler (None: held nothing)
    size: int

    def tokens(self, k: int) -> list[int]:
        state = self.states[k]
        return state[0] if state else []


class PromptStore:
    """Saved slot states, at most ``budget`` bytes. Counters for /metrics: ``saved``,
    ``restored`` (entries) and ``restored_tokens``."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._next = 0
        self.bytes = 0
        self.saved = self.restored = self.restored_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def swap(self, models: Sequence, main: int, slot: int, prefix: Sequence[int], *, slot_scope: str,
             scope: str, reuse: bool) -> bool:
        """Before a request with ``prefix`` (its prompt but the last token) uses ``slot``: save
        the slot's cells when the request would discard most of them, then load the saved
        entry of ``scope`` that shares the longest prefix with it, when that is longer than
        what the slot keeps. True when an entry was loaded (the slot then holds ``scope``'s
        cells)."""
        m = models[main]
        cached = m.seq_len(slot) if m is not None else 0
        keep = m.common_prefix(prefix, seq=slot) if (m is not None and reuse and slot_scope == scope) else 0
        if cached and 2 * keep < cached:
            self._save(models, slot, slot_scope)
        if not reuse:
            return False
        best, best_n = None, keep
        for key, e in self._entries.items():
            if e.scope == scope:
                n = common_prefix_len(e.tokens(main), prefix)
                if n > best_n:
                    best, best_n = key, n
        if best is None:
            return False
        e = self._entries.pop(best)  # its cells move into the slot; saved again when discarded
        self.bytes -= e.size
        for k, model in enumerate(models):
            if model is None:
                continue
            state = e.states[k]
            if state is None:  # the model held nothing then: it holds nothing now
                model.reset_seq(slot)
            elif not model.load_seq(slot, *state):
                for other in models:  # all or nothing: a slot never holds half a pair
                    if other is not None:
                        other.reset_seq(slot)
                return False
        self.restored += 1
        self.restored_tokens += best_n
        return True

    def _save(self, models: Sequence, slot: int, scope: str) -> None:
        try:
            states = [model.save_seq(slot) if model is not None and model.seq_len(slot) else None
                      for model in models]
        except RuntimeFailure:  # llama.cpp could not serialize the cells: they are simply not kept
            return
        size = sum(len(st[1]) for st in states if st is not None)
        if not size or size > self.budget:
            return
        new = Entry(scope, states, size)
        for key, e in list(self._entries.items()):  # an entry this one extends, on every model, says nothing more
            if e.scope == scope and all(common_prefix_len(e.tokens(k), new.tokens(k)) == len(e.tokens(k))
                                        for k in range(len(states))):
                self._drop(key)
        while self._entries and self.bytes + size > self.budget:
            self._drop(next(iter(self._entries)))
        self._entries[self._next] = new
        self._next += 1
        self.bytes += size
        self.saved += 1

    def _drop(self, key: int) -> None:
        self.bytes -= self._entries.pop(key).size
