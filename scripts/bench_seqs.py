#!/usr/bin/env python3
"""What batching several sequences buys from llama.cpp itself on this machine: milliseconds
per ``decode_batch`` step of B sequences × 1 token (what the batched engine issues for
``target`` and ``easd-tf``), against one sequence × 1 token, at a given filled context.

    python scripts/bench_seqs.py [--target T.gguf] [--batches 1,4] [--fill 110,400] [--steps 12] [--threads 2]

Each (fill, B): a fresh context of B sequences (unified KV, ``--ctx`` each, as the engine
loads it), every sequence prefilled with ``fill`` random tokens, then ``--steps`` steps of
one token per sequence, timed. The engine's speed-up from batching cannot exceed
(B × ms per 1-token step) / (ms per B-token step). Figures are printed, never asserted.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speed import default_pair  # noqa: E402  (one lookup of the pulled default pair)

from easd_local.llamacpp.runtime import LoadOptions, Model, Part  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=None, help="a GGUF (default: the default pair's target)")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--fill", default="110,400", help="tokens already in each sequence")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--ctx", type=int, default=4096, help="context per sequence")
    a = ap.parse_args()
    target = a.target or default_pair()[1]
    if target is None:
        ap.error("no --target given and the default pair is not pulled")
    rng = np.random.default_rng(0)
    print(f"{target.name}, threads {a.threads}, ctx {a.ctx}/sequence, {a.steps} steps; load {os.getloadavg()[0]:.2f}")
    print(f"{'fill':>5} {'B':>3} {'ms/step':>8} {'ms/token':>9} {'tokens/s':>9}")
    base: dict[int, float] = {}
    for fill in (int(x) for x in a.fill.split(",")):
        for b in (int(x) for x in a.batches.split(",")):
            with Model(target, LoadOptions(n_ctx=a.ctx, n_threads=a.threads, n_seq=b)) as m:
                for s in range(b):
                    m.decode_batch([Part(s, [int(t) for t in rng.integers(100, 20000, fill)], ())])
                m.decode_batch([Part(s, [int(rng.integers(100, 20000))]) for s in range(b)])  # warm-up
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    m.decode_batch([Part(s, [int(rng.integers(100, 20000))]) for s in range(b)])
                dt = (time.perf_counter() - t0) / a.steps
            base.setdefault(fill, dt if b == 1 else float("nan"))
            gain = f"  × B=1 {b * base[fill] / dt:.2f}" if b > 1 and base[fill] == base[fill] else ""
            print(f"{fill:>5} {b:>3} {dt * 1000:>8.1f} {dt * 1000 / b:>9.1f} {b / dt:>9.1f}{gain}", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
