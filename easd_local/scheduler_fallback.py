"""SEQUENTIAL FALLBACK for the batched engine (``easd_local/scheduler.py``): one slot over
``decoding.generate``, advanced one event per ``step``.

A stand-in with the batched Scheduler's interface, so that the server's engine thread can
be written and tested before the batched engine lands; it is deleted when it does. With it
``--parallel`` is effectively 1: a second request waits for the first to finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from .config import DecodeConfig
from .decoding import Event, Finished, TokenEvent, fits_context, generate
from .errors import ConfigError, ContextOverflowError, EasdError
from .pair import Pair


@dataclass(frozen=True)
class Request:
    prompt: Sequence[int]
    cfg: DecodeConfig
    thresholds_source: str = "default"
    stop_tokens: Sequence[int] = ()
    rng_seed: int | None = None


@dataclass(frozen=True)
class Failed:
    """A failure inside one sequence; the others go on."""

    message: str


class Scheduler:
    """One slot: ``n_parallel`` is accepted for the interface and is always 1 here."""

    def __init__(self, pair: Pair, n_parallel: int):
        self.pair = pair
        self.n_parallel = 1
        self._next_id = 0
        self._rid: int | None = None
        self._gen: Iterator[Event] | None = None

    def free_slots(self) -> int:
        return 0 if self._gen is not None else 1

    @property
    def active(self) -> int:
        return 0 if self._gen is None else 1

    def submit(self, req: Request) -> int:
        """Check the request at once (ConfigError / ContextOverflowError) and take the slot."""
        if self._gen is not None:
            raise ConfigError("no free slot")
        p = self.pair
        cfg = req.cfg if req.rng_seed is None else req.cfg.replace(seed=req.rng_seed)
        cfg.validate(p.n_vocab)
        if cfg.mode != "target" and p.draft is None:
            raise ConfigError(f"mode {cfg.mode} needs a draft model, and this server was started without one")
        if cfg.mode != "draft" and p.target is None:
            raise ConfigError(f"mode {cfg.mode} needs a target model, and this server was started without one")
        if not req.prompt:
            raise ConfigError("empty prompt")
        models = {"draft": [p.draft], "target": [p.target]}.get(cfg.mode, [p.target, p.draft])
        n_ctx = min(m.n_ctx for m in models)
        if not fits_context(len(req.prompt), n_ctx):
            raise ContextOverflowError(f"prompt is {len(req.prompt)} tokens but the context holds {n_ctx}")
        self._next_id += 1
        self._rid = self._next_id
        self._gen = generate(p.target, p.draft, list(req.prompt), cfg, n_vocab=p.n_vocab,
                             thresholds_source=req.thresholds_source, stop_tokens=req.stop_tokens)
        return self._rid

    def cancel(self, rid: int) -> None:
        if rid == self._rid and self._gen is not None:
            self._gen.close()
            self._gen = self._rid = None

    def step(self) -> list[tuple[int, TokenEvent | Finished | Failed]]:
        if self._gen is None:
            return []
        rid = self._rid
        try:
            ev = next(self._gen)
        except EasdError as e:
            self._gen = self._rid = None
            return [(rid, Failed(str(e)))]
        if isinstance(ev, Finished):
            self._gen = self._rid = None
        return [(rid, ev)]
