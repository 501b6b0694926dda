#!/usr/bin/env python
"""What a verify of k tokens costs on this machine, in one-token decodes of the target, for
every k from 1 to ``--rows``: the curve that prompt lookup's length policy prices its proposals
with (``easd-local pair costs`` records it up to a lookup's longest proposal).

    python scripts/verify_curve.py                          # the default pair's target, 1..33 tokens
    python scripts/verify_curve.py --rows 17 --reps 20 --json curve.json   # and the figures as JSON
    python scripts/verify_curve.py --target T.gguf --threads 4
    python scripts/verify_curve.py --rows 17 --no-repack            # llama.cpp's plain CPU kernels

Each shape (k tokens after the same context, logits at every one: an SD verify of k − 1 drafted
tokens) is timed ``--reps`` times, the shapes in turn within each round after a warm-up round, and
the median kept (``pairscore.probe.time_verifies``, as the probe of ``pair costs`` times them). The context is
``pair costs``' two code-editing prompts. Printed per k: the cost in one-token decodes, the
milliseconds, and the step from k − 1; figures only, nothing asserted. A verify's cost is not a
straight line in k on a CPU (llama.cpp's kernels work in blocks of rows): this script shows
where its steps are.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--target", type=Path, help="target GGUF (default: the default pair's)")
    ap.add_argument("--rows", type=int, default=33, help="the longest verify timed, in tokens (default 33)")
    ap.add_argument("--reps", type=int, default=10, help="timed rounds (default 10)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-repack", action="store_true", help="no weight repacking (llama.cpp's -nr)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the figures to OUT as one JSON object "
                    "(lookup_replay.py --price reads it)")
    a = ap.parse_args(argv)
    if a.rows < 1 or a.reps < 1 or a.threads < 1:
        ap.error("--rows, --reps and --threads must be >= 1")
    from easd_local.fsutil import describe_write_error, write_json_atomic
    from easd_local.llamacpp.devices import system_info
    from easd_local.llamacpp.runtime import LoadOptions, Model
    from easd_local.pairscore.probe import time_verifies
    from easd_local.pairscore.ways_measure import PROMPTS
    from easd_local.store.resolve import resolve_pair

    if a.target is None:
        a.target = resolve_pair(None, None, None).target
    load0 = os.getloadavg()[0]
    with Model(a.target, LoadOptions(n_ctx=2048, n_threads=a.threads, extra_bufts=False if a.no_repack else None)) as m:
        toks = m.vocab.tokenize(PROMPTS[0] + PROMPTS[1], parse_special=False)
        if len(toks) < a.rows + 1:
            ap.error(f"--rows at most {len(toks) - 1} (the context's tokens)")
        secs = time_verifies(m, toks, a.rows, a.reps)
        repack = m.repack.extra_bufts
    costs = [s / secs[0] for s in secs]
    out = {"target": Path(a.target).name, "threads": a.threads, "reps": a.reps, "context": len(toks) - a.rows,
           "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)], "repack": repack,
           "system_info": system_info(), "cost_by_tokens": {str(k): round(c, 4) for k, c in enumerate(costs, 1)},
           "ms_by_tokens": {str(k): round(1e3 * s, 2) for k, s in enumerate(secs, 1)}}
    if a.json:
        try:  # whole or not at all: lookup_replay.py --price reads it
            write_json_atomic(a.json, out)
        except OSError as e:
            print(f"error: {describe_write_error(a.json, e)}", file=sys.stderr)
            return 1
    print(f"{out['target']}, {a.threads} threads, context {out['context']} tokens, median of {a.reps}, "
          f"load {out['load_avg'][0]} -> {out['load_avg'][1]}, weight repacking {'on' if repack else 'off'}")
    print(f"llama.cpp: {out['system_info']}")
    print(f"{'tokens':>6} {'drafted':>7} {'decodes':>8} {'ms':>8} {'step':>7}")
    for k, (c, s) in enumerate(zip(costs, secs), 1):
        step = f"{c - costs[k - 2]:+.2f}" if k > 1 else ""
        print(f"{k:6d} {k - 1:7d} {c:8.3f} {1e3 * s:8.1f} {step:>7}")
    return 0


if __name__ == "__main__":
    from easd_local.cli.common import run_script

    sys.exit(run_script(main))
