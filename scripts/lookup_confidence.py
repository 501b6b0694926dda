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
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import bench_lookup as B  # noqa: E402  (its request sets)


def replay(prompt, text, book, conf, theta: float, costs, size_n: int = 2, size_m: int = 16) -> float:
    """``pairscore.lookup.simulate``'s loop with the confidence rule: no proposal where the
    target's top probability at the last emitted token is below ``theta``."""
    from easd_local.engine.drafters import lookup as L
    from easd_local.pairscore.lookup import K_MAX

    seq, idx = list(prompt), L._SlotIndex(0, size_n)
    i, n, cost = 0, len(text), 0.0
    while i < n:
        e, length = L.match(seq, idx)
        k = 0
        if e >= 0 and (i == 0 or conf[i - 1] >= theta):
            k = book.length(length, min(size_m, len(seq) - e, n - i - 1, K_MAX))
        proposal = seq[e:e + k] if k else []
        a = 0
        while a < len(proposal) and proposal[a] == text[i + a]:
            a += 1
        if k:
            book.record(length, k, a)
        emitted = min(a + 1, n - i)
        cost += costs[min(k, len(costs) - 1)]
        seq.extend(text[i:i + emitted])
        i += emitted
    return n / cost


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
    from easd_local.engine.drafters.policy import AcceptanceBook, extend_costs
    from easd_local.llamacpp.runtime import LoadOptions, Model
    from easd_local.pairscore.lookup import K_MAX
    from easd_local.store import costs as cost_store
    from easd_local.store.resolve import resolve_pair

    files = resolve_pair(None, None, None)
    rec = cost_store.find(cost_store.costs_key(files.draft, files.target, 2, 0, None))
    if not rec or not rec.get("verify_costs"):
        print("error: no verify costs recorded for the default pair at 2 threads (run `easd-local pair costs`)",
              file=sys.stderr)
        return 2
    costs = extend_costs(rec["verify_costs"], K_MAX)
    with Model(files.target, LoadOptions(n_ctx=4096, n_threads=a.threads)) as m:
        vocab = m.vocab
        for f in a.runs:
            rows = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
            which = rows[0].get("set", "code")
            reqs = {q["id"]: q["text"] for q in B.load_requests(which, None)}
            texts = []
            for r in rows:
                if r["system"] != "ours" or r["method"] != "target":
                    continue
                chat = vocab.apply_chat_template([{"role": "user", "content": reqs[r["request"]]}])
                prompt = vocab.tokenize(chat, add_special=True, parse_special=True)
                text = r["token_ids"]
                m.reset()
                conf = []
                for z in m.decode(prompt + text[:-1], logits_at=range(len(prompt) - 1, len(prompt) + len(text) - 1)):
                    conf.append(1.0 / float(np.exp(z - z.max(), dtype=np.float64).sum()))
                texts.append((prompt, text, conf))
            for theta in thetas:
                book = AcceptanceBook(costs)
                xs = [replay(p, t, book, c, theta, costs) for p, t, c in texts]
                print(f"{f.name}: {len(xs)} texts, theta {theta:g}: median {statistics.median(xs):.3f}x, "
                      f"min {min(xs):.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
