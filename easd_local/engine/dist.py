"""A sampling distribution over a wide vocabulary kept as its support only: plain sampling
(no top-k, no top-p) gives probability 0 to every token more than ``gate.TAIL_NATS`` below
the best (``tempered``, which ``rules._tempered_softmax`` also uses), at T = 0.7 a large share
of a real row at a confident position; where the tokens near the best are half the row or
more (an uncertain position), the row stays dense, every token its probability. Held sparse,
the SD test's p(d) and q(d), a sample, the residual max(0, p − q) and EASD's penalised p cost
the support's size, not 152k-wide temporaries. Pure numpy.

The same distribution as the dense row, entry for entry; a sample follows the same
inverse-CDF rule over the tokens in id order (zero-probability tokens take no part in it),
so a draw picks the dense sample's token up to the rounding of the sums.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .finite import checked
from .gate import TAIL_NATS

# ``inverse_cdf`` finds its token block by block: the float64 sums of blocks of this many
# probabilities, then the cumulative sum inside the one block the draw falls in (a float64
# cumulative sum of 152k entries takes milliseconds); up to one block, the whole row's
SAMPLE_BLOCK = 2048
# ``Sparse.at_many`` of more tokens than this scatters the distribution into a dense row first
_DENSE_LOOKUP = 4096


def inverse_cdf(p: np.ndarray, rng: np.random.Generator) -> int:
    """The index of one inverse-CDF draw from the probabilities ``p`` (one ``rng.random()``):
    the cumulative sum is taken in float64 and scaled by its total, so ``p`` need not sum to
    exactly 1. ``searchsorted(..., side="right")`` never lands on a zero-probability entry; a
    draw that rounds past the end is clipped to the last entry with probability.

    Above ``SAMPLE_BLOCK`` entries the cumulative sum is not written out whole: the float64
    sums of the blocks locate the block the draw falls in, and the cumulative sum is taken
    inside that block only, from the mass before it. The same index up to the rounding of
    the sums (1e-16 relative)."""
    V = p.shape[-1]
    if V <= SAMPLE_BLOCK:
        cs = np.cumsum(p, dtype=np.float64)
        total = cs[-1] if cs.size else 0.0
        if not (total > 0) or not math.isfinite(total):
            raise ValueError(f"cannot sample from a distribution with total mass {total}")
        i = int(np.searchsorted(cs, rng.random() * total, side="right"))
        if i >= cs.size:
            i = int(np.flatnonzero(p > 0)[-1])
        return i
    B = SAMPLE_BLOCK
    full = V // B
    sums = p[: full * B].reshape(full, B).sum(axis=-1, dtype=np.float64)
    if full * B < V:
        sums = np.append(sums, p[full * B:].sum(dtype=np.float64))
    before = np.cumsum(sums)
    total = before[-1]
    if not (total > 0) or not math.isfinite(total):
        raise ValueError(f"cannot sample from a distribution with total mass {total}")
    x = rng.random() * total
    b = int(np.searchsorted(before, x, side="right"))  # the block whose mass holds x (never an empty one)
    if b >= before.size:
        return int(np.flatnonzero(p > 0)[-1])
    block = p[b * B:(b + 1) * B]
    cs = np.cumsum(block, dtype=np.float64)
    cs += before[b - 1] if b else 0.0
    i = int(np.searchsorted(cs, x, side="right"))
    if i >= cs.size:  # x rounds past the block's own sum: its last entry with mass
        i = int(np.flatnonzero(block > 0)[-1])
    return b * B + i


class Sparse(NamedTuple):
    """Probabilities ``probs`` of tokens ``ids`` (sorted, distinct) in a vocabulary of ``V``;
    every other token has probability 0."""

    ids: np.ndarray
    probs: np.ndarray
    V: int

    def at(self, token: int) -> float:
        i = int(np.searchsorted(self.ids, token))
        return float(self.probs[i]) if i < self.ids.size and self.ids[i] == token else 0.0

    def at_many(self, tokens: np.ndarray) -> np.ndarray:
        """Probabilities of sorted ``tokens`` (0 outside the support), in ``probs``' dtype. Many
        tokens are looked up through the dense row (a binary search each would cost more: tens
        of thousands of tokens on an uncertain row at T = 0.7)."""
        if tokens.size > _DENSE_LOOKUP:
            return self.dense()[tokens]
        i = np.searchsorted(self.ids, tokens)
        np.minimum(i, self.ids.size - 1, out=i)
        return np.where(self.ids[i] == tokens, self.probs[i], self.probs.dtype.type(0))

    def dense(self) -> np.ndarray:
        out = np.zeros(self.V, dtype=self.probs.dtype)
        out[self.ids] = self.probs
        return out

    def sample(self, rng: np.random.Generator) -> int:
        """One inverse-CDF draw (one ``rng.random()``) over the support in id order: the
        dense row's token up to the rounding of the sums."""
        return int(self.ids[inverse_cdf(self.probs, rng)])

    def scaled(self, r: np.ndarray) -> "Sparse | None":
        """``r`` (over ``ids``) normalised, or None when it has no mass."""
        s = float(r.sum(dtype=np.float64))
        if not s > 0:
            return None
        r *= r.dtype.type(1.0 / s)
        return Sparse(self.ids, r, self.V)


def tempered(z: np.ndarray, temperature: float, max_share: float = 0.5) -> Sparse | None:
    """softmax(z / temperature) of one wide row over the tokens within ``TAIL_NATS`` (tempered)
    of the best; None when they are ``max_share`` of the row or more: the dense row is then
    cheaper to build and to use (``python scripts/bench_rules.py`` times both by share).
    ``finite.NonFiniteRow`` for a row with a NaN or a +inf, or no finite logit."""
    t = z.dtype.type(temperature)
    top = checked(z.max())
    near = z >= top - TAIL_NATS * temperature
    if int(np.count_nonzero(near)) >= max_share * z.size:
        return None
    keep = np.flatnonzero(near)
    e = z[keep] / t if temperature != 1.0 else z[keep]
    e -= top / t
    np.exp(e, out=e)
    e *= (1.0 / e.sum(dtype=np.float64)).astype(e.dtype)
    return Sparse(keep, e, z.size)


def residual(p: Sparse, q: Sparse) -> Sparse:
    """norm(max(0, p − q)) (zero wherever p is); p itself when that has no mass (float
    rounding only, as ``rules.residual``)."""
    r = p.probs - q.at_many(p.ids)
    np.maximum(r, 0, out=r)
    return p.scaled(r) or p


def without(p: Sparse, token: int) -> Sparse:
    """p with ``token`` removed, renormalised (``rules.residual_point``); p itself when
    nothing else has mass."""
    r = p.probs.copy()
    i = int(np.searchsorted(p.ids, token))
    if i < p.ids.size and p.ids[i] == token:
        r[i] = 0
    return p.scaled(r) or p


def penalized(p: Sparse, token: int, lam: float) -> Sparse | None:
    """p with p(token) *= lam, renormalised (``rules.penalize``); None when nothing is left."""
    r = p.probs.copy()
    i = int(np.searchsorted(p.ids, token))
    if i < p.ids.size and p.ids[i] == token:
        r[i] *= lam
    return p.scaled(r)
