"""The EASD gate: its quantities (entropy, top-N overlap), its predicate, and ``Gate``, the one
value built from the decoding settings that every user of the gate asks.

The gate fires at a position where draft and target are both uncertain and agree on their
candidates: ``H(z_d) >= tau_draft and H(z_t) >= tau_target and overlap >= tau_overlap`` on
raw (untempered) logits. A gate whose thresholds cannot be reached (an infinite entropy
threshold, an overlap threshold above 1) never fires, and then nothing is computed for it.
The steps (``rules.verify``, ``rules.target_first``), ``near_ties`` and ``bench rerun`` read
it through ``Gate``; ``rules`` re-exports the quantities. Pure numpy, no I/O.

The decoding steps read an entropy only as exactly as its comparison with the threshold
needs (``entropy_against``): on a wide row, where bounds from the few tokens near the best
settle the side, the figure reported is within 0.007 nats of the exact one (exact where
they do not, and on every row narrower than 4,096 tokens); the gate's decisions are those
of the exact figures. ``bench rerun`` and calibration read the exact ones.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from .finite import checked
from .modes import MODE_TABLE


def _rows(logits) -> tuple[np.ndarray, bool]:
    """View ``logits`` as 2-D float rows; the flag says the input was 1-D."""
    z = np.asarray(logits)
    if z.dtype.kind != "f":
        z = z.astype(np.float32)
    if z.ndim == 1:
        return z[None, :], True
    if z.ndim != 2:
        raise ValueError(f"logits must have shape (V,) or (k, V), got {z.shape}")
    return z, False


# Tokens whose logit lies more than this many nats below a row's best have at most e^-30 (1e-13)
# of the best's probability: all of them together at most V * e^-30 (1.4e-8 at 152k tokens) of
# the mass. Plain sampling (``rules``, ``dist``) gives them probability 0 where they are most
# of the row (``dist.tempered``).
TAIL_NATS = 30.0

_scratch = threading.local()  # per thread: two float32 rows the entropy works in


def _work(V: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 scratch rows of width ``V``. A fresh 600 KB numpy temporary costs more in
    page faults than the arithmetic done in it (glibc serves it by mmap)."""
    w = getattr(_scratch, "rows", None)
    if w is None or w.shape[1] < V:
        w = _scratch.rows = np.empty((2, V), dtype=np.float32)
    return w[0, :V], w[1, :V]


def entropy(logits):
    """Shannon entropy (nats) of the untempered softmax (T = 1) over the full row.

    ``H(z) = logsumexp(z) - sum(softmax(z) * z)``, computed as
    ``log S - sum(e * d) / S`` with ``d = z - max(z)``, ``e = exp(d)``, ``S = sum(e)``,
    which is shift invariant and never negative; sums are accumulated in float64.
    Tokens with logit -inf have probability 0 and contribute nothing.
    Returns a float64 array ``(k,)`` for ``(k, V)`` input, a float64 scalar for ``(V,)``.
    """
    z, squeeze = _rows(logits)
    if z.dtype == np.float32:
        h = np.array([_entropy_row(row) for row in z], dtype=np.float64)
        return h[0] if squeeze else h
    with np.errstate(invalid="ignore"):  # as in _entropy_row
        d = z - z.max(axis=-1, keepdims=True)
        e = np.exp(d)
        np.multiply(e, d, out=d)  # d is now e * d
    s = e.sum(axis=-1, dtype=np.float64)
    t = d.sum(axis=-1, dtype=np.float64)
    for i in np.flatnonzero(np.isnan(t)):
        t[i] = _masked_t(z[i])
    h = np.log(s) - t / s
    return h[0] if squeeze else h


def _entropy_row(row: np.ndarray) -> float:
    """``entropy`` of one float32 row, by the same operations (the same bits), in scratch rows."""
    d, e = _work(row.size)
    # invalid: 0 * -inf for masked logits (fixed below); inf - inf in a row that is not
    # finite, whose entropy is then NaN (``entropy_against`` and ``Gate.read`` raise)
    with np.errstate(invalid="ignore"):
        np.subtract(row, row.max(), out=d)
        np.exp(d, out=e)
        np.multiply(e, d, out=d)
    s = e.sum(dtype=np.float64)
    t = d.sum(dtype=np.float64)
    if np.isnan(t):
        t = _masked_t(row)
    return float(np.log(s) - t / s)


