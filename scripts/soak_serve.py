#!/usr/bin/env python3
"""Soak `easd-local serve`: many requests from several clients, some that misbehave.

Starts the server on loopback (a free port; the pair given, or the catalog default pair) and
sends ``--requests`` requests (default 1,000) from ``--clients`` client threads (default 8),
each sending its next request as soon as its last one ended, until all are sent or
``--time-limit`` seconds have passed. Request i is, by i mod 10 and a generator seeded with
``--seed`` and i:

* 1 in 10 disconnects: a stream read for 0-4 events then closed, or a non-streamed request
  closed before its answer;
* 1 in 10 malformed: bad JSON, bytes that are not UTF-8, wrong types, a huge ``max_tokens``,
  a prompt over the context, unknown fields (which a server ignores: 200), an unknown path;
* the rest: chat and completion requests, streamed and not, greedy or sampled, in the modes
  of ``--modes``, of 1 to ``--max-tokens`` tokens, some with stop strings; the chats are turns
  of ``2 x clients`` conversations of up to 4 turns (GSM8K questions; "The answer is N." as
  the assistant's turns), request i being a turn of conversation i mod 2K that extends the
  conversation's previous request (the prompt cache's work, when it finds its slot).

The server's ``--queue`` is small (default: clients - parallel - 1), so the queue fills and
some requests get a 503 with ``Retry-After``: each such answer is counted (``503``), and the
client sends the request again after a second, as the openai client would (at most 120
times, then ``gave_up_503``). The first ``--warmup`` requests are a
warm-up: after them the clients stop until every slot is idle, and the server's RSS is taken
(process and children, from /proc).

Printed: requests by outcome (2xx, 4xx by code, 503 queue full, client disconnects, other
5xx and streams that ended in an error event: the failures), the slots busy at the end (from
``/metrics``, after waiting up to 60 s for cancellations to land), the server's RSS at start,
after warm-up and at the end, the host-memory prompt store's bytes then (``--cache-ram``: it
grows by design up to its budget, so the leak check is the RSS less the store), the prompt
tokens the cache reused and evaluated (``/metrics``), answers whose ``timings`` do not add up (``cache_n + prompt_n`` must be the
prompt's tokens), and whether the server is still alive. Exit status 1 if any 5xx, a busy
slot, a dead server or an inconsistent answer, else 0. ``--json`` writes the same as JSON.

Usage::

    nice python scripts/soak_serve.py                        # default pair, 1,000 requests, 8 clients
    python scripts/soak_serve.py --draft D.gguf --target T.gguf --requests 100 --clients 4 --time-limit 120
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_serve import EXE, Server  # noqa: E402  (one way to start a server and wait for it)

MALFORMED = ("bad_json", "not_utf8", "wrong_type", "huge_max_tokens", "over_context", "unknown_fields",
             "unknown_path")
FAILURES = ("5xx", "stream_error", "inconsistent", "client_error", "refused_well_formed")
MAX_503, RETRY_S = 120, 1.0  # a request refused with 503 is sent again after Retry-After, this many times at most


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gsm8k() -> list[tuple[str, str]]:
    rows = (ROOT / "easd_local" / "data" / "gsm8k" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    out = []
    for r in rows[:200]:
        d = json.loads(r)
        out.append((d["question"], f"The answer is {d['answer'].split('####')[-1].strip()}."))
    return out


# ------------------------------------------------------------------------- the server's state
def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (a supervising parent runs the work in a
    child)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(d.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def metrics(host: str, port: int) -> dict[str, float]:
    """/metrics as {name: value summed over labels}."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            out[name_labels.split("{", 1)[0]] += float(value)
    return out


def health(host: str, port: int) -> int | None:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def wait_idle(host: str, port: int, limit_s: float = 60.0) -> tuple[float, float]:
    """(slots busy, requests waiting) once both are 0, or when ``limit_s`` has passed."""
    t_end = time.monotonic() + limit_s
    while True:
        m = metrics(host, port)
        busy, waiting = m.get("easd_requests_processing", -1), m.get("easd_requests_waiting", -1)
        if (busy == 0 and waiting == 0) or time.monotonic() > t_end:
            return busy, waiting
        time.sleep(0.2)


# ------------------------------------------------------------------------- one request
class Plan:
    """What request i sends: method, path, body bytes, whether it streams, how it ends."""

    def __init__(self, i: int, a, qa: list[tuple[str, str]]):
        rng = random.Random(a.seed * 1_000_003 + i)
        self.kind = {0: "disconnect", 5: "malformed"}.get(i % 10, "normal")
        self.method, self.path, self.stream, self.variant = "POST", "/v1/chat/completions", False, ""
        self.read_events = -1  # disconnect: events read before closing (-1: not a disconnect)
        chat = rng.random() < 0.75
        body: dict = {"max_tokens": rng.randint(1, a.max_tokens), "mode": rng.choice(a.modes)}
        if rng.random() < 0.3:
            body.update(temperature=0.7, seed=rng.randint(0, 2**31 - 1))
        else:
            body["temperature"] = 0
        if chat:
            # conversation i mod C is at turn (i // C) mod 4: its requests extend one another
            n_conv = 2 * a.clients
            conv, depth = i % n_conv, (i // n_conv) % 4
            msgs = [{"role": "system", "content": "You are a careful math tutor."}]
            for j in range(depth + 1):
                q, ans = qa[(conv * 4 + j) % len(qa)]
                msgs.append({"role": "user", "content": q})
                if j < depth:
                    msgs.append({"role": "assistant", "content": ans})
            body["messages"] = msgs
        else:
            self.path = "/v1/completions"
            q, _ = qa[rng.randrange(len(qa))]
            body["prompt"] = f"Question: {q}\nAnswer:"
        if rng.random() < 0.15:
            body["stop"] = ["\n\n", "####"]
        if self.kind == "disconnect":
            self.stream = rng.random() < 0.8
            self.read_events = rng.randint(0, 4) if self.stream else 0  # 0: gone before any answer
            body["max_tokens"] = max(body["max_tokens"], 64)
            self.variant = f"after {self.read_events} events" if self.stream else "before the answer"
        elif self.kind == "normal":
            self.stream = rng.random() < 0.5
        body["stream"] = self.stream
        if self.stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        self.raw = json.dumps(body).encode()
        if self.kind == "malformed":
            self.variant = MALFORMED[(i // 10) % len(MALFORMED)]
            v = self.variant
            if v == "bad_json":
                self.raw = self.raw[: len(self.raw) // 2]
            elif v == "not_utf8":
                self.raw = b'{"prompt": "\xff\xfe\xfa", "max_tokens": 2}'
                self.path = "/v1/completions"
            elif v == "wrong_type":
                self.raw = json.dumps({**body, "max_tokens": "ten", "stream": False}).encode()
            elif v == "huge_max_tokens":
                self.raw = json.dumps({**body, "max_tokens": 10**9, "stream": False}).encode()
            elif v == "over_context":
                self.raw = json.dumps({"prompt": "word " * (2 * a.ctx), "max_tokens": 4}).encode()
                self.path = "/v1/completions"
            elif v == "unknown_fields":
                self.raw = json.dumps({**body, "max_tokens": min(body["max_tokens"], 4), "stream": False,
                                       "frobnicate": True, "metadata": {"user": "soak"},
                                       "logit_bias_x": [1, 2]}).encode()
            else:
                self.path = "/v1/chat/completion"  # a typo


def send(host: str, port: int, plan: Plan, timeout: float) -> tuple[str, dict]:
    """Run one planned request; (outcome, details). Outcomes: "2xx", "4xx:<code>",
    "503", "disconnect", and the failures "5xx", "stream_error", "inconsistent", "client_error"."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(plan.method, plan.path, body=plan.raw, headers={"Content-Type": "application/json"})
        if plan.read_events == 0:
            time.sleep(0.05)  # the request is in; leave before the answer (or the stream's first event)
            return "disconnect", {}
        resp = conn.getresponse()
        status = resp.status
        if status != 200:
            body = resp.read()
            try:
                err = json.loads(body)["error"]
            except (ValueError, KeyError, TypeError):
                return ("5xx" if status >= 500 else f"{status // 100}xx:{status}"), {"body": body[:200].decode("utf-8", "replace")}
            if status == 503 and err.get("code") == "queue_full":
                return "503", {}
            if status >= 500:
                return "5xx", {"status": status, "error": err}
            return f"4xx:{status}" + (f":{err['code']}" if err.get("code") else ""), {"param": err.get("param")}
        if not plan.stream:
            obj = json.loads(resp.read())
            return _check(obj.get("usage"), obj.get("timings")), {}
        events, usage, timings = 0, None, None
        while True:
            line = resp.readline()
            if not line:
                return "stream_error", {"why": "the stream ended without [DONE]"}
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            obj = json.loads(data)
            if "error" in obj:
                return "stream_error", {"error": obj["error"]}
            events += 1
            usage = obj.get("usage") or usage
            timings = obj.get("timings") or timings
            if plan.read_events >= 0 and events >= plan.read_events:
                return "disconnect", {}
        if plan.read_events >= 0:
            return "disconnect", {"note": "finished before the client left"}
        return _check(usage, timings), {}
    except (OSError, http.client.HTTPException, ValueError) as e:
        if plan.kind == "disconnect":
            return "disconnect", {}
        return "client_error", {"error": f"{type(e).__name__}: {e}"}
    finally:
        conn.close()


def _check(usage: dict | None, timings: dict | None) -> str:
    if timings is None:
        return "inconsistent"
    if usage is not None and timings.get("cache_n") is not None:
        if timings["cache_n"] + timings["prompt_n"] != usage["prompt_tokens"]:
            return "inconsistent"
    return "2xx"


# ------------------------------------------------------------------------- the run
def run_phase(host: str, port: int, plans: list[Plan], a, t_stop: float, outcomes: collections.Counter,
              examples: dict) -> int:
    """Send ``plans`` from ``a.clients`` threads until done or ``t_stop``; the number sent."""
    lock = threading.Lock()
    todo = collections.deque(plans)
    sent = [0]

    def client() -> None:
        while True:
            with lock:
                if not todo or time.monotonic() > t_stop:
                    return
                plan = todo.popleft()
                sent[0] += 1
            for _ in range(MAX_503):
                outcome, info = send(host, port, plan, timeout=a.request_timeout)
                if outcome != "503":
                    break
                with lock:
                    outcomes["503"] += 1
                time.sleep(RETRY_S)  # the server's Retry-After
            else:
                outcome, info = "gave_up_503", {}
            if plan.kind == "normal" and outcome.startswith("4xx"):
                outcome = "refused_well_formed"  # a well-formed request the server refused
            with lock:
                outcomes[outcome] += 1
                if outcome in FAILURES and len(examples.setdefault(outcome, [])) < 5:
                    examples[outcome].append({"kind": plan.kind, "variant": plan.variant, **info})

    threads = [threading.Thread(target=client, daemon=True) for _ in range(a.clients)]
    for th in threads:
        th.start()
    for th in threads:
        # each request ends within its timeout; the join is bounded too
        th.join(max(1.0, t_stop - time.monotonic()) + a.request_timeout + 30)
    return sent[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default=None)
    ap.add_argument("--draft")
    ap.add_argument("--target")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=3600.0, help="seconds; no new request after it")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up requests (default: a tenth, at most 100)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--queue", type=int, default=None, help="the server's --queue (default clients - parallel - 1)")
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--modes", default="target,sd,easd,easd-tf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--log", type=Path, default=Path("/tmp/soak_serve.log"), help="the server's output")
    a = ap.parse_args()
    a.modes = a.modes.split(",")
    if a.queue is None:
        a.queue = max(0, a.clients - a.parallel - 1)
    warmup = a.warmup if a.warmup is not None else min(100, max(1, a.requests // 10))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model_args = (["--draft", a.draft, "--target", a.target] if a.draft else (["--pair", a.pair] if a.pair else []))
    extra = ["--ctx", str(a.ctx)] + (["--threads", str(a.threads)] if a.threads else [])
    qa = gsm8k()
    plans = [Plan(i, a, qa) for i in range(a.requests)]
    cmd = EXE + ["serve", "--port", "0", "--parallel", str(a.parallel), "--queue", str(a.queue), "--log-level",
                 "warning", *model_args, *extra]
    log(f"load: {os.getloadavg()}  server: {' '.join(cmd[3:])}")
    server = Server(cmd, a.log)
    host, port = server.base.split("//", 1)[1].rsplit(":", 1)
    port = int(port)
    outcomes: collections.Counter = collections.Counter()
    examples: dict = {}
    rep: dict = {"requests_planned": a.requests, "clients": a.clients, "parallel": a.parallel, "queue": a.queue,
                 "ctx": a.ctx, "max_tokens": a.max_tokens, "modes": a.modes, "warmup": warmup,
                 "time_limit_s": a.time_limit, "load_start": os.getloadavg()}
    try:
        rep["rss_start"] = tree_rss(server.proc.pid)
        t0 = time.monotonic()
        t_stop = t0 + a.time_limit
        sent = run_phase(host, port, plans[:warmup], a, t_stop, outcomes, examples)
        wait_idle(host, port)
        rep["rss_after_warmup"] = tree_rss(server.proc.pid)
        rep["store_after_warmup"] = metrics(host, port).get("easd_prompt_cache_ram_bytes", 0.0)
        sent += run_phase(host, port, plans[warmup:], a, t_stop, outcomes, examples)
        rep["wall_s"] = round(time.monotonic() - t0, 1)
        t_idle = time.monotonic()
        busy, waiting = wait_idle(host, port)
        rep["idle_after_s"] = round(time.monotonic() - t_idle, 1)
        rep["rss_end"] = tree_rss(server.proc.pid)
        m = metrics(host, port)
        rep["store_end"] = m.get("easd_prompt_cache_ram_bytes", 0.0)
        rep["store_entries_end"] = m.get("easd_prompt_cache_ram_entries", 0.0)
        rep["store_restored_tokens"] = m.get("easd_prompt_cache_ram_restored_tokens", 0.0)
        rep.update(sent=sent, slots_busy_end=busy, waiting_end=waiting, slots=m.get("easd_slots"),
                   prompt_cached_tokens=m.get("easd_prompt_cached_tokens_total", 0.0),
                   prompt_evaluated_tokens=m.get("easd_prompt_evaluated_tokens_total", 0.0),
                   generated_tokens=m.get("easd_generated_tokens_total", 0.0),
                   health=health(host, port), alive=server.proc.poll() is None)
    finally:
        server.stop()
        rep["server_log_tracebacks"] = a.log.read_text(errors="replace").count("Traceback")
    rep["outcomes"] = dict(sorted(outcomes.items()))
    rep["failures"] = {k: outcomes.get(k, 0) for k in FAILURES}
    rep["failure_examples"] = examples
    rep["load_end"] = os.getloadavg()
    rep["rss_end_vs_warmup"] = rep["rss_end"] / rep["rss_after_warmup"] - 1 if rep.get("rss_after_warmup") else None
    # the host-memory prompt store (--cache-ram) grows by design up to its budget: the leak
    # check is the memory outside it
    if rep.get("rss_after_warmup"):
        rep["rss_less_store_end_vs_warmup"] = ((rep["rss_end"] - rep["store_end"])
                                               / (rep["rss_after_warmup"] - rep["store_after_warmup"]) - 1)
    ok = (not any(rep["failures"].values()) and rep["slots_busy_end"] == 0 and rep["alive"]
          and rep["health"] == 200 and rep["server_log_tracebacks"] == 0)
    rep["ok"] = ok
    mib = 1024 * 1024
    print(f"sent {rep['sent']} of {a.requests} requests from {a.clients} clients in {rep['wall_s']} s "
          f"(--parallel {a.parallel}, --queue {a.queue}, warm-up {warmup}); load {rep['load_start']} -> {rep['load_end']}")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in rep["outcomes"].items())
          + "   (503: answers 'queue full', each request sent again after Retry-After)")
    print(f"5xx and failed streams: {rep['failures']['5xx'] + rep['failures']['stream_error']}   "
          f"inconsistent timings: {rep['failures']['inconsistent']}   client errors: {rep['failures']['client_error']}")
    print(f"slots busy at the end: {rep['slots_busy_end']:g} of {rep['slots']:g} (waiting {rep['waiting_end']:g}; "
          f"idle {rep['idle_after_s']} s after the last request)   server alive: {rep['alive']} (/health {rep['health']})")
    print(f"RSS: start {rep['rss_start'] / mib:.0f} MiB, after warm-up {rep['rss_after_warmup'] / mib:.0f} MiB, "
          f"end {rep['rss_end'] / mib:.0f} MiB ({100 * rep['rss_end_vs_warmup']:+.1f} % vs after warm-up)")
    print(f"host-memory prompt store (--cache-ram): {rep['store_after_warmup'] / mib:.0f} MiB after warm-up, "
          f"{rep['store_end'] / mib:.0f} MiB in {rep['store_entries_end']:.0f} prompts at the end, "
          f"{rep['store_restored_tokens']:.0f} tokens loaded back; RSS less the store: "
          f"{100 * rep['rss_less_store_end_vs_warmup']:+.1f} % vs after warm-up")
    print(f"prompt tokens reused by the cache {rep['prompt_cached_tokens']:.0f}, evaluated "
          f"{rep['prompt_evaluated_tokens']:.0f}; generated {rep['generated_tokens']:.0f}")
    if examples:
        print("failures, first of each: " + json.dumps(examples)[:2000])
    print("OK" if ok else "NOT OK")
    if a.json:
        a.json.write_text(json.dumps(rep, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
