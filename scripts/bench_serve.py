#!/usr/bin/env python3
"""Serving throughput of `easd-local serve`: K concurrent clients, several modes and slot counts.

For each ``--parallel`` value one server process is started (on a free loopback port, with
the pair given or the catalog default pair); then for each mode and each K in ``--clients``
K client threads send ``--requests`` streamed chat requests in all (each client sends its
next request as soon as its last one ended), greedy, the mode set per request. Printed per
(parallel, mode, K):

* aggregate tokens/s: completion tokens of all requests / wall time from the first request
  sent to the last one ended;
* time to first token (the first chunk with text, as the client sees it): p50 and p95;
* per-request tokens/s: (completion tokens - 1) / (last chunk - first text chunk), median.

Prompts: GSM8K test questions (shipped), one per request in order. Every request's text and
``timings`` go to ``--json`` if given. Nothing here asserts a speed: it prints figures.

Side by side, for each ``--parallel`` value: llama.cpp's own ``llama-server``, built from the
llama.cpp that llama-cpp-python vendors (scripts/bench_speed.py's build, with the server target
added; once, ~15 min on 2 cores), the same pair, the same slots (``-np P -c P*ctx -kvu``),
greedy, the same client load: without ``-md`` against our ``target``, with ``-md`` (draft-simple,
``--spec-draft-n-max gamma``, ``--spec-draft-n-min 0``, ``--draft-p-min 0``: our sd's drafting)
against our ``sd``. Both prompt caches are off (llama-server: ``--cache-ram 0``; both:
``cache_prompt`` false in each request): every round sends the same questions, which either
server would otherwise serve from its cache (a first run, before easd-local had one, did: 0.2 s
to first token against our 1.9 s). A closing table prints ours / llama-server for every (parallel, mode,
K). ``--no-llama-server`` skips that half, ``--no-ours`` the other; ``--no-build`` skips
llama-server when it is not built. llama-server skips our loader's repacking self-test: where
its verdict turned repacking off for these models (an AMX CPU whose kernels crash, llama.cpp
#20824) llama-server gets ``-nr`` too, so both run the same kernels and neither crashes.

**Multi-turn mode** (``--multi-turn N``): the prompt cache across requests, with the cache on
for both servers (llama-server with its defaults: ``--cache-ram`` 8 GiB, ``cache_prompt``
true). For each ``--parallel`` value and mode, each server gets a conversation of N turns
over the official ``openai`` client (streamed, greedy; turn k adds the k-th GSM8K test
question to the history, which keeps the assistant's earlier replies), interleaved with
unrelated single-question requests from a second client: one after each turn
(``--interleave between``), or sent back to back by a second thread while the conversation
runs (``--interleave concurrent``). Printed per turn and server: time to first token (as the
client sees it), ``cache_n`` / ``prompt_n`` from ``timings``, and each server's last / first
turn TTFT ratio and aggregate tokens/s (every completion token of both clients / wall time).
``--cache-off-baseline`` adds a run of easd-local with ``--no-cache-prompt``,
``--cache-ram-off-baseline`` one with ``--cache-ram 0`` (the slots' cache only: with
``--parallel 1`` every unrelated request then takes the conversation's cells).

Usage::

    nice python scripts/bench_serve.py --parallel 1,4 --modes target,sd,easd-tf \\
        --clients 1,2,4,8 --requests 8 --max-tokens 64 [--threads 2] [--json out.json]
    nice python scripts/bench_serve.py --multi-turn 8 --parallel 2 --modes sd --max-tokens 64 --threads 2 \\
        [--cache-off-baseline] [--interleave concurrent]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_speed  # noqa: E402  (one build of llama.cpp's tools)
sys.path.insert(0, str(ROOT))
from easd_local.lifeline import preexec  # noqa: E402
EXE = [sys.executable, "-c", "from easd_local.cli import main; main()"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prompts(n: int) -> list[str]:
    rows = (ROOT / "easd_local" / "data" / "gsm8k" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(r)["question"] for r in rows[:n]]


class Server:
    """A server process on a free loopback port; ``base`` once it answers /health with 200."""

    def __init__(self, cmd: list[str], log_path: Path, base: str | None = None):
        self._log = open(log_path, "w")  # noqa: SIM115
        # tied to this script: a killed benchmark leaves no server holding the port
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=preexec())
        self.log_path = log_path
        t_end = time.monotonic() + 600
        self.base = base
        while time.monotonic() < t_end and self.base is None:
            m = re.search(r"listening on (http://\S+?)/v1", log_path.read_text())
            if m:
                self.base = m.group(1)
            elif self.proc.poll() is not None:
                raise SystemExit(f"server exited:\n{log_path.read_text()}")
            else:
                time.sleep(0.1)
        while time.monotonic() < t_end:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited:\n{log_path.read_text()}")
            time.sleep(0.2)
        raise SystemExit("server did not become ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def ours(model_args: list[str], parallel: int, extra: list[str], log_path: Path) -> Server:
    return Server(EXE + ["serve", "--port", "0", "--parallel", str(parallel), "--log-level", "warning",
                         "--queue", "1000", *model_args, *extra], log_path)


def questions(first: int, n: int) -> list[str]:
    rows = (ROOT / "easd_local" / "data" / "gsm8k" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(r)["question"] for r in rows[first : first + n]]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def repack_off(draft: Path, target: Path, threads: int | None) -> bool:
    """Whether our loader runs these models without weight repacking here (its self-test's
    verdict, remembered per file and machine): llama-server skips that self-test, so it is then
    told ``-nr`` (on an AMX CPU whose kernels crash, llama.cpp #20824, it would crash too) and
    both servers run the same kernels."""
    from easd_local.llamacpp import repack
    from easd_local.llamacpp.runtime import LoadOptions

    n = LoadOptions(n_threads=threads).threads()
    return not all(repack.decide(m, requested=None, threads=n, n_gpu_layers=0).extra_bufts for m in (target, draft))


def llama_server(exe: Path, draft: Path, target: Path, parallel: int, with_draft: bool, a, log_path: Path,
                 cache: bool = False) -> Server:
    port = free_port()
    cmd = [str(exe), "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-np", str(parallel),
           "-c", str(a.ctx * parallel), "-kvu", "--no-webui", "-fa", "off", "-ngl", "0"]
    if a.no_repack:
        cmd.append("-nr")
    if not cache:
        cmd += ["--cache-ram", "0"]
    if a.threads:
        cmd += ["-t", str(a.threads), "-tb", str(a.threads)]
    if with_draft:
        cmd += ["-md", str(draft), "-ngld", "0", "--spec-type", "draft-simple", "--spec-draft-n-max", str(a.gamma),
                "--spec-draft-n-min", "0", "--draft-p-min", "0"]
        if a.threads:
            cmd += ["-td", str(a.threads), "-tbd", str(a.threads)]
    return Server(cmd, log_path, base=f"http://127.0.0.1:{port}")


def one_request(base: str, prompt: str, mode: str, max_tokens: int) -> dict:
    # cache_prompt off: every (mode, K) round sends the same questions, and llama-server would
    # otherwise serve their prompts from its cache (easd-local honours the field too)
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "mode": mode, "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": False}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.perf_counter()
    t_first = t_last = None
    text, usage, timings = [], None, None
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if "error" in obj:
                raise RuntimeError(obj["error"]["message"])
            for ch in obj.get("choices", []):
                piece = ch["delta"].get("content")
                if piece:
                    now = time.perf_counter()
                    t_first = t_first or now
                    t_last = now
                    text.append(piece)
            usage = obj.get("usage") or usage
            timings = obj.get("timings") or timings
    t_end = time.perf_counter()
    n = usage["completion_tokens"] if usage else int((timings or {}).get("predicted_n", 0))
    gen = (t_last - t_first) if (t_first and t_last) else 0.0
    return {"t0": t0, "t_end": t_end, "ttft": (t_first or t_end) - t0, "tokens": n,
            "tok_s": (n - 1) / gen if gen > 0 and n > 1 else None, "text": "".join(text), "timings": timings}


def run_load(base: str, mode: str, k: int, texts: list[str], max_tokens: int) -> list[dict]:
    todo = list(enumerate(texts))
    lock = threading.Lock()
    out: list[dict] = []
    errors: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i, prompt = todo.pop(0)
            try:
                res = one_request(base, prompt, mode, max_tokens)
            except BaseException as e:  # noqa: BLE001 - reported after the run
                errors.append(e)
                return
            res["i"] = i
            with lock:
                out.append(res)

    threads = [threading.Thread(target=client) for _ in range(k)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise SystemExit(f"{len(errors)} request(s) failed, first: {errors[0]}")
    return out


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    idx = min(len(v) - 1, max(0, round(q * (len(v) - 1))))
    return v[idx]


def measure(base: str, system: str, par: int, mode: str, a) -> list[dict]:
    rows = []
    one_request(base, "warm up", mode, 4)
    for k in [int(x) for x in a.clients.split(",")]:
        texts = prompts(max(a.requests, k))
        res = run_load(base, mode, k, texts, a.max_tokens)
        wall = max(r["t_end"] for r in res) - min(r["t0"] for r in res)
        tokens = sum(r["tokens"] for r in res)
        ttft = [r["ttft"] for r in res]
        per = [r["tok_s"] for r in res if r["tok_s"] is not None]
        row = {"system": system, "parallel": par, "mode": mode, "clients": k, "requests": len(res),
               "tokens": tokens, "wall_s": wall, "aggregate_tok_s": tokens / wall, "ttft_p50_s": pct(ttft, 0.5),
               "ttft_p95_s": pct(ttft, 0.95), "request_tok_s_p50": statistics.median(per) if per else None,
               "load": os.getloadavg()[0], "runs": sorted(res, key=lambda r: r["i"])}
        rows.append(row)
        print(f"{system:>12} {par:>8} {mode:>8} {k:>3} {len(res):>4} {row['aggregate_tok_s']:>10.2f} "
              f"{row['ttft_p50_s']:>9.3f} {row['ttft_p95_s']:>9.3f} "
              f"{(row['request_tok_s_p50'] or float('nan')):>13.2f} {row['load']:>5.1f}", flush=True)
    return rows


# ------------------------------------------------------------------------- multi-turn mode
def stream_chat(client, model: str, messages: list[dict], mode: str, max_tokens: int, cache_off: bool) -> dict:
    """One streamed greedy chat request over the openai client: its text, TTFT, usage, timings."""
    extra = {"mode": mode} | ({"cache_prompt": False} if cache_off else {})
    t0 = time.perf_counter()
    t_first = None
    text, usage, timings = [], None, None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, extra_body=extra)
    for ch in stream:
        for c in ch.choices:
            if c.delta.content:
                t_first = t_first or time.perf_counter()
                text.append(c.delta.content)
        usage = ch.usage or usage
        timings = (ch.model_extra or {}).get("timings") or timings
    t_end = time.perf_counter()
    return {"t0": t0, "t_end": t_end, "ttft": (t_first or t_end) - t0, "text": "".join(text),
            "tokens": usage.completion_tokens if usage else 0, "prompt_tokens": usage.prompt_tokens if usage else None,
            "cache_n": (timings or {}).get("cache_n"), "prompt_n": (timings or {}).get("prompt_n")}


def conversation(base: str, system: str, par: int, mode: str, a, cache_off: bool = False) -> dict:
    """The multi-turn run on one server: per-turn figures and the aggregate."""
    import openai

    conv = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=3600)
    other = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=3600)
    model = conv.models.list().data[0].id
    stream_chat(conv, model, [{"role": "user", "content": "warm up"}], mode, 4, cache_off)
    turns_q = questions(0, a.multi_turn)
    unrelated_q = questions(100, 4 * a.multi_turn)
    history: list[dict] = []
    turns, unrelated = [], []
    done = threading.Event()
    errors: list[BaseException] = []

    def second_client() -> None:  # --interleave concurrent: back to back until the conversation ends
        for q in unrelated_q:
            if done.is_set():
                return
            try:
                unrelated.append(stream_chat(other, model, [{"role": "user", "content": q}], mode, a.max_tokens,
                                             cache_off))
            except BaseException as e:  # noqa: BLE001 - reported after the run
                errors.append(e)
                return

    th = threading.Thread(target=second_client) if a.interleave == "concurrent" else None
    if th is not None:
        th.start()
    try:
        for k, q in enumerate(turns_q):
            history.append({"role": "user", "content": q})
            r = stream_chat(conv, model, history, mode, a.max_tokens, cache_off)
            history.append({"role": "assistant", "content": r["text"]})
            turns.append(r)
            log(f"  {system} turn {k + 1}: TTFT {r['ttft']:.2f} s, cache_n {r['cache_n']}, prompt_n {r['prompt_n']}")
            if th is None:
                unrelated.append(stream_chat(other, model, [{"role": "user", "content": unrelated_q[k]}], mode,
                                             a.max_tokens, cache_off))
    finally:
        done.set()
        if th is not None:
            th.join(3600)
    if errors:
        raise SystemExit(f"the second client failed: {errors[0]}")
    runs = turns + unrelated
    wall = max(r["t_end"] for r in runs) - min(r["t0"] for r in runs)
    return {"system": system, "parallel": par, "mode": mode, "interleave": a.interleave, "turns": turns,
            "unrelated": unrelated, "wall_s": wall, "aggregate_tok_s": sum(r["tokens"] for r in runs) / wall,
            "last_over_first": turns[-1]["ttft"] / turns[0]["ttft"], "load": os.getloadavg()}


def multi_turn_table(rows: list[dict]) -> None:
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["parallel"], r["mode"])].append(r)
    for (par, mode), runs in by.items():
        print(f"\n--parallel {par}, mode {mode}, {runs[0]['interleave']}: time to first token per turn (s), "
              "cache_n / prompt_n")
        head = f"{'turn':>4} " + " ".join(f"{r['system']:>26}" for r in runs)
        print(head)
        for k in range(len(runs[0]["turns"])):
            cells = []
            for r in runs:
                t = r["turns"][k]
                cells.append(f"{t['ttft']:>8.2f}  {str(t['cache_n']):>7} / {str(t['prompt_n']):<7}")
            print(f"{k + 1:>4} " + " ".join(f"{c:>26}" for c in cells))
        print(f"{'last/first':>10} " + " ".join(f"{r['last_over_first']:>20.2f}" for r in runs))
        print(f"{'agg tok/s':>10} " + " ".join(f"{r['aggregate_tok_s']:>20.2f}" for r in runs))
        print(f"{'load':>10} " + " ".join(f"{r['load'][0]:>20.1f}" for r in runs))


def run_multi_turn(a, model_args: list[str], extra: list[str], exe, draft, target) -> list[dict]:
    rows = []
    for par in [int(x) for x in a.parallel.split(",")]:
        for mode in a.modes.split(","):
            systems = [] if a.no_ours else [("easd-local", False)]
            if a.cache_off_baseline and not a.no_ours:
                systems.append(("easd-local cache off", True))
            if a.cache_ram_off_baseline and not a.no_ours:
                systems.append(("easd-local --cache-ram 0", "ram"))
            for name, off in systems:
                flags = extra + {True: ["--no-cache-prompt"], "ram": ["--cache-ram", "0"]}.get(off, [])
                off = off is True
                server = ours(model_args, par, flags, a.log_dir / f"bench_serve_mt_p{par}_{mode}.log")
                try:
                    rows.append(conversation(server.base, name, par, mode, a, cache_off=off))
                finally:
                    server.stop()
            if exe is not None and mode in ("target", "sd"):
                ls = llama_server(exe, draft, target, par, mode == "sd", a,
                                  a.log_dir / f"llama_server_mt_p{par}_{mode}.log", cache=True)
                try:
                    rows.append(conversation(ls.base, "llama-server", par, mode, a))
                finally:
                    ls.stop()
    multi_turn_table(rows)
    return rows


def ratio_table(rows: list[dict]) -> None:
    def key(r):
        return (r["parallel"], r["mode"], r["clients"])

    theirs = {key(r): r for r in rows if r["system"] == "llama-server"}
    pairs = [(r, theirs[key(r)]) for r in rows if r["system"] == "easd-local" and key(r) in theirs]
    if not pairs:
        return
    print("\nours / llama-server, aggregate tokens/s (goal >= 0.9); texts: requests whose text differs")
    print(f"{'parallel':>8} {'mode':>8} {'K':>3} {'ours':>8} {'theirs':>8} {'ratio':>6} {'texts':>6}")
    for o, t in pairs:
        differ = sum(1 for x, y in zip(o["runs"], t["runs"]) if x["text"] != y["text"])
        print(f"{o['parallel']:>8} {o['mode']:>8} {o['clients']:>3} {o['aggregate_tok_s']:>8.2f} "
              f"{t['aggregate_tok_s']:>8.2f} {o['aggregate_tok_s'] / t['aggregate_tok_s']:>6.2f} "
              f"{differ:>3}/{len(o['runs'])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default=None)
    ap.add_argument("--draft")
    ap.add_argument("--target")
    ap.add_argument("--parallel", default="1,4")
    ap.add_argument("--modes", default="target,sd,easd-tf")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=8, help="requests per (parallel, mode, K); at least K")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=4096, help="context per slot, both sides")
    ap.add_argument("--gamma", type=int, default=4, help="draft length, both sides")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--no-llama-server", action="store_true", help="run only easd-local serve")
    ap.add_argument("--no-ours", action="store_true", help="run only llama-server (to redo its half)")
    ap.add_argument("--multi-turn", type=int, default=0, metavar="N",
                    help="the multi-turn mode: a conversation of N turns per server, prompt cache on for both")
    ap.add_argument("--interleave", choices=("between", "concurrent"), default="between",
                    help="multi-turn: the second client's unrelated requests come one after each turn, or "
                         "back to back from another thread")
    ap.add_argument("--cache-ram-off-baseline", action="store_true",
                    help="multi-turn: also run easd-local with --cache-ram 0 (slots only, no host-memory store)")
    ap.add_argument("--cache-off-baseline", action="store_true",
                    help="multi-turn: also run easd-local with --no-cache-prompt")
    bench_speed.add_build_options(ap, "skip llama-server if it is not built")
    a = ap.parse_args()
    a.no_repack = False  # llama-server's -nr: set below where our loader's verdict says so
    # a SIGTERM (timeout, kill) ends through the finally blocks, so the server process is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model_args = (["--draft", a.draft, "--target", a.target] if a.draft else (["--pair", a.pair] if a.pair else []))
    extra = ["--ctx", str(a.ctx), "--gamma", str(a.gamma)] + (["--threads", str(a.threads)] if a.threads else [])
    exe = draft = target = None
    if not a.no_llama_server:
        draft, target = (Path(a.draft), Path(a.target)) if a.draft else bench_speed.default_pair()
        if a.pair not in (None, "default") or target is None:
            log("NOTE: llama-server runs only with --draft/--target or the pulled default pair; skipping it")
        else:
            tools = bench_speed.ensure_tools(a, ("llama-server",))
            exe = tools["llama-server"] if tools else None
            a.no_repack = exe is not None and repack_off(draft, target, a.threads)
            if a.no_repack:
                log("llama-server runs with -nr (no weight repacking), as our loader does here")
    rows = []
    log(f"load: {os.getloadavg()}")
    if a.multi_turn:
        rows = run_multi_turn(a, model_args, extra, exe, draft, target)
        log(f"load: {os.getloadavg()}")
        if a.json:
            a.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
        return
    print(f"{'system':>12} {'parallel':>8} {'mode':>8} {'K':>3} {'reqs':>4} {'agg tok/s':>10} {'TTFT p50':>9} "
          f"{'TTFT p95':>9} {'req tok/s p50':>13} {'load':>5}")
    for par in [int(x) for x in a.parallel.split(",")]:
        if not a.no_ours:
            server = ours(model_args, par, extra, a.log_dir / f"bench_serve_p{par}.log")
            try:
                for mode in a.modes.split(","):
                    rows += measure(server.base, "easd-local", par, mode, a)
            finally:
                server.stop()
        if exe is None:
            continue
        for mode, with_draft in (("target", False), ("sd", True)):
            if mode not in a.modes.split(","):
                continue
            ls = llama_server(exe, draft, target, par, with_draft, a, a.log_dir / f"llama_server_p{par}_{mode}.log")
            try:
                rows += measure(ls.base, "llama-server", par, mode, a)
            finally:
                ls.stop()
    log(f"load: {os.getloadavg()}")
    ratio_table(rows)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
