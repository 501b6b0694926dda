#!/usr/bin/env python
"""Tokens/s per decoding mode, the controller's share of wall time, and target-first EASD's
speed relative to target-only decoding, on GSM8K questions through the chat template.

    python scripts/bench_modes.py                       # tiny random-weight pair (generated)
    python scripts/bench_modes.py --draft D.gguf --target T.gguf --n-prompts 10 --max-tokens 128
    python scripts/bench_modes.py --draft D.gguf --target T.gguf --modes target,sd --repack both
    python scripts/bench_modes.py --draft D.gguf --target T.gguf --modes target,sd --mmap both

``--repack both`` runs the pair with llama.cpp's extra buffer types (repacked weights:
CPU_REPACK, AMX) as the self-test decides and with them off (``--no-repack``), alternating
the two in child processes ``--reps`` times each, and prints what the fallback costs (off ÷
on per mode, from each variant's median run). Separate processes, because with both
loaded in one process the repacked pair ran several times slower than alone on this machine.
``--mmap both`` does the same for the weights mapped from the file (llama.cpp's default) and
read into memory (``--no-mmap``).

Modes are interleaved per question (target, sd, easd, easd-tf, then the next question) so
that drift in machine load hits every mode alike. Greedy. Figures are printed, never
asserted: speed targets live here, not in tests.
"""

from __future__ import annotations

import argparse
import statistics
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from easd_local.engine import decoding  # noqa: E402
from easd_local.bench.datasets import load_dataset  # noqa: E402
from easd_local.bench.prompt import build_messages  # noqa: E402
from easd_local.engine.config import DecodeConfig  # noqa: E402
from easd_local.llamacpp.devices import system_info  # noqa: E402
from easd_local.engine.decoding import Stats  # noqa: E402
from easd_local.engine.pair import load_pair  # noqa: E402
from easd_local.llamacpp.runtime import LoadOptions  # noqa: E402


def tiny_pair() -> tuple[Path, Path]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny_pair", Path(__file__).with_name("make_tiny_pair.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    paths = mod.write_tiny_models(Path(tempfile.mkdtemp(prefix="easd-tiny-")))
    return paths["draft"], paths["target"]


