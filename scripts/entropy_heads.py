#!/usr/bin/env python
"""How a real model's logits rows look to the EASD gate's bounded entropy (``gate.entropy_against``):
how many tokens lie within 12, 20 and 28 nats of each row's best, and at how many positions the
bounds from the tokens within 20 nats settle ``H >= tau`` without the exact entropy.

    python scripts/entropy_heads.py                         # the default pair's target, 2 GSM8K questions
    python scripts/entropy_heads.py --model T.gguf --n-prompts 5 --max-tokens 128 --tau 0.6

The model writes its own greedy answer to each question (chat template, one sequence); every
row it produced is read. Printed: the median, 10th and 90th percentile of the counts; the share
of rows whose bounds settle the decision at ``--tau`` (default: the target's default
threshold); the decisions that differ from the exact entropy's (there should be none); and the
largest gap between the figure reported and the exact entropy; and what the decision costs a
row, as the decoding steps pay it straight after a decode (64 MB swept through the caches
before each call): ``entropy_against`` finding the row's maximum itself, and given it (the
logit of the argmax a greedy step took anyway). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from easd_local.bench.datasets import load_dataset  # noqa: E402
from easd_local.bench.prompt import build_messages  # noqa: E402
from easd_local.engine import gate  # noqa: E402
from easd_local.engine.config import DEFAULT_TAU_TARGET  # noqa: E402
from easd_local.llamacpp.runtime import LoadOptions, Model  # noqa: E402

WITHIN = (12.0, 20.0, 28.0)  # nats below the best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", help="a GGUF file; default: the default pair's target")
    ap.add_argument("--n-prompts", type=int, default=2, help="GSM8K questions")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--tau", type=float, default=DEFAULT_TAU_TARGET, help="the threshold H is compared with")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    from easd_local.store.resolve import resolve_pair

    if a.model and not Path(a.model).is_file():
        ap.error(f"--model {a.model}: no such file")
    path = a.model or resolve_pair("default", None, None).target
    counts: list[list[int]] = [[] for _ in WITHIN]
    settled = differ = unequal = 0
    gap = 0.0
    n_rows = 0
    us_own: list[float] = []
    us_given: list[float] = []
    sweep = np.ones(64 << 18, dtype=np.float32)  # 64 MB: about what a decode leaves of the caches

    def cold_us(fn) -> float:
        sweep.sum()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6

    with Model(path, LoadOptions(n_ctx=2048, n_threads=a.threads)) as m:
        for p in load_dataset("gsm8k", limit=a.n_prompts):
            m.reset()
            toks = m.vocab.chat_tokens(build_messages(p.question))
            z = m.decode(toks, logits_at=(-1,))[0]
            eog = m.vocab.eog_ids()
            for _ in range(a.max_tokens):
                for c, d in zip(counts, WITHIN):
                    c.append(int(np.count_nonzero(z >= z.max() - np.float32(d))))
                h = float(gate.entropy(z))
                b = gate.entropy_bounds(z)
                got = gate.entropy_against(z, a.tau)
                n_rows += 1
                if gate.settles(b, a.tau):
                    settled += 1
                    gap = max(gap, abs(got - h))
                differ += (got >= a.tau) != (h >= a.tau)
                t = int(z.argmax())
                unequal += gate.entropy_against(z, a.tau, z[t]) != got  # given the maximum: the very same figure
                own = (us_own, None)  # finding the row's maximum itself
                given = (us_given, z[t])  # given it: the argmax's logit
                for times, top in (own, given) if n_rows % 2 else (given, own):  # the order alternates by row
                    times.append(cold_us(lambda: gate.entropy_against(z, a.tau, top)))
                if t in eog:
                    break
                z = m.decode([t], logits_at=(-1,))[0]
    print(f"{Path(path).name}: {n_rows} rows of {a.n_prompts} greedy answers, vocabulary {z.size:,}")
    for c, d in zip(counts, WITHIN):
        print(f"tokens within {d:g} nats of the best: median {np.median(c):,.0f}, "
              f"10th percentile {np.percentile(c, 10):,.0f}, 90th {np.percentile(c, 90):,.0f}")
    print(f"H >= {a.tau:g} settled by the bounds at {settled} of {n_rows} rows ({100.0 * settled / n_rows:.0f} %); "
          f"decisions that differ from the exact entropy's: {differ}; largest |reported - exact| where settled: "
          f"{gap:.5f} nats")
    print(f"the decision, µs a row after 64 MB swept through the caches (median): finding the row's maximum "
          f"{np.median(us_own):.0f}, given it {np.median(us_given):.0f} (figures that differ between the two: {unequal})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
