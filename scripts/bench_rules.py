#!/usr/bin/env python
"""The controller's numpy rules at the real vocabulary, the code before issue 46 against the
code now, side by side in one process (so load on the machine hits both alike): microseconds
per call on LM-like rows 151,936 wide (a bulk 20-odd nats below a few leaders, as a real
Qwen2.5 row), the better of ``--repeats`` rounds.

    python scripts/bench_rules.py
    python scripts/bench_rules.py --json

Then plain sampling at T = 0.7 by the share of the row within 30 tempered nats of its best
(rows with a wider or narrower bulk): the distribution held sparse (``dist.tempered`` made to
keep it so) against the dense softmax, and what ``rules.distribution`` does now (sparse under
half the row, else dense).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from easd_local.engine import dist, gate, rules  # noqa: E402

V = 151_936


# ------------------------------------------------------------------ before issue 46
def old_entropy(z):
    d = z - z.max(axis=-1, keepdims=True)
    e = np.exp(d)
    s = e.sum(axis=-1, dtype=np.float64)
    np.multiply(e, d, out=d)
    t = d.sum(axis=-1, dtype=np.float64)
    return np.log(s) - t / s


def old_top_n(z, n):
    return z.argpartition(z.shape[-1] - n, axis=-1)[:, -n:]


def old_probs(z, T):
    zt = z / z.dtype.type(T)
    e = zt - zt.max(axis=-1, keepdims=True)
    np.exp(e, out=e)
    e *= (1.0 / e.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(e.dtype)
    return e


def old_sample(p, rng):
    cs = np.cumsum(p, dtype=np.float64)
    return int(np.searchsorted(cs, rng.random() * cs[-1], side="right"))


def old_residual(p, q):
    r = np.maximum(p - q, 0)
    return r / r.dtype.type(r.sum(dtype=np.float64))


def lm_row(rng) -> np.ndarray:
    z = rng.normal(-3.0, 2.0, V).astype(np.float32)
    z[rng.integers(0, V, 40)] += rng.uniform(15, 24, 40).astype(np.float32)
    return z


def best_us(fn, repeats: int, n: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return 1e6 * best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    z1 = lm_row(rng)[None, :]
    z2 = lm_row(rng)[None, :]
    p, q = old_probs(z1, 0.7)[0], old_probs(z2, 0.7)[0]
    cases = {
        "entropy (1 row)": (lambda: old_entropy(z1), lambda: gate.entropy(z1), 20),
        "top-5 set (1 row)": (lambda: old_top_n(z1, 5), lambda: gate.top_n_sets(z1, 5), 20),
        "softmax T=0.7 (1 row)": (lambda: old_probs(z1, 0.7), lambda: rules.sampling_probs(z1, 0.7), 20),
        "sample (1 row)": (lambda: old_sample(p, np.random.default_rng(1)),
                           lambda: rules.sample(p, np.random.default_rng(1)), 10),
        "residual (1 row)": (lambda: old_residual(p, q), lambda: rules.residual(p, q), 20),
    }
    out = {}
    for name, (old, new, n) in cases.items():  # interleaved: drift in load hits both alike
        o = best_us(old, a.repeats, n)
        w = best_us(new, a.repeats, n)
        out[name] = {"before_us": round(o, 1), "after_us": round(w, 1)}
    shares = []
    for spread in (3.0, 4.0, 5.0, 6.0, 10.0):  # the bulk's width: the wider, the more tokens near the best
        z = rng.normal(0.0, spread, V).astype(np.float32)
        z[7] += 12.0
        near = int(np.count_nonzero(z >= z.max() - np.float32(gate.TAIL_NATS * 0.7)))
        shares.append({"share": round(near / V, 3),
                       "sparse_us": round(best_us(lambda: dist.tempered(z, 0.7, max_share=1.0), a.repeats, 10), 1),
                       "dense_us": round(best_us(lambda: old_probs(z[None, :], 0.7), a.repeats, 10), 1),
                       "now_us": round(best_us(lambda: rules.distribution(z, 0.7), a.repeats, 10), 1)})
    load = round(os.getloadavg()[0], 2)
    if a.json:
        print(json.dumps({"n_vocab": V, "loadavg": load, "rules": out, "plain_sampling_by_share": shares}))
        return 0
    print(f"numpy rules at {V:,} tokens, before issue 46 vs now, best of {a.repeats} rounds; load average {load}")
    print(f"{'':24} {'before us':>10} {'after us':>10}")
    for name, r in out.items():
        print(f"{name:24} {r['before_us']:>10} {r['after_us']:>10}")
    print("plain sampling at T=0.7, by the share of the row within 30 tempered nats of its best (us)")
    print(f"{'share':>8} {'sparse':>10} {'dense':>10} {'now':>10}")
    for r in shares:
        print(f"{r['share']:>8} {r['sparse_us']:>10} {r['dense_us']:>10} {r['now_us']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