# ``entropy_against``: a row at least this wide is first bounded from its head, the tokens
# within _HEAD_NATS of its best (a real row's median: about a thousand of 152k)
_BOUND_MIN_V = 4096
_HEAD_NATS = 20.0
_HEAD_SHARE = 8  # ... when at most 1/_HEAD_SHARE of the row is in the head, else exact
_DECIDE_MARGIN = 1e-4  # nats: bounds this close to the threshold leave it to the exact figure


def entropy_bounds(row: np.ndarray, top: float | None = None) -> tuple[float, float, float] | None:
    """(lower, estimate, upper) bounds of ``entropy(row)`` from the tokens within
    ``_HEAD_NATS`` of the best, summed in float64, and the tail's count: each tail
    token has e = exp(z - max) < e^-20 and adds at most e^-20 to the normaliser S and
    20·e^-20 to T = -sum(e·d) (x·e^-x falls past x = 1), so with S_h, T_h the head's,
    ``log S_h + T_h / (S_h + s_t) <= H <= log(S_h + s_t) + (T_h + t_t) / S_h``, t_t and s_t
    the tail's most; at 152k tokens the two are at most 0.007 nats apart. The estimate is
    the head's own entropy. None when the head is too large to be worth it, or the row not
    finite. ``top``: the row's maximum where the caller has it already (the logit of the
    argmax it took), which spares a pass over the row.

    The head is exponentiated in float32 (numpy's float64 exp is scalar code on CPUs
    without AVX-512: 5 to 10 ns a token against about 1.5 on an AMD EPYC), its d and e then summed in
    float64; the bounds move by about 1e-6 nats, far inside ``_DECIDE_MARGIN``."""
    m = row.max() if top is None else top
    if not math.isfinite(m):
        return None
    head = np.flatnonzero(row >= m - row.dtype.type(_HEAD_NATS))
    if head.size * _HEAD_SHARE > row.size:
        return None
    d = row[head]
    d -= m
    e = np.exp(d).astype(np.float64)
    s_h = float(e.sum())
    t_h = -float(np.dot(e, d.astype(np.float64)))
    n_tail = row.size - head.size
    s_t = n_tail * math.exp(-_HEAD_NATS)
    t_t = s_t * _HEAD_NATS
    lo = math.log(s_h) + t_h / (s_h + s_t)
    hi = math.log(s_h + s_t) + (t_h + t_t) / s_h
    return lo, min(max(math.log(s_h) + t_h / s_h, lo), hi), hi


def settles(bounds: tuple[float, float, float] | None, tau: float) -> bool:
    """Whether ``entropy_bounds``' bounds put H on one side of ``tau`` (by ``_DECIDE_MARGIN``)."""
    return bounds is not None and (bounds[2] < tau - _DECIDE_MARGIN or bounds[0] >= tau + _DECIDE_MARGIN)


def entropy_against(row: np.ndarray, tau: float, top: float | None = None) -> float:
    """``entropy(row)`` for a decision ``H >= tau``: on the same side of ``tau`` as the exact
    figure, and equal to it where the bounds (``entropy_bounds``) do not settle the side; else
    the bounds' estimate (within 0.007 nats of it at 152k tokens). Rows narrower than
    ``_BOUND_MIN_V`` (and rows whose head is wide) get the exact figure. At a confident
    position of a real row this reads the row twice and exponentiates a few hundred tokens,
    where ``entropy`` exponentiates all 152k (numpy's float32 exp: ~1.3 ns a token here).
    A row with a NaN or a +inf, or no finite logit: ``finite.NonFiniteRow``. ``top``: the
    row's maximum, where the caller has it (``entropy_bounds``)."""
    row = np.asarray(row)
    if row.ndim == 1 and row.size >= _BOUND_MIN_V and row.dtype == np.float32 and math.isfinite(tau):
        b = entropy_bounds(row, top)
        if settles(b, tau):
            return b[1]
    return checked(float(entropy(row)))  # NaN exactly when the row is not finite


