"""Decoding one sequence: target-only, draft-only, SD, EASD and target-first EASD.

The work is done by ``easd_local.scheduler`` (one stepper per mode; many sequences at
once); ``generate`` is its one-sequence case, and this module holds what both share: the
events, the statistics and the cache invariant below.

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

import math
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence, Union

from .config import DecodeConfig
from .rules import BONUS, DRAFT, DRAFT_ONLY, EASD, ORIGINS, RESAMPLED, TARGET
from .runtime import Model

__all__ = ["BONUS", "DRAFT", "DRAFT_ONLY", "EASD", "ORIGINS", "RESAMPLED", "TARGET", "TRACE_NAMES", "TokenEvent",
           "Stats", "Finished", "Event", "json_number", "fits_context", "generate", "run"]

# the origin of an emitted token (BONUS, DRAFT, ...) is defined with the rules that
# produce it; the names `generate --trace` writes
TRACE_NAMES = {DRAFT: "draft-accepted", TARGET: "target", RESAMPLED: "target-resampled", EASD: "easd-resampled",
               BONUS: "bonus", DRAFT_ONLY: "draft"}


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # newly completed text (may be "" while a multi-byte character is pending)
    origin: str
    h_draft: float | None = None
    h_target: float | None = None
    overlap: float | None = None


@dataclass
class Stats:
    mode: str = ""
    prompt_tokens: int = 0
    tokens: int = 0
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the SD test accepted (including ones the gate then rejected)
    draft_accepted: int = 0  # draft tokens emitted (accepted and not gated)
    sd_rejections: int = 0
    easd_fires: int = 0
    bonus: int = 0
    target_tokens: int = 0  # tokens chosen by the target outside SD (target mode, ungated easd-tf)
    target_calls: int = 0  # target decode calls after the prompt (verify batches / single steps)
    draft_calls: int = 0  # draft decode calls after the prompt (drafting steps and catch-ups)
    draft_consults: int = 0  # easd-tf: positions where the draft's logits were needed
    catchup_calls: int = 0  # batched draft decodes of more than one pending token
    catchup_tokens: int = 0
    seconds_prompt: float = 0.0
    seconds_draft: float = 0.0  # inside draft decodes, prompt included
    seconds_target: float = 0.0  # inside target decodes, prompt included
    seconds_prompt_draft: float = 0.0  # the prompt's share of seconds_draft
    seconds_prompt_target: float = 0.0  # the prompt's share of seconds_target
    seconds_controller: float = 0.0
    seconds_total: float = 0.0
    tokens_per_s: float = 0.0  # generated tokens / (total - prompt) seconds
    ttft_s: float = 0.0
    acceptance_rate: float = 0.0  # draft_accepted / drafted
    mean_accepted_len: float = 0.0  # emitted tokens per target verify call
    easd_fires_per_100: float = 0.0
    tau_draft: float = 0.0
    tau_target: float = 0.0
    top_n: int = 0
    overlap: float = 0.0
    penalty: float = 0.0
    gamma: int = 0
    temperature: float = 0.0
    thresholds_source: str = "default"
    stop_reason: str = ""

    def count(self, origin: str) -> None:
        """Count one emitted token of ``origin``."""
        self.tokens += 1
        field_name = _ORIGIN_COUNTS.get(origin)
        if field_name is None and origin not in ORIGINS:
            raise ValueError(f"unknown origin {origin!r}")
        if field_name is not None:
            setattr(self, field_name, getattr(self, field_name) + 1)

    def to_dict(self) -> dict:
        """Strict-JSON form: see ``json_number``."""
        return {k: json_number(v) for k, v in asdict(self).items()}


def acceptance_text(drafted: int, draft_accepted: int, tok_per_verify: float) -> str:
    """SD figures in llama.cpp's words: n_drafted, n_accept (drafts emitted) and tokens
    per verify (the bonus token included), as the bench report's tok/verify column."""
    rate = 100 * draft_accepted / drafted if drafted else 0.0
    return f"n_drafted {drafted} · n_accept {draft_accepted} ({rate:.0f}%) · {tok_per_verify:.2f} tok/verify"


# the Stats counter each origin adds to (draft-only tokens are counted only as tokens:
# nothing proposed or verified them)
_ORIGIN_COUNTS = {DRAFT: "draft_accepted", TARGET: "target_tokens", RESAMPLED: "sd_rejections", EASD: "easd_fires",
                  BONUS: "bonus"}


def json_number(value):
    """``value`` for strict JSON (which has no Infinity/NaN): a non-finite float becomes
    "inf" / "-inf", NaN becomes None; anything else is returned as is."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


@dataclass(frozen=True)
class Finished:
    stats: Stats
    text: str  # the whole completion (end-of-generation tokens excluded)
    tokens: list[int] = field(default_factory=list)
    tail: str = ""  # text completed only at the end (a dangling partial character); stream it last


Event = Union[TokenEvent, Finished]


def fits_context(n_prompt: int, n_ctx: int) -> bool:
    """Whether a prompt of ``n_prompt`` tokens can be decoded in ``n_ctx``: the prompt
    and room for at least one generated token."""
    return n_prompt + 1 <= n_ctx


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
) -> Iterator[Event]:
    """Decode from ``prompt`` with ``cfg.mode``; yield TokenEvents then one Finished.

    The one-sequence case of :class:`easd_local.scheduler.Scheduler` (slot 0, whose
    caches it reuses by longest common prefix). ``n_vocab`` is the shared vocabulary of
    the pair (logits beyond it are ignored); ``rng_seed`` seeds the sampling generator
(default ``cfg.seed``). A failure inside the sequence is raised."""
    from .pair import Pair
    from .scheduler import Failed, Request, Scheduler

    V = n_vocab or min(m.n_vocab for m in (target, draft) if m is not None)
    sched = Scheduler(Pair(draft=draft, target=target, n_vocab=V), 1)
    sched.submit(Request(prompt, cfg, thresholds_source=thresholds_source, stop_tokens=stop_tokens, rng_seed=rng_seed))
    while True:
        for _rid, ev in sched.step():
            if isinstance(ev, Failed):
                raise ev.error if ev.error is not None else RuntimeError(ev.message)
            yield ev
            if isinstance(ev, Finished):
                return


def run(target: Model, draft: Model | None, prompt: Sequence[int], cfg: DecodeConfig, **kw) -> tuple[Finished, list[TokenEvent]]:
    """Drain ``generate``; return the Finished event and the token events."""
    events: list[TokenEvent] = []
    for ev in generate(target, draft, prompt, cfg, **kw):
        if isinstance(ev, Finished):
            return ev, events
        events.append(ev)
    raise AssertionError("generate ended without Finished")  # pragma: no cover
