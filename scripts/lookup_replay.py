#!/usr/bin/env python
"""Prompt lookup replayed along the target's own greedy texts of a ``bench_lookup.py`` run, priced
with this machine's recorded verify costs (``easd-local pair costs``): what the lookup drafter's
policy gives (``pairscore.lookup.simulate``, one drafter's book carried through the set, as a
server's), and what a drafter that followed the same places and knew how many of its tokens
would be accepted would give (the ceiling of any length policy). Decode time only, no llama.cpp
decode: the target's texts and the prompts (tokenized with the target's vocabulary) are all it
reads.

    python scripts/lookup_replay.py results/lookup-code-256.jsonl results/lookup-gsm8k-256.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_lookup as B  # noqa: E402  (its request sets)


def oracle(prompt: list[int], text: list[int], costs, size_n: int = 2, size_m: int = 16) -> float:
    """Speed-up of lookup SD along ``text`` when each step proposes, of the looked-up tokens,
    exactly as many as will be accepted, if that pays at ``costs`` (else none)."""
    from easd_local.engine.drafters import lookup as L

    seq, idx, i, cost = list(prompt), L._SlotIndex(0, size_n), 0, 0.0
    while i < len(text):
        e, _ = L.match(seq, idx)
        a = 0
        if e >= 0:
            cont = seq[e:e + size_m]
            while a < len(cont) and i + a < len(text) and cont[a] == text[i + a]:
                a += 1
        best = max(range(a + 1), key=lambda k: (k + 1) / costs[k])
        emitted = min(best + 1, len(text) - i)
        cost += costs[best]
        seq.extend(text[i:i + emitted])
        i += emitted
    return len(text) / cost


def recorded_costs():
    """(the default pair's files, the costs record, its verify costs extended to ``K_MAX``
    drafted tokens), or None with the message printed when no costs were recorded at 2 threads."""
    from easd_local.engine.drafters.policy import extend_costs
    from easd_local.pairscore.lookup import K_MAX
    from easd_local.store import costs as cost_store
    from easd_local.store.resolve import resolve_pair

    files = resolve_pair(None, None, None)
    rec = cost_store.find(cost_store.costs_key(files.draft, files.target, 2, 0, None))
    if not rec or not rec.get("verify_costs"):
        print("error: no verify costs recorded for the default pair at 2 threads (run `easd-local pair costs`)",
              file=sys.stderr)
        return None
    return files, rec, extend_costs(rec["verify_costs"], K_MAX)


def load_run(run: Path) -> tuple[str, list[dict], dict[str, str]]:
    """A ``bench_lookup.py --json`` run: its request set's name, its rows, and the set's
    requests by id."""
    rows = [json.loads(line) for line in run.read_text(encoding="utf-8").splitlines() if line.strip()]
    which = rows[0].get("set", "code")
    return which, rows, {q["id"]: q["text"] for q in B.load_requests(which, None)}


def prompt_tokens(vocab, request: str) -> list[int]:
    """A request rendered and tokenized as the bench did (the chat template, one user turn)."""
    chat = vocab.apply_chat_template([{"role": "user", "content": request}])
    return vocab.tokenize(chat, add_special=True, parse_special=True)


def target_texts(run: Path, vocab) -> list[tuple[list[int], list[int]]]:
    """(prompt, the target's own text) of each request of a ``bench_lookup.py --json`` run."""
    _, rows, reqs = load_run(run)
    return [(prompt_tokens(vocab, reqs[r["request"]]), r["token_ids"])
            for r in rows if r["system"] == "ours" and r["method"] == "target"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("runs", nargs="+", type=Path, help="bench_lookup.py --json files")
    a = ap.parse_args(argv)
    for f in a.runs:
        if not f.is_file():
            ap.error(f"{f}: no such file (a bench_lookup.py --json output)")
    from easd_local.engine.drafters.policy import AcceptanceBook
    from easd_local.llamacpp.runtime import ModelFile
    from easd_local.pairscore.lookup import simulate

    got = recorded_costs()
    if got is None:
        return 2
    files, rec, costs = got
    print(f"verify costs recorded {rec.get('date')}: " + ", ".join(f"{k}: {c:.2f}" for k, c in enumerate(costs[:9])))
    vocab = ModelFile(files.target).vocab
    for f in a.runs:
        book = AcceptanceBook(costs)
        policy, best = [], []
        for prompt, text in target_texts(f, vocab):
            policy.append(simulate(prompt, text, book).speedup)
            best.append(oracle(prompt, text, costs))
        for name, xs in (("the drafter's policy", policy), ("knowing the accepted length", best)):
            print(f"{f.name}: {len(xs)} texts, {name}: median {statistics.median(xs):.3f}x, "
                  f"min {min(xs):.3f}x, max {max(xs):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
