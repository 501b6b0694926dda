#!/usr/bin/env python
"""Throughput of the batched engine: aggregate and per-sequence tokens/s of each mode at
B = 1, 2, 4, 8 sequences decoding together, and the peak RSS of each B. (Its B = 1
side-by-side of decoding.generate against the single-sequence loop it replaced was run
before that loop was deleted; the figures are in the README.)

    python scripts/bench_batch.py                              # the default catalog pair
    python scripts/bench_batch.py --draft D.gguf --target T.gguf --batches 1,2,4 --prompts 8

Every B decodes the same prompts (the first --prompts GSM8K test questions through the
chat template, greedy, --max-tokens each), B at a time with a slot refilled as soon as its
sequence finishes. Each B runs in a fresh subprocess (its contexts hold B sequences, so
its peak RSS is its own). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from easd_local.engine import decoding  # noqa: E402
from easd_local.bench.datasets import load_dataset  # noqa: E402
from easd_local.bench.prompt import build_messages  # noqa: E402
from easd_local.engine.config import DecodeConfig  # noqa: E402
from easd_local.engine.pair import load_pair  # noqa: E402
from easd_local.llamacpp.runtime import LoadOptions  # noqa: E402
from easd_local.engine.scheduler import Failed, Request, Scheduler  # noqa: E402
from easd_local.lifeline import preexec  # noqa: E402


def default_pair() -> tuple[Path, Path, DecodeConfig]:
    from easd_local.store.resolve import resolve_config, resolve_pair

    spec = resolve_pair(None, None, None, mode="easd", confirm=lambda n: False)
    cfg, _ = resolve_config(DecodeConfig(), spec, {})
    return spec.draft, spec.target, cfg


def one_b(a) -> dict:
    """Run every mode at B = a.one_b in this process; return the figures."""
    B = a.one_b
    base = DecodeConfig(max_tokens=a.max_tokens, gamma=a.gamma, tau_draft=a.tau_draft, tau_target=a.tau_target)
    pair = load_pair(a.draft, a.target, LoadOptions(n_ctx=a.ctx, n_threads=a.threads, n_seq=B))
    problems = load_dataset("gsm8k", limit=a.prompts)
    prompts = [pair.target.vocab.chat_tokens(build_messages(p.question)) for p in problems]
    out = {"B": B, "kv_bytes": pair.target.kv_bytes + pair.draft.kv_bytes, "modes": {}}
    # time spent evaluating prompts (decodes that ask for no logits): subtracted for the
    # decode-only aggregate, since prompts are evaluated one at a time at every B
    prefill = [0.0]
    cls = type(pair.target)
    real = cls.decode_batch

    def timed(model, parts, **kw):
        t = time.perf_counter()
        try:
            return real(model, parts, **kw)
        finally:
            if all(len(p.logits_at) == 0 for p in parts):
                prefill[0] += time.perf_counter() - t

    cls.decode_batch = timed
    for mode in a.modes.split(","):
        cfg = base.replace(mode=mode)
        pair.target.reset()
        pair.draft.reset()
        sched = Scheduler(pair, B)
        queue = list(reversed(prompts))
        stats = []
        prefill[0] = 0.0
        t0 = time.perf_counter()
        while queue or sched.active:
            while queue and sched.free_slots():
                sched.submit(Request(queue.pop(), cfg, reuse_cache=False))
            for _rid, ev in sched.step():
                if isinstance(ev, Failed):
                    raise SystemExit(f"{mode}: {ev.message}")
                if isinstance(ev, decoding.Finished):
                    stats.append(ev.stats)
        wall = time.perf_counter() - t0
        tokens = sum(s.tokens for s in stats)
        out["modes"][mode] = {
            "tokens": tokens, "wall_s": wall, "aggregate_tps": tokens / wall, "prefill_s": prefill[0],
            "decode_tps": tokens / (wall - prefill[0]),
            "per_seq_tps": sum(s.tokens_per_s for s in stats) / len(stats),
        }
    cls.decode_batch = real
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    pair.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--target", type=Path)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--modes", default="target,sd,easd,easd-tf")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tau-draft", type=float, default=None)
    ap.add_argument("--tau-target", type=float, default=None)
    ap.add_argument("--one-b", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    a = ap.parse_args()
    if not (a.draft and a.target) or a.tau_draft is None or a.tau_target is None:
        d, t, cfg = default_pair() if not (a.draft and a.target) else (a.draft, a.target, DecodeConfig())
        a.draft, a.target = a.draft or d, a.target or t
        a.tau_draft = cfg.tau_draft if a.tau_draft is None else a.tau_draft
        a.tau_target = cfg.tau_target if a.tau_target is None else a.tau_target
    if a.one_b:
        print(json.dumps(one_b(a)))
        return 0

    load = os.getloadavg()[0]
    runs = []
    for B in (int(x) for x in a.batches.split(",")):
        cmd = [sys.executable, __file__, "--one-b", str(B), "--draft", str(a.draft), "--target", str(a.target),
               "--modes", a.modes, "--prompts", str(a.prompts), "--max-tokens", str(a.max_tokens),
               "--ctx", str(a.ctx), "--gamma", str(a.gamma), "--tau-draft", str(a.tau_draft),
               "--tau-target", str(a.tau_target)] + (["--threads", str(a.threads)] if a.threads else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=preexec())  # ends with this script
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    load_end = os.getloadavg()[0]
    if a.json:
        print(json.dumps({"runs": runs, "load": [load, load_end]}, indent=1))
        return 0
    print(f"pair: {a.draft.name} + {a.target.name}; {a.prompts} GSM8K prompts × {a.max_tokens} tokens, greedy, "
          f"gamma {a.gamma}, tau_d {a.tau_draft:g}, tau_t {a.tau_target:g}, ctx {a.ctx}/sequence, "
          f"threads {a.threads or os.cpu_count()}; load average {load:.1f} at start, {load_end:.1f} at end")
    modes = a.modes.split(",")
    base = {m: runs[0]["modes"][m] for m in modes}
    print("\naggregate: generated tokens / wall (prompts included); decode-only: the same without the "
          "seconds spent evaluating prompts; per-seq: mean of each sequence's own tokens/s")
    print(f"{'B':>3} {'mode':8} {'aggregate':>10} {'× B=1':>6} {'decode-only':>12} {'× B=1':>6} "
          f"{'per-seq':>8} {'wall s':>7} {'prompts s':>10}")
    for r in runs:
        for m in modes:
            f, b = r["modes"][m], base[m]
            print(f"{r['B']:>3} {m:8} {f['aggregate_tps']:10.2f} {f['aggregate_tps'] / b['aggregate_tps']:6.2f} "
                  f"{f['decode_tps']:12.2f} {f['decode_tps'] / b['decode_tps']:6.2f} {f['per_seq_tps']:8.2f} "
                  f"{f['wall_s']:7.1f} {f['prefill_s']:10.1f}")
    print(f"\n{'B':>3} {'peak RSS':>10} {'KV cache':>10}")
    for r in runs:
        print(f"{r['B']:>3} {r['peak_rss'] / 2**20:8.0f} MiB {r['kv_bytes'] / 2**20:8.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
