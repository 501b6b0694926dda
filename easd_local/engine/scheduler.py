"""Many sequences at once: a scheduler that drives every active sequence's step (``steps``,
one per mode) and packs what they ask for into as few llama.cpp batches as a step allows.

A step advances every active sequence by one step of its mode:

- ``target`` / ``draft``: one token;
- ``sd`` / ``easd``: the sequence's drafter (``drafters``: the draft model, a prompt lookup)
  proposes tokens, the target verifies them, accept and gate (``rules.verify``), roll both
  caches back to the emitted prefix;
- ``easd-tf``: one target token, consulting the draft only where the gate may fire
  (``gate.Gate.wants_draft``, ``rules.target_first``).

and issues, in this order:

1. the prefill of the sequences submitted since the last step: one target decode per new
   prompt and what its drafter's ``begin`` asks (a model drafter: one draft decode; a lookup:
   nothing), apart from the step's own work on purpose. A prompt is
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

Cache invariant (per sequence, see ``steps``): before a step the target's sequence holds
``seq[:-1]``; a model drafter's holds a prefix of ``seq``.

The scheduler knows the pair's models only to batch what is asked of them, to clear and
save a slot's cells and to tell the target's seconds from the rest: which drafter a sequence
uses is ``Pair.drafter``'s answer for its ``DecodeConfig.drafters``.

Statistics per sequence are one ``events.Stats``. Times: ``seconds_draft``
and ``seconds_target`` are the seconds spent inside the draft's / target's ``llama_decode``
while the sequence was active (batches are shared: at B > 1 they include work done for other
sequences, which the sequence waited for); ``seconds_controller`` is the rest of its life
(the logits read out of llama.cpp included).

Single-threaded: one thread calls ``submit``, ``cancel`` and ``step``.
"""

from __future__ import annotations

import time
from operator import itemgetter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .prompt_store import PromptStore
from .prompt_cache import DEFAULT_SIMILARITY, SlotView, pick_slot
from .config import DecodeConfig
from .events import Finished, TokenEvent, fits_context
from ..errors import ConfigError, ContextOverflowError, EasdError
from .pair import Pair
from .finite import NonFiniteRow
from ..llamacpp.runtime import Model, Part, non_finite_logits
from .sequence import Seq as _Seq  # one sequence's state (the name this module has always used)
from .steps import STEPS, StepGen


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


