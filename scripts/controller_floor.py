#!/usr/bin/env python
"""The least a Python controller pays here between two decodes: a bare greedy loop over
llama-cpp-python's own calls, beside easd-local's ``generate`` on the same pair, prompt and
machine, the two alternating round by round.

    python scripts/controller_floor.py                           # the default pair: target and greedy sd
    python scripts/controller_floor.py --modes target --rounds 5
    python scripts/controller_floor.py --draft D.gguf --target T.gguf --max-tokens 32

The bare loop fills llama.cpp's batch, calls ``llama_decode``, takes each wanted row's address
(``llama_get_logits_ith``), reads the row through a numpy view and takes its argmax; for sd
(greedy, the draft model proposing up to ``--gamma`` tokens, one verify block, the longest
agreeing prefix and the target's token after it) it also rolls the two caches back
(``llama_memory_seq_rm``). Nothing else: no text, no events, no statistics, no check of a row
for NaN, no scheduler. Its batches are the ones easd-local builds for the same modes, so it
emits the same tokens (a difference is printed).

Printed per mode and round: the microseconds a generated token spends outside
``llama_decode`` (``seconds_controller`` ÷ tokens, as ``generate --json`` reports it, for
easd-local; the same clock for the bare loop: its wall time less its ``llama_decode``
seconds), and the two's difference. At the default pair on a CPU, each decode streams the
weights through the caches, so even the bare loop's few lines run cold (its row argmax alone
several times its warm cost: the last line, the argmax of the target's row straight after a
decode and at once again): the bare figure is a floor under any Python controller on this
machine, not a target of easd-local's. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller_split import PROMPT, add_pair_options, default_pair_files  # noqa: E402  (a sibling script)


class Bare:
    """One model's context driven by hand (sequence 0): the batch's fields, its decode and the
    rows' views, its rollback. ``seconds`` sums the time inside ``llama_decode``."""

    def __init__(self, model) -> None:
        from easd_local.llamacpp import runtime

        self._ll, self._rt = runtime._ll, runtime
        self.m, self.ctx, self.batch = model, model._ctx, model._batch
        self.fields = model._fields
        self.mem = self._ll.llama_get_memory(self.ctx)
        self.n = 0  # cells held
        self.seconds = 0.0
        self.views: dict[int, object] = {}

    def decode(self, tokens: list[int], rows: int) -> list:
        """Evaluate ``tokens`` after the cells held; the views of the last ``rows`` rows."""
        token, pos, n_seq_id, seq_id, logits = self.fields
        k = len(tokens)
        for j, t in enumerate(tokens):
            token[j], pos[j], n_seq_id[j], seq_id[j][0], logits[j] = t, self.n + j, 1, 0, j >= k - rows
        self.batch.n_tokens = k
        t0 = time.perf_counter()
        rc = self._ll.llama_decode(self.ctx, self.batch)
        if self.m._sync is not None:  # on a GPU: the wait for the device is the decode's (as in the runtime)
            self.m._sync(self.ctx)
        self.seconds += time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.n += k
        out = []
        for j in range(k - rows, k):
            a = self._rt.logits_address(self.ctx, j)
            z = self.views.get(a)
            if z is None:
                import numpy as np

                z = self.views[a] = np.asarray(self._rt._Rows(a, 1, self.m.n_vocab))[0]
            out.append(z)
        return out

    def keep(self, n: int) -> None:
        """Drop the cells from position ``n`` on."""
        if n < self.n:
            self._ll.llama_memory_seq_rm(self.mem, 0, n, -1)
            self.n = n


def bare_target(target, prompt: list[int], max_tokens: int) -> tuple[list[int], float, float]:
    """The bare target loop: (tokens, wall seconds, seconds inside llama_decode)."""
    target.reset()
    t = Bare(target)
    t0 = time.perf_counter()
    t.decode(prompt[:-1], 0)
    last, out = prompt[-1], []
    while len(out) < max_tokens:
        last = int(t.decode([last], 1)[0].argmax())
        out.append(last)
    wall = time.perf_counter() - t0
    target.reset()
    return out, wall, t.seconds


def argmax_probe(target, prompt: list[int], n: int) -> tuple[float, float]:
    """Median µs of the row's argmax straight after each of ``n`` one-token decodes, and of
    the same argmax at once again (the row then in the caches)."""
    target.reset()
    t = Bare(target)
    t.decode(prompt[:-1], 0)
    last, first, again = prompt[-1], [], []
    for _ in range(n):
        z = t.decode([last], 1)[0]
        t0 = time.perf_counter()
        last = int(z.argmax())
        t1 = time.perf_counter()
        z.argmax()
        again.append(time.perf_counter() - t1)
        first.append(t1 - t0)
    target.reset()
    return statistics.median(first) * 1e6, statistics.median(again) * 1e6


