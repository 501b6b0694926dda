#!/usr/bin/env python
"""The controller's live cost per token, ``generate --json``'s ``seconds_controller`` ÷ tokens,
for two trees of this code run alternately (before / after a change) on the default pair.

    python scripts/controller_ab.py                                   # this tree alone
    python scripts/controller_ab.py --tree before=/tmp/old --tree after=.   # A/B, alternating
    python scripts/controller_ab.py --modes target,sd --max-tokens 96 --rounds 2
    python scripts/controller_ab.py --modes sd-t0.7,easd-t0.7 --prompt "Write a haiku about rain."

Each run is one ``python -m easd_local generate PROMPT --mode M -n N --threads T --json`` with
``PYTHONPATH`` set to the tree (a ``git archive`` of a commit, say), so both trees use the same
llama.cpp, models and machine; runs alternate between the trees prompt by prompt and mode by
mode, so a change in the machine's load falls on both. Printed per mode and tree: ms of
controller a generated token per prompt, and tokens/s. Figures are printed, never asserted;
run it with nothing else on the machine (it says the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# label -> generate's flags (greedy unless said; default thresholds)
MODES = {
    "target": ["--mode", "target"],
    "sd": ["--mode", "sd"],
    "lookup": ["--mode", "sd", "--spec-type", "ngram-simple"],
    "sd-t0.7": ["--mode", "sd", "--temperature", "0.7"],
    "easd": ["--mode", "easd"],
    "easd-tf": ["--mode", "easd-tf"],
    "easd-t0.7": ["--mode", "easd", "--temperature", "0.7"],
}
DEFAULT_MODES = ["target", "sd", "lookup", "sd-t0.7", "easd", "easd-tf"]
PROMPTS = [
    "A baker makes 48 muffins and puts them in boxes of 6. He sells each box for $5. "
    "How much money does he make? Explain step by step.",
    "Sam reads 12 pages on Monday and twice as many on Tuesday. The book has 120 pages. "
    "How many pages are left? Explain step by step.",
]


def run_one(tree: Path, prompt: str, flags: list[str], n: int, threads: int) -> dict | str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "easd_local", "generate", prompt, *flags, "-n", str(n),
           "--threads", str(threads), "--json"]
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return json.loads(r.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                    help="a tree of this code (repeat for A/B); default: this repository")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--prompt", action="append", default=[], help="a prompt of your own (repeat for more); "
                    "default: two GSM8K-like questions")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="times each (prompt, mode, tree) runs")
    args = ap.parse_args(argv)
    trees: list[tuple[str, Path]] = []
    for t in args.tree or [f"this={REPO}"]:
        label, sep, path = t.partition("=")
        if not sep or not label or not (Path(path) / "easd_local").is_dir():
            ap.error(f"--tree {t!r}: want LABEL=PATH, PATH a tree of this code (with easd_local/)")
        trees.append((label, Path(path).resolve()))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    prompts = args.prompt or PROMPTS
    print(f"load average {os.getloadavg()[0]:.2f}; {len(prompts)} prompts, {args.max_tokens} tokens, "
          f"{args.threads} threads; trees: " + ", ".join(f"{lab}={p}" for lab, p in trees), flush=True)
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for prompt in prompts:
            for mode in modes:
                for label, tree in trees:
                    out = run_one(tree, prompt, MODES[mode], args.max_tokens, args.threads)
                    if isinstance(out, str):
                        print(f"{mode} {label}: failed: {out}", flush=True)
                        continue
                    ms = 1000.0 * out["seconds_controller"] / max(1, out["tokens"])
                    got.setdefault((mode, label), []).append((ms, out["tokens_per_s"]))
                    print(f"{mode:8} {label:8} {out['tokens']:4d} tokens  {ms:6.3f} ms/token controller  "
                          f"{out['tokens_per_s']:6.2f} tok/s", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'mode':8} " + " ".join(f"{lab + ' ms/token':>24}" for lab, _ in trees))
    for mode in modes:
        cells = []
        for label, _ in trees:
            xs = got.get((mode, label), [])
            cells.append(", ".join(f"{ms:.2f}" for ms, _ in xs) or "-")
        print(f"{mode:8} " + " ".join(f"{c:>24}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
