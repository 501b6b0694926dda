#!/usr/bin/env python
"""Prompt lookup replayed along the target's own greedy texts of a ``bench_lookup.py`` run, priced
with this machine's recorded verify costs (``easd-local pair costs``): what the lookup drafter's
policy gives (``pairscore.lookup.simulate``, one drafter's book carried through the set, as a
server's), the same policy blind to its second witness (every match counted as ``ONCE``: the
policy before it), the policy without its stop-loss per text (``policy.Ledger``), with the
stop-loss's first form (break-even after 8 decodes, sessions 23-29), and what a
drafter that followed the same places and knew how many of its tokens would be accepted would
give (the ceiling of any length policy). Decode time only, no
llama.cpp decode: the target's texts and the prompts (tokenized with the target's vocabulary)
are all it reads.

    python scripts/lookup_replay.py results/lookup-code-256.jsonl results/lookup-gsm8k-256.jsonl
    python scripts/lookup_replay.py --study results/study/gsm8k-greedy.jsonl --skip 10 --limit 100

``--costs``: the verify costs the policy decides with, instead of the recorded ones (extended
past their range as a drafter extends them). ``--price``: a ``scripts/verify_curve.py --json``
output; every policy, and the ceiling, is priced with that measured curve instead of the costs
it decides with (so two cost records can be compared on one curve):

    python scripts/lookup_replay.py results/lookup-code-256.jsonl --price results/verify-curve-s25.json \
        --costs 1.0,1.67,2.24,2.37,2.97,3.63,4.06,7.31,7.27

``--study``: the quality study's greedy answers of the target alone (its ``completion`` texts,
tokenized again, their first 256 tokens) to GSM8K questions after the first ``--skip`` (the
256-token bench's ten), each after the question as ``bench_lookup.py`` renders it (the study's
own prompt differed: an approximation of the prompt, held-out texts).
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


def priced(sim, price) -> float:
    """A simulation's speed-up with its verifies priced at ``price`` (one-token decodes per k
    drafted tokens) rather than the costs its policy decided with."""
    return sim.tokens / sum(n * price[min(k, len(price) - 1)] for k, n in sim.proposals.items())


def recorded_costs(given: list[float] | None = None):
    """(the default pair's files, the costs record, its verify costs extended to ``K_MAX``
    drafted tokens, or ``given``'s), or None with the message printed when none were given and
    none were recorded at 2 threads."""
    from easd_local.engine.drafters.policy import extend_costs
    from easd_local.pairscore.lookup import K_MAX
    from easd_local.store import costs as cost_store
    from easd_local.store.resolve import resolve_pair

    files = resolve_pair(None, None, None)
    rec = cost_store.find(cost_store.costs_key(files.draft, files.target, 2, 0, None)) or {}
    if given is not None:
        return files, rec, extend_costs(given, K_MAX)
    if not rec.get("verify_costs"):
        print("error: no verify costs recorded for the default pair at 2 threads (run `easd-local pair costs`)",
              file=sys.stderr)
        return None
    return files, rec, extend_costs(rec["verify_costs"], K_MAX)


def read_curve(path: Path) -> list[float] | None:
    """A ``verify_curve.py --json`` file's costs by tokens (k = 1..), None if it holds none."""
    try:
        curve = json.loads(path.read_text(encoding="utf-8"))["cost_by_tokens"]
        out = [float(curve[str(k)]) for k in range(1, len(curve) + 1)]
    except (ValueError, KeyError, TypeError):
        return None
    return out if out and out[0] > 0 else None


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
    ap.add_argument("runs", nargs="*", type=Path, help="bench_lookup.py --json files")
    ap.add_argument("--study", type=Path, help="the study's gsm8k-greedy.jsonl (its target answers)")
    ap.add_argument("--skip", type=int, default=10, help="with --study: GSM8K questions skipped first")
    ap.add_argument("--limit", type=int, default=100, help="with --study: answers replayed")
    ap.add_argument("--costs", help="verify costs to decide with, k = 0.. comma-separated (default: the recorded)")
    ap.add_argument("--price", type=Path, help="price with this verify_curve.py --json curve")
    a = ap.parse_args(argv)
    try:
        decide = [float(x) for x in a.costs.split(",")] if a.costs else None
    except ValueError:
        ap.error(f"--costs: numbers separated by commas, got {a.costs!r}")
    if decide is not None and (not decide or decide[0] <= 0):
        ap.error("--costs: the first (no draft: one decode) must be positive")
    for f in a.runs + ([a.study] if a.study else []) + ([a.price] if a.price else []):
        if not f.is_file():
            ap.error(f"{f}: no such file")
    if not a.runs and not a.study:
        ap.error("give bench_lookup.py --json files, or --study")
    curve = read_curve(a.price) if a.price else None
    if a.price and curve is None:
        ap.error(f"--price {a.price}: not a verify_curve.py --json file")
    from easd_local.engine.drafters.policy import AcceptanceBook, Ledger, extend_costs
    from easd_local.llamacpp.runtime import ModelFile
    from easd_local.pairscore.lookup import K_MAX, simulate

    got = recorded_costs(decide)
    if got is None:
        return 2
    files, rec, costs = got
    said = "given (--costs)" if decide is not None else f"recorded {rec.get('date')}"
    print(f"verify costs {said}: " + ", ".join(f"{k}: {c:.2f}" for k, c in enumerate(costs[:17])))
    price = extend_costs(curve, K_MAX) if curve else costs
    if curve:
        print(f"priced with {a.price.name}: " + ", ".join(f"{k}: {c:.2f}" for k, c in enumerate(price[:17])))
    vocab = ModelFile(files.target).vocab
    sets = [(f.name, target_texts(f, vocab)) for f in a.runs]
    if a.study:
        sets.append((f"{a.study.name} (questions {a.skip + 1}-)", study_texts(a.study, vocab, a.skip, a.limit)))
    for name, texts in sets:
        book, blind_book, loose_book, first_book = (AcceptanceBook(costs) for _ in range(4))
        policy, blind, loose, first, best = [], [], [], [], []
        for prompt, text in texts:
            policy.append(priced(simulate(prompt, text, book), price))
            blind.append(priced(simulate(prompt, text, blind_book, witnessed=False), price))
            loose.append(priced(simulate(prompt, text, loose_book, ledger=False), price))
            first.append(priced(simulate(prompt, text, first_book, ledger=Ledger(slack=0.0, warm=8.0)), price))
            best.append(oracle(prompt, text, price))
        for what, xs in (("the drafter's policy", policy), ("the policy blind to its witness", blind),
                         ("the policy without its stop-loss", loose),
                         ("the policy with its first stop-loss (break-even after 8 decodes)", first),
                         ("knowing the accepted length", best)):
            print(f"{name}: {len(xs)} texts, {what}: median {statistics.median(xs):.3f}x, "
                  f"mean {statistics.mean(xs):.3f}x, min {min(xs):.3f}x, max {max(xs):.3f}x, "
                  f"below 0.95x {sum(x < 0.95 for x in xs)}")
    return 0


def study_texts(path: Path, vocab, skip: int, limit: int, n_tokens: int = 256) -> list[tuple[list[int], list[int]]]:
    """(prompt, the target's answer) of the study's greedy target answers to GSM8K questions
    ``skip``.. (``--study``)."""
    answers = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line) if line.strip() else {}
        if r.get("method") == "target" and r.get("completion"):
            answers[r["index"]] = r["completion"]
    out = []
    for i, q in enumerate(B.load_requests("gsm8k", skip + 4 * limit)):
        if i >= skip and i in answers and len(out) < limit:
            text = vocab.tokenize(answers[i], add_special=False, parse_special=False)[:n_tokens]
            out.append((prompt_tokens(vocab, q["text"]), text))
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
