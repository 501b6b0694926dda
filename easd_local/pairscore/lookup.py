"""What prompt lookup (``--spec-type ngram-simple``) would do along a text, predicted without
generating: greedy SD with the lookup drafter, simulated exactly along the target's own
greedy text (a proposal is accepted while it equals the text), with the drafter's own match
and proposal-length rules (``drafters.lookup``, ``drafters.policy``), priced with this
machine's verify costs. Pure: no llama.cpp, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..engine.drafters import K_MAX  # noqa: F401  (the drafters' longest proposal; pair score reads it here)
from ..engine.drafters import lookup as L
from ..engine.drafters.policy import ONCE, AcceptanceBook, Ledger


@dataclass
class LookupSim:
    tokens: int = 0
    verifies: int = 0
    drafted: int = 0
    accepted: int = 0
    cost: float = 0.0  # in one-token target decodes
    proposals: dict[int, int] = field(default_factory=dict)  # drafted tokens -> verify calls

    @property
    def speedup(self) -> float:
        """The target alone's decodes for the same tokens ÷ lookup SD's (decode time only)."""
        return self.tokens / self.cost if self.cost > 0 else float("nan")

    @property
    def tokens_per_verify(self) -> float:
        return self.tokens / self.verifies if self.verifies else 0.0

    def add(self, other: "LookupSim") -> None:
        self.tokens += other.tokens
        self.verifies += other.verifies
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.cost += other.cost
        for k, n in other.proposals.items():
            self.proposals[k] = self.proposals.get(k, 0) + n


def simulate(prompt: Sequence[int], text: Sequence[int], book: AcceptanceBook, *, size_n: int = 2,
             size_m: int = 16, may_draft: Callable[[int], bool] | None = None,
             witnessed: bool = True, ledger: bool | Ledger = True) -> LookupSim:
    """Greedy lookup SD along ``text`` after ``prompt``; ``book`` carries what the drafter
    learnt (pass one book through a corpus, as one server's drafter would). ``may_draft(i)``:
    a rule tried on top of the drafter's (``scripts/lookup_confidence.py``), asked before
    proposing at text position ``i``; False: no proposal there. ``witnessed=False``: every
    match counted as ``ONCE`` (the policy before the drafter read its second witness;
    ``scripts/lookup_replay.py`` compares the two). ``ledger=False``: no stop-loss per text
    (``policy.Ledger``: the policy before it); a fresh ``Ledger``: the stop-loss with its
    settings."""
    out = LookupSim()
    seq = list(prompt)
    idx = L._SlotIndex(0, size_n)
    i, n = 0, len(text)
    costs = book.costs
    own = ledger if isinstance(ledger, Ledger) else Ledger() if ledger else None
    while i < n:
        e, length, witness = L.witnessed_match(seq, idx)
        if not witnessed:
            witness = ONCE
        k = 0
        if e >= 0 and (may_draft is None or may_draft(i)):
            k = book.length(length, min(size_m, len(seq) - e, n - i - 1, K_MAX), witness, own)
        proposal = seq[e:e + k] if k else []
        a = 0
        while a < len(proposal) and proposal[a] == text[i + a]:
            a += 1
        if k:
            book.record(length, k, a, witness, own)
        emitted = min(a + 1, n - i)
        out.tokens += emitted
        out.verifies += 1
        out.drafted += k
        out.accepted += a
        out.cost += costs[min(k, len(costs) - 1)]
        out.proposals[k] = out.proposals.get(k, 0) + 1
        seq.extend(text[i:i + emitted])
        i += emitted
    return out
