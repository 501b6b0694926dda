#!/usr/bin/env python
"""The controller's own time per generated token, per mode, with llama.cpp's compute taken out.

Each mode's generations are first run for real (``decoding.generate``), and every
``llama_decode`` call is recorded with the logits rows it produced. They are then replayed many
times: ``llama_decode`` becomes a stub that puts the recorded rows where llama.cpp keeps its
logits (the runtime's getter, ``runtime.logits_address``, points at them), so everything else runs
as in a real generation: the runtime's batch filling and its reading of the logits rows (the
copies or views), the rules, the gate, the steps, the scheduler and the events. What is timed
is ``seconds_controller`` as ``generate --json`` reports it: everything outside
``llama_decode`` (plus the stub's own few microseconds a decode).

    python scripts/bench_controller.py                     # tiny pair (306 tokens), 10 questions, 128 tokens
    python scripts/bench_controller.py --pair default      # the default pair (151,936 tokens), 2 questions, 96 tokens
    python scripts/bench_controller.py --draft D.gguf --target T.gguf --json

Modes: target, sd (greedy), sd-t0.7 (sd sampled at temperature 0.7, seed 0), easd and easd-tf
(greedy, default thresholds), one sequence. Per mode it prints the microseconds per generated
token (the minimum over repeats, and the median), split into:

- ``runtime``: the runtime's side of each decode (filling the batch, reading the logits rows out
  of llama.cpp: copies, views, the finiteness check);
- ``rules``: the token rules (argmax, softmax and sampling, the residual, the verify loop);
- ``gate``: the EASD gate (entropies, top-N sets, overlap);
- ``scheduler``: the rest (steps, drafter bookkeeping, scheduler, events, detokenizing);

taken from one more replay with each part's functions timed (their timers cost a little; the
split is the instrumented run's, the totals are the clean runs'). ``live`` is
``seconds_controller`` ÷ tokens of the real (recorded) generations, as ``generate --json``
reports it, so it moves with the load on the machine; the replayed figures far less (no
decode to be descheduled in). ``--json`` prints one object with ``us_per_token`` per mode.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402

from easd_local.bench.datasets import load_dataset  # noqa: E402
from easd_local.bench.prompt import build_messages  # noqa: E402
from easd_local.engine import decoding  # noqa: E402
from easd_local.engine.config import DecodeConfig  # noqa: E402
from easd_local.engine.pair import load_pair  # noqa: E402
from easd_local.llamacpp import runtime  # noqa: E402
from easd_local.llamacpp.runtime import LoadOptions  # noqa: E402

# label -> the settings of that run (greedy unless said; default thresholds)
MODES = {
    "target": dict(mode="target"),
    "sd": dict(mode="sd"),
    "sd-t0.7": dict(mode="sd", temperature=0.7),
    "easd": dict(mode="easd"),
    "easd-tf": dict(mode="easd-tf"),
    "sd:ngram-simple": dict(mode="sd", spec_type="ngram-simple"),  # prompt lookup: no draft model
}
PARTS = ("runtime", "rules", "gate", "scheduler")


# ------------------------------------------------------------------ record and replay
class Replay:
    """``llama_decode`` recorded on the first pass (with the logits rows each call produced),
    replayed afterwards: the stub checks the batch is the recorded one and points the runtime's
    logits getter at the recorded rows."""

    def __init__(self, n_vocab: dict[int, int]) -> None:
        self.n_vocab = n_vocab  # context address -> row width
        # llama_decode, the row getter the recording copies through, the runtime's address getter
        self.real = (llama_cpp.llama_decode, llama_cpp.llama_get_logits_ith, runtime.logits_address)
        self.calls: list[tuple] = []  # (ctx, n_tokens, first token, last token, rows (n, V), {batch index: row})
        self.at = 0
        self.replaying = False
        self.current: dict[int, tuple[np.ndarray, dict[int, int]]] = {}
        # --cold: a buffer streamed through the caches before each replayed decode, as a CPU
        # decode streams the weights; the seconds between decodes are summed in ``gaps``
        self.cold: np.ndarray | None = None
        self.gaps, self._back = 0.0, None

    def install(self) -> None:
        llama_cpp.llama_decode = self.decode
        runtime.logits_address = self.logits_address

    def uninstall(self) -> None:
        llama_cpp.llama_decode = self.real[0]
        runtime.logits_address = self.real[2]

    def rewind(self) -> None:
        self.at = 0

    def decode(self, ctx, batch) -> int:
        n = batch.n_tokens
        if self.replaying and self.cold is not None:
            if self._back is not None:
                self.gaps += time.perf_counter() - self._back
            self.cold += 1  # read and written: the caches hold it, not the controller's data
            self._back = time.perf_counter()
        if self.replaying:
            rec = self.calls[self.at]
            self.at += 1
            if rec[:4] != (ctx, n, batch.token[0], batch.token[n - 1]):
                raise RuntimeError("the replay left the recorded path (a decision changed between runs)")
            self.current[ctx] = rec[4], rec[5]
            return 0
        rc = self.real[0](ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc}) while recording")
        flagged = [j for j in range(n) if batch.logits[j]]
        V = self.n_vocab[ctx]
        rows = np.empty((len(flagged), V), dtype=np.float32)
        for r, j in enumerate(flagged):
            rows[r] = np.ctypeslib.as_array(self.real[1](ctx, j), shape=(V,))
        self.calls.append((ctx, n, batch.token[0], batch.token[n - 1], rows, {j: r for r, j in enumerate(flagged)}))
        self.current[ctx] = rows, self.calls[-1][5]
        return 0

    def logits_address(self, ctx, j):  # the runtime's own getter (an int address)
        if not self.replaying:
            return self.real[2](ctx, j)
        rows, where = self.current[ctx]
        return rows.ctypes.data + where[j] * rows.shape[1] * 4


# ------------------------------------------------------------------ the split
class Split:
    """Exclusive time per part: each wrapped function's time goes to its part, less the time
    of wrapped functions of another part it calls."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS + ("stub",), 0.0)
        self.stack = ["scheduler"]
        self.t = 0.0
        self.undo: list[tuple[object, str, object]] = []

    def start(self) -> None:
        self.seconds = dict.fromkeys(PARTS + ("stub",), 0.0)
        self.stack = ["scheduler"]
        self.t = time.perf_counter()

    def stop(self) -> None:
        now = time.perf_counter()
        self.seconds[self.stack[-1]] += now - self.t
        self.t = now

    def wrap(self, owner, name: str, part: str) -> None:
        fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if fn is None or isinstance(fn, (property, functools.cached_property)):
            return
        split = self

        @functools.wraps(fn)
        def timed(*a, **kw):
            now = time.perf_counter()
            split.seconds[split.stack[-1]] += now - split.t
            split.t = now
            split.stack.append(part)
            try:
                return fn(*a, **kw)
            finally:
                now = time.perf_counter()
                split.seconds[split.stack.pop()] += now - split.t
                split.t = now

        self.undo.append((owner, name, fn))
        setattr(owner, name, timed)

    def install(self) -> None:
        from easd_local.engine import gate, rules, sequence
        from easd_local.llamacpp import runtime
        from easd_local.engine.drafters import model as drafter

        for name in ("decode_batch",):
            self.wrap(runtime.Model, name, "runtime")
        for name in ("verify", "target_first", "greedy", "runner_up", "sampling_probs", "distribution", "prob",
                     "sample", "residual", "residual_point", "penalize", "sd_accept"):
            self.wrap(rules, name, "rules")
        self.wrap(sequence.Seq, "sample", "rules")
        self.wrap(drafter, "top_probability", "rules")
        for name in ("screen", "read", "read_lazily", "wants_draft"):
            self.wrap(gate.Gate, name, "gate")
        # llama_decode itself (the replay's stub) is nobody's part: it is timed out of the runtime
        self.wrap(llama_cpp, "llama_decode", "stub")

    def uninstall(self) -> None:
        for owner, name, fn in reversed(self.undo):
            setattr(owner, name, fn)
        self.undo.clear()


