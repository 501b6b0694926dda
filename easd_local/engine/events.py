"""What decoding produces, for every layer to read: where a token came from (its origin),
the token events a generation streams, its ``Finished`` record and one ``Stats``.

The bottom of the engine: it imports nothing that decodes, so the rules, the steps, the
scheduler and ``decoding.generate`` above them, and the applications, all speak it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Union

from ..jsonsafe import json_number
from .modes import MODE_TABLE

# Where an emitted token came from. Each says what happened, so the statistics are counts
# of origins (Stats) and the trace (TRACE_NAMES) is true.
DRAFT = "draft"  # proposed by the draft, accepted by the SD test, gate closed
TARGET = "target"  # chosen by the target: target mode, every easd-tf position the gate did not fire at
RESAMPLED = "resampled"  # the SD test rejected a draft token and the target resampled it
EASD = "easd"  # the gate fired on an SD-accepted draft token (easd-tf: at its position) and the target picked again
BONUS = "bonus"  # all drafted tokens kept: the target's next token comes for free
DRAFT_ONLY = "draft-only"  # draft mode: the draft chose it, nothing verified it
LOOKUP = "lookup"  # proposed by a lookup drafter (no model: ngram-simple, ngram-mod), accepted by the SD test
ORIGINS = (DRAFT, TARGET, RESAMPLED, EASD, BONUS, DRAFT_ONLY, LOOKUP)
# origins of drafted tokens that the target accepted (llama.cpp's draft_n_accepted)
ACCEPTED_DRAFTS = (DRAFT, LOOKUP)

# the names `generate --trace` writes
TRACE_NAMES = {DRAFT: "draft-accepted", TARGET: "target", RESAMPLED: "target-resampled", EASD: "easd-resampled",
               BONUS: "bonus", DRAFT_ONLY: "draft", LOOKUP: "lookup-accepted"}


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # newly completed text (may be "" while a multi-byte character is pending)
    origin: str
    h_draft: float | None = None
    h_target: float | None = None
    overlap: float | None = None


# Stats fields that are settings of the run, not counts: an addition keeps them when both
# sides agree and clears them otherwise
_SETTINGS = ("mode", "tau_draft", "tau_target", "top_n", "overlap", "penalty", "gamma", "temperature",
             "thresholds_source", "stop_reason")


@dataclass
class Stats:
    """One generation's counts and times (or the sum of several: ``a + b``); the rates are
    derived from them, so a sum's rates are the pooled rates."""

    mode: str = ""
    prompt_tokens: int = 0
    # prompt tokens whose KV cells a slot's cache already held (reused, not evaluated) on the
    # model whose tokens are emitted; prompt_tokens - prompt_cached were evaluated
    prompt_cached: int = 0
    tokens: int = 0
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the SD test accepted (including ones the gate then rejected)
    draft_accepted: int = 0  # draft tokens emitted (accepted and not gated), the draft model's
    lookup_accepted: int = 0  # looked-up tokens emitted (a lookup drafter's: no model)
    sd_rejections: int = 0
    easd_fires: int = 0
    bonus: int = 0
    target_tokens: int = 0  # tokens the target chose itself (target mode, easd-tf where the gate did not fire)
    target_calls: int = 0  # target decode calls after the prompt (verify batches / single steps)
    verify_calls: int = 0  # target calls that verified a drafted block (sd, easd)
    verified_tokens: int = 0  # tokens those verify calls emitted
    draft_calls: int = 0  # draft decode calls after the prompt (drafting steps and catch-ups)
    draft_consults: int = 0  # easd-tf: positions where the draft's logits were needed
    target_first_tokens: int = 0  # tokens of easd-tf generations (the consult rate's denominator)
    catchup_calls: int = 0  # batched draft decodes of more than one pending token
    catchup_tokens: int = 0
    seconds_prompt: float = 0.0
    seconds_draft: float = 0.0  # inside the draft's llama_decode calls, prompt included
    seconds_target: float = 0.0  # inside the target's llama_decode calls, prompt included
    seconds_prompt_draft: float = 0.0  # the prompt's share of seconds_draft
    seconds_prompt_target: float = 0.0  # the prompt's share of seconds_target
    # everything else of the generation's life, outside llama_decode: filling batches, reading
    # the logits rows out of llama.cpp, the rules, the gate, the steps, the scheduler, the
    # events (docs/controller.md)
    seconds_controller: float = 0.0
    seconds_total: float = 0.0
    ttft_s: float = 0.0
    tau_draft: float = 0.0
    tau_target: float = 0.0
    top_n: int = 0
    overlap: float = 0.0  # the gate's threshold (tau_overlap), not a measured overlap
    penalty: float = 0.0
    gamma: int = 0
    temperature: float = 0.0
    thresholds_source: str = "default"
    stop_reason: str = ""
    # the accept-length histogram beside the means (as gpt-fast's accept_counts): entry k is
    # the number of verify calls that emitted k drafted tokens (sum: verify_calls; sum of
    # k times entry k: drafts_emitted)
    accept_lengths: list[int] = field(default_factory=list)

    # ---------------------------------------------------------------- counting
    def count(self, origin: str) -> None:
        """Count one emitted token of ``origin``."""
        self.tokens += 1
        field_name = _ORIGIN_COUNTS.get(origin)
        if field_name is not None:
            self.__dict__[field_name] += 1
        elif origin not in ORIGINS:
            raise ValueError(f"unknown origin {origin!r}")

    def count_verify(self, drafted: int, origins: list[str], kept: int) -> None:
        """Count one target call that verified ``drafted`` tokens: its block's ``origins``
        (rules.verify's picks), of which the first ``kept`` were emitted (a block is cut at the
        token budget or an end-of-generation token). The tokens themselves are counted by
        ``count`` as they are emitted."""
        self.target_calls += 1
        self.verify_calls += 1
        self.drafted += drafted
        self.accepted += origins.count(DRAFT) + origins.count(LOOKUP) + origins.count(EASD)  # the gated ones included
        self.verified_tokens += kept
        emitted = origins[:kept]
        k = emitted.count(DRAFT) + emitted.count(LOOKUP)
        self.accept_lengths.extend([0] * (k + 1 - len(self.accept_lengths)))
        self.accept_lengths[k] += 1

    def __add__(self, other: "Stats") -> "Stats":
        out = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name in _SETTINGS:
                out[f.name] = a if a == b else f.default
            elif f.name == "accept_lengths":
                n = max(len(a), len(b))
                out[f.name] = [x + y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)))]
            else:
                out[f.name] = a + b
        return Stats(**out)

    @classmethod
    def from_dict(cls, d: dict) -> "Stats":
        """From ``to_dict``'s form (a bench row's ``stats``): the derived rates and unknown
        keys are ignored; "inf" / "-inf" / None come back as floats."""
        out = {}
        for f in fields(cls):
            if f.name in d:
                v = d[f.name]
                if f.name in _FLOAT_FIELDS:
                    v = math.nan if v is None else float(v)
                elif f.name == "accept_lengths":
                    v = [int(x) for x in v]
                out[f.name] = v
        info = MODE_TABLE.get(str(d.get("mode", "")))
        if info is not None and "verify_calls" not in d:
            # one generation's figures: its mode says which calls were verify calls
            if info.speculative:
                out["verify_calls"], out["verified_tokens"] = out.get("target_calls", 0), out.get("tokens", 0)
            if info.target_first:
                out["target_first_tokens"] = out.get("tokens", 0)
        return cls(**out)

    # ---------------------------------------------------------------- rates
    @property
    def seconds_generating(self) -> float:
        """Wall time after the prompt: what the tokens took."""
        return max(0.0, self.seconds_total - self.seconds_prompt)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of generation (prompt excluded)."""
        gen = self.seconds_generating
        return self.tokens / gen if gen > 0 else 0.0

    @property
    def drafts_emitted(self) -> int:
        """Drafted tokens emitted, whoever drafted them (llama.cpp's draft_n_accepted)."""
        return self.draft_accepted + self.lookup_accepted

    @property
    def acceptance_rate(self) -> float:
        """Drafted tokens emitted / drafted."""
        return self.drafts_emitted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """Tokens emitted per target verify call (sd, easd)."""
        return self.verified_tokens / self.verify_calls if self.verify_calls else 0.0

    @property
    def easd_fires_per_100(self) -> float:
        return 100.0 * self.easd_fires / self.tokens if self.tokens else 0.0

    @property
    def draft_consult_rate(self) -> float | None:
        """easd-tf: the share of its positions where the draft was consulted; None without easd-tf."""
        return self.draft_consults / self.target_first_tokens if self.target_first_tokens else None

    def to_dict(self) -> dict:
        """Strict-JSON form (see ``json_number``) with the rates, in the key order bench rows
        and ``generate --json`` have always had; the bookkeeping behind the rates that a
        single generation's mode implies (``from_dict`` restores it) is left out."""
        d = asdict(self)
        out = {}
        for k in _DICT_KEYS:
            out[k] = json_number(d[k] if k in d else getattr(self, k))
        return out


_DERIVED_ONLY = ("verify_calls", "verified_tokens", "target_first_tokens")
_DICT_KEYS = [f.name for f in fields(Stats) if f.name not in _DERIVED_ONLY]
_DICT_KEYS[_DICT_KEYS.index("ttft_s"):_DICT_KEYS.index("ttft_s")] = ["tokens_per_s"]
_DICT_KEYS[_DICT_KEYS.index("ttft_s") + 1:_DICT_KEYS.index("ttft_s") + 1] = [
    "acceptance_rate", "mean_accepted_len", "easd_fires_per_100"]
_FLOAT_FIELDS = {f.name for f in fields(Stats) if f.type in ("float", float)}


def acceptance_text(drafted: int, draft_accepted: int, tok_per_verify: float) -> str:
    """SD figures in llama.cpp's words: n_drafted, n_accept (drafts emitted) and tokens
    per verify (the bonus token included), as the bench report's tok/verify column."""
    rate = 100 * draft_accepted / drafted if drafted else 0.0
    return f"n_drafted {drafted} · n_accept {draft_accepted} ({rate:.0f}%) · {tok_per_verify:.2f} tok/verify"


# the Stats counter each origin adds to (draft-only tokens are counted only as tokens:
# nothing proposed or verified them)
_ORIGIN_COUNTS = {DRAFT: "draft_accepted", TARGET: "target_tokens", RESAMPLED: "sd_rejections", EASD: "easd_fires",
                  BONUS: "bonus", LOOKUP: "lookup_accepted"}


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
