#!/usr/bin/env python
"""Where each greedy text of a ``bench_lookup.py`` run parts from its own system's target alone,
and whether that is a near-tie: the target's logits at the parting position are recomputed at
B = 1 (prompt and the target's text up to there, our runtime) and the two tokens' logit gap is
printed beside the top-2 margin. |gap| equal to the margin: the two texts took the two best
tokens, a batch-shape near-tie (README, "Lossless means lossless").

    python scripts/lookup_partings.py results/lookup-code-256.jsonl results/lookup-gsm8k-256.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from lookup_replay import load_run, prompt_tokens  # noqa: E402  (a run's rows and prompts, as the replay reads them)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("runs", nargs="+", type=Path, help="bench_lookup.py --json files")
    ap.add_argument("--target", help="target GGUF (default: the catalog default pair's)")
    a = ap.parse_args(argv)
    for f in a.runs:
        if not f.is_file():
            ap.error(f"{f}: no such file (a bench_lookup.py --json output)")
    from easd_local.llamacpp.runtime import LoadOptions, Model, Part
    from easd_local.store.resolve import resolve_pair

    target = resolve_pair(None, None, a.target).target
    with Model(target, LoadOptions(n_ctx=4096, n_threads=2)) as m:
        for f in a.runs:
            which, rows, reqs = load_run(f)
            # each text against its target's run of the same round (``bench_lookup.py --repeats``)
            ref = {(r["request"], r["system"], r.get("round", 0)): r for r in rows if r["method"] == "target"}
            for r in rows:
                n = r.get("round", 0)
                t = ref.get((r["request"], r["system"], n), {}).get("token_ids")
                o = r["token_ids"]
                i = next((k for k, (a, b) in enumerate(zip(t or [], o)) if a != b), None)
                if r["method"] == "target" or i is None:
                    continue
                p = prompt_tokens(m.vocab, reqs[r["request"]])
                m.reset()
                z = m.decode_batch([Part(0, p + t[:i], (-1,))])[0][0]
                top2 = np.sort(z)[-2:]
                print(f"{which} {r['request']} {r['system']}:{r['method']}" + (f" round {n + 1}" if "round" in r else "")
                      + f" parts at {i}: the target's token {t[i]} "
                      f"vs {o[i]}, logit gap {z[t[i]] - z[o[i]]:.4f}, top-2 margin {top2[1] - top2[0]:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
