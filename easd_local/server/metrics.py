"""The server's Prometheus counters (prometheus_client, its own registry).

What llama-server's ``--metrics`` reports (prompt and generated tokens, requests in
progress and deferred), the prompt cache's share (prompt tokens reused and evaluated), plus the speculative/EASD figures, each labelled by mode: drafted,
accepted, SD rejections, gate fires, bonus tokens. Token-origin counters move as tokens are
emitted, so they include requests that were cancelled or cut by a stop string; ``drafted``
and ``sd_accepted`` come from decoding's final statistics, so they cover finished requests.
Updated from the engine thread only (prometheus_client's metrics are thread-safe to read).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..engine.decoding import BONUS, DRAFT, EASD, RESAMPLED, Stats, TokenEvent
from ..engine.events import LOOKUP

CONTENT_TYPE = CONTENT_TYPE_LATEST
disable_created_metrics()  # no *_created series: start times say nothing here


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("easd_requests", "Requests ended, by mode and outcome "
                                "(stop, length, cancelled, failed, rejected).", ["mode", "outcome"], registry=r)
        self.prompt_tokens = Counter("easd_prompt_tokens", "Prompt tokens of admitted requests.", ["mode"], registry=r)
        self.prompt_cached = Counter("easd_prompt_cached_tokens", "Prompt tokens reused from a slot's KV cache "
                                     "(timings.cache_n), of requests whose prompt was evaluated.", ["mode"], registry=r)
        self.prompt_evaluated = Counter("easd_prompt_evaluated_tokens", "Prompt tokens evaluated "
                                        "(timings.prompt_n).", ["mode"], registry=r)
        self.generated = Counter("easd_generated_tokens", "Tokens generated.", ["mode"], registry=r)
        self.drafted = Counter("easd_drafted_tokens", "Draft tokens proposed (finished requests).", ["mode"], registry=r)
        self.sd_accepted = Counter("easd_sd_accepted_tokens", "Draft tokens the SD test accepted, gated ones "
                                   "included (finished requests).", ["mode"], registry=r)
        self.draft_accepted = Counter("easd_draft_accepted_tokens", "Draft tokens emitted.", ["mode"], registry=r)
        self.lookup_accepted = Counter("easd_lookup_accepted_tokens", "Looked-up tokens emitted (a lookup drafter: "
                                       "--spec-type ngram-simple, ngram-mod).", ["mode"], registry=r)
        self.sd_rejections = Counter("easd_sd_rejections", "Tokens resampled by the target after an SD rejection.",
                                     ["mode"], registry=r)
        self.gate_fires = Counter("easd_gate_fires", "Tokens where the EASD gate fired and the target picked again.",
                                  ["mode"], registry=r)
        self.bonus = Counter("easd_bonus_tokens", "Bonus tokens (all drafts kept).", ["mode"], registry=r)
        self.processing = Gauge("easd_requests_processing", "Requests holding a decoding slot.", registry=r)
        self.waiting = Gauge("easd_requests_waiting", "Requests queued for a slot.", registry=r)
        self.slots = Gauge("easd_slots", "Decoding slots (--parallel as the engine provides it).", registry=r)
        self.ram_bytes = Gauge("easd_prompt_cache_ram_bytes", "Host memory holding prompts saved from their "
                               "slots (--cache-ram).", registry=r)
        self.ram_entries = Gauge("easd_prompt_cache_ram_entries", "Prompts saved in host memory.", registry=r)
        self.ram_restored = Gauge("easd_prompt_cache_ram_restored_tokens", "Prompt tokens loaded back "
                                  "from host memory into a slot (counted in easd_prompt_cached_tokens too).",
                                  registry=r)

    def token(self, mode: str, ev: TokenEvent) -> None:
        self.generated.labels(mode).inc()
        counter = {DRAFT: self.draft_accepted, EASD: self.gate_fires, BONUS: self.bonus,
                   RESAMPLED: self.sd_rejections, LOOKUP: self.lookup_accepted}.get(ev.origin)
        if counter is not None:
            counter.labels(mode).inc()

    def prompt(self, mode: str, cached: int, evaluated: int) -> None:
        self.prompt_cached.labels(mode).inc(cached)
        self.prompt_evaluated.labels(mode).inc(evaluated)

    def cache_ram(self, store) -> None:
        self.ram_bytes.set(store.bytes)
        self.ram_entries.set(len(store))
        self.ram_restored.set(store.restored_tokens)

    def finished(self, stats: Stats) -> None:
        self.drafted.labels(stats.mode).inc(stats.drafted)
        self.sd_accepted.labels(stats.mode).inc(stats.accepted)

    def ended(self, mode: str, outcome: str) -> None:
        self.requests.labels(mode, outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
