"""Which idle slot a request goes to, so that it reuses the most of a cached prompt (pure).

A slot's KV cells outlive its request: the next request on that slot keeps the longest
common prefix of its prompt and the cells (``Scheduler._prefill``) and evaluates only the
rest. With several slots the choice of slot decides what is reused, and what is lost.

The rule is llama-server's (``get_available_slot``): the idle slot whose cached tokens share
the longest prefix with the prompt, if that prefix is more than ``similarity`` of the prompt
(its ``--slot-prompt-similarity``, default 0.1; 0 turns the search off); otherwise the least
recently used idle slot (an empty one first). One addition: a slot is only chosen by prefix
when the request keeps at least half of its cached tokens, or finds its whole prompt there (a
retry or a regenerated reply: what it discards is the reply it replaces). Without this, an
unrelated request that shares only the chat template's system prompt with a long
conversation would take that conversation's slot and discard its cache although another slot
was idle. (What a request does discard goes to the host-memory store, ``prompt_store``, when
the server has one; a slot left alone costs nothing to get back.)

A slot's cells are only reused by a request of the same ``scope`` (one per API key, were
there several): a cached prefix must not leak between keys, even as a faster first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..llamacpp.runtime import common_prefix_len  # noqa: F401  (prompt_store reads it from here)

DEFAULT_SIMILARITY = 0.1  # llama-server's --slot-prompt-similarity default


@dataclass(frozen=True)
class SlotView:
    """What the choice needs to know of one idle slot."""

    slot: int
    cached: int  # tokens in its cells (the model whose tokens the request emits)
    common: int  # length of the common prefix of those tokens and the prompt
    last_used: int  # when it was last given a request (larger: later; -1: never)
    same_scope: bool = True  # its cells were written by a request of the same scope


def pick_slot(idle: list[SlotView], n_prompt: int, similarity: float = DEFAULT_SIMILARITY,
              reuse: bool = True) -> int:
    """The slot a request of ``n_prompt`` tokens goes to, among ``idle`` (not empty).
    ``reuse`` False (the request opts out of the cache): least recently used."""
    if not idle:
        raise ValueError("no idle slot")
    best, best_sim = None, similarity
    if reuse and similarity > 0 and n_prompt > 0:
        for v in idle:
            if v.cached == 0 or not v.same_scope:
                continue
            if 2 * v.common < v.cached and v.common < n_prompt - 1:
                continue
            sim = v.common / n_prompt
            if sim > best_sim:
                best, best_sim = v, sim
    if best is None:
        best = min(idle, key=lambda v: (v.last_used, v.slot))
    return best.slot
