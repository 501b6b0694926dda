#!/usr/bin/env python
"""Would the target's confidence tell the lookup drafter when not to draft? Replays prompt lookup
along the target's own greedy texts of a ``bench_lookup.py`` run, as ``lookup_replay.py`` does
(the drafter's policy, one book through the set, priced with the recorded verify costs), with one
rule added: draft only where the target gave the last emitted token a probability of at least
``theta`` (its top probability there; the rows come from one teacher-forced decode of each text).
``theta`` 0 is the policy as it is.

    python scripts/lookup_confidence.py results/lookup-code-256.jsonl results/lookup-gsm8k-256.jsonl
    python scripts/lookup_confidence.py RUN.jsonl --thetas 0,0.5,0.9

Printed per run and theta: the median and smallest speed-up over the texts (decode time only).
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from lookup_replay import recorded_costs, target_texts  # noqa: E402  (the replay's costs and texts)


def confidences(m, prompt: list[int], text: list[int]) -> list[float]:
    """The target's top probability at each token of ``text`` (one teacher-forced decode)."""
    m.reset()
    rows = m.decode(prompt + text[:-1], logits_at=range(len(prompt) - 1, len(prompt) + len(text) - 1))
    return [1.0 / float(np.exp(z - z.max(), dtype=np.float64).sum()) for z in rows]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("runs", nargs="+", type=Path, help="bench_lookup.py --json files")
    ap.add_argument("--thetas", default="0,0.3,0.5,0.7,0.8,0.9,0.95,0.99")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    for f in a.runs:
        if not f.is_file():
            ap.error(f"{f}: no such file (a bench_lookup.py --json output)")
    try:
        thetas = [float(x) for x in a.thetas.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--thetas {a.thetas!r}: want comma-separated numbers")
    from easd_local.engine.drafters.policy import AcceptanceBook
    from easd_local.llamacpp.runtime import LoadOptions, Model
    from easd_local.pairscore.lookup import simulate

    got = recorded_costs()
    if got is None:
        return 2
    files, _, costs = got
    with Model(files.target, LoadOptions(n_ctx=4096, n_threads=a.threads)) as m:
        for f in a.runs:
            texts = [(p, t, confidences(m, p, t)) for p, t in target_texts(f, m.vocab)]
            for theta in thetas:
                book = AcceptanceBook(costs)
                # no proposal where the target's top probability at the last emitted token is below theta
                xs = [simulate(p, t, book, may_draft=lambda i, c=c: i == 0 or c[i - 1] >= theta).speedup
                      for p, t, c in texts]
                print(f"{f.name}: {len(xs)} texts, theta {theta:g}: median {statistics.median(xs):.3f}x, "
                      f"min {min(xs):.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
