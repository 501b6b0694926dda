#!/usr/bin/env python
"""The least a Python controller pays here between two decodes: a bare greedy loop over
llama-cpp-python's own calls, beside easd-local's ``generate`` on the same pair, prompt and
machine, the two alternating round by round.

    python scripts/controller_floor.py                           # the default pair: target and greedy sd
    python scripts/controller_floor.py --modes target --rounds 5
    python scripts/controller_floor.py --draft D.gguf --target T.gguf --max-tokens 32
    python scripts/controller_floor.py --backend-sampling      # also the loops with llama.cpp's argmax

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

``--backend-sampling`` runs each bare loop a second time with llama.cpp taking the argmax
itself: a greedy sampler chain attached to the sequence (``llama_set_sampler``) puts
``ggml_argmax`` in the decode's graph, no row is copied out, and the loop reads each token
(``llama_get_sampled_token_ith``). The two bare loops take turns going first, round by round,
and each line also gives both loops' milliseconds a token in all (their wall time over the
tokens, the prompt's evaluation included), so that what leaves the controller's clock and what
the decode gains or loses are seen side by side.
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
    rows' views, its rollback. ``seconds`` sums the time inside ``llama_decode``.

    ``sampled``: llama.cpp picks each wanted row's argmax itself (a greedy sampler chain
    attached to sequence 0, ``llama_set_sampler``: ``ggml_argmax`` in the decode's graph, and
    no row copied out of it), and ``picks`` reads the tokens (``llama_get_sampled_token_ith``);
    ``close`` detaches it. Otherwise ``picks`` takes numpy's argmax of each row's view."""

    def __init__(self, model, sampled: bool = False) -> None:
        from easd_local.llamacpp import runtime

        self._ll, self._rt = runtime._ll, runtime
        self.m, self.ctx, self.batch = model, model._ctx, model._batch
        self.fields = model._fields
        self.mem = self._ll.llama_get_memory(self.ctx)
        self.n = 0  # cells held
        self.seconds = 0.0
        self.views: dict[int, object] = {}
        self.chain = None
        if sampled:
            ll = self._ll
            if not hasattr(ll, "llama_set_sampler"):  # an experimental API of llama.cpp's (0.3.36 has it)
                raise RuntimeError("this llama-cpp-python has no backend sampling (llama_set_sampler)")
            self.chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
            ll.llama_sampler_chain_add(self.chain, ll.llama_sampler_init_greedy())
            if not ll.llama_set_sampler(self.ctx, 0, self.chain):
                self.close()
                raise RuntimeError("llama.cpp cannot sample on this model's backend (llama_set_sampler)")

    def close(self) -> None:
        """Detach and free the sampler chain (the context then copies rows out again)."""
        if self.chain is not None:
            self._ll.llama_set_sampler(self.ctx, 0, None)
            self._ll.llama_sampler_free(self.chain)
            self.chain = None

    def picks(self, tokens: list[int], rows: int) -> list:
        """Evaluate ``tokens`` after the cells held; what gives the last ``rows`` rows' argmax
        tokens: llama.cpp's tokens where it samples, else the rows' views (whose argmax the
        loop takes, as it needs them: a verify stops at its first rejection). ``token`` reads
        either."""
        if self.chain is None:
            return self.decode(tokens, rows)
        self._run(tokens, rows)
        k = len(tokens)
        got, ctx = self._ll.llama_get_sampled_token_ith, self.ctx
        return [got(ctx, j) for j in range(k - rows, k)]

    def token(self, pick) -> int:
        """The argmax token of one of ``picks``' entries."""
        return pick if self.chain is not None else int(pick.argmax())

    def decode(self, tokens: list[int], rows: int) -> list:
        """Evaluate ``tokens`` after the cells held; the views of the last ``rows`` rows."""
        self._run(tokens, rows)
        k = len(tokens)
        out = []
        for j in range(k - rows, k):
            a = self._rt.logits_address(self.ctx, j)
            z = self.views.get(a)
            if z is None:
                import numpy as np

                z = self.views[a] = np.asarray(self._rt._Rows(a, 1, self.m.n_vocab))[0]
            out.append(z)
        return out

    def _run(self, tokens: list[int], rows: int) -> None:
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

    def keep(self, n: int) -> None:
        """Drop the cells from position ``n`` on."""
        if n < self.n:
            self._ll.llama_memory_seq_rm(self.mem, 0, n, -1)
            self.n = n


