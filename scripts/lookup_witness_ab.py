#!/usr/bin/env python3
"""The lookup drafter's witness, live: prompt lookup with and without it, and the target alone,
side by side per request in one process on the default pair (greedy, decode tokens/s); or, with
``--compare stop-loss``, the drafter with and without its ledger per sequence (``policy.Ledger``).

    python scripts/lookup_witness_ab.py --set gsm8k --limit 20 --json results/lookup-witness-ab-gsm8k.jsonl
    python scripts/lookup_witness_ab.py --set code --limit 20
    python scripts/lookup_witness_ab.py --set gsm8k --limit 20 --compare stop-loss

``ngram-simple`` as it is (its ``AcceptanceBook`` counts acceptance apart by the matched
n-gram's second witness, ``policy.WITNESSES``) against the same drafter told every match has
none (``ONCE``: the policy before the witness), each with its own book carried through the set
as a server's drafter carries it, and the target alone; the three runs of a request one after
another, their order reversed on odd requests, so that the drift of a shared machine falls on
all three. Requests and their rendering are ``bench_lookup.py``'s. Printed per request: tok/s
of each and the two lookups' ratios to the target; then the medians, and the witness's ratio
to the one without (per request, its median); with ``--compare stop-loss`` they are named
stop-loss and no-stop-loss (both witnessed). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import bench_lookup as B  # noqa: E402  (its requests, its run of ours)

LABELS = {"witness": ("witness", "no-witness"), "stop-loss": ("stop-loss", "no-stop-loss")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--set", choices=("code", "gsm8k"), default="gsm8k")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write one row per (request, method)")
    ap.add_argument("--compare", choices=("witness", "stop-loss"), default="witness",
                    help="what the drafter is run without (default: its witness)")
    a = ap.parse_args(argv)
    from easd_local.engine.config import DecodeConfig
    from easd_local.engine.drafters import make
    from easd_local.engine.drafters.lookup import LookupDrafter
    from easd_local.engine.drafters.policy import AcceptanceBook
    from easd_local.engine.pair import open_models
    from easd_local.llamacpp.runtime import LoadOptions
    from easd_local.store import costs as cost_store
    from easd_local.store.resolve import resolve_pair

    files = resolve_pair(None, None, None)
    rec = cost_store.find(cost_store.costs_key(files.draft, files.target, a.threads, 0, None))
    costs = rec.get("verify_costs") if rec else None
    if not costs:
        print("error: no verify costs recorded for the default pair (run `easd-local pair costs`)", file=sys.stderr)
        return 2
    requests = B.load_requests(a.set, a.limit)
    cfg = DecodeConfig(mode="target", max_tokens=a.max_tokens, temperature=0.0)
    rows = []
    load0 = os.getloadavg()[0]
    with ExitStack() as stack:
        out = stack.enter_context(open(a.json, "w", encoding="utf-8")) if a.json else None
        pair = stack.enter_context(open_models(None, files.target, LoadOptions(n_threads=a.threads, n_gpu_layers=0)))
        pair.verify_costs = costs
        on, off = LABELS[a.compare]
        methods = ("target", on, off)
        drafters = {on: make("ngram-simple", None, costs)}
        drafters[off] = LookupDrafter(AcceptanceBook(drafters[on].book.costs), witnessed=a.compare != "witness",
                                      stop_loss=a.compare != "stop-loss")
        B.run_ours(pair, pair.target.vocab.tokenize("Hello", add_special=True), "target", cfg)  # warm-up
        for i, q in enumerate(requests):
            chat = pair.target.vocab.apply_chat_template([{"role": "user", "content": q["text"]}])
            tokens = pair.target.vocab.tokenize(chat, add_special=True, parse_special=True)
            got = {}
            for m in (methods if i % 2 == 0 else methods[::-1]):
                if m != "target":
                    pair.use_drafter("ngram-simple", drafters[m])
                r = B.run_ours(pair, tokens, "target" if m == "target" else "ngram-simple", cfg)
                got[m] = r
                row = {"request": q["id"], "method": m, "tokens": r["tokens"], "tok_s": r["tok_s"],
                       "drafted": r["drafted"], "accepted": r["accepted"], "set": a.set}
                rows.append(row)
                if out:
                    out.write(json.dumps(row) + "\n")
                    out.flush()
            t = got["target"]["tok_s"]
            print(f"{q['id']:26s} target {t:6.2f}  " + "  ".join(
                f"{m} {got[m]['tok_s']:6.2f} ({got[m]['tok_s'] / t:.3f}x)" for m in (on, off)), flush=True)
    by = {m: {r["request"]: r["tok_s"] for r in rows if r["method"] == m} for m in methods}
    ids = list(by["target"])
    w = [by[on][k] / by["target"][k] for k in ids]
    b = [by[off][k] / by["target"][k] for k in ids]
    wb = [by[on][k] / by[off][k] for k in ids]
    print(f"\n{a.set}, {len(ids)} requests, {a.max_tokens} tokens, {a.threads} threads; load {load0:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end")
    for name, xs in ((f"{on} / target", w), (f"{off} / target", b), (f"{on} / {off}", wb)):
        print(f"{name:26s} median {statistics.median(xs):.3f}  min {min(xs):.3f}  max {max(xs):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
