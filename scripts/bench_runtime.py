#!/usr/bin/env python3
"""Time easd_local.llamacpp.runtime decodes and measure memory for a draft/target pair.

For each pair: load both models, then for each model and each batch size k (1, 2, 4, 8)
time one ``decode`` of k tokens with logits at all k positions (what a verify step asks
for) at a realistic position (after a 100-token prompt), rolling the cache back to the
prompt between repetitions; report the median of N repetitions after a warm-up.  Memory:
the peak RSS of the process after loading both models (``getrusage`` ru_maxrss) and the
current RSS from /proc/self/status (split into anonymous and file-backed: weights are
mmapped, so they count as file pages).

The tiny test pair (scripts/make_tiny_pair.py, written to a temp dir) is always measured;
a real pair is measured too when ``--draft PATH --target PATH`` is given.  Each pair is
measured in its own child process so that peak RSS belongs to that pair alone.

    python scripts/bench_runtime.py [--draft D.gguf --target T.gguf] [--reps 10] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (1, 2, 4, 8)
TEXT = (
    "The history of the printing press begins in the fifteenth century, when movable type "
    "made it possible to copy books far faster than scribes could. Within fifty years, "
    "presses had spread to more than two hundred cities across Europe, and the price of a "
    "book fell sharply. Scholars could compare editions, merchants could print forms, and "
    "ordinary readers could own pamphlets, calendars and songs. "
)


def _rss() -> dict[str, int]:
    """Current RSS (KiB) from /proc/self/status; peak from getrusage (KiB on Linux)."""
    out = {"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, val = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[{"VmRSS": "rss_kib", "RssAnon": "rss_anon_kib", "RssFile": "rss_file_kib",
                     "VmHWM": "hwm_kib"}[key]] = int(val.split()[0])
    except OSError:
        pass
    return out


def _prompt(model, n: int) -> list[int]:
    toks: list[int] = []
    while len(toks) < n + max(SIZES):
        toks += model.vocab.tokenize(TEXT, add_special=False)
    return toks


def measure_pair(draft: str, target: str, args) -> dict:
    """Runs in the child process: load, time, measure."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from easd_local.llamacpp.runtime import LoadOptions, Model

    base = _rss()
    opts = LoadOptions(n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=args.gpu_layers, n_batch=512)
    loaded = {}
    load_s = {}
    for role, path in (("target", target), ("draft", draft)):
        t0 = time.perf_counter()
        loaded[role] = Model(path, opts)
        load_s[role] = time.perf_counter() - t0
    after_load = _rss()

    # two kinds of batch: a verify (logits at every position) and a catch-up / prefill
    # (logits at the last position only: one output-layer row instead of k)
    timings: dict[str, dict[str, float]] = {}
    timings_last: dict[str, dict[str, float]] = {}
    for role in ("draft", "target"):
        m = loaded[role]
        toks = _prompt(m, args.prompt_tokens)
        prompt, cont = toks[: args.prompt_tokens], toks[args.prompt_tokens:]
        m.reset()
        m.decode(prompt, logits_at=())
        timings[role], timings_last[role] = {}, {}
        for k in SIZES:
            block = cont[:k]
            for table, at in ((timings, tuple(range(k))), (timings_last, (k - 1,))):
                samples = []
                for rep in range(args.warmup + args.reps):
                    t0 = time.perf_counter()
                    m.decode(block, logits_at=at)
                    dt = time.perf_counter() - t0
                    m.rollback(args.prompt_tokens)
                    if rep >= args.warmup:
                        samples.append(dt)
                table[role][str(k)] = statistics.median(samples) * 1e3
    after_run = _rss()
    facts = {role: loaded[role].facts() for role in ("draft", "target")}
    for m in loaded.values():
        m.close()
    return {
        "draft": draft,
        "target": target,
        "models": {
            role: {"name": f.name, "architecture": f.architecture, "file_type": f.file_type,
                   "n_params": f.n_params, "file_size": f.file_size, "n_vocab": f.n_vocab,
                   "load_s": round(load_s[role], 3)}
            for role, f in facts.items()
        },
        "settings": {"threads": opts.threads(), "gpu_layers": args.gpu_layers, "ctx": args.ctx,
                     "prompt_tokens": args.prompt_tokens, "reps": args.reps, "warmup": args.warmup},
        "decode_ms_median": timings,
        "decode_last_ms_median": timings_last,
        "memory_kib": {"before_load": base, "after_load": after_load, "after_decodes": after_run},
    }