def admit(pair: Pair, req: Request):
    """(the model whose tokens ``req`` emits, its drafter or None, the context it has) for a
    request the pair can run; ConfigError / ContextOverflowError naming what is wrong."""
    cfg = req.cfg
    cfg.validate()
    mode, info = cfg.mode, cfg.mode_info
    if cfg.needs_draft_model and pair.draft is None:
        uses = "" if info.needs_draft else f" with --spec-type {cfg.spec_type}"
        raise ConfigError(f"mode {mode}{uses} needs a draft model (give --draft or a --pair)")
    if info.needs_target and pair.target is None:
        raise ConfigError(f"mode {mode} needs a target model (give --target or a --pair)")
    if len(req.prompt) == 0:
        raise ConfigError("empty prompt")
    main = pair.target if info.needs_target else pair.draft
    drafter = pair.drafter(cfg.drafters) if cfg.drafters else None
    used = [main] + ([drafter.model] if drafter is not None and drafter.model is not None else [])
    n_ctx = min(m.n_ctx for m in used)
    if not fits_context(len(req.prompt), n_ctx):
        raise ContextOverflowError(
            f"prompt is {len(req.prompt)} tokens but the context holds {n_ctx}; shorten it or raise --ctx")
    return main, drafter, n_ctx


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

    def __init__(self, pair: Pair, n_parallel: int, slot_similarity: float = DEFAULT_SIMILARITY,
                 cache_ram: int = 0) -> None:
        if n_parallel < 1:
            raise ConfigError(f"--parallel must be >= 1, got {n_parallel}")
        for m in pair.models:
            if m.n_seq < n_parallel:
                raise ConfigError(
                    f"{m.path.name} was loaded for {m.n_seq} sequence{'s' if m.n_seq != 1 else ''}, "
                    f"not {n_parallel} (LoadOptions.n_seq)"
                )
        self.pair = pair
        self.n_parallel = n_parallel
        self.target = pair.target
        V = pair.n_vocab or min(m.n_vocab for m in pair.models)
        self.V = V
        self._slots: list[_Seq | None] = [None] * n_parallel
        self.slot_similarity = slot_similarity
        self._last_used = [-1] * n_parallel  # admission tick of each slot's last request (LRU)
        self._scope = [""] * n_parallel  # the cache scope of the request that last wrote the slot
        self._tick = 0
        self._prefills: list[Prefill] = []
        self._new: list[_Seq] = []
        self._next_rid = 0
        self.store = PromptStore(cache_ram) if cache_ram > 0 else None  # bytes; 0: no host-memory cache

    @property
    def models(self) -> tuple[Model, ...]:
        return self.pair.models  # read each time: a draft model may be loaded after the start

    # ------------------------------------------------------------------ admission
    def free_slots(self) -> int:
        return sum(s is None for s in self._slots)

    @property
    def active(self) -> int:
        return self.n_parallel - self.free_slots()

    def submit(self, req: Request) -> int:
        """Admit ``req`` (it starts at the next step); return its request id. ConfigError /
        ContextOverflowError for a request that cannot run; RuntimeError when no slot is free."""
        main, drafter, n_ctx = admit(self.pair, req)
        if None not in self._slots:
            raise RuntimeError(f"no free slot (all {self.n_parallel} are busy)")
        slot = self._pick_slot(req, main)
        self._last_used[slot] = self._tick
        self._tick += 1
        rid = self._next_rid
        self._next_rid += 1
        s = _Seq(rid, slot, req, main, self.V, n_ctx)
        s.drafter = drafter
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
            for m in self.models:
                m.reset_seq(s.slot)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[tuple[int, Event]]:
        """Advance every active sequence by one step of its mode (``steps``): start each
        one's step, then serve what the steps ask for, one batch per model at a time, the
        draft's before the target's (drafting rounds, then one target batch, then easd-tf's
        consults), until every step is over."""
        out: list[tuple[int, Event]] = []
        if self._new:
            self._prefill(out)
        live = [s for s in self._slots if s is not None]
        waiting: dict[_Seq, tuple[StepGen, Model, Part]] = {}  # sequence -> its step, what it asks
        for s in live:
            if len(s.seq) >= s.ctx_limit:
                s.done, s.stop_reason = True, "context"
            else:
                step = STEPS[s.mode](s)
                self._advance(s, step, None, waiting, out)
        while waiting:
            asked = list(map(itemgetter(1), waiting.values()))
            # drafting before verifying: any other model's asks before the target's
            model = next((m for m in asked if m is not self.target), self.target) \
                if self.target in asked else asked[0]
            batch = [s for s in live if s in waiting and waiting[s][1] is model]  # slot order
            self._run(model, batch, waiting, out)
        for s in live:
            if s.done and self._slots[s.slot] is s:
                self._release(s)
                out.append((s.rid, s.finished()))
        return out

    def _advance(self, s: _Seq, step: StepGen, z: np.ndarray | None, waiting: dict, out: list,
                 source: Model | None = None) -> None:
        """Run ``s``'s step on to its next ask (sending it ``z``, ``source``'s rows), or to its end."""
        try:
            model, part = step.send(z)
        except StopIteration:
            model = None
        except NonFiniteRow as e:  # a row a rule read (``finite``): the rows just sent
            model = non_finite_logits(source.path) if source is not None else e
        except (EasdError, ValueError, FloatingPointError) as e:
            model = e
        if s.events:  # what the step emitted, before anything else about the sequence
            out.extend([(s.rid, ev) for ev in s.events])
            s.events.clear()
        if isinstance(model, BaseException):
            self._fail(s, model, out)
        elif model is not None:
            waiting[s] = (step, model, part)

    def _decode(self, model: Model, parts: list[Part]) -> list[np.ndarray]:
        """One batched decode (rows lent: ``Model.decode_batch``'s ``lend``), its seconds
        inside ``llama_decode`` added to every active sequence's clock."""
        t0 = model.seconds_decode
        try:
            return model.decode_batch(parts, lend=True)
        finally:
            dt = model.seconds_decode - t0
            target = model is self.target
            for s in self._slots:
                if s is not None:
                    if target:
                        s.sec_target += dt
                    else:
                        s.sec_draft += dt

    def _run(self, model: Model, batch: list[_Seq], waiting: dict, out: list) -> None:
        """One batched decode of what ``batch`` asks of ``model``; each sequence's step gets
        its rows. A failure fails only the sequences it concerns."""
        steps = [waiting.pop(s) for s in batch]
        try:
            zs = self._decode(model, [part for _, _, part in steps])
        except EasdError as e:  # a failed batch fails the sequences in it, nobody else
            for s, (step, _, _) in zip(batch, steps):
                step.close()
                self._fail(s, e, out)
            return
        V = self.V
        for s, (step, _, _), z in zip(batch, steps, zs):
            # lent rows, unchecked: the rule that reads a row checks it (``finite``), and a
            # NonFiniteRow fails just this sequence (``_advance``)
            self._advance(s, step, z if z.shape[1] == V else z[:, :V], waiting, out, model)

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
            if self.store is not None and self.store.swap(
                    (self.target, self.pair.draft), 0 if info.needs_target else 1, s.slot, prompt[:-1],
                    slot_scope=self._scope[s.slot], scope=s.req.cache_scope, reuse=s.req.reuse_cache):
                self._scope[s.slot] = s.req.cache_scope
            if not s.req.reuse_cache or self._scope[s.slot] != s.req.cache_scope:
                for m in self.models:
                    m.reset_seq(s.slot)
            self._scope[s.slot] = s.req.cache_scope
            main = s.main
            cached = main.common_prefix(prompt[:-1], seq=s.slot)
            main.rollback(cached, s.slot)
            if len(prompt) - 1 > cached:
                try:
                    self._decode(main, [Part(s.slot, list(prompt[cached:-1]), ())])
                except EasdError as e:
                    self._fail(s, e, out)
            # the drafter's own prefill (a model drafter's decode of the prompt, easd-tf's
            # too: its first consult would otherwise evaluate the whole prompt inside
            # generation) is prompt work: in seconds_prompt and time to first token
            if s.drafter is not None and self._slots[s.slot] is s:
                begin = s.drafter.begin(s)
                try:
                    for m, part in begin:
                        self._decode(m, [part])
                except EasdError as e:
                    begin.close()
                    self._fail(s, e, out)
            s.stats.seconds_prompt = time.perf_counter() - s.t_start
            s.stats.seconds_prompt_draft, s.stats.seconds_prompt_target = s.sec_draft, s.sec_target
            s.stats.prompt_cached = cached
            if self._slots[s.slot] is s:
                self._prefills.append(Prefill(s.rid, cached, len(prompt) - cached))
