"""The OpenAI response shapes and the per-request statistics object (pure functions).

``timings`` follows llama-server's object of that name (``cache_n``: prompt tokens reused
from the slot's cache, ``prompt_n``: prompt tokens evaluated, ``prompt_ms``,
``predicted_per_second``, ``draft_n``, ``draft_n_accepted``...) so that tools that show
llama-server's figures show ours, and adds what the acceptance rule did: SD rejections,
gate fires, bonus tokens, the mode, whether it is lossless, and the thresholds in force with
their source.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from ..engine.config import DecodeConfig
from ..engine.decoding import BONUS, DRAFT, EASD, ORIGINS, RESAMPLED, TARGET, Stats, TokenEvent, json_number

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def finish_reason(stop_reason: str) -> str:
    """decoding's stop reason -> OpenAI's finish_reason ("stop" for a stop string too)."""
    return FINISH_REASONS.get(stop_reason, "stop")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000.0 * seconds, 3)


def _rate(n: int, seconds: float | None) -> float | None:
    if seconds is None:
        return None
    return n / seconds if seconds > 0 else 0.0


def _settings(cfg: DecodeConfig, source: str) -> dict:
    return {
        "mode": cfg.mode, "lossless": cfg.lossless, "gamma": cfg.gamma, "temperature": cfg.temperature,
        "tau_draft": json_number(cfg.tau_draft), "tau_target": json_number(cfg.tau_target), "top_n": cfg.top_n,
        "overlap": cfg.overlap, "penalty": cfg.penalty, "thresholds_source": source,
    }


def timings_from_stats(stats: Stats, cfg: DecodeConfig, queue_s: float) -> dict:
    """The statistics of a request that decoding finished (its Stats are complete)."""
    gen_s = max(0.0, stats.seconds_total - stats.seconds_prompt)
    evaluated = stats.prompt_tokens - stats.prompt_cached
    return {
        "cache_n": stats.prompt_cached, "prompt_n": evaluated, "prompt_ms": _ms(stats.seconds_prompt),
        "prompt_per_second": _rate(evaluated, stats.seconds_prompt),
        "predicted_n": stats.tokens, "predicted_ms": _ms(gen_s), "predicted_per_second": stats.tokens_per_s,
        "queue_ms": _ms(queue_s), "ttft_ms": _ms(stats.ttft_s),
        "draft_n": stats.drafted, "draft_n_accepted": stats.drafts_emitted, "sd_accepted": stats.accepted,
        "sd_rejections": stats.sd_rejections, "gate_fires": stats.easd_fires, "bonus": stats.bonus,
        "target_tokens": stats.target_tokens, "draft_consults": stats.draft_consults,
        "acceptance_rate": stats.acceptance_rate, "mean_accepted_len": stats.mean_accepted_len,
        **_settings(cfg, stats.thresholds_source), "stop_reason": stats.stop_reason,
    }


@dataclass
class Tally:
    """What the HTTP layer saw of one request's tokens, for a request that ends before
    decoding's own Finished (a stop string): counts by origin and times of arrival."""

    prompt_n: int
    t_admitted: float = field(default_factory=time.perf_counter)
    t_first: float | None = None
    t_last: float | None = None
    tokens: int = 0
    origins: dict = field(default_factory=lambda: dict.fromkeys(ORIGINS, 0))

    def add(self, ev: TokenEvent) -> None:
        now = time.perf_counter()
        if self.t_first is None:
            self.t_first = now
        self.t_last = now
        self.tokens += 1
        self.origins[ev.origin] = self.origins.get(ev.origin, 0) + 1


def timings_from_tally(t: Tally, cfg: DecodeConfig, source: str, queue_s: float, stop_reason: str) -> dict:
    """The statistics of a request cut short by a stop string. The engine was told to
    drop it, so decoding's own figures never came: draft counts and what the prompt cache
    reused are unknown (null) and the times are as measured on arrival."""
    gen_s = (t.t_last - t.t_first) if (t.t_first is not None and t.t_last is not None) else None
    return {
        "cache_n": None, "prompt_n": None, "prompt_ms": None, "prompt_per_second": None,
        "predicted_n": t.tokens, "predicted_ms": _ms(gen_s),
        "predicted_per_second": (t.tokens - 1) / gen_s if gen_s else None,
        "queue_ms": _ms(queue_s), "ttft_ms": _ms(None if t.t_first is None else t.t_first - t.t_admitted),
        "draft_n": None, "draft_n_accepted": t.origins[DRAFT], "sd_accepted": None,
        "sd_rejections": t.origins[RESAMPLED], "gate_fires": t.origins[EASD], "bonus": t.origins[BONUS],
        "target_tokens": t.origins[TARGET], "draft_consults": None,
        "acceptance_rate": None, "mean_accepted_len": None,
        **_settings(cfg, source), "stop_reason": stop_reason,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(kind: str, rid: str, created: int, model: str, text: str, finish: str, usage_: dict,
               timings: dict) -> dict:
    """The non-streamed response: ``chat.completion`` or ``text_completion``."""
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage_, "timings": timings}


def chunk(kind: str, rid: str, created: int, model: str, text: str | None, *, finish: str | None = None,
          role: bool = False, timings: dict | None = None, tokens: list[dict] | None = None) -> dict:
    """One streamed chunk with a piece of text (``role`` on the first chat chunk), or the
    final one with ``finish`` and the statistics. ``tokens``: the ``easd_tokens`` extension
    (server/spans.py), which OpenAI clients ignore."""
    if kind == "chat":
        delta: dict = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    out = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
    if tokens:
        out["easd_tokens"] = tokens
    if timings is not None:
        out["timings"] = timings
    return out


def usage_chunk(kind: str, rid: str, created: int, model: str, usage_: dict, timings: dict) -> dict:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage
    (and, as the last chunk, the statistics)."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage_,
            "timings": timings}