def bare_sd(target, draft, prompt: list[int], max_tokens: int, gamma: int) -> tuple[list[int], float, float]:
    """The bare greedy SD loop with the draft model (as easd-local's sd step: the draft
    catches up with what it lacks, drafts one token a decode, the target verifies the last
    token and the drafts in one block; both caches keep what is still on the path)."""
    target.reset()
    draft.reset()
    t, d = Bare(target), Bare(draft)
    t0 = time.perf_counter()
    t.decode(prompt[:-1], 0)
    d.decode(prompt[:-1], 0)
    seq, n0 = list(prompt), len(prompt)
    while len(seq) - n0 < max_tokens:
        n_old = len(seq)
        n_max = min(gamma, max_tokens - (n_old - n0))
        drafts, pending = [], seq[d.n:]
        while len(drafts) < n_max:
            x = int(d.decode(pending, 1)[0].argmax())
            drafts.append(x)
            pending = [x]
        rows = t.decode([seq[-1], *drafts], len(drafts) + 1)
        for j, z in enumerate(rows):
            x = int(z.argmax())
            seq.append(x)
            if j == len(drafts) or x != drafts[j] or len(seq) - n0 >= max_tokens:
                break
        t.keep(len(seq) - 1)
        keep = n_old - 1  # the draft's cells: what is still on the path, short of the last token
        while keep < min(d.n, len(seq) - 1) and _drafted(keep, n_old, seq, drafts):
            keep += 1
        d.keep(keep)
    wall = time.perf_counter() - t0
    target.reset()
    draft.reset()
    return seq[n0:n0 + max_tokens], wall, t.seconds + d.seconds


def _drafted(i: int, n_old: int, seq: list[int], drafts: list[int]) -> bool:
    """Whether the draft's cell at position ``i`` (>= n_old - 1) holds ``seq[i]``: that cell
    holds the verify's first token (position n_old - 1) or a draft (position n_old + j - 1
    holds drafts[j - 1])."""
    return i == n_old - 1 or drafts[i - n_old] == seq[i]


def ours(pair, prompt: list[int], mode: str, max_tokens: int, gamma: int) -> tuple[list[int], float]:
    """easd-local's generate: (tokens, seconds_controller)."""
    from easd_local.engine.config import DecodeConfig
    from easd_local.engine.decoding import Finished, generate

    for m in pair.models:
        m.reset()
    cfg = DecodeConfig(mode=mode, spec_type="draft", max_tokens=max_tokens, temperature=0.0, gamma=gamma)
    fin = None
    for ev in generate(pair.target, pair.draft, prompt, cfg, n_vocab=pair.n_vocab, pair=pair):
        if isinstance(ev, Finished):
            fin = ev
    return list(fin.tokens), fin.stats.seconds_controller


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_pair_options(ap)
    ap.add_argument("--modes", default="target,sd", help="comma-separated, of target and sd (greedy)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--gamma", type=int, default=4, help="sd's most drafted tokens a verify (default 4)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in ("target", "sd") for m in modes):
        ap.error("--modes: target and/or sd")
    if a.max_tokens < 2 or a.rounds < 1 or a.threads < 1 or a.gamma < 1:
        ap.error("--max-tokens >= 2, --rounds, --threads and --gamma >= 1")
    from easd_local import host
    from easd_local.engine.pair import open_models
    from easd_local.llamacpp.runtime import LoadOptions

    default_pair_files(a, "sd" in modes)
    draft = a.draft if "sd" in modes else None
    with open_models(draft, a.target, LoadOptions(n_ctx=2048, n_threads=a.threads, n_gpu_layers=0)) as pair:
        prompt = pair.target.vocab.chat_tokens([{"role": "user", "content": a.prompt}])
        print(f"µs a generated token outside llama_decode; {a.max_tokens} tokens, {a.threads} threads, "
              f"target {Path(a.target).name}" + (f", draft {Path(a.draft).name}" if draft else "")
              + f"; load average {host.load():.2f}")
        for mode in modes:
            rows = []
            for r in range(a.rounds):
                if mode == "target":
                    toks, wall, dec = bare_target(pair.target, prompt, a.max_tokens)
                else:
                    toks, wall, dec = bare_sd(pair.target, pair.draft, prompt, a.max_tokens, a.gamma)
                bare_us = (wall - dec) / len(toks) * 1e6
                mine, ctl = ours(pair, prompt, mode, a.max_tokens, a.gamma)
                ours_us = ctl / max(1, len(mine)) * 1e6
                same = "same tokens" if mine == toks else \
                    f"tokens differ from position {next((i for i, (x, y) in enumerate(zip(mine, toks)) if x != y), min(len(mine), len(toks)))}"
                rows.append((bare_us, ours_us))
                print(f"{mode:7s} round {r + 1}: bare loop {bare_us:6.0f}   easd-local {ours_us:6.0f}   "
                      f"difference {ours_us - bare_us:6.0f}   ({same})", flush=True)
            b, o = statistics.median(x for x, _ in rows), statistics.median(y for _, y in rows)
            print(f"{mode:7s} median : bare loop {b:6.0f}   easd-local {o:6.0f}   difference {o - b:6.0f}")
        cold, warm = argmax_probe(pair.target, prompt, min(a.max_tokens, 64))
        print(f"the target's row, argmax straight after a decode {cold:.0f} µs, the same argmax again {warm:.0f} µs "
              f"(medians over {min(a.max_tokens, 64)} decodes)")
    return 0


if __name__ == "__main__":
    from easd_local.cli.common import run_script

    sys.exit(run_script(main))