def bare_target(target, prompt: list[int], max_tokens: int, sampled: bool = False) -> tuple[list[int], float, float]:
    """The bare target loop: (tokens, wall seconds, seconds inside llama_decode); ``sampled``:
    llama.cpp takes each argmax (``Bare``)."""
    target.reset()
    t = Bare(target, sampled)
    try:
        t0 = time.perf_counter()
        t.picks(prompt[:-1], 0)
        last, out = prompt[-1], []
        while len(out) < max_tokens:
            last = t.token(t.picks([last], 1)[0])
            out.append(last)
        wall = time.perf_counter() - t0
    finally:
        t.close()
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


def bare_sd(target, draft, prompt: list[int], max_tokens: int, gamma: int,
            sampled: bool = False) -> tuple[list[int], float, float]:
    """The bare greedy SD loop with the draft model (as easd-local's sd step: the draft
    catches up with what it lacks, drafts one token a decode, the target verifies the last
    token and the drafts in one block; both caches keep what is still on the path);
    ``sampled``: llama.cpp takes each argmax, on both models (``Bare``)."""
    target.reset()
    draft.reset()
    t = Bare(target, sampled)
    try:
        d = Bare(draft, sampled)
    except BaseException:
        t.close()
        raise
    try:
        t0 = time.perf_counter()
        t.picks(prompt[:-1], 0)
        d.picks(prompt[:-1], 0)
        seq, n0 = list(prompt), len(prompt)
        while len(seq) - n0 < max_tokens:
            n_old = len(seq)
            n_max = min(gamma, max_tokens - (n_old - n0))
            drafts, pending = [], seq[d.n:]
            while len(drafts) < n_max:
                x = d.token(d.picks(pending, 1)[0])
                drafts.append(x)
                pending = [x]
            for j, pick in enumerate(t.picks([seq[-1], *drafts], len(drafts) + 1)):
                x = t.token(pick)
                seq.append(x)
                if j == len(drafts) or x != drafts[j] or len(seq) - n0 >= max_tokens:
                    break
            t.keep(len(seq) - 1)
            keep = n_old - 1  # the draft's cells: what is still on the path, short of the last token
            while keep < min(d.n, len(seq) - 1) and _drafted(keep, n_old, seq, drafts):
                keep += 1
            d.keep(keep)
        wall = time.perf_counter() - t0
    finally:
        t.close()
        d.close()
        target.reset()
        draft.reset()
    return seq[n0:n0 + max_tokens], wall, t.seconds + d.seconds


def _drafted(i: int, n_old: int, seq: list[int], drafts: list[int]) -> bool:
    """Whether the draft's cell at position ``i`` (>= n_old - 1) holds ``seq[i]``: that cell
    holds the verify's first token (position n_old - 1) or a draft (position n_old + j - 1
    holds drafts[j - 1])."""
    return i == n_old - 1 or drafts[i - n_old] == seq[i]


def _bare(pair, prompt: list[int], mode: str, a, sampled: bool) -> tuple[list[int], float, float]:
    """One bare loop: (tokens, µs a token outside llama_decode, ms a token in all)."""
    if mode == "target":
        toks, wall, dec = bare_target(pair.target, prompt, a.max_tokens, sampled)
    else:
        toks, wall, dec = bare_sd(pair.target, pair.draft, prompt, a.max_tokens, a.gamma, sampled)
    return toks, (wall - dec) / len(toks) * 1e6, wall / len(toks) * 1e3


