"""One sequence being decoded: what it has generated, its statistics, its random generator and
its gate. The steps (``steps``) advance it; the scheduler owns it from ``submit`` to its
``Finished``. No step keeps anything here: a step's state lives in the step.
"""

from __future__ import annotations

import time
from typing import Protocol, Sequence

import numpy as np

from . import rules
from .config import DecodeConfig
from .events import Finished, Stats, TokenEvent
from .gate import Gate
from .rules import Pick
from ..llamacpp.runtime import Model
from ..llamacpp.vocab import Detokenizer


class RequestLike(Protocol):
    """What a sequence reads of the request that started it (``scheduler.Request``)."""

    prompt: Sequence[int]
    cfg: DecodeConfig
    thresholds_source: str
    stop_tokens: Sequence[int]
    rng_seed: int | None


class Seq:
    """One sequence's state: identity, tokens, statistics and what decides its tokens."""

    def __init__(self, rid: int, slot: int, req: RequestLike, main: Model, V: int, ctx_limit: int) -> None:
        cfg = req.cfg
        self.rid, self.slot, self.req, self.cfg, self.V = rid, slot, req, cfg, V
        self.main = main  # the model whose tokens the sequence emits
        self.drafter = None  # the scheduler's drafter for this sequence's mode and spec type, if it drafts
        self.mode = cfg.mode
        self.gate = Gate.of(cfg)
        self.gate_on = self.gate.can_fire
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
        self.events: list[TokenEvent] = []  # emitted since the scheduler last took them
        self.budget = cfg.max_tokens
        self.ctx_limit = ctx_limit
        self.t_start = time.perf_counter()
        self.first = True
        self.done = False
        self.stop_reason = "length"
        self.sec_draft = 0.0
        self.sec_target = 0.0

    def sample(self, z: np.ndarray) -> int:
        """A token from one row of logits, as this sequence's settings say (one draw when sampling)."""
        return self.draw(z)[0]

    def draw(self, z: np.ndarray):
        """``sample``'s token and the distribution it was drawn from (None when greedy)."""
        cfg = self.cfg
        if cfg.greedy:
            return rules.best(z), None  # the first maximum, as np.argmax; the row checked
        q = rules.distribution(z, cfg.temperature, cfg.top_k, cfg.top_p)
        return rules.sample(q, self.rng), q

    def accept(self, picks: list[Pick]) -> int:
        """Emit ``picks`` in order until the token budget runs out or an end-of-generation
        token is emitted (then the sequence is done); return how many were emitted."""
        for n, p in enumerate(picks, 1):
            self._emit(p)
            self.budget -= 1
            if p.token in self.eog:
                self.done, self.stop_reason = True, "eos"
                return n
            if self.budget <= 0:
                self.done = True
                return n
        return len(picks)

    def _emit(self, p: Pick) -> None:
        if self.first:
            self.stats.ttft_s = time.perf_counter() - self.t_start
            self.first = False
        self.stats.count(p.origin)
        self.seq.append(p.token)
        self.out_tokens.append(p.token)
        text = "" if p.token in self.eog else self.detok.add(p.token)
        self.pieces.append(text)
        r = p.reading
        self.events.append(TokenEvent(p.token, text, p.origin) if r is None else
                           TokenEvent(p.token, text, p.origin, r.h_draft, r.h_target, r.overlap))

    def finished(self) -> Finished:
        s = self.stats
        tail = self.detok.flush()
        if tail:
            self.pieces.append(tail)
        total = time.perf_counter() - self.t_start
        s.seconds_total = total
        s.seconds_draft = self.sec_draft
        s.seconds_target = self.sec_target
        # sec_draft / sec_target hold llama_decode's own seconds (Model.seconds_decode), so the
        # controller is everything else: the logits read out of llama.cpp included
        s.seconds_controller = max(0.0, total - self.sec_draft - self.sec_target)
        s.stop_reason = self.stop_reason
        return Finished(stats=s, text="".join(self.pieces), tokens=self.out_tokens, tail=tail)
