"""Today's single-sequence decoding loop, kept only to measure the scheduler's B = 1 path
against it side by side (scripts/bench_batch.py); it will be deleted once measured.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import numpy as np

from . import rules
from .config import DecodeConfig
from .decoding import BONUS, DRAFT, EASD, TARGET, Event, Finished, Stats, TokenEvent, fits_context
from .errors import ConfigError, ContextOverflowError
from .runtime import Detokenizer, Model


class _Clock:
    """Accumulates the seconds spent inside draft and target decodes."""

    def __init__(self) -> None:
        self.draft = 0.0
        self.target = 0.0

    def run(self, which: str, fn: Callable, *a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            dt = time.perf_counter() - t0
            if which == "draft":
                self.draft += dt
            else:
                self.target += dt


def _prefill(model: Model, prompt: Sequence[int]) -> None:
    """Bring the cache to ``prompt[:-1]``, reusing the longest common prefix."""
    keep = model.common_prefix(prompt[:-1])
    model.rollback(keep)
    rest = list(prompt[keep:-1])
    if rest:
        model.decode(rest, logits_at=())


def _probs_max(z: np.ndarray) -> float:
    m = float(z.max())
    return 1.0 / float(np.exp(z - m, dtype=np.float32).sum())


def generate(
    target: Model | None,
    draft: Model | None,
    prompt: Sequence[int],
    cfg: DecodeConfig,
    *,
    n_vocab: int | None = None,
    thresholds_source: str = "default",
    stop_tokens: Sequence[int] = (),
) -> Iterator[Event]:
    """Decode from ``prompt`` with ``cfg.mode``; yield TokenEvents then one Finished.

    ``n_vocab`` is the shared vocabulary of the pair (logits beyond it are ignored)."""
    cfg.validate()
    mode = cfg.mode
    needs_draft = mode in ("draft", "sd", "easd", "easd-tf")
    if needs_draft and draft is None:
        raise ConfigError(f"mode {mode} needs a draft model (give --draft or a --pair)")
    if mode != "draft" and target is None:
        raise ConfigError(f"mode {mode} needs a target model (give --target or a --pair)")
    if len(prompt) == 0:
        raise ConfigError("empty prompt")
    main = draft if mode == "draft" else target
    V = n_vocab or min(m.n_vocab for m in (target, draft) if m is not None)
    n_ctx = min(main.n_ctx, draft.n_ctx) if needs_draft and mode != "draft" else main.n_ctx
    if not fits_context(len(prompt), n_ctx):
        raise ContextOverflowError(
            f"prompt is {len(prompt)} tokens but the context holds {n_ctx}; shorten it or raise --ctx"
        )
    gate_on = cfg.gate_enabled
    rng = np.random.default_rng(cfg.seed)
    eog = set(main.eog_ids()) | set(stop_tokens)
    detok = Detokenizer(main)
    stats = Stats(
        mode=mode, prompt_tokens=len(prompt), tau_draft=cfg.tau_draft, tau_target=cfg.tau_target,
        top_n=cfg.top_n, overlap=cfg.overlap, penalty=cfg.penalty, gamma=cfg.gamma,
        temperature=cfg.temperature, thresholds_source=thresholds_source,
    )
    clock = _Clock()
    t_start = time.perf_counter()
    seq = list(prompt)
    pieces: list[str] = []
    out_tokens: list[int] = []

    # ---- prompt: both caches to prompt[:-1] (the first step evaluates prompt[-1])
    clock.run("draft" if mode == "draft" else "target", _prefill, main, prompt)
    if mode in ("sd", "easd") or (mode == "easd-tf" and gate_on):
        # easd-tf too: its first consult would otherwise evaluate the whole prompt on the
        # draft inside generation; as in sd/easd that is prompt work (counted in
        # seconds_prompt and time to first token, not in tokens_per_s)
        clock.run("draft", _prefill, draft, prompt)
    elif mode == "easd-tf":
        draft.rollback(draft.common_prefix(prompt[:-1]))  # gate off: the draft is never consulted
    stats.seconds_prompt = time.perf_counter() - t_start
    stats.seconds_prompt_draft, stats.seconds_prompt_target = clock.draft, clock.target
    budget = cfg.max_tokens
    ctx_limit = min(main.n_ctx, draft.n_ctx) if mode in ("sd", "easd", "easd-tf") else main.n_ctx
    stop_reason = "length"
    first = True

    def emit(tok: int, origin: str, h_d=None, h_t=None, ov=None) -> TokenEvent:
        nonlocal first
        if first:
            stats.ttft_s = time.perf_counter() - t_start
            first = False
        stats.tokens += 1
        if origin == DRAFT:
            # draft-only mode proposes nothing: its tokens are not "accepted" drafts
            if mode != "draft":
                stats.draft_accepted += 1
        elif origin == EASD:
            stats.easd_fires += 1
        elif origin == BONUS:
            stats.bonus += 1
        elif origin == TARGET:
            if mode in ("sd", "easd"):
                stats.sd_rejections += 1
            else:
                stats.target_tokens += 1
        seq.append(tok)
        out_tokens.append(tok)
        text = "" if tok in eog else detok.add(tok)
        pieces.append(text)
        return TokenEvent(tok, text, origin, h_d, h_t, ov)

    def sample_from(z: np.ndarray) -> int:
        if cfg.greedy:
            return int(np.argmax(z))
        return rules.sample(rules.sampling_probs(z[None, :], cfg.temperature, cfg.top_k, cfg.top_p)[0], rng)

    done = False
    while not done:
        if len(seq) >= ctx_limit:
            stop_reason = "context"
            break
        if mode in ("target", "draft"):
            who = "draft" if mode == "draft" else "target"
            z = clock.run(who, main.decode, [seq[-1]])[0, :V]
            if who == "draft":
                stats.draft_calls += 1
            else:
                stats.target_calls += 1
            tok = sample_from(z)
            ev = emit(tok, DRAFT if mode == "draft" else TARGET)
            yield ev
            block = [tok]
        elif mode == "easd-tf":
            z_t = clock.run("target", target.decode, [seq[-1]])[0, :V]
            stats.target_calls += 1
            consult, h_t = rules.needs_draft(z_t, cfg, gate_on)
            z_d = None
            if consult:
                pending = seq[draft.n_past :]
                z_d = clock.run("draft", draft.decode, pending)[0, :V]
                stats.draft_calls += 1
                stats.draft_consults += 1
                if len(pending) > 1:
                    stats.catchup_calls += 1
                    stats.catchup_tokens += len(pending)
            tok, origin, _fired, h_t, h_d, ov = rules.target_first_step(z_t, z_d, cfg, rng, gate_on, h_t=h_t)
            yield emit(tok, origin, h_d, h_t, ov)
            block = [tok]
        else:  # sd / easd
            n_old = len(seq)
            # ---- draft: catch up, then propose up to gamma tokens (stopping early on the
            # context end or, like llama.cpp, when the draft's top probability < p_min)
            room = ctx_limit - n_old - 1
            g_max = max(0, min(cfg.gamma, room, budget))
            d_tokens: list[int] = []
            z_drafts: list[np.ndarray] = []
            pending = seq[draft.n_past :]
            while len(d_tokens) < g_max:
                zq = clock.run("draft", draft.decode, pending)[0, :V]
                stats.draft_calls += 1
                if len(pending) > 1:
                    stats.catchup_calls += 1
                    stats.catchup_tokens += len(pending)
                if cfg.draft_p_min > 0.0 and _probs_max(zq) < cfg.draft_p_min:
                    break
                d = sample_from(zq)
                d_tokens.append(d)
                z_drafts.append(zq)
                if d in eog:
                    break
                pending = [d]
            g = len(d_tokens)
            stats.drafted += g
            # ---- target: verify [last, d1..dg] in one batch, logits at every position
            z_t = clock.run("target", target.decode, [seq[-1]] + d_tokens, logits_at=range(g + 1))[:, :V]
            stats.target_calls += 1
            z_d = np.stack(z_drafts) if g else np.empty((0, V), dtype=np.float32)
            res = rules.verify_block(np.asarray(d_tokens, dtype=np.int64), z_d, z_t, cfg, rng, gate_on)
            stats.accepted += res.n_accepted_sd
            block = list(res.tokens)
            for i, (tok, origin) in enumerate(zip(res.tokens, res.origins)):
                h_d = res.h_draft[i] if i < len(res.h_draft) else None
                h_t = res.h_target[i] if i < len(res.h_target) else None
                ov = res.overlap[i] if i < len(res.overlap) else None
                ev = emit(tok, origin, h_d, h_t, ov)
                yield ev
                budget -= 1
                if tok in eog or budget <= 0:
                    block = block[: i + 1]
                    break
            # ---- roll both caches back to the accepted prefix: target keeps seq[:-1];
            # the draft keeps what it evaluated that is still on the path
            k = len(block) - 1  # draft tokens kept before the final token of the block
            target.rollback(n_old + k)
            draft.rollback(draft.common_prefix(seq, start=n_old - 1))
            if block and block[-1] in eog:
                stop_reason = "eos"
                break
            if budget <= 0:
                break
            continue
        # single-token modes
        budget -= 1
        if block[-1] in eog:
            stop_reason = "eos"
            break
        if budget <= 0:
            break

    tail = detok.flush()
    if tail:
        pieces.append(tail)
    total = time.perf_counter() - t_start
    stats.seconds_total = total
    stats.seconds_draft = clock.draft
    stats.seconds_target = clock.target
    stats.seconds_controller = max(0.0, total - clock.draft - clock.target)
    gen_time = total - stats.seconds_prompt
    stats.tokens_per_s = stats.tokens / gen_time if gen_time > 0 else 0.0
    stats.acceptance_rate = stats.draft_accepted / stats.drafted if stats.drafted else 0.0
    stats.mean_accepted_len = stats.tokens / stats.target_calls if (stats.target_calls and mode in ("sd", "easd")) else 0.0
    stats.easd_fires_per_100 = 100.0 * stats.easd_fires / stats.tokens if stats.tokens else 0.0
    stats.stop_reason = stop_reason
    yield Finished(stats=stats, text="".join(pieces), tokens=out_tokens, tail=tail)
