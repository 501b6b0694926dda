"""Many sequences at once: one small stepper per mode and a scheduler that packs the work
of every active sequence into as few llama.cpp batches as a step allows.

A step advances every active sequence by one step of its mode:

- ``target`` / ``draft``: one token;
- ``sd`` / ``easd``: draft up to gamma tokens, verify them on the target, accept, gate
  (``rules.verify_block``), roll both caches back to the accepted prefix;
- ``easd-tf``: one target token, consulting the draft only where ``H_t >= tau_t``
  (``rules.consult_draft`` / ``rules.target_first_step``).

and issues, in this order:

1. the prefill of the sequences submitted since the last step: one target decode and one
   draft decode per new prompt, apart from the step's own work on purpose. A prompt is
   hundreds of tokens whose logits nobody needs (a large batch on its own), it may exceed
   ``n_batch`` (and be split into several decodes, which would split the step's batch with
   it); alone, its cells are computed exactly as at B = 1 (llama.cpp's numerics depend on
   what else is in a batch) and the sequence gets an honest ``seconds_prompt`` / time to
   first token. At B = 1 it is exactly the prefill ``decoding.generate`` always did. The
   newcomers then take their first step in the same ``step`` call;
2. the drafting rounds: round r is one draft batch holding the r-th drafting decode of
   every SD sequence still drafting (the first carries its catch-up) and, in round 0, the
   one-token step of every ``draft``-mode sequence;
3. ONE target batch: single tokens (target, easd-tf) and verify blocks of any length;
4. one draft batch with every easd-tf catch-up the target's entropies asked for.

Each sequence has its own random generator (``Request.rng_seed``) and sees only its own
logits, so its output does not depend on which sequences share its batches beyond
llama.cpp's batched-vs-single numerics (a one-token batch takes another matmul kernel
than a multi-token one; see tests/test_runtime.py).

Cache invariant (per sequence, as in ``decoding``): before a step the target's sequence
holds ``seq[:-1]``; the draft's holds a prefix of ``seq``.

Statistics per sequence are exactly those of ``decoding.Stats``. Times: ``seconds_draft``
and ``seconds_target`` are the seconds spent inside the draft's / target's decodes while
the sequence was active (batches are shared: at B > 1 they include work done for other
sequences, which the sequence waited for); ``seconds_controller`` is the rest of its life.

Single-threaded: one thread calls ``submit``, ``cancel`` and ``step``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from . import rules
from .prompt_cache import DEFAULT_SIMILARITY, SlotView, pick_slot
from .config import DecodeConfig
from .decoding import DRAFT_ONLY, TARGET, Finished, Stats, TokenEvent, fits_context
from ..errors import ConfigError, ContextOverflowError, EasdError, RuntimeFailure
from .pair import Pair
from .runtime import Model, Part
from .vocab import Detokenizer


@dataclass(frozen=True)
class Request:
    prompt: Sequence[int]
    cfg: DecodeConfig
    thresholds_source: str = "default"
    stop_tokens: Sequence[int] = ()
    rng_seed: int | None = None  # this sequence's generator seed; None -> cfg.seed
    # False: start from empty caches (bench: every generation pays for its own prompt);
    # True: reuse the slot's cache by longest common prefix (chat turns, served conversations)
    reuse_cache: bool = True
    # a slot's cells are reused only by a request of the scope that wrote them (see prompt_cache)
    cache_scope: str = ""


@dataclass(frozen=True)
class Prefill:
    """What a newcomer's prompt cost: ``cached`` tokens reused from its slot's cells and
    ``evaluated`` ones (the last prompt token included, which its first step evaluates), on
    the model whose tokens it emits."""

    rid: int
    cached: int
    evaluated: int


@dataclass(frozen=True)
class Failed:
    """A failure inside one sequence (non-finite logits, a llama.cpp error in a batch it
    was part of); the other sequences go on. Its slot is free."""

    message: str
    error: BaseException | None = field(default=None, compare=False, repr=False)


Event = TokenEvent | Finished | Failed


def _probs_max(z: np.ndarray) -> float:
    m = float(z.max())
    return 1.0 / float(np.exp(z - m, dtype=np.float32).sum())


class _Seq:
    """One sequence's state: what it has generated, its statistics, and the scratch of the
    step in progress."""

    def __init__(self, rid: int, slot: int, req: Request, main: Model, V: int, ctx_limit: int) -> None:
        cfg = req.cfg
        self.rid, self.slot, self.req, self.cfg, self.V = rid, slot, req, cfg, V
        self.mode = cfg.mode
        self.gate_on = cfg.gate_enabled
        self.rng = rules.make_rng(cfg.seed if req.rng_seed is None else req.rng_seed)
        self.eog = set(main.vocab.eog_ids()) | set(req.stop_tokens)
        self.detok = Detokenizer(main.vocab)
        self.stats = Stats(
            mode=cfg.mode, prompt_tokens=len(req.prompt), tau_draft=cfg.tau_draft, tau_target=cfg.tau_target,
            top_n=cfg.top_n, overlap=cfg.overlap, penalty=cfg.penalty, gamma=cfg.gamma,
            temperature=cfg.temperature, thresholds_source=req.thresholds_source,
        )
        self.seq = list(req.prompt)
        self.out_tokens: list[int] = []
        self.pieces: list[str] = []
        self.budget = cfg.max_tokens
        self.ctx_limit = ctx_limit
        self.t_start = time.perf_counter()
        self.first = True
        self.done = False
        self.stop_reason = "length"
        self.sec_draft = 0.0
        self.sec_target = 0.0
        # step scratch (sd/easd: drafting; easd-tf: the consult)
        self.n_old = 0
        self.g_max = 0
        self.d_tokens: list[int] = []
        self.z_drafts: list[np.ndarray] = []
        self.pending: list[int] = []
        self.drafting = False
        self.z_t: np.ndarray | None = None
        self.h_t = math.nan
        self.consult = False

    def emit(self, tok: int, origin: str, h_d=None, h_t=None, ov=None) -> TokenEvent:
        s = self.stats
        if self.first:
            s.ttft_s = time.perf_counter() - self.t_start
            self.first = False
        s.count(origin)
        self.seq.append(tok)
        self.out_tokens.append(tok)
        text = "" if tok in self.eog else self.detok.add(tok)
        self.pieces.append(text)
        return TokenEvent(tok, text, origin, h_d, h_t, ov)

    def sample_from(self, z: np.ndarray) -> int:
        cfg = self.cfg
        if cfg.greedy:
            return int(np.argmax(z))
        return rules.sample(rules.sampling_probs(z[None, :], cfg.temperature, cfg.top_k, cfg.top_p)[0], self.rng)

    def after_single(self, tok: int) -> None:
        """Bookkeeping after a one-token step."""
        self.budget -= 1
        if tok in self.eog:
            self.done, self.stop_reason = True, "eos"
        elif self.budget <= 0:
            self.done = True

    def finished(self) -> Finished:
        s = self.stats
        tail = self.detok.flush()
        if tail:
            self.pieces.append(tail)
        total = time.perf_counter() - self.t_start
        s.seconds_total = total
        s.seconds_draft = self.sec_draft
        s.seconds_target = self.sec_target
        s.seconds_controller = max(0.0, total - self.sec_draft - self.sec_target)
        info = self.cfg.mode_info
        if info.speculative:  # every target call after the prompt verified a drafted block
            s.verify_calls, s.verified_tokens = s.target_calls, s.tokens
        if info.target_first:
            s.target_first_tokens = s.tokens
        s.stop_reason = self.stop_reason
        return Finished(stats=s, text="".join(self.pieces), tokens=self.out_tokens, tail=tail)


# ----------------------------------------------------------------------------- steppers


class _Stepper:
    """One mode's step over one sequence, in the scheduler's phases. A ``*_part`` method
    returns the work the sequence needs from a batch (None: nothing); the matching ``on_*``
    gets that part's logits (rows of the shared vocabulary) and returns the tokens emitted."""

    def __init__(self, target: Model | None, draft: Model | None) -> None:
        self.target, self.draft = target, draft

    def begin(self, s: _Seq) -> None:
        pass

    def draft_part(self, s: _Seq) -> Part | None:
        return None

    def on_draft(self, s: _Seq, z: np.ndarray) -> list[TokenEvent]:
        raise AssertionError("no draft work")  # pragma: no cover

    def target_part(self, s: _Seq) -> Part | None:
        return None

    def on_target(self, s: _Seq, z: np.ndarray) -> list[TokenEvent]:
        raise AssertionError("no target work")  # pragma: no cover

    def consult_part(self, s: _Seq) -> Part | None:
        return None

    def on_consult(self, s: _Seq, z: np.ndarray) -> list[TokenEvent]:
        raise AssertionError("no consult")  # pragma: no cover


