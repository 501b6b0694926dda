"""The model drafter (``--spec-type draft``): a small model of the target's vocabulary drafts,
in its own KV cells (one llama.cpp sequence per slot), which hold a prefix of the sequence
between steps.

It owns its cache's catch-up (evaluating what it lacks of the sequence before it drafts),
its prefix reuse (after a verify it keeps what it evaluated that is still on the path) and
its early stop (``draft_p_min``, an end-of-generation token).
"""

from __future__ import annotations

from typing import Generator

import numpy as np

from ..events import DRAFT, Stats
from ..finite import checked
from ...llamacpp.runtime import Model, Part
from ..sequence import Seq
from .base import Ask, Counters, DraftGen, Proposal


def top_probability(z: np.ndarray) -> float:
    """The largest probability of the (untempered) softmax of one row of logits (the row
    checked on the way: ``finite``)."""
    m = float(checked(z.max()))
    return 1.0 / float(np.exp(z - m, dtype=np.float32).sum())


class ModelDrafter:
    kind = "draft"

    def __init__(self, model: Model) -> None:
        self.model = model
        self.counters = Counters()

    def begin(self, s: Seq) -> Generator[Ask, np.ndarray, None]:
        """Bring the cells to ``prompt[:-1]``, reusing their longest common prefix; as prompt
        work (``seconds_prompt``, time to first token), not generation. easd-tf with its gate
        off never consults the draft: its cells only have to hold a prefix of the sequence."""
        prompt = s.req.prompt
        m, slot = self.model, s.slot
        keep = m.common_prefix(prompt[:-1], seq=slot)
        m.rollback(keep, slot)
        if s.cfg.mode_info.target_first and not s.gate_on:
            return
        if len(prompt) - 1 > keep:
            yield m, Part(slot, list(prompt[keep:-1]), ())

    def draft(self, s: Seq, n_max: int) -> DraftGen:
        """One drafting round (one ``yield``) per token: the first catches the cache up with
        what it lacks of ``s.seq``. Stops at ``n_max`` and ``--draft-max`` tokens, after an
        end-of-generation token, or, as llama.cpp's ``--draft-p-min``, at a round whose top
        probability is below ``draft_p_min`` (that round's token is not proposed)."""
        self.counters.calls += 1
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        dists: list = []  # the q each token was sampled from (sampling): the verify's q
        # the verify reads the draft's rows only for the gate: greedy sd's proposal is its
        # tokens (each a point mass: the same greedy rule), sampled sd's its tokens and their
        # q, and no row is copied
        keep_rows = s.gate.can_fire
        pending = s.seq[self.model.seq_len(s.slot):]
        n_max = min(n_max, s.cfg.gamma)
        while len(tokens) < n_max:
            z = (yield self.model, Part(s.slot, pending))[0]
            _count(s.stats, pending)
            p_min = s.cfg.draft_p_min
            if p_min > 0.0 and top_probability(z) < p_min:
                break
            d, q = s.draw(z)
            tokens.append(d)
            if keep_rows:
                rows.append(z.copy())  # a lent row: the next round's decode overwrites it
            if q is not None:
                dists.append(q)  # its own arrays, not the lent row's
            if d in s.eog:
                break
            pending = [d]
        if len(tokens) < s.cfg.draft_min:
            tokens, rows, dists = [], [], []
        return Proposal(tokens, rows if keep_rows else None, DRAFT, self,
                        dists if not s.cfg.greedy else None)

    def consult(self, s: Seq) -> Generator[Ask, np.ndarray, np.ndarray]:
        """One round: catch up with ``s.seq`` and return the logits after its last token."""
        pending = s.seq[self.model.seq_len(s.slot):]
        z = (yield self.model, Part(s.slot, pending))[0]
        _count(s.stats, pending)
        return z

    def accept(self, s: Seq, proposal: Proposal, n_accepted: int, start: int) -> None:
        """Keep what the cells evaluated that is still on ``s.seq``'s path, short of its last
        token: the next round evaluates that one for its logits (EASD's re-pick with a
        penalty > 0 may re-emit the gated draft token, which the cells already hold)."""
        if proposal.drafter is self:
            self.counters.add(len(proposal.tokens), n_accepted)
        start = min(start, self.model.seq_len(s.slot))
        keep = self.model.common_prefix(s.seq, start=start, seq=s.slot)
        self.model.rollback(min(keep, len(s.seq) - 1), s.slot)


def _count(st: Stats, pending: list[int]) -> None:
    st.draft_calls += 1
    if len(pending) > 1:
        st.catchup_calls += 1
        st.catchup_tokens += len(pending)
