"""The pure numpy maths of speculative decoding (SD) and Entropy-Aware SD (EASD).

No llama.cpp, no I/O: everything here maps logits (and a ``numpy.random.Generator``)
to numbers, so the real decoding loop and the fake-model tests run the same code. The gate
(its quantities, its predicate and ``Gate``) is in ``gate``, re-exported here.

Shapes: logits are ``(k, V)`` float arrays (k positions, V up to ~152k) or ``(V,)`` for a
single position; functions that accept both return a scalar for ``(V,)`` input. Work is
vectorised over the vocabulary; float32 is kept where it is accurate enough and sums that
decide probabilities (softmax normalisers, entropies, cumulative masses for sampling and
top-p) are accumulated in float64.

Randomness (see ``verify`` and ``target_first``) is drawn in a fixed,
documented order, and the EASD gate itself never consumes random numbers, so with the
same seed EASD whose gate never fires emits exactly what SD emits and leaves the
generator in the same state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import dist
from .config import RANDOM_SEED, DecodeConfig
from .dist import Sparse
from .finite import NonFiniteRow, checked
# where an emitted token came from (defined with the events; the rules produce them)
from .events import BONUS, DRAFT, DRAFT_ONLY, EASD, ORIGINS, RESAMPLED, TARGET
# the gate's quantities and its predicate, under the names the rules have always had
from .gate import Gate, Reading, _rows, _top_n_sets, entropy, sets_overlap, top_n_overlap, top_n_sets
from .gate import opens as gate

__all__ = [
    "entropy",
    "top_n_overlap",
    "top_n_sets",
    "sets_overlap",
    "gate",
    "sampling_probs",
    "greedy",
    "best",
    "NonFiniteRow",
    "runner_up",
    "sd_accept",
    "residual",
    "penalize",
    "sample",
    "Pick",
    "verify",
    "target_first",
    "BlockResult",
    "verify_block",
    "consult_draft",
    "target_first_step",
    "ORIGINS",
    "DRAFT",
    "TARGET",
    "RESAMPLED",
    "EASD",
    "BONUS",
    "DRAFT_ONLY",
]

# top-p without top-k: the nucleus is first looked for among this many most likely
# tokens (argpartition + a small sort); only when they hold less than top_p of the
# mass is the whole row sorted. The result is identical either way (up to tie order).
_NUCLEUS_CANDIDATES = 1024



# ----------------------------------------------------------------------------- helpers


def _softmax(z: np.ndarray) -> np.ndarray:
    """Row softmax of 2-D ``z`` in z's dtype, normaliser summed in float64."""
    e = z - z.max(axis=-1, keepdims=True)
    np.exp(e, out=e)
    s = e.sum(axis=-1, keepdims=True, dtype=np.float64)
    e *= (1.0 / s).astype(e.dtype)
    return e


# --------------------------------------------------------------- sampling distribution