def _masked_t(row: np.ndarray) -> np.float64:
    """``sum(e * d)`` of a row whose masked (-inf) logits made it NaN (0 * -inf): without them."""
    with np.errstate(invalid="ignore"):  # a row that is not finite: NaN, as in _entropy_row
        zi = row - row.max()
        ei = np.exp(zi)
        return np.multiply(ei, zi, out=np.zeros_like(ei), where=ei > 0).sum(dtype=np.float64)


# top-N sets look for their candidates among the blocks of this many logits with the largest maxima
_TOP_BLOCK = 1024


def _top_n_sets(z: np.ndarray, n: int) -> np.ndarray:
    """Indices (k, n) of the n largest entries per row, ties at the n-th value broken toward the
    lower index (the set ``np.argsort(-z, kind="stable")[:, :n]`` holds, in index order).

    Without sorting or partitioning the whole row: one pass takes the maximum of every block of
    ``_TOP_BLOCK`` entries; every entry outside the blocks whose maximum is among the n largest
    block maxima is below the n-th of those, while those blocks hold at least n entries at or
    above it, so the top n lie in them (and in the short tail after the last whole block).
    Among those few thousand candidates, in index order, one ``np.partition`` finds the n-th
    value. ``n <= V``."""
    k, V = z.shape
    out = np.empty((k, n), dtype=np.intp)
    nb = V // _TOP_BLOCK
    blocks = nb > 2 * n
    if blocks:
        bmax = z[:, : nb * _TOP_BLOCK].reshape(k, nb, _TOP_BLOCK).max(axis=-1)
        offsets = np.arange(_TOP_BLOCK)
    for i in range(k):
        row = z[i]
        if blocks:
            bm = bmax[i]
            t = np.partition(bm, nb - n)[nb - n]  # the n-th largest block maximum
            chosen = np.flatnonzero(bm >= t)
            ids = np.concatenate([(chosen[:, None] * _TOP_BLOCK + offsets).ravel(), np.arange(nb * _TOP_BLOCK, V)])
            vals = row[ids]
        else:
            ids, vals = None, row
        m = vals.size
        v = np.partition(vals, m - n)[m - n]  # the n-th largest value
        above = np.flatnonzero(vals > v)
        pick = np.concatenate([above, np.flatnonzero(vals == v)[: n - above.size]])
        out[i] = pick if ids is None else ids[pick]
    return out


def top_n_overlap(z_draft, z_target, n: int):
    """``|TopN(z_d) ∩ TopN(z_t)| / n`` per row.

    TopN is the set of the n largest logits; with ties at the n-th value the tied tokens of
    lower id belong to it (``_top_n_sets``). ``n`` larger than V is clamped to V (every
    token is then in both sets, overlap 1). Returns ``(k,)`` float64 or a scalar for 1-D
    input.
    """
    zd, squeeze = _rows(z_draft)
    zt, _ = _rows(z_target)
    if zd.shape != zt.shape:
        raise ValueError(f"draft and target logits differ in shape: {zd.shape} vs {zt.shape}")
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    n = min(n, zd.shape[-1])
    ov = sets_overlap(_top_n_sets(zd, n), _top_n_sets(zt, n))
    return ov[0] if squeeze else ov


def sets_overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|A ∩ B| / n`` per row of two (k, n) arrays of top-N sets (``top_n_sets``): the overlap
    of ``top_n_overlap`` when one side's sets are reused against several others."""
    common = (a[:, :, None] == b[:, None, :]).any(axis=-1).sum(axis=-1)
    return common / float(a.shape[-1])


def top_n_sets(z, n: int) -> np.ndarray:
    """The (k, n) top-N sets ``top_n_overlap`` compares (``n`` clamped to V)."""
    zz, _ = _rows(z)
    return _top_n_sets(zz, min(int(n), zz.shape[-1]))


def conditions(h_draft, h_target, overlap, tau_draft, tau_target, tau_overlap):
    """The gate's three conditions, ``(H_d >= tau_draft, H_t >= tau_target, O >= tau_overlap)``,
    on numbers (bools) or numpy arrays (elementwise); the one place they are written."""
    return h_draft >= tau_draft, h_target >= tau_target, overlap >= tau_overlap