def _run_child(label: str, draft: str, target: str, args) -> dict:
    cmd = [sys.executable, __file__, "--_child", "--draft", draft, "--target", target,
           "--reps", str(args.reps), "--warmup", str(args.warmup), "--ctx", str(args.ctx),
           "--prompt-tokens", str(args.prompt_tokens), "--gpu-layers", str(args.gpu_layers)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from easd_local.lifeline import preexec

    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=preexec())  # ends with this script
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"bench_runtime: {label} pair failed: {tail}")
    out = json.loads(r.stdout)
    out["label"] = label
    return out


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MiB"


def render(results: list[dict]) -> str:
    lines = []
    for res in results:
        s = res["settings"]
        lines.append(f"== {res['label']} pair  (threads={s['threads']}, gpu_layers={s['gpu_layers']}, "
                     f"ctx={s['ctx']}, at position {s['prompt_tokens']}, median of {s['reps']} "
                     f"after {s['warmup']} warm-up)")
        for role in ("draft", "target"):
            m = res["models"][role]
            lines.append(f"   {role:<6} {m['name']} ({m['architecture']}, {m['file_type']}, "
                         f"{m['n_params'] / 1e6:,.1f}M params, {m['file_size'] / 2**20:,.1f} MiB file, "
                         f"loaded in {m['load_s']:.2f} s)")
        head = f"   {'decode of k tokens':<20}" + "".join(f"{'k=' + str(k):>11}" for k in SIZES)
        lines.append(head)
        for role in ("draft", "target"):
            row = res["decode_ms_median"][role]
            lines.append(f"   {role + ' (ms)':<20}" + "".join(f"{row[str(k)]:>11.2f}" for k in SIZES))
        for role in ("draft", "target"):
            row = res["decode_ms_median"][role]
            lines.append(f"   {role + ' (ms/token)':<20}" + "".join(f"{row[str(k)] / k:>11.2f}" for k in SIZES))
        lines.append(f"   {'logits at the last position only (catch-up / prefill):'}")
        for role in ("draft", "target"):
            row = res["decode_last_ms_median"][role]
            lines.append(f"   {role + ' (ms)':<20}" + "".join(f"{row[str(k)]:>11.2f}" for k in SIZES))
        mem = res["memory_kib"]
        a, b = mem["after_load"], mem["before_load"]
        lines.append(f"   memory after loading both: peak RSS {_mib(a['peak_rss_kib'])}, current RSS "
                     f"{_mib(a.get('rss_kib', 0))} (anon {_mib(a.get('rss_anon_kib', 0))}, file/mmap "
                     f"{_mib(a.get('rss_file_kib', 0))}); before loading {_mib(b.get('rss_kib', 0))}")
        c = mem["after_decodes"]
        lines.append(f"   after the decodes:         peak RSS {_mib(c['peak_rss_kib'])}, current RSS "
                     f"{_mib(c.get('rss_kib', 0))}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--draft", help="draft GGUF of a real pair (with --target)")
    ap.add_argument("--target", help="target GGUF of a real pair (with --draft)")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions per size (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed repetitions first")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers to offload (-1 = all)")
    ap.add_argument("--ctx", type=int, default=1024, help="context size of each model")
    ap.add_argument("--prompt-tokens", type=int, default=100, help="position of the timed decodes")
    ap.add_argument("--no-tiny", action="store_true", help="skip the tiny pair")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if (args.draft is None) != (args.target is None):
        ap.error("give both --draft and --target, or neither")
    if args.reps < 1 or args.warmup < 0 or args.prompt_tokens < 1:
        ap.error("--reps must be >= 1, --warmup >= 0, --prompt-tokens >= 1")
    if args.prompt_tokens + max(SIZES) > args.ctx:
        ap.error("--ctx must hold --prompt-tokens + 8")

    if args._child:
        from easd_local.errors import EasdError

        try:
            res = measure_pair(args.draft, args.target, args)
        except EasdError as e:
            print(e, file=sys.stderr)
            return 2
        json.dump(res, sys.stdout)
        return 0

    results = []
    with tempfile.TemporaryDirectory(prefix="easd-bench-") as tmp:
        if not args.no_tiny or args.draft is None:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from make_tiny_pair import write_tiny_models

            tiny = write_tiny_models(Path(tmp), seed=0)
            results.append(_run_child("tiny", str(tiny["draft"]), str(tiny["target"]), args))
        if args.draft is not None:
            results.append(_run_child("real", args.draft, args.target, args))
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
