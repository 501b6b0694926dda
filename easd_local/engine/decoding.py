"""Decoding one sequence: target-only, draft-only, SD, EASD and target-first EASD.

The work is done by ``easd_local.engine.scheduler`` (one step per mode, ``steps``; many
sequences at once); ``generate`` is its one-sequence case, on top of it. What a generation
produces (token events, origins, ``Finished``, ``Stats``) is defined in ``events``, below
everything that decodes, and re-exported here.

``generate`` is a generator (in the manner of mlx-lm's ``stream_generate``): it yields one
``TokenEvent`` per emitted token, carrying where the token came from, and finally one
``Finished`` with the statistics. It keeps no state between calls except what is in the
models' KV caches, which it reuses by longest common prefix (so a chat turn only
evaluates the new tokens).

Cache invariant, shared by every mode (as in llama.cpp's speculative-simple): before each
step the target's cache holds ``seq[:-1]`` and the step evaluates ``seq[-1]`` (alone, or
followed by the drafted tokens in one verify batch). The draft's cache holds a prefix of
``seq`` and is caught up with one batched decode whenever it is needed (in ``easd-tf``:
only at positions where the target's entropy lets the gate fire; the prompt itself is
evaluated on both models before generation starts, in every mode that uses the draft).

EASD (modes ``easd`` and ``easd-tf``) is deliberately NOT lossless: when draft and target
are both uncertain and agree on their top-N candidates, it rejects a token the SD test
accepted and lets the target pick again. Mode ``sd`` (and ``easd`` with the gate off) is
lossless: its output follows the target's distribution (greedy: the target's tokens, up to
the tiny logit differences between batched and single-token evaluation in llama.cpp).
"""

from __future__ import annotations

from typing import Iterator, Sequence

from ..jsonsafe import json_number
# what a generation produces: re-exported here, where callers have always found them
from .events import (BONUS, DRAFT, DRAFT_ONLY, EASD, ORIGINS, RESAMPLED, TARGET, TRACE_NAMES, Event, Finished,
                     Stats, TokenEvent, acceptance_text, fits_context)
from .config import DecodeConfig
from .pair import Pair
from ..llamacpp.runtime import Model
from .scheduler import Failed, Request, Scheduler

__all__ = ["BONUS", "DRAFT", "DRAFT_ONLY", "EASD", "ORIGINS", "RESAMPLED", "TARGET", "TRACE_NAMES", "TokenEvent",
           "Stats", "Finished", "Event", "json_number", "fits_context", "acceptance_text", "generate",
           "generate_all", "Stopper"]


class Stopper:
    """Lets the caller of ``generate`` end it early and still get its statistics (a chat
    turn cut short by Ctrl-C counts its drafts, gate fires and times like any other)."""

    def __init__(self) -> None:
        self._stop = None

    def stop(self) -> Finished | None:
        """End the generation now; its Finished so far (``stop_reason`` "interrupted"), or
        None when it had not started or has already finished."""
        stop, self._stop = self._stop, None
        return stop() if stop is not None else None


def generate(
    target: Model | None,
    draft: Model | None,
    prompt: Sequence[int],
    cfg: DecodeConfig,
    *,
    n_vocab: int | None = None,
    thresholds_source: str = "default",
    stop_tokens: Sequence[int] = (),
    rng_seed: int | None = None,
    stopper: Stopper | None = None,
    pair: Pair | None = None,
) -> Iterator[Event]:
    """Decode from ``prompt`` with ``cfg.mode``; yield TokenEvents then one Finished.

    The one-sequence case of :class:`easd_local.engine.scheduler.Scheduler` (slot 0, whose
    caches it reuses by longest common prefix). ``n_vocab`` is the shared vocabulary of
    the pair (logits beyond it are ignored); ``rng_seed`` seeds the sampling generator
    (default ``cfg.seed``). A failure inside the sequence is raised. ``stopper``: see
    :class:`Stopper`. ``pair``: the same models' ``Pair``, whose drafters a caller keeps
    across generations (a chat's turns); by default one for this generation."""
    V = n_vocab or min(m.n_vocab for m in (target, draft) if m is not None)
    if pair is None:
        pair = Pair(draft=draft, target=target, n_vocab=V)
    sched = Scheduler(pair, 1)
    rid = sched.submit(Request(prompt, cfg, thresholds_source=thresholds_source, stop_tokens=stop_tokens,
                               rng_seed=rng_seed))
    if stopper is not None:
        stopper._stop = lambda: sched.stop(rid)
    while True:
        for _rid, ev in sched.step():
            if isinstance(ev, Failed):
                raise ev.error if ev.error is not None else RuntimeError(ev.message)
            if isinstance(ev, Finished):
                if stopper is not None:
                    stopper._stop = None
                yield ev
                return
            yield ev


def generate_all(
    target: Model | None, draft: Model | None, prompt: Sequence[int], cfg: DecodeConfig, **kw
) -> tuple[Finished, list[TokenEvent]]:
    """Drain ``generate``; return the Finished event and the token events."""
    events: list[TokenEvent] = []
    for ev in generate(target, draft, prompt, cfg, **kw):
        if isinstance(ev, Finished):
            return ev, events
        events.append(ev)
    raise AssertionError("generate ended without Finished")  # pragma: no cover