def both_ways(a, draft, target, knob: str) -> int:
    """``knob`` (repack or mmap) on and off in alternating child processes; tok/s: the median
    run of each."""
    import subprocess

    from easd_local.lifeline import preexec

    base = [sys.executable, __file__, "--draft", str(draft), "--target", str(target), "--modes", a.modes,
            "--n-prompts", str(a.n_prompts), "--max-tokens", str(a.max_tokens), "--gamma", str(a.gamma), "--json"]
    base += [f for k in ("threads", "tau_draft", "tau_target") if getattr(a, k) is not None
             for f in (f"--{k.replace('_', '-')}", str(getattr(a, k)))]
    base += ["--mmap", a.mmap] if knob == "repack" else ["--repack", a.repack]  # the other knob as asked
    runs = {"on": [], "off": []}
    loads = []
    for _ in range(a.reps):
        for variant in ("on", "off"):
            p = subprocess.run(base + [f"--{knob}", variant], capture_output=True, text=True, check=True,
                               preexec_fn=preexec())  # ends with this script
            runs[variant].append(json.loads(p.stdout.strip().splitlines()[-1]))
            loads.append(os.getloadavg()[0])
    first = runs["on"][0]
    print(f"pair: {Path(draft).name} -> {Path(target).name}; {first['n_prompts']} GSM8K questions × {a.reps} runs "
          f"per variant, alternating {knob} on/off in child processes; greedy, max {a.max_tokens} tokens, "
          f"{first['threads']} threads; load avg {min(loads):.2f}-{max(loads):.2f}")
    print(f"llama.cpp: {first['llama_system_info']}")
    for variant in ("on", "off"):
        print(f"{knob} {variant}: " + "; ".join(
            f"{role} {r['note'] or 'weight repacking on (' + (r['detail'] or '-') + ')'}"
            for role, r in runs[variant][0]["repacking"].items())
            + f"; weights {'mapped' if runs[variant][0]['mmap'] else 'read into memory'}, "
            f"load {statistics.median(r['load_s'] for r in runs[variant]):.2f} s (median)")
    print(f"{'mode':8} {'tok/s on':>9} {'tok/s off':>9} {'off/on':>7}   per run on | off  (medians of the runs: a run "
          "disturbed by other load does not drag the figure)")
    out = {}
    for m in first["modes"]:
        tps = {v: statistics.median(r["modes"][m]["tokens_per_s"] for r in runs[v]) for v in ("on", "off")}
        ratio = tps["off"] / tps["on"] if tps["on"] else float("nan")
        out[m] = {"on": round(tps["on"], 2), "off": round(tps["off"], 2), "off_over_on": round(ratio, 3)}
        per = " ".join(f"{r['modes'][m]['tokens_per_s']:.1f}" for r in runs["on"]) + " | " + " ".join(
            f"{r['modes'][m]['tokens_per_s']:.1f}" for r in runs["off"])
        print(f"{m:8} {tps['on']:>9.2f} {tps['off']:>9.2f} {ratio:>7.3f}   {per}")
    if a.json:
        print(json.dumps({"modes": out, "loadavg": [min(loads), max(loads)]}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--target", type=Path)
    ap.add_argument("--modes", default="target,sd,easd,easd-tf")
    ap.add_argument("--n-prompts", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tau-draft", type=float, default=None)
    ap.add_argument("--tau-target", type=float, default=None)
    ap.add_argument("--repack", choices=("on", "off", "both"), default="on",
                    help="llama.cpp's weight repacking: on (as the self-test decides), off (--no-repack), or both "
                         "side by side")
    ap.add_argument("--mmap", choices=("on", "off", "both"), default="on",
                    help="the weights mapped from the file (on, llama.cpp's default), read into memory (off, "
                         "--no-mmap), or both side by side")
    ap.add_argument("--reps", type=int, default=2, help="with --repack/--mmap both: runs of each variant, alternating")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args()

    draft, target = (a.draft, a.target) if a.draft and a.target else tiny_pair()
    if a.repack == "both" and a.mmap == "both":
        ap.error("--repack both and --mmap both: one side-by-side comparison at a time")
    if a.repack == "both" or a.mmap == "both":
        return both_ways(a, draft, target, "repack" if a.repack == "both" else "mmap")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    # thresholds as generate/chat would use them: flags > the pair's profile > defaults
    from easd_local.store.resolve import PairFiles, resolve_config

    flags = {k: v for k, v in (("tau_draft", a.tau_draft), ("tau_target", a.tau_target)) if v is not None}
    base, tau_source = resolve_config(DecodeConfig(max_tokens=a.max_tokens, gamma=a.gamma),
                                      PairFiles(draft=Path(draft), target=Path(target), label="bench"), flags)
    t0 = time.perf_counter()
    extra = False if a.repack == "off" else None  # None: the self-test decides
    pair = load_pair(draft, target, LoadOptions(n_ctx=2048, n_threads=a.threads, extra_bufts=extra,
                                                mmap=a.mmap == "on"))
    load_s = time.perf_counter() - t0
    problems = load_dataset("gsm8k", limit=a.n_prompts)
    agg = {m: Stats() for m in modes}
    for prob in problems:
        prompt = pair.target.vocab.chat_tokens(build_messages(prob.question))
        for m in modes:
            # a fresh cache for each run: every mode pays for its own prompt
            pair.target.reset()
            pair.draft.reset()
            fin, _ = decoding.generate_all(pair.target, pair.draft, prompt, base.replace(mode=m), n_vocab=pair.n_vocab)
            agg[m] = agg[m] + fin.stats
    rows = {}
    for m, g in agg.items():
        # decode seconds after the prompt (the prompt's decodes are all in seconds_prompt)
        target_gen_s = g.seconds_target - g.seconds_prompt_target
        draft_gen_s = g.seconds_draft - g.seconds_prompt_draft
        rows[m] = dict(
            tokens=g.tokens, tokens_per_s=round(g.tokens_per_s, 2),
            # prompt included: what a user waits for end to end
            tokens_per_s_e2e=round(g.tokens / g.seconds_total, 2) if g.seconds_total else 0.0,
            prompt_s=round(g.seconds_prompt / len(problems), 3),
            # where a generated token's time goes (prompt excluded): the ratio to target-only
            # decomposes into these
            ms_per_token={k: round(1000 * v / g.tokens, 2) if g.tokens else 0.0 for k, v in (
                ("target", target_gen_s), ("draft", draft_gen_s),
                ("other", g.seconds_generating - target_gen_s - draft_gen_s))},
            controller_share=round(g.seconds_controller / g.seconds_total, 4) if g.seconds_total else 0.0,
            acceptance=round(g.acceptance_rate, 3) if g.drafted else None,
            easd_fires_per_100=round(g.easd_fires_per_100, 2),
            draft_consult_rate=round(g.draft_consult_rate, 3) if g.draft_consult_rate is not None else None,
            catchup_tokens_per_consult=round(g.catchup_tokens / g.draft_consults, 2) if g.draft_consults else None,
            tokens_per_verify=round(g.mean_accepted_len, 2) if g.verify_calls else None,
        )
    ratios = {}
    if "target" in rows and rows["target"]["tokens_per_s"]:
        for m in modes:
            if m != "target":
                ratios[f"{m}/target"] = round(rows[m]["tokens_per_s"] / rows["target"]["tokens_per_s"], 3)
                if rows["target"]["tokens_per_s_e2e"]:
                    ratios[f"{m}/target end-to-end"] = round(
                        rows[m]["tokens_per_s_e2e"] / rows["target"]["tokens_per_s_e2e"], 3)
    if "sd" in rows and "easd" in rows and rows["sd"]["tokens_per_s"]:
        ratios["easd/sd"] = round(rows["easd"]["tokens_per_s"] / rows["sd"]["tokens_per_s"], 3)
    repacking = {role: getattr(pair, role).repack.to_dict() for role in ("target", "draft")}
    out = dict(draft=str(draft), target=str(target), n_prompts=len(problems), max_tokens=a.max_tokens,
               gamma=a.gamma, threads=a.threads or os.cpu_count(), load_s=round(load_s, 2),
               tau_draft=base.tau_draft, tau_target=base.tau_target, tau_source=tau_source, modes=rows, ratios=ratios,
               loadavg=os.getloadavg()[0], repacking=repacking, mmap=a.mmap == "on",
               llama_system_info=system_info())
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"pair: {Path(draft).name} -> {Path(target).name}; {len(problems)} GSM8K questions, greedy, "
          f"max {a.max_tokens} tokens, gamma {a.gamma}, {out['threads']} threads, "
          f"tau_d={base.tau_draft:g} tau_t={base.tau_target:g} ({tau_source}); load avg {out['loadavg']:.2f}")
    print(f"llama.cpp: {out['llama_system_info']}")
    print("repacking: " + "; ".join(f"{role} {r['note'] or 'weight repacking on (' + (r['detail'] or '-') + ')'}"
                                    for role, r in repacking.items()))
    print("tok/s: generated tokens / generation seconds (prompt excluded, as llama.cpp's eval rate); "
          "e2e: prompt included; prompt s: mean per question")
    print("ms/token: generation time per generated token inside target decodes / draft decodes / elsewhere")
    hdr = f"{'mode':8} {'tokens':>7} {'tok/s':>8} {'e2e':>6} {'prompt s':>8} {'ms/token t/d/other':>19} {'ctrl%':>6} {'accept':>7} {'fires/100':>9} {'consult':>8} {'tok/verify':>10}"
    print(hdr)
    for m, r in rows.items():
        f = lambda v, fmt: (fmt.format(v) if v is not None else "-")  # noqa: E731
        print(f"{m:8} {r['tokens']:>7} {r['tokens_per_s']:>8.2f} {r['tokens_per_s_e2e']:>6.2f} {r['prompt_s']:>8.3f} "
              f"{'/'.join(format(r['ms_per_token'][k], '.1f') for k in ('target', 'draft', 'other')):>19} "
              f"{100 * r['controller_share']:>5.1f}% "
              f"{f(r['acceptance'], '{:.3f}'):>7} {r['easd_fires_per_100']:>9.2f} {f(r['draft_consult_rate'], '{:.3f}'):>8} "
              f"{f(r['tokens_per_verify'], '{:.2f}'):>10}")
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
