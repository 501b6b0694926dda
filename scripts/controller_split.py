#!/usr/bin/env python
"""Where the controller's live time goes between two decodes: one greedy generation on a
real pair, timed by stamps around a few calls, split into what the runtime does after
``llama_decode`` returns (the logits row's address from llama.cpp apart), the sampling rule
(``Seq.sample``: target and draft modes), emitting the token (``Seq._emit``: its text, its
event, the counters), what the runtime does before the next ``llama_decode``, and the rest
(the scheduler, the steps and other rules, the generator's plumbing).

    python scripts/controller_split.py                            # the default pair, mode target
    python scripts/controller_split.py --mode sd --spec-type ngram-simple --rounds 5
    python scripts/controller_split.py --draft D.gguf --target T.gguf --max-tokens 16

Each round is one ``decoding.generate`` of ``--max-tokens`` tokens after the same prompt (the
chat template, one user turn); printed per round: the generation's own ``seconds_controller``
per token and each part's microseconds per token (the sum over the decodes after the prompt's,
over the tokens), so that the parts add up to about that figure. The stamps cost a microsecond
or two each: the split is a map of where the time goes, not a measurement to quote against a
goal (``generate --json`` and ``controller_ab.py`` are). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a Python function that checks whether a number is prime."


def add_pair_options(ap: argparse.ArgumentParser) -> None:
    """``--draft`` / ``--target``, each defaulting to the default pair's (``default_pair_files``);
    ``controller_floor.py`` takes the same two."""
    ap.add_argument("--draft", type=Path, help="draft GGUF (default: the default pair's)")
    ap.add_argument("--target", type=Path, help="target GGUF (default: the default pair's)")


def default_pair_files(a: argparse.Namespace, needs_draft: bool) -> None:
    """Fill ``a.target`` (and ``a.draft`` where the run needs a draft model) with the default
    pair's files where not given (pulled already, else the store's one-line error)."""
    from easd_local.store.resolve import resolve_pair

    if a.target is None or (needs_draft and a.draft is None):
        files = resolve_pair(None, a.draft, a.target)
        a.draft, a.target = a.draft or files.draft, a.target or files.target


PARTS = ("after llama_decode", "  of which the row's address", "the rule (Seq.sample)", "emitting (Seq._emit)",
         "before llama_decode", "the rest")


class Stamps:
    """(label, ns) marks, appended by wrappers around the calls timed."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, int]] = []

    def wrap(self, obj, name: str, label: str) -> None:
        f, marks, ns = getattr(obj, name), self.marks, time.perf_counter_ns

        def timed(*a, **k):
            marks.append((label + "<", ns()))
            try:
                return f(*a, **k)
            finally:
                marks.append((label + ">", ns()))
        setattr(obj, name, timed)


def split(marks: list[tuple[str, int]]) -> tuple[dict[str, float], int]:
    """Nanoseconds per part, summed over the windows from each decode's return to the next
    decode's call (the first decode, the prompt's, and what precedes it left out), and the
    number of windows."""
    out = dict.fromkeys(PARTS, 0.0)
    ends = [i for i, (lab, _) in enumerate(marks) if lab == "llama_decode>"]
    windows = 0
    for a in ends:
        nxt = next((j for j in range(a + 1, len(marks)) if marks[j][0] == "llama_decode<"), None)
        if nxt is None:
            break
        w = marks[a:nxt + 1]
        total = w[-1][1] - w[0][1]
        open_at: dict[str, int] = {}
        spent = dict.fromkeys(("address", "sample", "emit"), 0)
        db_out = db_in = None
        for lab, t in w:
            name, edge = lab[:-1], lab[-1]
            if name == "decode_batch":
                if edge == ">":
                    db_out = t
                else:
                    db_in = t
            elif edge == "<":
                open_at[name] = t
            elif name in open_at:
                spent[name] += t - open_at.pop(name)
        after = (db_out - w[0][1]) if db_out is not None else 0
        before = (w[-1][1] - db_in) if db_in is not None else 0
        out["after llama_decode"] += after
        out["  of which the row's address"] += spent["address"]
        out["the rule (Seq.sample)"] += spent["sample"]
        out["emitting (Seq._emit)"] += spent["emit"]
        out["before llama_decode"] += before
        out["the rest"] += total - after - before - spent["sample"] - spent["emit"]
        windows += 1
    return out, windows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_pair_options(ap)
    ap.add_argument("--mode", default="target", help="decoding mode (default target)")
    ap.add_argument("--spec-type", default="draft", help="drafters for sd/easd (default draft)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    if a.max_tokens < 2 or a.rounds < 1 or a.threads < 1:
        ap.error("--max-tokens >= 2, --rounds >= 1 and --threads >= 1")
    from easd_local.engine import sequence
    from easd_local.engine.config import DecodeConfig
    from easd_local.engine.decoding import Finished, generate
    from easd_local.engine.pair import open_models
    from easd_local.llamacpp import runtime
    from easd_local.llamacpp.runtime import LoadOptions

    cfg = DecodeConfig(mode=a.mode, spec_type=a.spec_type, max_tokens=a.max_tokens, temperature=0.0)
    default_pair_files(a, cfg.needs_draft_model)
    st = Stamps()
    st.wrap(runtime._ll, "llama_decode", "llama_decode")
    st.wrap(runtime.Model, "decode_batch", "decode_batch")
    st.wrap(runtime, "logits_address", "address")
    st.wrap(sequence.Seq, "sample", "sample")
    st.wrap(sequence.Seq, "_emit", "emit")
    draft = a.draft if cfg.needs_draft_model else None
    with open_models(draft, a.target, LoadOptions(n_ctx=2048, n_threads=a.threads, n_gpu_layers=0)) as pair:
        tokens = pair.target.vocab.chat_tokens([{"role": "user", "content": a.prompt}])
        print(f"mode {a.mode} (--spec-type {a.spec_type}), {a.max_tokens} tokens, {a.threads} threads, "
              f"target {Path(a.target).name}; µs per generated token")
        rows = []
        for r in range(a.rounds):
            st.marks.clear()
            fin = None
            for ev in generate(pair.target, pair.draft, tokens, cfg, n_vocab=pair.n_vocab, pair=pair):
                if isinstance(ev, Finished):
                    fin = ev
            parts, windows = split(st.marks)
            n = max(1, fin.stats.tokens)
            rows.append({k: v / n / 1e3 for k, v in parts.items()})
            print(f"round {r + 1}: {fin.stats.tokens} tokens, {windows} decodes after the prompt's; "
                  f"seconds_controller {fin.stats.seconds_controller / n * 1e6:.0f} µs a token; parts: "
                  + ", ".join(f"{k.strip()} {v:.0f}" for k, v in rows[-1].items()), flush=True)
        print("\nmedian over rounds, µs per token:")
        for k in PARTS:
            print(f"  {k:32s}{statistics.median(x[k] for x in rows):8.1f}")
    return 0


if __name__ == "__main__":
    from easd_local.cli.common import run_script

    sys.exit(run_script(main))
