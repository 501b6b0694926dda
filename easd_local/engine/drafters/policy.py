"""How many looked-up tokens to propose: as many as pay, by this machine's verify costs and
the acceptance the drafter has seen. Pure maths and counts; no llama.cpp.

A verify of k drafted tokens costs ``cost[k]`` one-token decodes (``cost[0] == 1``: no draft
is an ordinary decode). With a conditional acceptance ``a`` (each proposed token is accepted,
given that the ones before it were, with probability a), proposing k tokens emits
1 + a + ... + a^k tokens on average; the length proposed is the k that maximises tokens per
cost, so a drafter whose proposals are seldom accepted stops proposing (k = 0: the step is
the target's own decode) and one that copies a text proposes long blocks.

Acceptance is counted per bucket of match length (a lookup that matched the last 8 tokens of
the text is more often right than one that matched 2), from a prior worth two proposals that
expects a match of L tokens to go on with probability 1 − 1/(L + 1) (2: 0.67, 4: 0.8, 8:
0.89), so that a text being copied is proposed in long blocks from its first match. A bucket whose best length is 0 still proposes one token on every
``EXPLORE``-th match, so that it can learn that the text has started to repeat.

A lookup also says what its second witness says (``WITNESSES``): the n-gram it matched occurred
once before (``ONCE``), or twice and the earlier time it was followed by the same token
(``AGREE``) or another (``DISAGREE``). Each is counted apart: a continuation two places agree
on is taken up more often (replayed along the default target's own texts with this machine's
costs, ``python scripts/lookup_replay.py``: the policy's median on 20 code edits 1.279x ->
1.313x, on 10 GSM8K answers 1.005x -> 1.025x).

The book's rates are averages over every sequence; one text can copy less than the average
says. Each sequence keeps a ``Ledger`` of its own drafting steps: once they have cost
``LEDGER_WARM`` decodes and emitted more than ``LEDGER_SLACK`` decodes' worth of tokens fewer
than they cost (they made the sequence that much slower than the target alone), it holds its
proposals back, all but one in ``EXPLORE``, until the ledger recovers: a stop-loss per request
that bounds what a text that does not repeat can lose, in decodes, and does not judge a text
on its first proposal or two.

Its first form (session 23) held back after the warm-up as soon as the steps were behind at all
(replayed with the AMD EPYC's costs, ``python scripts/lookup_replay.py``: the smallest speed-up
over 100 held-out GSM8K answers 0.938x -> 0.975x, medians within 1 %). On the Xeon's flatter
verify costs (session 30) that held back texts that were a decode or two behind early and
repeated later; with a slack of 2 decodes, replayed with the Xeon's recorded costs (``python
scripts/lookup_replay.py``, which replays both; a grid of slack 1-6 with and without the
warm-up chose these: ``results/lookup-ledger-grid-s30.txt``): GSM8K mean 1.073x -> 1.087x (20
bench answers), 1.079x -> 1.090x (100 held out), 20 code edits 1.758x -> 1.763x; with the AMD
EPYC's costs within 1 %, the smallest figure >= 0.954x on every set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

# A verify of k drafted tokens, in one-token decodes, when this machine's costs were not
# measured: 1 + 0.29 k, the slope measured on a 2-core Xeon for the default pair (5 tokens:
# 2.15 decodes; 9 tokens: 3.0); `easd-local pair costs` measures this machine's.
DEFAULT_SLOPE = 0.29
EXPLORE = 8
BUCKETS = (2, 3, 4, 6, 8, 12, 16)  # a match of at least this many tokens falls in this bucket
PRIOR = 2.0  # the prior's weight, in tokens
LEDGER_SLACK = 2.0  # decodes a sequence's drafting steps may lose against the target alone before it holds back
LEDGER_WARM = 8.0  # ... once they have cost this many decodes: a text is not judged on its first proposal or two
# what the occurrence before the matched one says of the continuation (``lookup.match``)
ONCE, AGREE, DISAGREE = 0, 1, 2
WITNESSES = (ONCE, AGREE, DISAGREE)


def linear_costs(k_max: int, slope: float = DEFAULT_SLOPE) -> tuple[float, ...]:
    return tuple(1.0 + slope * k for k in range(k_max + 1))


def extend_costs(costs: Sequence[float], k_max: int) -> tuple[float, ...]:
    """``costs`` (k = 0.. as measured) continued linearly up to ``k_max`` drafted tokens with
    their mean slope, the cost of a drafted token over the measured range. Not the last step's:
    a verify's cost is not a straight line in its tokens (blocks of rows in llama.cpp's CPU
    kernels), and a last step that timed cheaper than the one before (a record of 2026-12-06
    ended 7.31, 7.27) would price every longer proposal at next to nothing."""
    c = [float(x) for x in costs]
    if not c or c[0] <= 0:
        raise ValueError("costs[0] must be the (positive) cost of one decode")
    c = [x / c[0] for x in c]
    slope = (c[-1] - c[0]) / (len(c) - 1) if len(c) > 1 else DEFAULT_SLOPE
    slope = max(slope, 1e-3)
    while len(c) < k_max + 1:
        c.append(c[-1] + slope)
    return tuple(c[:k_max + 1])


def best_length(a: float, costs: Sequence[float], k_max: int) -> int:
    """The k in 0..k_max that maximises (1 + a + ... + a^k) / costs[k]."""
    best_k, best, tokens, ak = 0, 1.0 / costs[0], 1.0, 1.0
    for k in range(1, min(k_max, len(costs) - 1) + 1):
        ak *= a
        tokens += ak
        rate = tokens / costs[k]
        if rate > best:
            best_k, best = k, rate
    return best_k


def bucket(match_len: int, witness: int = ONCE) -> int:
    """The book's cell of a lookup: its match length's bucket, apart for each witness."""
    b = 0
    for i, lo in enumerate(BUCKETS):
        if match_len >= lo:
            b = i
    return witness * len(BUCKETS) + b


@dataclass
class Ledger:
    """One sequence's drafting steps: the tokens they emitted (accepted + the target's own) and
    what their verifies cost, in one-token decodes (``costs[k]``); ``allows`` a proposal while
    they have cost under ``LEDGER_WARM`` or are at most ``LEDGER_SLACK`` decodes behind the
    target alone, else one in ``EXPLORE`` (the text may start to repeat)."""

    tokens: float = 0.0
    cost: float = 0.0
    held: int = 0
    # the stop-loss's settings; slack 0: its first form, held back after the warm-up once the
    # steps were behind at all (``scripts/lookup_replay.py`` replays both)
    slack: float = LEDGER_SLACK
    warm: float = LEDGER_WARM

    def allows(self) -> bool:
        if self.cost < self.warm or self.cost - self.tokens <= self.slack:
            return True
        self.held += 1
        return self.held % EXPLORE == 0

    def record(self, proposed: int, accepted: int, costs: Sequence[float]) -> None:
        if proposed > 0:
            self.tokens += accepted + 1
            self.cost += costs[min(proposed, len(costs) - 1)]


@dataclass
class AcceptanceBook:
    """Accepted and rejected looked-up tokens per match-length bucket and witness (``bucket``),
    and the lengths they make worth proposing. Shared by every sequence of one drafter: a
    served conversation's next request starts with what the last one learnt."""

    costs: tuple[float, ...]
    accepted: list[float] = field(
        default_factory=lambda: [PRIOR * (1 - 1 / (lo + 1)) for _ in WITNESSES for lo in BUCKETS])
    rejected: list[float] = field(default_factory=lambda: [PRIOR / (lo + 1) for _ in WITNESSES for lo in BUCKETS])
    skipped: list[int] = field(default_factory=lambda: [0] * (len(WITNESSES) * len(BUCKETS)))

    def rate(self, b: int) -> float:
        return self.accepted[b] / (self.accepted[b] + self.rejected[b])

    def length(self, match_len: int, available: int, witness: int = ONCE, ledger: Ledger | None = None) -> int:
        """How many of ``available`` looked-up tokens to propose after a match of ``match_len``
        with this ``witness``; none while the sequence's ``ledger`` (if any) holds back."""
        if available <= 0:
            return 0
        b = bucket(match_len, witness)
        k = best_length(self.rate(b), self.costs, available)
        if k == 0:
            self.skipped[b] += 1
            if self.skipped[b] % EXPLORE == 0:
                k = 1
        if k and ledger is not None and not ledger.allows():
            k = 0
        return k

    def record(self, match_len: int, proposed: int, accepted: int, witness: int = ONCE,
               ledger: Ledger | None = None) -> None:
        """A proposal of ``proposed`` tokens of which the first ``accepted`` were accepted (the
        next one, if any, was rejected; tokens after it were never tested); counted in the
        sequence's ``ledger`` too, if any."""
        if proposed <= 0:
            return
        b = bucket(match_len, witness)
        self.accepted[b] += accepted
        self.rejected[b] += accepted < proposed
        if ledger is not None:
            ledger.record(proposed, accepted, self.costs)


class Ledgers:
    """A drafter's ``Ledger`` per slot, a fresh one for each new sequence there (request ids
    restart with every scheduler: the sequence object tells them apart)."""

    def __init__(self) -> None:
        self._by_slot: dict[int, tuple[object, Ledger]] = {}

    def of(self, slot: int, owner: object) -> Ledger:
        got = self._by_slot.get(slot)
        if got is None or got[0] is not owner:
            got = self._by_slot[slot] = (owner, Ledger())
        return got[1]
