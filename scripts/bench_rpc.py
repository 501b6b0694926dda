#!/usr/bin/env python
"""Target local vs target through an rpc-server on loopback: tokens/s of target, sd and
easd-tf, and what each target decode costs in protocol overhead.

    python scripts/build_rpc.py                  # once
    python scripts/bench_rpc.py                  # the catalog's default pair
    python scripts/bench_rpc.py --draft D.gguf --target T.gguf --n-prompts 3 --max-tokens 64

One process loads the draft (local), the target locally, and the target again with all its
layers on an ``rpc-server`` that this script starts on 127.0.0.1 with the same thread count.
For each GSM8K question (chat template, greedy) every mode runs with the local target and
with the RPC target, interleaved, so that drift in machine load hits both alike.

What loopback measures: the RPC protocol's own overhead (serialising graphs, copying
activations and logits through the kernel, one request/response round trip per target
decode) on one machine, where both sides share the CPU. It is not a cluster: a real
network adds its latency to every round trip and its bandwidth to every byte. The script
therefore prints, per target decode, the extra milliseconds and the loopback bytes, from
which a two-machine figure follows: extra ms + round trips x RTT + bytes / bandwidth.
Bytes come from the kernel's loopback counters (/proc/net/dev "lo"), which also count any
other loopback traffic on the machine while a run is going.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from easd_local.engine import decoding  # noqa: E402
from easd_local.llamacpp import rpc  # noqa: E402
from easd_local.bench.datasets import load_dataset  # noqa: E402
from easd_local.bench.prompt import build_messages  # noqa: E402
from easd_local.engine.config import DecodeConfig  # noqa: E402
from easd_local.engine.pair import check_pair_files  # noqa: E402
from easd_local.store.resolve import PairFiles, resolve_config  # noqa: E402
from easd_local.llamacpp.runtime import LoadOptions, Model  # noqa: E402
from easd_local.lifeline import preexec  # noqa: E402


def lo_bytes() -> int | None:
    try:
        for line in Path("/proc/net/dev").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                f = rest.split()
                # on loopback every byte sent is also received: count it once
                return int(f[0])
    except OSError:
        pass
    return None


def start_server(threads: int) -> tuple[subprocess.Popen, str]:
    server = rpc.backend_dir() / rpc.SERVER_NAME
    if not server.is_file():
        raise SystemExit(f"error: no rpc-server in {server.parent}: run python scripts/build_rpc.py first")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(server), "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=preexec())  # dies with us
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("error: rpc-server did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--target", type=Path)
    ap.add_argument("--modes", default="target,sd,easd-tf")
    ap.add_argument("--n-prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    if a.draft and a.target:
        spec = PairFiles(draft=a.draft, target=a.target, label="given")
    else:
        from easd_local.store.resolve import resolve_pair

        spec = resolve_pair(None, None, None, mode="sd", confirm=lambda *x: False, progress=None)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    base, tau_source = resolve_config(DecodeConfig(max_tokens=a.max_tokens, gamma=a.gamma), spec, {})
    check_pair_files(spec.draft, spec.target)
    load0 = os.getloadavg()[0]
    proc, endpoint = start_server(a.threads)
    models: list[Model] = []
    try:
        opts = LoadOptions(n_ctx=2048, n_threads=a.threads, n_gpu_layers=-1)
        t0 = time.perf_counter()
        draft = Model(spec.draft, opts)
        local = Model(spec.target, opts)
        t1 = time.perf_counter()
        remote = Model(spec.target, LoadOptions(n_ctx=2048, n_threads=a.threads, n_gpu_layers=-1, rpc=(endpoint,)))
        models += [draft, local, remote]
        load_s = {"local": round(t1 - t0, 2), "rpc": round(time.perf_counter() - t1, 2)}
        n_vocab = min(draft.n_vocab, local.n_vocab)
        problems = load_dataset("gsm8k", limit=a.n_prompts)
        keys = ("tokens", "gen_s", "target_gen_s", "target_calls", "bytes")
        agg = {(m, w): dict.fromkeys(keys, 0) for m in modes for w in ("local", "rpc")}
        same = {m: 0 for m in modes}
        for i, prob in enumerate(problems):
            prompt = local.vocab.chat_tokens(build_messages(prob.question))
            for m in modes:
                order = ("local", "rpc") if i % 2 == 0 else ("rpc", "local")
                toks = {}
                for where in order:
                    target = local if where == "local" else remote
                    target.reset()
                    draft.reset()
                    b0 = lo_bytes()
                    fin, _ = decoding.generate_all(target, draft, prompt, base.replace(mode=m), n_vocab=n_vocab)
                    b1 = lo_bytes()
                    s, g = fin.stats, agg[(m, where)]
                    g["tokens"] += s.tokens
                    g["gen_s"] += s.seconds_total - s.seconds_prompt
                    g["target_gen_s"] += s.seconds_target - s.seconds_prompt_target
                    g["target_calls"] += s.target_calls
                    g["bytes"] += (b1 - b0) if b0 is not None and b1 is not None else 0
                    toks[where] = fin.tokens
                    print(f"question {i + 1}/{len(problems)} {m:8} {where:5}: {s.tokens} tokens, "
                          f"{s.tokens / max(s.seconds_total - s.seconds_prompt, 1e-9):.2f} tok/s, "
                          f"{s.target_calls} target calls, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
                same[m] += toks["local"] == toks["rpc"]
        rows = {}
        for m in modes:
            loc, rem = agg[(m, "local")], agg[(m, "rpc")]
            tps = {w: g["tokens"] / g["gen_s"] if g["gen_s"] else 0.0 for w, g in (("local", loc), ("rpc", rem))}
            calls = rem["target_calls"] or 1
            rows[m] = dict(
                tokens_per_s_local=round(tps["local"], 2), tokens_per_s_rpc=round(tps["rpc"], 2),
                rpc_over_local=round(tps["rpc"] / tps["local"], 3) if tps["local"] else None,
                ms_per_token_extra=round(1000 * (rem["gen_s"] / max(rem["tokens"], 1) - loc["gen_s"] / max(loc["tokens"], 1)), 2),
                target_calls_per_token=round(rem["target_calls"] / max(rem["tokens"], 1), 3),
                ms_per_target_call_local=round(1000 * loc["target_gen_s"] / max(loc["target_calls"], 1), 2),
                ms_per_target_call_rpc=round(1000 * rem["target_gen_s"] / calls, 2),
                loopback_kb_per_target_call=round(rem["bytes"] / calls / 1024, 1),
                same_tokens=f"{same[m]}/{len(problems)}",
            )
    finally:
        for m in models:  # before the server goes: freeing RPC buffers needs it
            m.close()
        proc.terminate()
        proc.wait(10)
    out = dict(draft=str(spec.draft), target=str(spec.target), endpoint=endpoint, n_prompts=len(problems),
               max_tokens=a.max_tokens, gamma=a.gamma, threads=a.threads, load_s=load_s, tau_source=tau_source,
               modes=rows, loadavg_start=round(load0, 2), loadavg_end=round(os.getloadavg()[0], 2))
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"pair: {Path(spec.draft).name} -> {Path(spec.target).name}; {len(problems)} GSM8K questions, greedy, "
          f"max {a.max_tokens} tokens, gamma {a.gamma}, {a.threads} threads (rpc-server too); "
          f"load avg {out['loadavg_start']} -> {out['loadavg_end']}; model load s {load_s}")
    print("loopback RPC: protocol overhead on one machine, not a network (see --help)")
    hdr = (f"{'mode':8} {'tok/s local':>11} {'tok/s rpc':>9} {'rpc/local':>9} {'+ms/token':>9} {'calls/token':>11} "
           f"{'ms/call local':>13} {'ms/call rpc':>11} {'KB/call':>8} {'same':>5}")
    print(hdr)
    for m, r in rows.items():
        print(f"{m:8} {r['tokens_per_s_local']:>11.2f} {r['tokens_per_s_rpc']:>9.2f} {r['rpc_over_local'] or 0:>9.3f} "
              f"{r['ms_per_token_extra']:>9.2f} {r['target_calls_per_token']:>11.3f} {r['ms_per_target_call_local']:>13.2f} "
              f"{r['ms_per_target_call_rpc']:>11.2f} {r['loopback_kb_per_target_call']:>8.1f} {r['same_tokens']:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