class _TargetStep(_Stepper):
    """mode target: one token from the target."""

    def target_part(self, s):
        return Part(s.slot, [s.seq[-1]])

    def on_target(self, s, z):
        s.stats.target_calls += 1
        return _sample_one(s, z, TARGET)


def _sample_one(s: _Seq, z: np.ndarray, origin: str) -> list[TokenEvent]:
    """Plain decoding's step: sample the one row, emit it as ``origin``, advance."""
    tok = s.sample_from(z[0])
    ev = s.emit(tok, origin)
    s.after_single(tok)
    return [ev]


class _DraftStep(_Stepper):
    """mode draft: one token from the draft (in the first drafting round)."""

    def begin(self, s):
        s.drafting = True

    def draft_part(self, s):
        if not s.drafting:
            return None
        s.drafting = False
        return Part(s.slot, [s.seq[-1]])

    def on_draft(self, s, z):
        s.stats.draft_calls += 1
        return _sample_one(s, z, DRAFT_ONLY)


class _SpecStep(_Stepper):
    """modes sd / easd: draft up to gamma tokens (one drafting round each; the first also
    catches the draft up), verify [last, d1..dg] on the target in one block, accept and
    gate with ``rules.verify_block``, roll both caches back to the accepted prefix."""

    def begin(self, s):
        s.n_old = len(s.seq)
        # stop drafting early on the context end, the token budget or, like llama.cpp,
        # when the draft's top probability < p_min
        room = s.ctx_limit - s.n_old - 1
        s.g_max = max(0, min(s.cfg.gamma, room, s.budget))
        s.d_tokens, s.z_drafts = [], []
        s.pending = s.seq[self.draft.seq_len(s.slot) :]
        s.drafting = s.g_max > 0

    def draft_part(self, s):
        return Part(s.slot, s.pending) if s.drafting else None

    def on_draft(self, s, z):
        st = s.stats
        zq = z[0]
        st.draft_calls += 1
        if len(s.pending) > 1:
            st.catchup_calls += 1
            st.catchup_tokens += len(s.pending)
        if s.cfg.draft_p_min > 0.0 and _probs_max(zq) < s.cfg.draft_p_min:
            s.drafting = False
            return []
        d = s.sample_from(zq)
        s.d_tokens.append(d)
        s.z_drafts.append(zq)
        s.pending = [d]
        s.drafting = d not in s.eog and len(s.d_tokens) < s.g_max
        return []

    def target_part(self, s):
        g = len(s.d_tokens)
        return Part(s.slot, [s.seq[-1]] + s.d_tokens, range(g + 1))

    def on_target(self, s, z_t):
        st, g = s.stats, len(s.d_tokens)
        st.drafted += g
        st.target_calls += 1
        z_d = np.stack(s.z_drafts) if g else np.empty((0, s.V), dtype=np.float32)
        res = rules.verify_block(np.asarray(s.d_tokens, dtype=np.int64), z_d, z_t, s.cfg, s.rng, s.gate_on)
        st.accepted += res.n_accepted_sd
        block = list(res.tokens)
        events = []
        for i, (tok, origin) in enumerate(zip(res.tokens, res.origins)):
            h_d = res.h_draft[i] if i < len(res.h_draft) else None
            h_t = res.h_target[i] if i < len(res.h_target) else None
            ov = res.overlap[i] if i < len(res.overlap) else None
            events.append(s.emit(tok, origin, h_d, h_t, ov))
            s.budget -= 1
            if tok in s.eog or s.budget <= 0:
                block = block[: i + 1]
                break
        # roll both caches back to the accepted prefix: the target keeps seq[:-1]; the
        # draft keeps what it evaluated that is still on the path
        self.target.rollback(s.n_old + len(block) - 1, s.slot)
        self.draft.rollback(self.draft.common_prefix(s.seq, start=s.n_old - 1, seq=s.slot), s.slot)
        s.d_tokens, s.z_drafts = [], []
        if block[-1] in s.eog:
            s.done, s.stop_reason = True, "eos"
        elif s.budget <= 0:
            s.done = True
        return events


