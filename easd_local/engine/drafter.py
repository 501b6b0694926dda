"""The drafter: what proposes the tokens the target verifies (sd, easd) and gives the draft's
view of a position (easd-tf), behind a narrow interface, as llama.cpp's ``common_speculative``.

It owns its cache's catch-up (evaluating what it lacks of the sequence before it drafts),
its prefix reuse (after a verify it keeps what it evaluated that is still on the path) and
its early stop (``draft_p_min``, an end-of-generation token). Its methods are generators
like the steps that call them (``yield from``): each ``yield`` asks for one row of logits
from one batch and is sent it back, so the scheduler batches the drafting of every sequence.
Another drafter (an n-gram lookup, a draft with another tokenizer) implements the same
three methods; a drafter that needs no model simply yields nothing.
"""

from __future__ import annotations

from typing import Generator, Protocol

import numpy as np

from .events import Stats
from .runtime import Model, Part
from .sequence import Seq

# What a step or a drafter asks the scheduler for: one part of one model's next batch. The
# reply sent back is that part's logits rows (the shared vocabulary's columns).
Ask = tuple[Model, Part]


class Drafter(Protocol):
    def draft(self, s: Seq, n_max: int) -> Generator[Ask, np.ndarray, tuple[list[int], list[np.ndarray]]]:
        """Up to ``n_max`` tokens to follow ``s.seq`` and the logits row each was picked from."""

    def consult(self, s: Seq) -> Generator[Ask, np.ndarray, np.ndarray]:
        """The draft's logits row after ``s.seq``."""

    def rewind(self, s: Seq, start: int) -> None:
        """Forget what is no longer on ``s.seq``'s path (the first ``start`` tokens are)."""


def top_probability(z: np.ndarray) -> float:
    """The largest probability of the (untempered) softmax of one row of logits."""
    m = float(z.max())
    return 1.0 / float(np.exp(z - m, dtype=np.float32).sum())


class ModelDrafter:
    """Drafts with a small model of the target's vocabulary, in its own KV cells (one
    llama.cpp sequence per slot), which hold a prefix of the sequence between steps."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def draft(self, s: Seq, n_max: int) -> Generator[Ask, np.ndarray, tuple[list[int], list[np.ndarray]]]:
        """One drafting round (one ``yield``) per token: the first catches the cache up with
        what it lacks of ``s.seq``. Stops at ``n_max`` tokens, after an end-of-generation
        token, or, as llama.cpp's ``--draft-p-min``, at a round whose top probability is
        below ``draft_p_min`` (that round's token is not proposed)."""
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        pending = s.seq[self.model.seq_len(s.slot):]
        while len(tokens) < n_max:
            z = (yield self.model, Part(s.slot, pending))[0]
            _count(s.stats, pending)
            p_min = s.cfg.draft_p_min
            if p_min > 0.0 and top_probability(z) < p_min:
                break
            d = s.sample(z)
            tokens.append(d)
            rows.append(z.copy())  # a lent row: the next round's decode overwrites it
            if d in s.eog:
                break
            pending = [d]
        return tokens, rows

    def consult(self, s: Seq) -> Generator[Ask, np.ndarray, np.ndarray]:
        """One round: catch up with ``s.seq`` and return the logits after its last token."""
        pending = s.seq[self.model.seq_len(s.slot):]
        z = (yield self.model, Part(s.slot, pending))[0]
        _count(s.stats, pending)
        return z

    def rewind(self, s: Seq, start: int) -> None:
        """Keep what the cells evaluated that is still on ``s.seq``'s path, short of its last
        token: the next round evaluates that one for its logits (EASD's re-pick with a
        penalty > 0 may re-emit the gated draft token, which the cells already hold)."""
        keep = self.model.common_prefix(s.seq, start=start, seq=s.slot)
        self.model.rollback(min(keep, len(s.seq) - 1), s.slot)


def _count(st: Stats, pending: list[int]) -> None:
    st.draft_calls += 1
    if len(pending) > 1:
        st.catchup_calls += 1
        st.catchup_tokens += len(pending)
