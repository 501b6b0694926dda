"""Fake numpy "models" and exact-law helpers for testing ``easd_local.engine.rules``.

A fake model is a logit table over a small vocabulary: row ``context[-1] % rows`` gives
the next-token logits (one row = context-free). Because everything is a table, the
exact output law of SD/EASD can be written down and compared with empirical draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from easd_local.engine import rules as R
from easd_local.engine.config import DecodeConfig


@dataclass(frozen=True)
class TableModel:
    table: np.ndarray  # (rows, V) float32 logits

    @property
    def n_vocab(self) -> int:
        return int(self.table.shape[1])

    def logits(self, context) -> np.ndarray:
        """Next-token logits (V,) after ``context`` (a sequence of token ids)."""
        row = int(context[-1]) % self.table.shape[0] if len(context) else 0
        return self.table[row]

    def logits_block(self, context, tokens) -> np.ndarray:
        """(len(tokens)+1, V): logits after context, context+t0, ..., context+all tokens."""
        ctx = list(context)
        rows = [self.logits(ctx)]
        for t in tokens:
            ctx.append(int(t))
            rows.append(self.logits(ctx))
        return np.stack(rows)


def make_pair(V: int = 8, seed: int = 0, spread: float = 1.0, noise: float = 0.9, rows: int | None = None):
    """A (target, draft) pair of context-dependent tables (``rows`` = V by default).

    The draft is the target plus Gaussian noise, so they agree often but not always.
    """
    rng = np.random.default_rng(seed)
    rows = V if rows is None else rows
    t = rng.normal(0.0, spread, (rows, V))
    d = t + rng.normal(0.0, noise, (rows, V))
    return TableModel(t.astype(np.float32)), TableModel(d.astype(np.float32))


def q_table(draft: TableModel, cfg: DecodeConfig) -> np.ndarray | None:
    """The draft's sampling distribution for every table row (None when greedy)."""
    if cfg.greedy:
        return None
    return R.sampling_probs(draft.table, cfg.temperature, cfg.top_k, cfg.top_p)


def draft_block(draft: TableModel, context, g: int, cfg: DecodeConfig, rng: np.random.Generator, q=None):
    """Draft g tokens autoregressively: argmax (greedy) or a sample of q = sampling_probs.

    Returns ``(tokens (g,), z_draft (g, V))``. Sampling draws one ``rng.random()`` per
    token, before the verification draws. ``q`` = ``q_table(draft, cfg)`` may be passed
    to save recomputing the distributions (it is the same function of the same rows).
    """
    ctx = list(context)
    toks, rows = [], []
    n_rows = draft.table.shape[0]
    for _ in range(g):
        z = draft.logits(ctx)
        if cfg.greedy:
            t = R.greedy(z)
        elif q is not None:
            t = R.sample(q[int(ctx[-1]) % n_rows if ctx else 0], rng)
        else:
            t = R.sample(R.sampling_probs(z, cfg.temperature, cfg.top_k, cfg.top_p), rng)
        toks.append(t)
        rows.append(z)
        ctx.append(t)
    V = draft.n_vocab
    return np.array(toks, dtype=np.intp), (np.stack(rows) if rows else np.zeros((0, V), np.float32))


def sd_generate(target, draft, context, n_tokens: int, cfg: DecodeConfig, rng, gate_on: bool):
    """A minimal SD/EASD decoding loop over fake models; returns (tokens, blocks)."""
    ctx = list(context)
    out: list[int] = []
    blocks = []
    q = q_table(draft, cfg)
    while len(out) < n_tokens:
        toks, zd = draft_block(draft, ctx, cfg.gamma, cfg, rng, q)
        zt = target.logits_block(ctx, toks)
        res = R.verify_block(toks, zd, zt, cfg, rng, gate_on)
        blocks.append(res)
        out.extend(res.tokens)
        ctx.extend(res.tokens)
    return out[:n_tokens], blocks


# ----------------------------------------------------------------------- exact laws


def probs64(z, cfg: DecodeConfig) -> np.ndarray:
    """The sampling distribution in float64 (via the float64 path of sampling_probs)."""
    return R.sampling_probs(np.asarray(z, dtype=np.float64), cfg.temperature, cfg.top_k, cfg.top_p)


def easd_first_law(p: np.ndarray, q: np.ndarray, lam: float) -> np.ndarray:
    """Exact law of the token emitted when the gate is open (always fires) at a position:

    ``P(x) = sum_d q(d) min(1, p(d)/q(d)) pen_d(x) + (1 - sum_d min(p(d), q(d))) res(x)``
    with ``pen_d(x) = p(x) (lam if x == d else 1) / (1 - (1 - lam) p(d))`` and
    ``res = norm(max(0, p - q))``. Written out independently of the rules module.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    V = p.size
    law = np.zeros(V)
    for d in range(V):
        if q[d] == 0:
            continue
        acc = min(1.0, p[d] / q[d])
        pen = p.copy()
        pen[d] *= lam
        pen /= pen.sum()
        law += q[d] * acc * pen
    reject = 1.0 - np.minimum(p, q).sum()
    pos = np.maximum(p - q, 0.0)
    if reject > 1e-12:
        law += reject * pos / pos.sum()
    return law


# ------------------------------------------------------------------------ statistics


def chi2_stat(counts, probs) -> tuple[float, int]:
    """Pearson chi-square of ``counts`` against ``probs``; (stat, degrees of freedom).

    Cells with probability 0 must have count 0 (otherwise the stat is inf).
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    n = counts.sum()
    support = probs > 0
    if np.any(counts[~support] > 0):
        return math.inf, int(support.sum()) - 1
    exp = n * probs[support]
    stat = float(((counts[support] - exp) ** 2 / exp).sum())
    return stat, int(support.sum()) - 1


def chi2_threshold(df: int, z: float = 3.719) -> float:
    """Upper chi-square quantile (Wilson-Hilferty); z = 3.719 is the 1e-4 tail."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3