class _TargetFirstStep(_Stepper):
    """mode easd-tf: one target token; the draft is caught up and consulted only where the
    target's entropy lets the gate fire."""

    def target_part(self, s):
        return Part(s.slot, [s.seq[-1]])

    def on_target(self, s, z):
        s.stats.target_calls += 1
        z_t = z[0]
        s.consult, s.h_t = rules.consult_draft(z_t, s.cfg, s.gate_on)
        if s.consult:
            s.z_t = z_t
            return []
        return self._emit(s, z_t, None)

    def consult_part(self, s):
        if not s.consult:
            return None
        s.pending = s.seq[self.draft.seq_len(s.slot) :]
        return Part(s.slot, s.pending)

    def on_consult(self, s, z):
        st = s.stats
        st.draft_calls += 1
        st.draft_consults += 1
        if len(s.pending) > 1:
            st.catchup_calls += 1
            st.catchup_tokens += len(s.pending)
        z_t, s.z_t, s.consult = s.z_t, None, False
        return self._emit(s, z_t, z[0])

    def _emit(self, s, z_t, z_d):
        tok, origin, _fired, h_t, h_d, ov = rules.target_first_step(z_t, z_d, s.cfg, s.rng, s.gate_on, h_t=s.h_t)
        ev = s.emit(tok, origin, h_d, h_t, ov)
        s.after_single(tok)
        return [ev]


