"""The pure maths of a pair score: per-position figures from two rows of logits, and what
speculative decoding would do with them. No llama.cpp, no I/O.

Per position (target logits z_t, draft logits z_d over the shared vocabulary):

- greedy agreement: argmax z_d == argmax z_t (greedy SD accepts the draft's token exactly there);
- α = Σ_x min(p(x), q(x)) with p, q the target's and the draft's sampling distributions
  (``rules.sampling_probs``: the very p and q the SD test uses): the probability that
  sampled SD accepts the draft's token at this position (Leviathan et al., 2023);
  at temperature 0 it is the greedy agreement;
- KL(p‖q) of the untempered (T = 1) softmaxes, in nats;
- the entropies and the top-N overlap the EASD gate reads (``rules``).

From a text's positions in order, greedy SD is simulated exactly (``simulate``): a block
starting at position i drafts up to gamma tokens and accepts them while the draft's argmax
is the target's; it emits the accepted tokens and one more (the target's correction, or the
bonus token when all were accepted), and the next block starts after them. Along the
target's own greedy text this is what greedy ``sd`` does, block for block. Sampled SD is
predicted with the i.i.d. formula from α: (1 − α^(γ+1)) / (1 − α) tokens per verify.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..engine import rules

GAMMAS = tuple(range(1, 9))


# ------------------------------------------------------------------------ per position


def alpha_rows(z_target, z_draft, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Per row, Σ_x min(p(x), q(x)) with p, q the sampling distributions of the target's and
    the draft's logits (temperature 0: 1.0 where the argmaxes agree, else 0.0). (k,) float64."""
    zt = np.asarray(z_target)
    zd = np.asarray(z_draft)
    if zt.shape != zd.shape:
        raise ValueError(f"target and draft logits differ in shape: {zt.shape} vs {zd.shape}")
    if temperature == 0.0:
        return (rules.greedy(zt) == rules.greedy(zd)).astype(np.float64).reshape(-1)
    p = rules.sampling_probs(zt, temperature, top_k, top_p)
    q = rules.sampling_probs(zd, temperature, top_k, top_p)
    np.minimum(p, q, out=p)
    return np.atleast_1d(p.sum(axis=-1, dtype=np.float64))


def _log_softmax(z: np.ndarray) -> np.ndarray:
    """Row log-softmax in float32, its normaliser summed in float64."""
    d = z - z.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(d).sum(axis=-1, keepdims=True, dtype=np.float64))
    d -= lse.astype(d.dtype)
    return d