def _nucleus(pc: np.ndarray, top_p: float, total: np.ndarray) -> np.ndarray:
    """Keep, per row of ``pc`` (k, C), the smallest set of largest entries whose mass
    reaches ``top_p * total`` (at least one entry); zero the rest and renormalise."""
    C = pc.shape[-1]
    order = np.argsort(-pc, axis=-1)
    rows = np.arange(pc.shape[0])[:, None]
    ps = pc[rows, order]
    cs = np.cumsum(ps, axis=-1, dtype=np.float64)
    m = (cs < (top_p * total)[:, None]).sum(axis=-1) + 1  # first index reaching the mass, +1
    np.minimum(m, C, out=m)
    ps = np.where(np.arange(C)[None, :] < m[:, None], ps, 0).astype(pc.dtype, copy=False)
    out = np.zeros_like(pc)
    out[rows, order] = ps
    out *= (1.0 / out.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(out.dtype)
    return out


def _top_p_mask(p: np.ndarray, top_p: float) -> np.ndarray:
    """Boolean mask (k, C) of the nucleus of each row of the distribution ``p``."""
    k, C = p.shape
    total = p.sum(axis=-1, dtype=np.float64)
    if C > _NUCLEUS_CANDIDATES:
        # the nucleus is usually a few hundred tokens: look among the largest first
        rows = np.arange(k)[:, None]
        cand = np.argpartition(p, C - _NUCLEUS_CANDIDATES, axis=-1)[:, C - _NUCLEUS_CANDIDATES:]
        pc = p[rows, cand]
        if np.all(pc.sum(axis=-1, dtype=np.float64) >= top_p * total):
            mask = np.zeros(p.shape, dtype=bool)
            mask[rows, cand] = _nucleus(pc, top_p, total) > 0
            return mask
    return _nucleus(p, top_p, total) > 0


def _check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if not (temperature > 0) or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")


def _plain(top_k: int, top_p: float, V: int) -> bool:
    """Whether checked settings sample from the tempered softmax alone (no top-k, no top-p)."""
    return not 0 < top_k < V and top_p >= 1.0


def sampling_probs(logits, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """The distribution a token is sampled from, in llama.cpp's default sampler order:

    1. top-k (``0 < top_k < V``): keep exactly the k largest logits (argpartition's
       choice among ties at the k-th value);
    2. top-p (``top_p < 1``): keep the smallest set of most likely tokens whose
       cumulative probability under the *untempered* (T = 1) softmax of the survivors
       reaches ``top_p``, always at least one token; ties at the boundary are broken by
       sort order;
    3. temperature: softmax of ``z / temperature`` over the survivors (``temperature > 0``
       required, else ValueError). Masked tokens get exactly 0.

    This is the order of llama.cpp's common sampler chain (top-k -> top-p -> temp), so
    ``target``/``draft`` modes sample what llama.cpp would. p and q in SD/EASD are both
    built with this function, so the speculative maths is consistent either way.

    Returns float32 for float32 input (float64 for float64 input), shape as ``logits``; a
    row with a NaN or a +inf, or no finite logit, raises ``finite.NonFiniteRow``.
    """
    _check_sampling(temperature, top_k, top_p)
    z, squeeze = _rows(logits)
    k, V = z.shape
    if _plain(top_k, top_p, V):
        out = np.stack([_tempered_softmax(row, temperature) for row in z]) if k != 1 else \
            _tempered_softmax(z[0], temperature)[None, :]
        return out[0] if squeeze else out
    for m in z.max(axis=-1):  # the plain path's softmax checks its row on the way (``finite``)
        checked(m)
    rows = np.arange(k)[:, None]
    cand = None
    zc = z
    if 0 < top_k < V:
        cand = np.argpartition(z, V - top_k, axis=-1)[:, V - top_k:]
        zc = z[rows, cand]
    mask = _top_p_mask(_softmax(zc), top_p) if top_p < 1.0 else None
    zt = zc / zc.dtype.type(temperature) if temperature != 1.0 else zc  # never written to
    if mask is not None:
        zt = np.where(mask, zt, -np.inf).astype(zc.dtype, copy=False)
    pc = _softmax(zt)
    if cand is None:
        out = pc
    else:
        out = np.zeros_like(z)
        out[rows, cand] = pc
    return out[0] if squeeze else out


def _tempered_softmax(z: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(z / temperature) of one row (float32 or float64 as z). A row wider than
    ``dist.SAMPLE_BLOCK`` whose tokens within ``gate.TAIL_NATS`` of the best are under half of
    it: ``dist.tempered``'s, dense (the others given exactly 0: each has at most e^-30 of the
    best's probability, all together at most 1.4e-8 of the mass at 152k tokens). Otherwise the
    operations and bits of ``_softmax(z / temperature)``."""
    if z.size > dist.SAMPLE_BLOCK:
        sp = dist.tempered(z, temperature)
        if sp is not None:
            return sp.dense()
    return _dense_tempered(z, temperature)


def _dense_tempered(z: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(z / temperature) of one row over every token: ``_softmax(z / temperature)``'s
    operations and bits."""
    t = z.dtype.type(temperature)
    e = z / t if temperature != 1.0 else z.copy()
    e -= checked(z.max()) / t  # = max(z / t): division by t > 0 keeps the order
    np.exp(e, out=e)
    e *= (1.0 / e.sum(dtype=np.float64)).astype(e.dtype)
    return e


def distribution(z_row: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """``sampling_probs`` of one row, for the rules' own use: a ``dist.Sparse`` where plain
    sampling leaves most of a wide row at probability 0, else the dense row. ``sample``,
    ``residual``, ``residual_point``, ``penalize`` and ``prob`` take either."""
    _check_sampling(temperature, top_k, top_p)
    z = np.asarray(z_row)
    if z.ndim == 1 and z.size > dist.SAMPLE_BLOCK and _plain(top_k, top_p, z.size):
        sp = dist.tempered(z, temperature)
        # most of the row near its best: the dense row (not sampling_probs, which would ask
        # dist.tempered again)
        return sp if sp is not None else _dense_tempered(z, temperature)
    return sampling_probs(z, temperature, top_k, top_p)


def prob(p, token: int) -> float:
    """p(token) of a dense row or a ``dist.Sparse``."""
    return p.at(token) if isinstance(p, Sparse) else float(p[token])


# ------------------------------------------------------------------ token-level rules


def best(row: np.ndarray) -> int:
    """The first maximum of one row (as ``np.argmax``), the row's finiteness checked on the
    way: argmax stops on the first NaN, picks a +inf, and lands on a -inf only when the row
    has no finite logit, so the winner is finite exactly when ``runtime.all_finite`` holds
    (``finite``: the rules check the rows they read; the scheduler makes no pass of its own)."""
    i = int(row.argmax())
    checked(row[i])
    return i


def greedy(logits):
    """Argmax per row (first maximum on ties, as ``np.argmax``); int for 1-D input."""
    z, squeeze = _rows(logits)
    a = z.argmax(axis=-1)
    return int(a[0]) if squeeze else a


def runner_up(logits, exclude):
    """Per row, the argmax with token ``exclude[i]`` removed (first maximum on ties).

    Used by greedy EASD: the target's best token other than the draft's. Never returns
    ``exclude`` when V >= 2 (if every other logit is -inf, returns ``(exclude+1) % V``).
    ``exclude`` is a scalar or ``(k,)``; returns an int for 1-D logits, else ``(k,)``.
    """
    z, squeeze = _rows(logits)
    k, V = z.shape
    if V < 2:
        raise ValueError("runner_up needs a vocabulary of at least 2 tokens")
    ex = np.broadcast_to(np.asarray(exclude, dtype=np.intp).reshape(-1), (k,))
    best = z.argmax(axis=-1)
    clash = np.flatnonzero(best == ex)
    if clash.size:
        sub = z[clash].copy()
        exc = ex[clash]
        sub[np.arange(clash.size), exc] = -np.inf
        b2 = sub.argmax(axis=-1)
        same = b2 == exc
        b2[same] = (exc[same] + 1) % V
        best[clash] = b2
    return int(best[0]) if squeeze else best


def sd_accept(p_tok, q_tok, u):
    """SD acceptance test: accept with probability ``min(1, p/q)``.

    Returns ``u < p/q`` for ``u`` uniform on [0, 1), evaluated as ``u * q < p`` in
    float64, which needs no division and for ``q == 0`` (impossible for a token that was
    sampled from q) accepts iff ``p > 0``. A Python bool for scalars, else a bool array.
    """
    if np.ndim(u) == 0 and np.ndim(p_tok) == 0 and np.ndim(q_tok) == 0:
        return float(u) * float(q_tok) < float(p_tok)
    u, q, p = (np.asarray(x, dtype=np.float64) for x in (u, q_tok, p_tok))
    return u * q < p


def residual(p, q):
    """Rejection distribution ``norm(max(0, p - q))`` (along the last axis).

    If the positive part has zero mass, then ``p <= q`` everywhere and, both summing to
    one, ``p == q``: the SD rejection probability ``sum(max(0, q - p))`` is then 0, so
    this branch is only reached through float rounding; returning ``p`` keeps the output
    law equal to p (what SD must emit) instead of dividing by zero.
    """
    if isinstance(p, Sparse) or isinstance(q, Sparse):
        if isinstance(p, Sparse) and isinstance(q, Sparse):
            return dist.residual(p, q)
        p, q = (x.dense() if isinstance(x, Sparse) else x for x in (p, q))
    p = np.asarray(p)
    r = np.subtract(p, q)  # the one full-vocabulary array: the rest is done in it
    np.maximum(r, 0, out=r)
    s = r.sum(axis=-1, keepdims=True, dtype=np.float64)
    if p.ndim == 1:
        if not s[0] > 0:
            return p.copy()
        r /= r.dtype.type(s[0])
        return r
    return np.where(s > 0, r / np.where(s > 0, s, 1).astype(r.dtype), p)


def residual_point(p, token: int):
    """``residual(p, δ_token)`` without a full-vocabulary one-hot: p with ``token`` removed,
    renormalised (p itself when nothing else has mass, which the SD test then never reaches:
    it accepts a point mass on ``token`` with probability p(token) = 1)."""
    if isinstance(p, Sparse):
        return dist.without(p, token)
    r = np.array(p, copy=True)
    r[token] = 0
    s = float(r.sum(dtype=np.float64))
    return r / r.dtype.type(s) if s > 0 else np.asarray(p).copy()


def penalize(p, token: int, lam: float, fallback=None):
    """``p`` with ``p[token] *= lam``, renormalised (EASD's re-pick distribution).

    Zero remaining mass happens only when p is a point mass on ``token`` and lam == 0
    (e.g. after top-k = 1 or a tight top-p truncated every alternative away). Then
    ``fallback`` is used in p's place: an array, or a zero-argument callable returning
    one (so it is only built when needed); the decoding code passes the *untruncated*
    tempered target distribution, whose alternatives the truncation removed. If there is
    no fallback, or it too has no mass outside ``token``, ``p`` is returned unchanged:
    no other token is possible, so re-emitting the gated token is the only option.
    """
    if isinstance(p, Sparse):
        out = dist.penalized(p, token, lam)
        if out is not None:
            return out
        if fallback is None:
            return p
        p = p.dense()
    p = np.asarray(p)
    out = p.copy()
    out[token] *= lam
    s = out.sum(dtype=np.float64)
    if s > 0:
        out *= out.dtype.type(1.0 / s)
        return out
    if fallback is not None:
        f = np.array(fallback() if callable(fallback) else fallback, copy=True)
        f[token] *= lam
        s = f.sum(dtype=np.float64)
        if s > 0:
            f *= f.dtype.type(1.0 / s)
            return f
    return p.copy()


def make_rng(seed: int) -> np.random.Generator:
    """The generator for one generation: seeded, or from fresh entropy for RANDOM_SEED."""
    return np.random.default_rng(None if seed == RANDOM_SEED else seed)


def sample(probs, rng: np.random.Generator) -> int:
    """Inverse-CDF sample of one token from ``probs`` (V,), using one ``rng.random()``
    (``dist.inverse_cdf``: float64 sums scaled by their total, so ``probs`` need not sum to
    exactly 1; never a zero-probability token). A ``dist.Sparse`` draws over its support, by
    the same rule."""
    if isinstance(probs, Sparse):
        return probs.sample(rng)
    return dist.inverse_cdf(np.asarray(probs), rng)


# ------------------------------------------------------------------- one verify block


class Pick(NamedTuple):
    """One emitted token: its id, its origin and the gate's reading at its position (None
    where the gate had no position to read: the bonus token, target and draft modes)."""

    token: int
    origin: str
    reading: Reading | None = None


_NO_READING = Reading()


def verify(draft_tokens, z_draft, z_target, cfg: DecodeConfig, gate_: Gate, rng: np.random.Generator,
           q_draft=None) -> list[Pick]:
    """One SD verification of a drafted block, gated by ``gate_`` (EASD; a gate that cannot
    fire is plain SD): the tokens it emits, in order.

    ``draft_tokens`` (g,), ``z_draft`` (g, V) the draft's raw logits at each drafted
    position (or a list of g rows of V) (in sampling mode draft token i must have been sampled from
    ``sampling_probs(z_draft[i], cfg.temperature, cfg.top_k, cfg.top_p)``),
    ``z_target`` (g+1, V) the target's raw logits (row i scores draft token i's
    position, row g the position after the last draft). g may be 0 (bonus only).
    ``z_draft`` None: a drafter without distributions (a lookup) proposed the tokens, each
    a point mass q = δ_d. The SD test then accepts d with probability p(d) and a rejection
    samples norm(max(0, p − δ_d)), p without d: the emitted token still follows p exactly
    (P(d) = p(d); P(x ≠ d) = (1 − p(d)) · p(x) / (1 − p(d))), so SD stays lossless. Such a
    block cannot be gated (the gate reads the draft's entropy). ``q_draft``: the g
    distributions the drafts were sampled from (``distribution`` of each draft row, dense or
    ``dist.Sparse``), given by a drafter that kept them: the SD test's q, not computed again
    from the rows (which may then be None: an ungated block).

    Greedy (``cfg.temperature == 0``): accept draft i while it equals argmax z_t[i];
    the first mismatch is replaced by that argmax (RESAMPLED). Sampling: accept with
    probability min(1, p_i(d)/q_i(d)); on rejection emit a sample of residual(p_i, q_i)
    (RESAMPLED). The block stops at the first rejection; if all g are accepted a bonus
    token is emitted (argmax / sample of p_g). EASD: an SD-accepted draft token whose
    gate (raw-logit entropies and top-N overlap) fires is replaced by the target's
    runner-up (greedy) or a sample of penalize(p_i, d_i, cfg.penalty) (EASD) and the
    block stops. No gate on the bonus token. The gate is read lazily
    (``Gate.read_lazily``), only at SD-accepted positions and only until it fires: each
    examined position's reading holds only what the decision needed (H_t alone below
    tau_target; NaN at the rejected position, where it is never read); the decisions
    are those of reading it everywhere.

    Identities: ``DRAFT + EASD`` picks are the drafts the SD test accepted, at most one
    RESAMPLED, at most one EASD, a BONUS exactly when all g drafts were accepted and the
    gate did not fire.

    Random numbers (sampling mode only; greedy consumes none), in this order: for each
    examined position one ``rng.random()`` for the acceptance test; then exactly one
    more draw for the token that ends the block (residual sample, penalised sample or
    bonus sample). The gate itself draws nothing, so a gate that never fires leaves
    tokens and generator state identical to plain SD.
    """
    d = np.asarray(draft_tokens, dtype=np.intp).reshape(-1)
    g = int(d.size)
    zt, _ = _rows(z_target)
    V = zt.shape[-1]
    if zt.shape[0] != g + 1:
        raise ValueError(f"z_target must have g+1 = {g + 1} rows, got {zt.shape[0]}")
    if z_draft is None and gate_.can_fire:
        raise ValueError("the EASD gate needs the draft's distributions; a lookup proposal has none")
    if q_draft is not None and len(q_draft) != g:
        raise ValueError(f"q_draft must have g = {g} distributions, got {len(q_draft)}")
    point = z_draft is None and q_draft is None  # point-mass proposals (a lookup drafter)
    if z_draft is None:
        zd = None
    elif isinstance(z_draft, (list, tuple)):  # the drafter's rows, one array each: not stacked
        if len(z_draft) != g:
            raise ValueError(f"z_draft must have g = {g} rows, got {len(z_draft)}")
        zd = [np.asarray(z).reshape(V) for z in z_draft]
    else:
        zd = np.asarray(z_draft).reshape(g, V) if g else np.zeros((0, V), dtype=zt.dtype)

    # The four outcomes of a position, greedy or sampled; the loop below is shared so that
    # both follow the same order: test, then gate, then (at the end) the bonus. Each row's
    # figures are computed when a position first needs them, so the rows after the first
    # rejection (or gate) cost nothing.
    if cfg.greedy:
        tops: dict[int, int] = {}  # a rejected position asks twice (test, then its token)

        def top(i: int) -> int:
            t = tops.get(i)
            if t is None:  # the first maximum, as greedy(); the row checked
                t = tops[i] = best(zt[i])
            return t

        def accepts(i: int, di: int) -> bool:
            return di == top(i)

        def on_reject(i: int, di: int) -> int:
            return top(i)

        def on_gate(i: int, di: int) -> int:
            return runner_up(zt[i], di)

        def on_bonus() -> int:
            return top(g)
    else:
        T, K, P = cfg.temperature, cfg.top_k, cfg.top_p
        p_rows: dict[int, np.ndarray] = {}
        q_rows: dict[int, np.ndarray] = dict(enumerate(q_draft)) if q_draft is not None else {}

        def p(i: int) -> np.ndarray:
            if i not in p_rows:
                p_rows[i] = distribution(zt[i], T, K, P)
            return p_rows[i]

        def q(i: int) -> np.ndarray:
            if i not in q_rows:
                q_rows[i] = distribution(zd[i], T, K, P)
            return q_rows[i]

        def accepts(i: int, di: int) -> bool:
            return sd_accept(prob(p(i), di), 1.0 if point else prob(q(i), di), rng.random())

        def on_reject(i: int, di: int) -> int:
            return sample(residual_point(p(i), di) if point else residual(p(i), q(i)), rng)

        def on_gate(i: int, di: int) -> int:
            return sample(penalize(p(i), di, cfg.penalty, fallback=lambda: sampling_probs(zt[i], T)), rng)

        def on_bonus() -> int:
            return sample(p(g), rng)

    picks: list[Pick] = []
    for i in range(g):
        di = int(d[i])
        if not accepts(i, di):
            picks.append(Pick(on_reject(i, di), RESAMPLED, Reading()))
            return picks
        # greedy: the accepted draft is the target row's argmax, so its logit is the row's maximum
        r = _NO_READING if zd is None else gate_.read_lazily(zd[i], zt[i], zt[i, di] if cfg.greedy else None)
        if r.open:
            picks.append(Pick(on_gate(i, di), EASD, r))
            return picks
        picks.append(Pick(di, DRAFT, r))
    picks.append(Pick(on_bonus(), BONUS))
    return picks


# ------------------------------------------------------------ target-first EASD (tf)


def _emit_from_p(z_t: np.ndarray, cfg: DecodeConfig, rng: np.random.Generator, best_t: int | None) -> int:
    if cfg.greedy:
        return best(z_t) if best_t is None else best_t
    return sample(distribution(z_t, cfg.temperature, cfg.top_k, cfg.top_p), rng)


def target_first(z_target_row, z_draft_row, cfg: DecodeConfig, gate_: Gate, rng: np.random.Generator,
                 h_target: float, best_t: int | None = None) -> Pick:
    """One position of target-first EASD ("easd-tf").

    ``h_target`` is ``gate_.screen(z_target_row)``; ``z_draft_row`` is None where
    ``gate_.wants_draft(h_target)`` said the draft need not be consulted: the token is then
    emitted from p (greedy argmax or one sample), origin TARGET, and the reading holds H_t
    alone. With draft logits the gate is read on raw logits; closed -> emit from p. Open,
    greedy: if argmax q == argmax p emit the target's runner-up (EASD) else argmax p
    (TARGET). Open, sampling: draw ``d ~ q``; if the SD test would accept d (probability
    min(1, p(d)/q(d))) emit a sample of ``penalize(p, d, cfg.penalty)`` (EASD), else a
    sample of ``residual(p, q)`` (TARGET: easd-tf drafts nothing, so no drafted token was
    rejected; every position it does not fire at is the target's choice).

    Random numbers (sampling only): emit-from-p uses one draw; the open gate uses three,
    in order: d ~ q, the acceptance uniform, the emitted token.

    ``best_t`` (greedy): ``best(z_target_row)``, where the caller took it already.
    """
    z_t = np.asarray(z_target_row)
    if z_draft_row is None:
        return Pick(_emit_from_p(z_t, cfg, rng, best_t), TARGET, Reading(math.nan, h_target))
    z_d = np.asarray(z_draft_row)
    r = gate_.read(z_d, z_t, h_target, deciding=True)
    if not r.open:
        return Pick(_emit_from_p(z_t, cfg, rng, best_t), TARGET, r)
    if cfg.greedy:
        a_p = greedy(z_t) if best_t is None else best_t
        if greedy(z_d) == a_p:
            return Pick(runner_up(z_t, a_p), EASD, r)
        return Pick(a_p, TARGET, r)
    T, K, P = cfg.temperature, cfg.top_k, cfg.top_p
    p = distribution(z_t, T, K, P)
    q = distribution(z_d, T, K, P)
    d = sample(q, rng)
    if sd_accept(prob(p, d), prob(q, d), rng.random()):
        return Pick(sample(penalize(p, d, cfg.penalty, fallback=lambda: sampling_probs(z_t, T)), rng), EASD, r)
    return Pick(sample(residual(p, q), rng), TARGET, r)


# ------------------------------------------- the earlier API: blocks, tuples, a gate flag


@dataclass(frozen=True)
class BlockResult:
    """``verify``'s picks in the form ``verify_block`` has always returned.

    ``tokens``/``origins`` are emitted in order. Identities: ``count(DRAFT) + count(EASD)
    == n_accepted_sd``, ``count(RESAMPLED) == n_rejected_sd`` (0 or 1), ``count(easd) ==
    int(gate_fired)``, a bonus exactly when all g drafts were accepted and the gate did not
    fire, so ``len(tokens) == n_accepted_sd + n_rejected_sd + bonus``.
    ``h_draft``/``h_target``/``overlap`` have one entry per drafted position examined
    (``n_accepted_sd + n_rejected_sd``), NaN where the gate did not need the figure.
    """

    picks: tuple[Pick, ...]

    @property
    def tokens(self) -> list[int]:
        return [p.token for p in self.picks]

    @property
    def origins(self) -> list[str]:
        return [p.origin for p in self.picks]

    @property
    def n_accepted_sd(self) -> int:
        return sum(p.origin in (DRAFT, EASD) for p in self.picks)

    @property
    def n_rejected_sd(self) -> int:
        return sum(p.origin == RESAMPLED for p in self.picks)

    @property
    def gate_fired(self) -> bool:
        return any(p.origin == EASD for p in self.picks)

    def _figures(self, name: str) -> list[float]:
        return [getattr(p.reading, name) for p in self.picks if p.reading is not None]

    @property
    def h_draft(self) -> list[float]:
        return self._figures("h_draft")

    @property
    def h_target(self) -> list[float]:
        return self._figures("h_target")

    @property
    def overlap(self) -> list[float]:
        return self._figures("overlap")

    @property
    def bonus(self) -> bool:
        return bool(self.picks) and self.picks[-1].origin == BONUS

    @property
    def n_draft_emitted(self) -> int:
        return self.origins.count(DRAFT)


def verify_block(draft_tokens, z_draft, z_target, cfg: DecodeConfig, rng: np.random.Generator,
                 gate_on: bool) -> BlockResult:
    """``verify`` with the gate on (EASD, as far as ``cfg``'s thresholds can fire) or off (SD)."""
    return BlockResult(tuple(verify(draft_tokens, z_draft, z_target, cfg, Gate.of(cfg, on=gate_on), rng)))


def consult_draft(z_target_row, cfg: DecodeConfig, gate_on: bool) -> tuple[bool, float]:
    """easd-tf: whether the draft's logits are needed at this position, and H(z_t) (NaN
    when the gate is off; computed when it is on, even where its thresholds cannot fire)."""
    if not gate_on:
        return False, math.nan
    h_t = float(entropy(z_target_row))
    return Gate.of(cfg, on=True).wants_draft(h_t), h_t


def target_first_step(z_target_row, z_draft_row, cfg: DecodeConfig, rng: np.random.Generator, gate_on: bool,
                      h_t: float | None = None) -> tuple[int, str, bool, float, float, float]:
    """``target_first`` as ``(token, origin, fired, h_t, h_d, overlap)``; ``h_t`` from
    ``consult_draft`` (computed here when None and the gate is on)."""
    if h_t is None:
        h_t = float(entropy(z_target_row)) if gate_on else math.nan
    pick = target_first(z_target_row, z_draft_row if gate_on else None, cfg, Gate.of(cfg, on=gate_on), rng, h_t)
    r = pick.reading
    return pick.token, pick.origin, pick.origin == EASD, r.h_target, r.h_draft, r.overlap