# ------------------------------------------------------------------ runs
def run_prompts(pair, prompts, settings: dict, max_tokens: int) -> tuple[float, int, float]:
    """Every prompt once from empty caches: (seconds, tokens, seconds_controller)."""
    seconds = controller = 0.0
    n = 0
    cfg = DecodeConfig(max_tokens=max_tokens, **settings)
    for prompt in prompts:
        pair.target.reset()
        pair.draft.reset()
        t0 = time.perf_counter()
        fin, _ = decoding.generate_all(pair.target, pair.draft, prompt, cfg, n_vocab=pair.n_vocab)
        seconds += time.perf_counter() - t0
        n += fin.stats.tokens
        controller += fin.stats.seconds_controller
    return seconds, n, controller


def bench_mode(pair, replay: Replay, prompts, settings: dict, max_tokens: int, repeats: int,
               profile: int = 0) -> dict:
    swept, replay.cold = replay.cold, None  # warm runs first
    try:
        return _bench_mode(pair, replay, prompts, settings, max_tokens, repeats, profile, swept)
    finally:
        replay.cold = swept


def _bench_mode(pair, replay: Replay, prompts, settings: dict, max_tokens: int, repeats: int, profile: int,
                swept: np.ndarray | None) -> dict:
    replay.calls.clear()
    replay.replaying = False
    _, tokens, live = run_prompts(pair, prompts, settings, max_tokens)  # the real generations, recorded
    replay.replaying = True
    per_token, cold = [], []
    for _ in range(repeats):
        replay.rewind()
        s, n, _ = run_prompts(pair, prompts, settings, max_tokens)
        assert n == tokens, (n, tokens)
        per_token.append(1e6 * s / n)
    for _ in range(repeats if swept is not None else 0):  # again, the caches swept before each decode
        replay.rewind()
        replay.cold, replay.gaps, replay._back = swept, 0.0, None
        run_prompts(pair, prompts, settings, max_tokens)
        replay.cold = None
        cold.append(1e6 * replay.gaps / tokens)
    split = Split()
    split.install()
    try:
        replay.rewind()
        split.start()
        run_prompts(pair, prompts, settings, max_tokens)
        split.stop()
    finally:
        split.uninstall()
    if profile:  # where the replayed time goes, function by function (to stderr)
        import cProfile
        import pstats

        prof = cProfile.Profile()
        replay.rewind()
        prof.runcall(run_prompts, pair, prompts, settings, max_tokens)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(profile)
    replay.calls.clear()
    return {
        "tokens": tokens,
        "us_per_token": round(min(per_token), 1),
        "us_per_token_median": round(statistics.median(per_token), 1),
        "split_us_per_token": {p: round(1e6 * split.seconds[p] / tokens, 1) for p in PARTS},
        "live_controller_us_per_token": round(1e6 * live / tokens, 1),
        **({"cold_us_per_token": round(min(cold), 1)} if cold else {}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", help="draft GGUF (a path or a catalog model name); default: the tiny pair")
    ap.add_argument("--target", help="target GGUF (a path or a catalog model name)")
    ap.add_argument("--pair", help="a catalog pair (e.g. default) instead of --draft/--target")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--n-prompts", type=int, help="GSM8K questions (default 10 on the tiny pair, else 2)")
    ap.add_argument("--max-tokens", type=int, help="tokens per generation (default 128 on the tiny pair, else 96)")
    ap.add_argument("--repeats", type=int, help="replays per mode (default 10 on the tiny pair, else 5)")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads for the recording (default: all)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cold", type=int, default=0, metavar="MB",
                    help="also replay with MB of memory streamed through the caches before each decode, as a CPU "
                         "decode streams the weights, and print the controller's time between decodes (cold)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after each mode, print its N costliest functions in one replay under cProfile (stderr)")
    a = ap.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    tiny = not (a.draft or a.target or a.pair)
    if tiny:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_modes import tiny_pair  # the one writer of a temporary tiny pair

        draft, target = tiny_pair()
        label = "tiny pair"
    else:
        from easd_local.store.resolve import resolve_pair

        files = resolve_pair(a.pair, a.draft, a.target)
        draft, target, label = files.draft, files.target, files.label
    n_prompts = a.n_prompts or (10 if tiny else 2)
    max_tokens = a.max_tokens or (128 if tiny else 96)
    repeats = a.repeats or (10 if tiny else 5)

    pair = load_pair(draft, target, LoadOptions(n_ctx=2048, n_threads=a.threads))
    prompts = [pair.target.vocab.chat_tokens(build_messages(p.question))
               for p in load_dataset("gsm8k", limit=n_prompts)]
    replay = Replay({m._ctx: m.n_vocab for m in (pair.target, pair.draft)})
    if a.cold > 0:
        replay.cold = np.zeros(a.cold << 18, dtype=np.float32)  # MB of float32
    replay.install()
    out = {}
    try:
        for m in modes:
            out[m] = bench_mode(pair, replay, prompts, MODES[m], max_tokens, repeats, a.profile)
            print(f"{m}: {json.dumps(out[m])}", file=sys.stderr, flush=True)  # progress: a mode takes minutes
    finally:
        replay.uninstall()
    meta = {"pair": label, "n_vocab": pair.n_vocab, "n_prompts": len(prompts), "max_tokens": max_tokens,
            "repeats": repeats, "loadavg": round(os.getloadavg()[0], 2)}
    if a.json:
        print(json.dumps({**meta, "modes": out}))
        return 0
    print(f"controller time per generated token, llama_decode replayed: {label} (vocabulary {pair.n_vocab:,}), "
          f"{len(prompts)} GSM8K questions, up to {max_tokens} tokens, {repeats} replays; "
          f"load average {meta['loadavg']:.2f}")
    head = f"{'mode':8} {'tokens':>6} {'min us':>8} {'median':>8} " + " ".join(f"{p:>9}" for p in PARTS)
    print(head + f" {'live':>8}" + (f" {'cold':>8}" if a.cold > 0 else ""))
    for m, r in out.items():
        split = " ".join(f"{r['split_us_per_token'][p]:>9}" for p in PARTS)
        print(f"{m:8} {r['tokens']:>6} {r['us_per_token']:>8} {r['us_per_token_median']:>8} {split} "
              f"{r['live_controller_us_per_token']:>8}" + (f" {r['cold_us_per_token']:>8}" if a.cold > 0 else ""))
    print("(us per generated token; split: one instrumented replay; live: seconds_controller / tokens of the "
          "recorded generations" + (f"; cold: the controller between replayed decodes, {a.cold} MB streamed through "
                                    "the caches before each (min)" if a.cold > 0 else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
