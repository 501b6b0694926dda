#!/usr/bin/env python
"""The controller's own time per generated token, per mode, with llama.cpp taken out: each
mode's generation is run once for real on the tiny pair, every decode's logits recorded, and
then replayed many times from the record (the model's token mirror kept as a real decode
would), so what is timed is the Python that decides the tokens (steps, rules, gate,
scheduler, events) plus a small equal replay cost.

    python scripts/bench_controller.py                 # tiny pair, 10 GSM8K questions, 128 tokens
    python scripts/bench_controller.py --repeats 20 --json

Greedy, default thresholds, one sequence (``decoding.generate``). Far less sensitive to other
load on the machine than ``bench_modes.py``'s controller share (no decode to be descheduled
in), and the minimum over repeats is reported beside the median. Figures are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from easd_local.bench.datasets import load_dataset  # noqa: E402
from easd_local.bench.prompt import build_messages  # noqa: E402
from easd_local.engine import decoding  # noqa: E402
from easd_local.engine.config import DecodeConfig  # noqa: E402
from easd_local.engine.pair import load_pair  # noqa: E402
from easd_local.engine.runtime import LoadOptions, Model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_modes import tiny_pair  # noqa: E402  (the one writer of a temporary tiny pair)


class Replay:
    """Model.decode_batch recorded on the first pass, replayed afterwards."""

    def __init__(self) -> None:
        self.record: dict = {}
        self.replaying = False
        self.real = Model.decode_batch

    def __call__(self, model, parts):
        key = (id(model), tuple((tuple(model.seq_tokens(p.seq)), tuple(p.tokens), tuple(p.logits_at)) for p in parts))
        if not self.replaying:
            out = self.real(model, parts)
            self.record[key] = [z.copy() for z in out]
            return out
        for p in parts:
            model._seqs[p.seq].extend(p.tokens)
        return [z.copy() for z in self.record[key]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="target,sd,easd,easd-tf")
    ap.add_argument("--n-prompts", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    draft, target = tiny_pair()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    pair = load_pair(draft, target, LoadOptions(n_ctx=2048))
    prompts = [pair.target.vocab.chat_tokens(build_messages(p.question))
               for p in load_dataset("gsm8k", limit=a.n_prompts)]
    replay = Replay()
    Model.decode_batch = lambda model, parts: replay(model, parts)

    def run_all(mode: str) -> tuple[float, int]:
        t0, n = time.perf_counter(), 0
        for prompt in prompts:
            pair.target.reset()
            pair.draft.reset()
            fin, _ = decoding.generate_all(pair.target, pair.draft, prompt, DecodeConfig(mode=mode, max_tokens=a.max_tokens),
                                           n_vocab=pair.n_vocab)
            n += fin.stats.tokens
        return time.perf_counter() - t0, n

    for m in modes:
        run_all(m)  # record
    replay.replaying = True
    times: dict[str, list[float]] = {m: [] for m in modes}
    tokens = {}
    for _ in range(a.repeats):
        for m in modes:  # interleaved: drift in load hits every mode alike
            s, tokens[m] = run_all(m)
            times[m].append(1e6 * s / tokens[m])
    out = {m: {"tokens": tokens[m], "us_per_token_min": round(min(v), 1), "us_per_token_median": round(statistics.median(v), 1)}
           for m, v in times.items()}
    meta = {"n_prompts": len(prompts), "max_tokens": a.max_tokens, "repeats": a.repeats, "loadavg": os.getloadavg()[0]}
    if a.json:
        print(json.dumps({**meta, "modes": out}))
        return 0
    print(f"controller time per token, llama.cpp replayed ({len(prompts)} GSM8K questions, greedy, max "
          f"{a.max_tokens} tokens, {a.repeats} repeats; load avg {meta['loadavg']:.2f})")
    print(f"{'mode':9} {'tokens':>7} {'min us/tok':>11} {'median us/tok':>14}")
    for m, r in out.items():
        print(f"{m:9} {r['tokens']:>7} {r['us_per_token_min']:>11} {r['us_per_token_median']:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