_STEPPERS = {"target": _TargetStep, "draft": _DraftStep, "sd": _SpecStep, "easd": _SpecStep,
             "easd-tf": _TargetFirstStep}


# ---------------------------------------------------------------------------- scheduler


class Scheduler:
    """Up to ``n_parallel`` sequences decoding together on ``pair`` (slots, i.e. llama.cpp
    sequence ids, 0..n_parallel-1 on both models; load them with ``LoadOptions(n_seq=N)``).

    ``submit`` a :class:`Request` (it joins at the next ``step``), call ``step`` until
    ``active`` is 0; each step returns ``(request id, event)`` pairs: a sequence's
    TokenEvents in order, then one ``decoding.Finished`` (or :class:`Failed`), after which
    its slot is free. A finished sequence's KV cells stay (a later request in that slot
    reuses them by longest common prefix; ``submit`` picks the slot by
    ``prompt_cache.pick_slot`` with ``slot_similarity``); ``cancel`` clears them unless told
    to keep them, a failure clears them."""

    def __init__(self, pair: Pair, n_parallel: int, slot_similarity: float = DEFAULT_SIMILARITY) -> None:
        if n_parallel < 1:
            raise ConfigError(f"--parallel must be >= 1, got {n_parallel}")
        for m in (pair.target, pair.draft):
            if m is not None and m.n_seq < n_parallel:
                raise ConfigError(
                    f"{m.path.name} was loaded for {m.n_seq} sequence{'s' if m.n_seq != 1 else ''}, "
                    f"not {n_parallel} (LoadOptions.n_seq)"
                )
        self.pair = pair
        self.n_parallel = n_parallel
        self.target, self.draft = pair.target, pair.draft
        V = pair.n_vocab or min(m.n_vocab for m in (pair.target, pair.draft) if m is not None)
        self.V = V
        self._slots: list[_Seq | None] = [None] * n_parallel
        self.slot_similarity = slot_similarity
        self._last_used = [-1] * n_parallel  # admission tick of each slot's last request (LRU)
        self._scope = [""] * n_parallel  # the cache scope of the request that last wrote the slot
        self._tick = 0
        self._prefills: list[Prefill] = []
        self._new: list[_Seq] = []
        self._next_rid = 0
        self._steppers = {mode: cls(pair.target, pair.draft) for mode, cls in _STEPPERS.items()}

    # ------------------------------------------------------------------ admission
    def free_slots(self) -> int:
        return sum(s is None for s in self._slots)

    @property
    def active(self) -> int:
        return self.n_parallel - self.free_slots()

    def submit(self, req: Request) -> int:
        """Admit ``req`` (it starts at the next step); return its request id. ConfigError /
        ContextOverflowError for a request that cannot run; RuntimeError when no slot is free."""
        cfg = req.cfg
        cfg.validate()
        mode, info = cfg.mode, cfg.mode_info
        target, draft = self.target, self.draft
        if info.needs_draft and draft is None:
            raise ConfigError(f"mode {mode} needs a draft model (give --draft or a --pair)")
        if info.needs_target and target is None:
            raise ConfigError(f"mode {mode} needs a target model (give --target or a --pair)")
        if len(req.prompt) == 0:
            raise ConfigError("empty prompt")
        main = target if info.needs_target else draft  # whose tokens the sequence emits
        n_ctx = min(m.n_ctx for m, used in ((target, info.needs_target), (draft, info.needs_draft)) if used)
        if not fits_context(len(req.prompt), n_ctx):
            raise ContextOverflowError(
                f"prompt is {len(req.prompt)} tokens but the context holds {n_ctx}; shorten it or raise --ctx"
            )
        if None not in self._slots:
            raise RuntimeError(f"no free slot (all {self.n_parallel} are busy)")
        slot = self._pick_slot(req, main)
        self._last_used[slot] = self._tick
        self._tick += 1
        rid = self._next_rid
        self._next_rid += 1
        s = _Seq(rid, slot, req, main, self.V, n_ctx)
        self._slots[slot] = s
        self._new.append(s)
        return rid

    def _pick_slot(self, req: Request, main: Model) -> int:
        prompt = req.prompt
        idle = [SlotView(i, main.seq_len(i), main.common_prefix(prompt, seq=i), self._last_used[i],
                         self._scope[i] == req.cache_scope)
                for i, s in enumerate(self._slots) if s is None]
        return pick_slot(idle, len(prompt), self.slot_similarity, req.reuse_cache)

    def cancel(self, rid: int, keep_cache: bool = False) -> None:
        """Stop request ``rid`` now: its slot is free and its KV cells are cleared (no other
        sequence's), or with ``keep_cache`` kept for the next request on the slot to reuse
        (between steps they hold what the sequence evaluated, nothing half-written).
        Unknown or finished ids are ignored."""
        for s in self._slots:
            if s is not None and s.rid == rid:
                self._release(s, clear=not keep_cache)
                return

    def take_prefills(self) -> list[Prefill]:
        """The prompts prefilled since the last call (what each reused and evaluated)."""
        out, self._prefills = self._prefills, []
        return out

    def stop(self, rid: int, reason: str = "interrupted") -> Finished | None:
        """End request ``rid`` now and return what it generated, with its statistics so far
        (``stop_reason`` = ``reason``); its KV cells stay, for the next request on the slot to
        reuse. None for unknown or finished ids. Safe after a step was interrupted midway:
        the counters are only ever added to."""
        for s in self._slots:
            if s is not None and s.rid == rid:
                s.stop_reason = reason
                fin = s.finished()
                self._release(s)
                return fin
        return None

    def _release(self, s: _Seq, clear: bool = False) -> None:
        self._slots[s.slot] = None
        if s in self._new:
            self._new.remove(s)
        if clear:
            for m in (self.target, self.draft):
                if m is not None:
                    m.reset_seq(s.slot)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[tuple[int, Event]]:
        """Advance every active sequence by one step of its mode."""
        out: list[tuple[int, Event]] = []
        if self._new:
            self._prefill(out)
        live = [s for s in self._slots if s is not None]
        for s in live:
            if len(s.seq) >= s.ctx_limit:
                s.done, s.stop_reason = True, "context"
            else:
                self._steppers[s.mode].begin(s)
        work = [s for s in live if not s.done]
        # drafting rounds: one draft batch per round
        while True:
            parts = self._parts(work, "draft_part")
            if not parts:
                break
            self._run(self.draft, parts, "on_draft", out)
        # all target work of the step: one batch
        parts = self._parts(work, "target_part")
        if parts:
            self._run(self.target, parts, "on_target", out)
        # easd-tf catch-ups: one draft batch
        parts = self._parts(work, "consult_part")
        if parts:
            self._run(self.draft, parts, "on_consult", out)
        for s in live:
            if s.done and self._slots[s.slot] is s:
                self._release(s)
                out.append((s.rid, s.finished()))
        return out

    def _parts(self, work: list[_Seq], which: str) -> list[tuple[_Seq, Part]]:
        got = []
        for s in work:
            if self._slots[s.slot] is not s:  # failed earlier in this step
                continue
            p = getattr(self._steppers[s.mode], which)(s)
            if p is not None:
                got.append((s, p))
        return got

    def _decode(self, model: Model, parts: list[Part]) -> list[np.ndarray]:
        """One batched decode, its seconds added to every active sequence's clock."""
        t0 = time.perf_counter()
        try:
            return model.decode_batch(parts)
        finally:
            dt = time.perf_counter() - t0
            for s in self._slots:
                if s is not None:
                    if model is self.draft:
                        s.sec_draft += dt
                    else:
                        s.sec_target += dt

    def _run(self, model: Model, work: list[tuple[_Seq, Part]], handler: str, out: list) -> None:
        try:
            zs = self._decode(model, [p for _, p in work])
        except EasdError as e:  # a failed batch fails the sequences in it, nobody else
            for s, _ in work:
                self._fail(s, e, out)
            return
        for (s, _), z in zip(work, zs):
            try:
                z = z[:, : self.V]
                if not math.isfinite(float(z.max())):
                    raise RuntimeFailure(f"{model.path.name} returned non-finite logits (NaN or inf)")
                for ev in getattr(self._steppers[s.mode], handler)(s, z):
                    out.append((s.rid, ev))
            except (EasdError, ValueError, FloatingPointError) as e:
                self._fail(s, e, out)

    def _fail(self, s: _Seq, e: BaseException, out: list) -> None:
        self._release(s, clear=True)
        out.append((s.rid, Failed(str(e), e)))

    def _prefill(self, out: list) -> None:
        """Bring each newcomer's caches to ``prompt[:-1]`` (the first step evaluates
        ``prompt[-1]``), reusing the slot's longest common prefix. One decode per prompt
        and model: a prompt is a large batch already, so packing several gains little, and
        alone its cells are computed exactly as at B = 1 (llama.cpp's numerics depend on
        what else is in a batch), so a sequence's prompt does not depend on its companions."""
        new, self._new = self._new, []
        for s in new:
            prompt = s.req.prompt
            info = s.cfg.mode_info
            if not s.req.reuse_cache or self._scope[s.slot] != s.req.cache_scope:
                for m in (self.target, self.draft):
                    if m is not None:
                        m.reset_seq(s.slot)
            self._scope[s.slot] = s.req.cache_scope
            main = self.target if info.needs_target else self.draft
            cached = 0
            # easd-tf too: its first consult would otherwise evaluate the whole prompt on
            # the draft inside generation; as in sd/easd that is prompt work (counted in
            # seconds_prompt and time to first token, not in tokens_per_s)
            uses_draft = info.needs_draft and (not info.target_first or s.gate_on)
            for m, used in ((self.target, info.needs_target), (self.draft, uses_draft)):
                if not used or self._slots[s.slot] is not s:
                    continue
                keep = m.common_prefix(prompt[:-1], seq=s.slot)
                m.rollback(keep, s.slot)
                if m is main:
                    cached = keep
                if len(prompt) - 1 > keep:
                    try:
                        self._decode(m, [Part(s.slot, list(prompt[keep:-1]), ())])
                    except EasdError as e:
                        self._fail(s, e, out)
            if info.target_first and not s.gate_on:
                # the draft is never consulted: it only has to hold a prefix of the sequence
                self.draft.rollback(self.draft.common_prefix(prompt[:-1], seq=s.slot), s.slot)
            s.stats.seconds_prompt = time.perf_counter() - s.t_start
            s.stats.seconds_prompt_draft, s.stats.seconds_prompt_target = s.sec_draft, s.sec_target
            s.stats.prompt_cached = cached
            if self._slots[s.slot] is s:
                self._prefills.append(Prefill(s.rid, cached, len(prompt) - cached))