def _kl(lp: np.ndarray, p: np.ndarray, lq: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        kl = (p * (lp - lq)).sum(axis=-1, dtype=np.float64)
    bad = ~np.isfinite(kl)
    if bad.any():  # a -inf logit (p = 0 there: it contributes nothing); llama.cpp's rows never have one
        with np.errstate(invalid="ignore"):
            kl[bad] = np.where(p[bad] > 0, p[bad] * (lp[bad] - lq[bad]), 0.0).sum(axis=-1, dtype=np.float64)
    return np.maximum(kl, 0.0)


def kl_rows(z_target, z_draft) -> np.ndarray:
    """Per row, KL(p‖q) = Σ p (log p − log q) of the untempered softmaxes (p: target, q:
    draft), in nats. (k,) float64, never negative."""
    zt = np.atleast_2d(np.asarray(z_target, dtype=np.float32))
    zd = np.atleast_2d(np.asarray(z_draft, dtype=np.float32))
    lp = _log_softmax(zt)
    return _kl(lp, np.exp(lp), _log_softmax(zd))


@dataclass
class Rows:
    """The figures of one chunk of positions for one draft against the target."""

    agree: np.ndarray  # bool: argmax q == argmax p
    alpha: np.ndarray  # Σ min(p, q) at the chosen temperature
    kl: np.ndarray  # KL(p‖q), T = 1
    h_draft: np.ndarray
    h_target: np.ndarray
    overlap: np.ndarray  # top-N overlap


class TargetRows:
    """What every draft is compared with in a chunk of the target's logits, computed once:
    argmax, entropy, top-N sets, the untempered log-softmax and softmax."""

    def __init__(self, z_target: np.ndarray, top_n: int) -> None:
        self.z = np.atleast_2d(np.asarray(z_target, dtype=np.float32))
        self.best = rules.greedy(self.z)
        self.h = np.atleast_1d(rules.entropy(self.z))
        self.top_n = min(int(top_n), self.z.shape[-1])
        self.top = rules.top_n_sets(self.z, self.top_n)
        self.logp = _log_softmax(self.z)
        self.p = np.exp(self.logp)


def position_rows(target: TargetRows, z_draft: np.ndarray, *, temperature: float, top_k: int, top_p: float) -> Rows:
    """All per-position figures of a chunk (k, V) of a draft's logits against the target's
    (the same positions, the shared vocabulary)."""
    zd = np.atleast_2d(np.asarray(z_draft, dtype=np.float32))
    agree = target.best == rules.greedy(zd)
    lq = _log_softmax(zd)
    q = np.exp(lq)
    if temperature == 0.0:
        alpha = agree.astype(np.float64)
    elif temperature == 1.0 and top_k == 0 and top_p >= 1.0:
        alpha = np.minimum(target.p, q).sum(axis=-1, dtype=np.float64)  # the softmaxes are the sampling laws
    else:
        alpha = alpha_rows(target.z, zd, temperature, top_k, top_p)
    return Rows(
        agree=np.asarray(agree, dtype=bool).reshape(-1),
        alpha=np.atleast_1d(alpha),
        kl=_kl(target.logp, target.p, lq),
        h_draft=np.atleast_1d(rules.entropy(zd)),
        h_target=target.h,
        overlap=rules.sets_overlap(rules.top_n_sets(zd, target.top_n), target.top),
    )


# -------------------------------------------------------------------- SD along a text


@dataclass
class Simulated:
    """What greedy SD (or EASD) would do along texts: counts pooled over them."""

    tokens: int = 0
    verifies: int = 0  # target verify calls: one per block
    drafted: int = 0  # draft tokens proposed (one draft decode each)
    accepted: int = 0  # draft tokens accepted by the SD test
    bonus: int = 0  # blocks whose every draft token was accepted
    fires: int = 0  # EASD gate fires (a fire ends its block)
    verify_sizes: dict[int, int] | None = None  # tokens per verify batch (g + 1) -> blocks

    @property
    def tokens_per_verify(self) -> float:
        return self.tokens / self.verifies if self.verifies else float("nan")

    def add(self, other: "Simulated") -> None:
        self.tokens += other.tokens
        self.verifies += other.verifies
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.bonus += other.bonus
        self.fires += other.fires
        sizes = self.verify_sizes if self.verify_sizes is not None else {}
        for k, v in (other.verify_sizes or {}).items():
            sizes[k] = sizes.get(k, 0) + v
        self.verify_sizes = sizes


def agreement_runs(agree: Sequence[bool]) -> np.ndarray:
    """``runs[i]``: how many positions from i on agree in a row (0 where i does not)."""
    a = np.asarray(agree, dtype=bool)
    runs = np.zeros(a.size + 1, dtype=np.int64)
    for i in range(a.size - 1, -1, -1):
        runs[i] = runs[i + 1] + 1 if a[i] else 0
    return runs[:-1]


def simulate(agree: Sequence[bool], gamma: int, budget: int | None = None, fires: Sequence[bool] | None = None,
             runs: np.ndarray | None = None) -> Simulated:
    """Greedy SD (``fires`` None) or greedy EASD along one text of ``len(agree)`` positions.

    A block at position i drafts g = min(gamma, budget − i) tokens (``budget``: the run's
    max tokens; the text's end stops it too) and accepts them while they agree; in EASD an
    accepted position where ``fires`` is true is re-picked by the target and ends the block.
    The block emits its accepted tokens plus one (the correction, the re-pick or the bonus),
    cut at the text's end. Positions after a fire are taken from the text as they are: EASD's
    own text would part from it there, which this cannot follow."""
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    n = len(agree)
    if runs is None:
        runs = agreement_runs(agree)
    fire = None if fires is None else np.asarray(fires, dtype=bool)
    limit = n if budget is None else min(n, budget)
    out = Simulated(verify_sizes={})
    i = 0
    while i < limit:
        g = gamma if budget is None else min(gamma, budget - i)
        k = int(min(runs[i], g, n - i))
        if k == n - i:
            g = k  # every token to the text's end accepted: drafting stopped at its last (end-of-generation) token
        fired = False
        if fire is not None and k:
            hit = np.flatnonzero(fire[i : i + k])
            if hit.size:
                k, fired = int(hit[0]), True  # accepted up to the fire; the fired token is re-picked
        emitted = min(k + 1, n - i)
        out.verifies += 1
        out.drafted += g
        out.accepted += k + (1 if fired else 0)
        out.fires += int(fired)
        if not fired and k == g and emitted == k + 1:
            out.bonus += 1
        out.verify_sizes[g + 1] = out.verify_sizes.get(g + 1, 0) + 1
        out.tokens += emitted
        i += emitted
    return out


def iid_tokens_per_verify(alpha: float, gamma: int) -> float:
    """Expected tokens per verify of SD at draft length ``gamma`` when every draft token is
    accepted independently with probability ``alpha``: (1 − α^(γ+1)) / (1 − α)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


# ------------------------------------------------------------------------- speed


@dataclass(frozen=True)
class Costs:
    """Seconds per decode on this machine, from the timing probe."""

    target_token: float  # the target, one token, logits at it (a `target` mode step)
    target_verify: dict[int, float]  # k tokens, logits at every one -> seconds (an SD verify of gamma = k - 1)
    draft_token: float  # the draft, one token, logits at it (one drafting step)
    draft_two: float  # the draft, two tokens, logits at the last (the catch-up after a bonus block)


def sd_seconds(sim: Simulated, costs: Costs) -> float:
    """Decode time of greedy SD as simulated: every drafted token is one draft decode (the
    first of a block after a bonus block catches up two tokens), every block one verify."""
    verify = sum(n * costs.target_verify[k] for k, n in (sim.verify_sizes or {}).items())
    return sim.drafted * costs.draft_token + sim.bonus * (costs.draft_two - costs.draft_token) + verify


def speedup(sim: Simulated, costs: Costs) -> float:
    """Predicted tokens/s of SD over the target alone: the target's time for the same tokens
    ÷ SD's (decode time only: prompt and the Python controller left out)."""
    t = sd_seconds(sim, costs)
    return sim.tokens * costs.target_token / t if t > 0 else float("nan")


def iid_speedup(alpha: float, gamma: int, costs: Costs) -> float:
    """The same for sampled SD from the i.i.d. formula: per block gamma draft decodes, a catch-up
    when all were accepted (probability α^γ) and one verify of gamma + 1 tokens."""
    e = iid_tokens_per_verify(alpha, gamma)
    block = gamma * costs.draft_token + alpha ** gamma * (costs.draft_two - costs.draft_token) \
        + costs.target_verify[gamma + 1]
    return e * costs.target_token / block