def outputs_per_seq(n: int) -> None:
    """Contexts made from now on let a sampler attached to a sequence take up to ``n`` rows of
    one batch (a verify block's; llama.cpp's default context parameters allow 1)."""
    from easd_local.llamacpp import runtime

    made = runtime._context_params

    def params(*args, **kw):
        cparams = made(*args, **kw)
        cparams.n_outputs_max_per_seq = n
        return cparams

    runtime._context_params = params


def _line(row: dict) -> str:
    """One round's (or the medians') figures: µs a token outside llama_decode (and, with
    llama.cpp's argmax beside it, each bare loop's ms a token in all)."""
    out = f"bare loop {row['bare']:6.0f}   "
    if "lcpp" in row:
        out += f"bare, llama.cpp's argmax {row['lcpp']:6.0f}   "
    out += f"easd-local {row['ours']:6.0f}   difference {row['ours'] - row['bare']:6.0f}"
    if "lcpp" in row:
        out += f"   ms a token: bare {row['bare_ms']:.2f}, llama.cpp's argmax {row['lcpp_ms']:.2f}"
    return out


def _parted(a: list[int], b: list[int]) -> str:
    from easd_local.engine.near_ties import first_difference

    k = first_difference(a, b)
    return "same tokens" if k is None else f"tokens differ from position {k}"


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
    ap.add_argument("--backend-sampling", action="store_true",
                    help="also run each bare loop with llama.cpp taking the argmax in the decode's graph (a greedy "
                         "sampler attached, no row copied out), and print each bare loop's milliseconds a token")
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
    if a.backend_sampling:
        outputs_per_seq(a.gamma + 1)
    draft = a.draft if "sd" in modes else None
    with open_models(draft, a.target, LoadOptions(n_ctx=2048, n_threads=a.threads, n_gpu_layers=0)) as pair:
        prompt = pair.target.vocab.chat_tokens([{"role": "user", "content": a.prompt}])
        print(f"µs a generated token outside llama_decode; {a.max_tokens} tokens, {a.threads} threads, "
              f"target {Path(a.target).name}" + (f", draft {Path(a.draft).name}" if draft else "")
              + f"; load average {host.load():.2f}")
        for mode in modes:
            rows = []
            for r in range(a.rounds):
                # the two bare loops in turn, first one and then the other (the machine drifts)
                order = (r % 2 == 1, r % 2 == 0) if a.backend_sampling else (False,)
                runs = {sampled: _bare(pair, prompt, mode, a, sampled) for sampled in order}
                bare, lcpp = runs[False], runs.get(True)
                mine, ctl = ours(pair, prompt, mode, a.max_tokens, a.gamma)
                row = {"bare": bare[1], "ours": ctl / max(1, len(mine)) * 1e6, "bare_ms": bare[2]}
                if lcpp is not None:
                    row.update(lcpp=lcpp[1], lcpp_ms=lcpp[2])
                rows.append(row)
                notes = _parted(mine, bare[0]) + ("" if lcpp is None or lcpp[0] == bare[0] else
                                                  f"; llama.cpp's argmax: {_parted(lcpp[0], bare[0])}")
                print(f"{mode:7s} round {r + 1}: {_line(row)}   ({notes})", flush=True)
            print(f"{mode:7s} median : {_line({k: statistics.median(x[k] for x in rows) for k in rows[0]})}")
        cold, warm = argmax_probe(pair.target, prompt, min(a.max_tokens, 64))
        print(f"the target's row, argmax straight after a decode {cold:.0f} µs, the same argmax again {warm:.0f} µs "
              f"(medians over {min(a.max_tokens, 64)} decodes)")
    return 0


if __name__ == "__main__":
    from easd_local.cli.common import run_script

    sys.exit(run_script(main))