def opens(h_draft, h_target, overlap, tau_draft, tau_target, tau_overlap):
    """The gate's predicate: all three ``conditions`` hold.

    Elementwise on arrays (a numpy bool array; ``np.bool_`` for scalars). An infinite
    threshold never fires (no finite entropy or overlap reaches +inf); NaN never fires.
    """
    d_ok, t_ok, o_ok = conditions(np.asarray(h_draft), np.asarray(h_target), np.asarray(overlap), tau_draft,
                                  tau_target, tau_overlap)
    return d_ok & t_ok & o_ok


def can_fire(tau_draft: float, tau_target: float, tau_overlap: float) -> bool:
    """Whether thresholds like these can ever open the gate (finite entropy thresholds, an
    overlap threshold of at most 1)."""
    return math.isfinite(tau_draft) and math.isfinite(tau_target) and tau_overlap <= 1.0


class Reading(NamedTuple):
    """The gate at one position: the figures it computed (NaN where it did not need them)
    and whether it opened."""

    h_draft: float = math.nan
    h_target: float = math.nan
    overlap: float = math.nan
    open: bool = False


@dataclass(frozen=True)
class Gate:
    """The gate of one generation: its thresholds and whether it is used at all (``on``: the
    mode is gated)."""

    tau_draft: float
    tau_target: float
    tau_overlap: float
    top_n: int
    on: bool = True

    @classmethod
    def of(cls, cfg, on: bool | None = None) -> "Gate":
        """The gate of ``cfg`` (a ``DecodeConfig``); ``on`` defaults to whether its mode is gated."""
        if on is None:
            mode = MODE_TABLE.get(cfg.mode)
            on = mode is not None and mode.gated
        return cls(cfg.tau_draft, cfg.tau_target, cfg.overlap, cfg.top_n, on)

    @cached_property  # asked at every position of a step
    def can_fire(self) -> bool:
        return self.on and can_fire(self.tau_draft, self.tau_target, self.tau_overlap)

    def opens(self, h_draft, h_target, overlap):
        """This gate's predicate on given figures (arrays elementwise)."""
        return opens(h_draft, h_target, overlap, self.tau_draft, self.tau_target, self.tau_overlap)

    def screen(self, z_target_row, top: float | None = None) -> float:
        """H_t at a position, the cheap first filter (one row; ``entropy_against`` tau_target);
        NaN when the gate cannot fire. ``top``: the row's maximum, where the caller took its
        argmax already."""
        return entropy_against(z_target_row, self.tau_target, top) if self.can_fire else math.nan

    def wants_draft(self, h_target: float) -> bool:
        """Whether the draft's logits are needed to decide at a position with this H_t."""
        return self.can_fire and h_target >= self.tau_target

    def read(self, z_draft_row, z_target_row, h_target: float | None = None, deciding: bool = False) -> Reading:
        """Every figure at a position and whether the gate opens there (``h_target``: H_t
        when already computed). ``deciding``: the entropies only as exact as the decision
        needs (``entropy_against``), as the decoding steps read them; else exact. A row with
        a NaN or a +inf, or no finite logit: ``finite.NonFiniteRow``."""
        if deciding:
            h_t = self.screen(z_target_row) if h_target is None else h_target
            h_d = entropy_against(z_draft_row, self.tau_draft)
        else:
            h_t = float(entropy(z_target_row)) if h_target is None else h_target
            h_d = float(entropy(z_draft_row))
        checked(h_d)  # an entropy is NaN exactly when its row is not finite
        checked(h_t)
        ov = float(top_n_overlap(z_draft_row, z_target_row, self.top_n))
        d_ok, t_ok, o_ok = conditions(h_d, h_t, ov, self.tau_draft, self.tau_target, self.tau_overlap)
        return Reading(h_d, h_t, ov, d_ok and t_ok and o_ok)

    def read_lazily(self, z_draft_row, z_target_row, top_target: float | None = None) -> Reading:
        """The reading with only what the decision needs: nothing when the gate cannot fire,
        H_t alone where it is below its threshold, everything else where it passes.
        ``top_target``: the target row's maximum, where the caller has it."""
        h_t = self.screen(z_target_row, top_target)
        if not self.wants_draft(h_t):
            return Reading(math.nan, h_t)
        return self.read(z_draft_row, z_target_row, h_t, deciding=True)
