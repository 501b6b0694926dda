#!/usr/bin/env python3
"""Prompt-lookup drafting against llama.cpp's own, side by side, per request (issue 47).

For each request of a set (``--set code``: the code-editing requests of
``easd_local/data/code_edits/requests.jsonl``; ``--set gsm8k``: the first ``--limit`` GSM8K
test questions), rendered with the target's chat template and tokenized as
scripts/bench_speed.py does, every method decodes greedily up to ``--max-tokens`` tokens:

* ours (this process, ``decoding.generate_all``): ``target`` alone, and ``sd`` with each
  drafter that ``--methods`` names: ``ngram-simple`` (prompt lookup), ``ngram-mod`` (the shared
  n-gram table), ``draft`` (the draft model), or several joined with ``+``
  (``ngram-simple+draft``: ``--spec-type ngram-simple,draft``);
* llama.cpp's (``llama-server`` built from the vendored sources, one process per
  configuration, all started at once on loopback ports and used one at a time): the target
  alone, ``--spec-type ngram-simple --spec-draft-n-max 16``, ``--spec-type ngram-mod``
  (defaults). Each request goes to ``/completion`` as the same prompt tokens, with
  ``cache_prompt`` false and ``--cache-ram 0``, so each one pays its prompt.

Runs are interleaved per request (ours and llama.cpp's alternate, the order reversed on odd
requests) so that the drift of a shared machine falls on every method alike. ``--repeats N``
runs each request's methods N times in a row (the order reversed every other time): a request's
ratio is then the median of its N paired ratios, each over the target run beside it, which is
what a claim about the worst request needs on a machine whose speed moves by 5-10 % (at times a
third) from one run of a request to the next; the summary prints that spread of the target's own
runs. A drafter that keeps text across requests (``ngram-mod``, ours and llama.cpp's) runs in the
first round only: run again on the same request it replays its own last answer (llama.cpp's
accepted 195 of 246 drafts on a GSM8K answer's second run).

Speeds are decode tokens/s, prompt excluded: ours ``Stats.tokens_per_s``, llama.cpp's
``timings.predicted_per_second``. Each method's ratio is taken per request against its own
system's target alone (ours / our target, llama.cpp's / llama.cpp's target); the summary
gives their median, min and max, how many requests fell below 0.95× their target, accepted /
drafted, and our lookup over llama.cpp's of the same name. Greedy lookup is lossless: each
method's tokens are compared with its target's (round by round), and the requests whose tokens
differ are counted, with the first differing position.

Models load through the project's loader (the repacking self-test's verdict applies);
llama-server gets ``-nr`` when ``--no-repack`` is given or that verdict turned repacking off,
so that both sides use the same weight layout. ``--json OUT`` appends one row per
(request, method, round) as it finishes; ``--resume`` skips the rows already in OUT. ``--quick``:
2 requests, 16 tokens, on the tiny pair (written to a temporary folder) unless
``--draft/--target`` are given: a smoke test. Nothing here asserts a speed.

Usage::

    nice python scripts/bench_lookup.py --set code [--limit 24] [--max-tokens 256] [--threads 2] \\
        [--no-repack] [--methods target,ngram-simple,ngram-mod,draft] [--json out.jsonl [--resume]]
    nice python scripts/bench_lookup.py --set gsm8k --limit 40
    python scripts/bench_lookup.py --quick --no-llama
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_serve  # noqa: E402  (its Server and free_port)
import bench_speed  # noqa: E402  (one build of llama.cpp's tools; the default pair)

log = bench_speed.log
CODE_SET = ROOT / "easd_local" / "data" / "code_edits" / "requests.jsonl"
DEFAULT_METHODS = "target,ngram-simple,ngram-mod"
# llama-server's configurations: issue 47's settings for ngram-simple, defaults for ngram-mod
LLAMA_CONFIGS = {
    "target": [],
    "ngram-simple": ["--spec-type", "ngram-simple", "--spec-draft-n-max", "16"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
}
LLAMA_LEARNS = {"ngram-mod"}  # llama-server's n-gram table outlives a request


def learns(system: str, method: str) -> bool:
    """Whether the method keeps text it saw across requests (ngram-mod's table, ours and
    llama.cpp's): run again on the same request it would replay its own last answer, so it
    runs in the first round only."""
    if system == "llama":
        return method in LLAMA_LEARNS
    from easd_local.engine.modes import DRAFTER_TABLE, spec_kinds

    return method != "target" and any(DRAFTER_TABLE[k].learns for k in spec_kinds(spec_type(method)))


# ----------------------------------------------------------------------------- requests


def load_requests(which: str, limit: int | None) -> list[dict]:
    """``[{"id", "text"}]`` of set ``which`` (code or gsm8k), the first ``limit`` of them."""
    if which == "gsm8k":
        from easd_local.bench.datasets import load_dataset

        return [{"id": p.qid, "text": p.question} for p in load_dataset("gsm8k", limit=limit)]
    rows = [json.loads(line) for line in CODE_SET.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{"id": r["id"], "text": r["request"]} for r in rows][:limit]


# ----------------------------------------------------------------------------- methods


def spec_type(method: str) -> str | None:
    """``--spec-type`` of one of our methods; None for the target alone."""
    return None if method == "target" else method.replace("+", ",")


def parse_methods(text: str) -> list[str]:
    from easd_local.engine.modes import spec_kinds

    methods = [m.strip() for m in text.split(",") if m.strip()]
    for m in methods:
        if m != "target":
            spec_kinds(spec_type(m))  # ConfigError names the known drafters
    # every ratio is to the target alone: it always runs, first
    return ["target"] + [m for m in dict.fromkeys(methods) if m != "target"]


def run_ours(pair, tokens: list[int], method: str, cfg_base) -> dict:
    from easd_local.engine.decoding import generate_all

    st = spec_type(method)
    cfg = cfg_base.replace(mode="target") if st is None else cfg_base.replace(mode="sd", spec_type=st)
    draft = pair.draft if cfg.needs_draft_model else None
    # the loaded pair's drafters, kept across requests as a server keeps them (ngram-mod's table,
    # the lookups' acceptance counts), as llama-server's are over the run
    fin, _events = generate_all(pair.target, draft, tokens, cfg, n_vocab=pair.n_vocab, pair=pair)
    s = fin.stats
    return {"tokens": s.tokens, "tok_s": s.tokens_per_s, "drafted": s.drafted,
            "accepted": s.draft_accepted + s.lookup_accepted, "seconds": s.seconds_total - s.seconds_prompt,
            "token_ids": list(fin.tokens), "text": fin.text, "stop": s.stop_reason}


# ------------------------------------------------------------------------- llama-server


def start_llama(exe: Path, target: Path, config: str, a, no_repack: bool, log_path: Path):
    port = bench_serve.free_port()
    cmd = [str(exe), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-np", "1",
           "-c", str(a.ctx), "--no-webui", "-fa", "off", "-ngl", "0", "--cache-ram", "0",
           "-t", str(a.threads), "-tb", str(a.threads), *LLAMA_CONFIGS[config]]
    if no_repack:
        cmd.append("-nr")
    return bench_serve.Server(cmd, log_path, base=f"http://127.0.0.1:{port}")


def run_llama(base: str, tokens: list[int], max_tokens: int) -> dict:
    body = {"prompt": tokens, "n_predict": max_tokens, "temperature": 0, "seed": 0, "cache_prompt": False,
            "return_tokens": True, "stream": False}
    req = urllib.request.Request(base + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.loads(r.read())
    t = out.get("timings") or {}
    return {"tokens": int(t.get("predicted_n", 0)), "tok_s": float(t.get("predicted_per_second", 0.0)),
            "drafted": t.get("draft_n"), "accepted": t.get("draft_n_accepted"),
            "seconds": float(t.get("predicted_ms", 0.0)) / 1000.0, "prompt_n": t.get("prompt_n"),
            "token_ids": out.get("tokens") or [], "text": out.get("content", ""), "stop": out.get("stop_type")}


def llama_system_info(exe: Path) -> str:
    """llama-server's build and CPU features. The server prints its system info only at trace
    verbosity, so the features come from its own libllama, read in a child process (this one
    has llama-cpp-python's libllama loaded)."""
    def run(cmd: list[str]) -> str:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=60)
        return " ".join((r.stdout + r.stderr).split())

    version = run([str(exe), "--version"])
    lib = exe.parent / "libllama.so"
    features = run([sys.executable, "-c", "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
                    "f = lib.llama_print_system_info; f.restype = ctypes.c_char_p; print(f().decode())", str(lib)])
    return f"{version}; {features}"


# ------------------------------------------------------------------------------ results


def schedule(plan: list[tuple[str, str]], repeats: int, i: int) -> list[tuple[int, tuple[str, str]]]:
    """(round, (system, method)) of request ``i``'s runs, in order: each round the plan, reversed
    on every other (request + round); a drafter that ``learns`` in round 0 only."""
    return [(n, sm) for n in range(repeats) for sm in (plan if (i + n) % 2 == 0 else plan[::-1])
            if n == 0 or not learns(*sm)]


def first_diff(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def row_key(system: str, method: str) -> str:
    return f"{system}:{method}"


BELOW = 0.95  # issue 47: no request below this ratio to the target alone


def by_round(rows: list[dict]) -> dict[tuple[str, str], dict[int, dict]]:
    """(request, system:method) -> {round: row}; rows written before --repeats are round 0."""
    out: dict[tuple[str, str], dict[int, dict]] = {}
    for r in rows:
        out.setdefault((r["request"], row_key(r["system"], r["method"])), {})[r.get("round", 0)] = r
    return out


def paired_ratio(a: dict[int, dict], b: dict[int, dict]) -> float | None:
    """The median over rounds of a's tok/s over b's in the same round (None: no such round)."""
    rs = [a[k]["tok_s"] / b[k]["tok_s"] for k in sorted(a) if k in b and b[k]["tok_s"] > 0]
    return statistics.median(rs) if rs else None


def summarize(rows: list[dict], order: list[str]) -> list[dict]:
    """One entry per (system, method): per-request ratios to that system's target alone
    (over rounds, the median of the paired ratios), accepted / drafted, greedy differences
    from its target (in any round), the requests below BELOW, and ours over llama.cpp's."""
    by = by_round(rows)
    requests = list(dict.fromkeys(r["request"] for r in rows))
    out = []
    for key in order:
        system, method = key.split(":", 1)
        base = row_key(system, "target")
        ratios, vs_llama, diffs = [], [], []
        drafted = accepted = rounds = 0
        for q in requests:
            r, t = by.get((q, key)), by.get((q, base))
            if r is None:
                continue
            rounds = max(rounds, len(r))
            drafted += sum(x.get("drafted") or 0 for x in r.values())
            accepted += sum(x.get("accepted") or 0 for x in r.values())
            ratio = paired_ratio(r, t) if t is not None else None
            if ratio is not None:
                ratios.append(ratio)
            if t is not None and method != "target":
                firsts = [first_diff(r[k]["token_ids"], t[k]["token_ids"]) for k in r
                          if k in t and r[k]["token_ids"] and t[k]["token_ids"]]
                d = min((x for x in firsts if x is not None), default=None)
                if d is not None:
                    diffs.append((q, d))
            ll = by.get((q, row_key("llama", method)))
            v = paired_ratio(r, ll) if system == "ours" and ll is not None else None
            if v is not None:
                vs_llama.append(v)
        if not ratios and not any(q for q, k in by if k == key):
            continue
        out.append({"method": key, "n": len(ratios), "rounds": rounds,
                    "median": statistics.median(ratios) if ratios else None,
                    "min": min(ratios) if ratios else None, "max": max(ratios) if ratios else None,
                    "below": sum(x < BELOW for x in ratios),
                    "drafted": drafted, "accepted": accepted,
                    "vs_llama_median": statistics.median(vs_llama) if vs_llama else None,
                    "differs": diffs})
    return out


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def print_tables(rows: list[dict], order: list[str], meta: dict) -> None:
    by = by_round(rows)
    requests = list(dict.fromkeys(r["request"] for r in rows))
    rounds = max((len(v) for v in by.values()), default=1)
    print(f"\ndecode tok/s per request (ratio to the same system's target alone): set {meta['set']}, "
          f"max {meta['max_tokens']} tokens, {meta['threads']} threads, target {meta['target']}"
          + (f"; the median of {rounds} rounds, each ratio paired with the target's run in its round"
             if rounds > 1 else ""))
    w = 22
    print(f"{'request':24s}{'prompt':>7s}" + "".join(f"{k:>{w}s}" for k in order))
    for q in requests:
        cells = []
        for key in order:
            r = by.get((q, key))
            t = by.get((q, row_key(key.split(':', 1)[0], "target")))
            if r is None:
                cells.append(f"{'-':>{w}s}")
                continue
            ratio = paired_ratio(r, t) if t else None
            tok_s = statistics.median(x["tok_s"] for x in r.values())
            cells.append((f"{tok_s:.2f}" + (f" ({ratio:.2f}x)" if ratio is not None else "")).rjust(w))
        p = next((next(iter(by[(q, k)].values()))["prompt_tokens"] for k in order if (q, k) in by), 0)
        print(f"{q[:23]:24s}{p:>7d}" + "".join(cells))
    print("\nper method: ratio to its own target alone, per request (ours / our target, llama / llama's target)")
    print(f"{'method':24s}{'n':>4s}{'median':>8s}{'min':>8s}{'max':>8s}{f'<{BELOW}':>7s}{'accepted/drafted':>20s}"
          f"{'ours/llama':>12s}  greedy differs from its target")
    for s in summarize(rows, order):
        acc = f"{s['accepted']}/{s['drafted']}" + (f" {100 * s['accepted'] / s['drafted']:.0f}%" if s["drafted"]
                                                   else "")
        diff = "-" if s["method"].endswith(":target") else (
            "none" if not s["differs"] else
            f"{len(s['differs'])} requests: " + ", ".join(f"{q}@{d}" for q, d in s["differs"]))
        below = "-" if s["method"].endswith(":target") else str(s["below"])
        print(f"{s['method']:24s}{s['n']:>4d}{_f(s['median'], '{:.3f}'):>8s}{_f(s['min'], '{:.3f}'):>8s}"
              f"{_f(s['max'], '{:.3f}'):>8s}{below:>7s}{acc:>20s}{_f(s['vs_llama_median'], '{:.3f}'):>12s}  {diff}")
    for key in (k for k in order if k.endswith(":target")):
        speeds = [[x["tok_s"] for x in r.values()] for (_, k), r in by.items() if k == key and len(r) > 1]
        spread = [max(v) / min(v) for v in speeds if min(v) > 0]
        if spread:  # what one request's ratio can move by on this machine with nothing changed
            print(f"{key}: its own runs of a request, fastest over slowest: median {statistics.median(spread):.3f}, "
                  f"max {max(spread):.3f} over {len(spread)} requests (the noise a paired ratio carries)")


# --------------------------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--draft", type=Path, help="draft GGUF (default: the catalog default pair's, if pulled)")
    ap.add_argument("--target", type=Path, help="target GGUF (default: the catalog default pair's, if pulled)")
    ap.add_argument("--set", choices=("code", "gsm8k"), default="code", help="requests (default code)")
    ap.add_argument("--limit", type=int, help="first N requests (default: all code edits, 40 GSM8K questions)")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per generation (default 256)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads, both systems (default 2)")
    ap.add_argument("--ctx", type=int, default=4096, help="context per model, both systems (default 4096)")
    ap.add_argument("--no-repack", action="store_true", help="no weight repacking, both systems (llama.cpp's -nr)")
    ap.add_argument("--methods", default=DEFAULT_METHODS,
                    help=f"our methods: target and drafters, '+' to chain them (default {DEFAULT_METHODS}; "
                         "also draft, ngram-simple+draft, ...)")
    ap.add_argument("--no-llama", action="store_true", help="run only ours (never builds or starts llama-server)")
    bench_speed.add_build_options(ap, "skip llama.cpp's half if llama-server is not built")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each request's methods, one after another (default 1); a request's ratio is "
                         "the median of its paired ratios")
    ap.add_argument("--json", type=Path, metavar="OUT",
                    help="append one JSON row per (request, method, round) to OUT")
    ap.add_argument("--resume", action="store_true",
                    help="skip the (request, method, round) rows already in --json OUT")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 2 requests, 16 tokens, the tiny pair unless --draft/--target are given")
    a = ap.parse_args(argv)
    if a.quick:
        a.limit = a.limit or 2
        a.max_tokens = min(a.max_tokens, 16)
        a.ctx = min(a.ctx, 2048)  # the tiny pair's context
    if a.limit is None and a.set == "gsm8k":
        a.limit = 40
    for name in ("max_tokens", "threads", "ctx", "jobs", "repeats"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.limit is not None and a.limit < 1:
        ap.error("--limit must be >= 1")
    if a.resume and a.json is None:
        ap.error("--resume needs --json OUT")
    try:
        a.methods = parse_methods(a.methods)
    except Exception as e:  # noqa: BLE001  (ConfigError: an unknown drafter)
        ap.error(f"--methods: {e}")
    return a


def _models(a, tmp: Path) -> tuple[Path | None, Path | None]:
    if a.draft is not None or a.target is not None:
        return a.draft, a.target
    if a.quick:
        import make_tiny_pair

        paths = make_tiny_pair.write_tiny_models(tmp / "tiny", seed=0)
        return paths["draft"], paths["target"]
    return bench_speed.default_pair()


def start_servers(a, tmp: Path, stack: ExitStack, no_repack: bool) -> dict:
    """One llama-server per configuration of LLAMA_CONFIGS, stopped when ``stack`` closes;
    none when llama-server is not built and --no-build was given."""
    tools = bench_speed.ensure_tools(a, ("llama-server",))
    if tools is None:
        return {}
    servers = {}
    for config in LLAMA_CONFIGS:
        log(f"starting llama-server ({config}){' -nr' if no_repack else ''}")
        srv = start_llama(tools["llama-server"], a.target, config, a, no_repack, tmp / f"llama-server-{config}.log")
        stack.callback(srv.stop)
        servers[config] = srv
    log("llama-server: " + llama_system_info(tools["llama-server"]))
    return servers


def warm_up(pair, servers: dict, plan: list[tuple[str, str]], text: str, cfg_base) -> None:
    # the first decode of each model and server pays for page faults and thread start-up;
    # a short unrecorded run of each method keeps that out of the first request's ratios
    tokens = pair.target.vocab.tokenize(pair.target.vocab.apply_chat_template([{"role": "user", "content": text}]),
                                        add_special=True, parse_special=True)
    for system, method in plan:
        if system == "ours":
            run_ours(pair, tokens, method, cfg_base.replace(max_tokens=8))
        else:
            run_llama(servers[method].base, tokens, 8)


def main(argv=None) -> int:
    a = parse_args(argv)
    from easd_local.engine.config import DecodeConfig, needs_draft_model
    from easd_local.engine.pair import open_models
    from easd_local.llamacpp.runtime import LoadOptions

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="easd-bench-lookup-")))
        a.draft, a.target = _models(a, tmp)
        uses_draft = any(m != "target" and needs_draft_model("sd", spec_type(m)) for m in a.methods)
        if a.target is None or (uses_draft and a.draft is None):
            log("error: no --target (and --draft, for a method that drafts with the draft model) given, and the "
                "catalog default pair is not pulled (run `easd-local pull`)")
            return 2
        requests = load_requests(a.set, a.limit)
        done: set[tuple[str, str]] = set()
        rows: list[dict] = []
        if a.resume and a.json.is_file():
            rows = [json.loads(line) for line in a.json.read_text(encoding="utf-8").splitlines() if line.strip()]
            done = {(r["request"], row_key(r["system"], r["method"]), r.get("round", 0)) for r in rows}
            log(f"resume: {len(rows)} rows already in {a.json}")
        out_f = None
        if a.json is not None:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            out_f = stack.enter_context(open(a.json, "a" if a.resume else "w", encoding="utf-8"))

        import llama_cpp

        load0 = os.getloadavg()
        log(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
        log("our llama.cpp (llama-cpp-python " + bench_speed.llama_cpp_python_version() + "): "
            + llama_cpp.llama_print_system_info().decode(errors="replace").strip())
        opts = LoadOptions(n_ctx=a.ctx, n_threads=a.threads, n_gpu_layers=0,
                           extra_bufts=False if a.no_repack else None)
        pair = stack.enter_context(open_models(a.draft if uses_draft else None, a.target, opts))
        repack_off = not pair.target.repack.extra_bufts
        from easd_local.store import costs as cost_store

        rec = cost_store.find(cost_store.costs_key(a.draft, a.target, a.threads, 0, False if a.no_repack else None))
        pair.verify_costs = rec.get("verify_costs") if rec else None
        log("verify costs: " + (f"recorded by `easd-local pair costs` ({rec.get('date')})" if rec
                                else "not recorded here: the lookups assume 1 + 0.29 k decodes"))
        log(f"target {a.target} ({'weight repacking off' if repack_off else 'weight repacking on'}, "
            f"{pair.target.repack.verdict})" + (f"; draft {a.draft}" if uses_draft else ""))

        servers = {} if a.no_llama else start_servers(a, tmp, stack, repack_off)
        cfg_base = DecodeConfig(mode="target", max_tokens=a.max_tokens, temperature=0.0)
        plan: list[tuple[str, str]] = []
        for m in a.methods:
            plan.append(("ours", m))
            if m in servers:
                plan.append(("llama", m))
        plan += [("llama", c) for c in servers if c not in a.methods]
        order = [row_key(s, m) for s, m in plan]
        if a.repeats > 1 and any(learns(*sm) for sm in plan):
            log("note: " + ", ".join(row_key(*sm) for sm in plan if learns(*sm)) + " keep text across requests: "
                "first round only (a second run of a request would replay its first answer)")
        if any((q["id"], row_key(*sm), n) not in done for q in requests for n, sm in schedule(plan, a.repeats, 0)):
            warm_up(pair, servers, plan, requests[0]["text"], cfg_base)
        t_start = time.perf_counter()
        for i, q in enumerate(requests):
            text = pair.target.vocab.apply_chat_template([{"role": "user", "content": q["text"]}])
            tokens = pair.target.vocab.tokenize(text, add_special=True, parse_special=True)
            for n, (system, method) in schedule(plan, a.repeats, i):
                if (q["id"], row_key(system, method), n) in done:
                    continue
                r = (run_ours(pair, tokens, method, cfg_base) if system == "ours"
                     else run_llama(servers[method].base, tokens, a.max_tokens))
                r.update(request=q["id"], system=system, method=method, prompt_tokens=len(tokens),
                         max_tokens=a.max_tokens, threads=a.threads, set=a.set, round=n)
                if system == "llama" and r.get("prompt_n") not in (None, len(tokens)):
                    log(f"note: llama-server evaluated {r['prompt_n']} prompt tokens of {len(tokens)} "
                        f"(a prompt cache answered?)")
                rows.append(r)
                if out_f is not None:
                    out_f.write(json.dumps(r) + "\n")
                    out_f.flush()
                acc = f"  accepted {r['accepted']}/{r['drafted']}" if r.get("drafted") else ""
                log(f"request {i + 1}/{len(requests)}" + (f" round {n + 1}/{a.repeats}" if a.repeats > 1 else "")
                    + f" {q['id']:24s} {system:5s} {method:22s} "
                    f"{r['tokens']:4d} tok {r['tok_s']:7.2f} tok/s{acc}")
        wall = time.perf_counter() - t_start
        meta = {"set": a.set, "max_tokens": a.max_tokens, "threads": a.threads, "target": Path(a.target).name}
        print_tables([r for r in rows if r["request"] in {q["id"] for q in requests}], order, meta)
        load1 = os.getloadavg()
        print(f"\nwall {wall / 60:.1f} min; load average {load0[0]:.2f} at start, {load1[0]:.2f} at end "
              f"(1-minute, {os.cpu_count()} CPUs: figures from a busy machine are not final)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
