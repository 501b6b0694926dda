"""Small, dependency-free statistics for benchmark reports."""

from __future__ import annotations

import math
from fractions import Fraction

Z95 = 1.959964  # two-sided 95% normal quantile


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k/n; (0.0, 1.0) when n == 0.

    lo, hi = (p + z²/2n ∓ z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), clamped to [0, 1]
    (and exactly 0 when k == 0, exactly 1 when k == n).
    """
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar test on the discordant pairs (b wins, c losses).

    p = min(1, 2 · Σ_{i ≤ min(b,c)} C(b+c, i) / 2^(b+c)); 1.0 when b + c == 0.
    Computed with exact integers, so it is right for any n.
    """
    if b < 0 or c < 0:
        raise ValueError(f"counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = 0
    term = 1  # C(n, 0); C(n, i+1) = C(n, i)·(n-i)/(i+1), exact in integers
    for i in range(min(b, c) + 1):
        tail += term
        term = term * (n - i) // (i + 1)
    p = Fraction(2 * tail, 2**n)
    return float(min(Fraction(1), p))
