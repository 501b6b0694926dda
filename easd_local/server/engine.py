"""The engine thread: the one thread that loads the models and drives the scheduler.

Requests come in through ``submit`` (any thread) and wait in a bounded queue; at each step
the thread admits waiting requests into free slots (so a request that arrives mid-generation
joins the running batch at the next step), applies cancellations (a client that went away
frees its slot before the next step), runs one scheduler step and hands every event to its
request's ``deliver`` callback (the HTTP layer passes one that puts it on the request's
asyncio queue with ``loop.call_soon_threadsafe``).

Messages a request receives, in order: ``Admitted`` or ``Rejected``; then the scheduler's
``TokenEvent``s; then one ``Finished`` or ``Failed``. ``ShuttingDown`` may come instead of
any of these: the engine stopped before the request ended.

The prompt cache: the scheduler keeps each slot's KV cells after its request and sends a
request to the idle slot that lets it reuse the most (``engine.prompt_cache``); this is the
mechanism ``chat`` uses between turns, with one slot. ``cache_prompt`` False (the server's
``--no-cache-prompt``) makes every request start from empty cells, as a request's own
``cache_prompt: false`` does. A client that goes away leaves its slot's cells as they were
after the last step (what was evaluated: prompt and tokens so far), for its next request to
reuse; a failure clears them.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..engine.decoding import Finished, TokenEvent
from ..errors import ConfigError, EasdError
from ..engine.pair import Pair
from ..llamacpp.runtime import Model
from ..engine.prompt_cache import DEFAULT_SIMILARITY
from ..engine.scheduler import Failed, Request, Scheduler
from .metrics import Metrics
from .responses import finish_reason

__all__ = ["Admitted", "Engine", "Failed", "Job", "NotReady", "QueueFull", "Rejected", "Request", "ShuttingDown"]


@dataclass(frozen=True)
class Admitted:
    queue_s: float  # seconds spent waiting for a slot


@dataclass(frozen=True)
class Rejected:
    error: EasdError  # the scheduler refused the request (bad setting, prompt too long)


@dataclass(frozen=True)
class ShuttingDown:
    """The server is stopping: the request ends unanswered (a retry may find it back up)."""


class QueueFull(Exception):
    pass


class NotReady(Exception):
    pass


class Job:
    """One request's place in the engine. ``rid`` and ``done`` belong to the engine thread."""

    def __init__(self, request: Request, deliver: Callable[[object], None]):
        self.request = request
        self.deliver = deliver
        self.mode = request.cfg.mode
        self.t_enqueued = time.perf_counter()
        self.rid: int | None = None
        self.done = False


class Engine:
    def __init__(self, load: Callable[[], Pair], n_parallel: int, queue_size: int,
                 metrics: Metrics | None = None, on_load_failed: Callable[[BaseException], None] | None = None,
                 on_loaded: Callable[[Pair], dict | None] | None = None, cache_prompt: bool = True,
                 slot_similarity: float = DEFAULT_SIMILARITY, cache_ram: int = 0,
                 load_draft: Callable[[], "Model"] | None = None):
        self._load = load
        # the draft model, loaded in the engine thread by the first request that needs it when
        # the server's own way does not (a lookup, the target alone)
        self._load_draft = load_draft
        self.draft_loadable = load_draft is not None
        self.cache_prompt = cache_prompt
        self.slot_similarity = slot_similarity
        self.cache_ram = cache_ram  # bytes of host memory for prompts that left their slot (0: none)
        # called in the engine thread once the models are loaded, before the server is ready;
        # what it returns (the provenance of the server's results) is kept in ``provenance``
        self._on_loaded = on_loaded
        self.provenance: dict | None = None
        self._n_parallel = n_parallel
        self.queue_size = queue_size
        self.metrics = metrics or Metrics()
        self._on_load_failed = on_load_failed
        self.pair: Pair | None = None
        self.load_error: BaseException | None = None
        self.crashed: str | None = None  # the engine loop itself died (a bug): nothing more is served
        self.n_slots = 0
        self._sched: Scheduler | None = None
        self._cv = threading.Condition()
        self._waiting: collections.deque[Job] = collections.deque()
        self._cancels: list[tuple[Job, str]] = []
        self._running: dict[int, Job] = {}
        self._n_running = 0
        self._stopping = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="easd-engine", daemon=True)

    # ------------------------------------------------------------------ any thread
    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.load_error is None and self.crashed is None and not self._stopping

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def slot_context(self) -> int:
        """Tokens one slot holds, prompt included (the loaded models' smaller context)."""
        return min(m.n_ctx for m in (self.pair.target, self.pair.draft) if m is not None)

    def start(self) -> None:
        self._thread.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def submit(self, request: Request, deliver: Callable[[object], None]) -> Job:
        """Queue a request; QueueFull past ``queue_size`` waiting requests, NotReady while
        the models load (or after they failed to)."""
        if not self.ready:
            raise NotReady()
        if not self.cache_prompt and request.reuse_cache:
            request = dataclasses.replace(request, reuse_cache=False)
        job = Job(request, deliver)
        with self._cv:
            if len(self._waiting) + self._n_running >= self.n_slots + self.queue_size:
                raise QueueFull()
            self._waiting.append(job)
            self.metrics.waiting.set(len(self._waiting))
            self._cv.notify()
        return job

    def cancel(self, job: Job, outcome: str = "cancelled") -> None:
        """Drop a request (client gone, or a stop string matched): a waiting one leaves the
        queue now, a running one frees its slot before the next step. With ``outcome``
        "stop" the request is sent a ``Finished`` with its statistics so far (the tokens
        decoded by then: a few past the stop string, decoded before the cut arrived)."""
        with self._cv:
            if job in self._waiting:
                self._waiting.remove(job)
                self.metrics.waiting.set(len(self._waiting))
                self.metrics.ended(job.mode, outcome)
                return
            self._cancels.append((job, outcome))
            self._cv.notify()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------ engine thread
    def _main(self) -> None:
        try:
            self.pair = self._load()
            self._sched = Scheduler(self.pair, self._n_parallel, self.slot_similarity,
                                    self.cache_ram if self.cache_prompt else 0)
            if self._on_loaded is not None:
                self.provenance = self._on_loaded(self.pair)
        except BaseException as e:  # noqa: BLE001 - reported by whoever started the server
            self.load_error = e
            self._ready.set()
            if self.pair is not None:
                self.pair.close()
                self.pair = None
            if self._on_load_failed is not None:
                self._on_load_failed(e)
            return
        self.n_slots = self._sched.n_parallel
        self.metrics.slots.set(self.n_slots)
        self._ready.set()
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - a bug: report it on /health and to every request
            self.crashed = f"{type(e).__name__}: {e}"
        finally:
            self._shutdown()

    def _loop(self) -> None:
        sched = self._sched
        while True:
            with self._cv:
                while not (self._stopping or self._cancels or sched.active
                           or (self._waiting and sched.free_slots() > 0)):
                    self._cv.wait()
                if self._stopping:
                    return
                cancels, self._cancels = self._cancels, []
            for job, outcome in cancels:
                if job.done or job.rid is None:
                    continue
                if outcome == "stop":
                    # a stop string matched: the request still gets decoding's own statistics
                    # of what was decoded (a Finished), the cells stay for prefix reuse
                    fin = sched.stop(job.rid, "stop_string")
                    self._end(job, outcome)
                    if fin is not None:
                        self.metrics.finished(fin.stats)
                        job.deliver(fin)
                else:
                    # between steps the slot's cells hold what was evaluated: keep them for
                    # the client's next request (a chat UI's "stop", then the next turn)
                    sched.cancel(job.rid, keep_cache=True)
                    self._end(job, outcome)
            self._admit()
            if sched.active:
                self._step()

    def _admit(self) -> None:
        sched = self._sched
        while sched.free_slots() > 0:
            with self._cv:
                if not self._waiting:
                    return
                job = self._waiting.popleft()
                self.metrics.waiting.set(len(self._waiting))
            try:
                self._check_budget(job.request)
                if job.request.cfg.needs_draft_model and self.pair.draft is None and self._load_draft is not None:
                    self.pair.draft = self._load_draft()
                    self.pair.n_vocab = sched.V = min(self.pair.n_vocab, self.pair.draft.n_vocab)
                job.rid = sched.submit(job.request)
            except EasdError as e:
                job.done = True
                self.metrics.ended(job.mode, "rejected")
                job.deliver(Rejected(e))
                continue
            with self._cv:
                self._n_running += 1
            self._running[job.rid] = job
            self.metrics.processing.set(len(self._running))
            self.metrics.prompt_tokens.labels(job.mode).inc(len(job.request.prompt))
            job.deliver(Admitted(time.perf_counter() - job.t_enqueued))

    def _check_budget(self, request: Request) -> None:
        """A token budget larger than a slot's whole context can never be honoured (OpenAI
        refuses such a max_tokens too); a smaller one that the prompt leaves no room for
        ends at the context's end with finish_reason "length"."""
        n_ctx = self.slot_context
        if request.cfg.max_tokens > n_ctx:
            raise ConfigError(f"max-tokens {request.cfg.max_tokens} is larger than the context of a slot "
                              f"({n_ctx} tokens, prompt included); lower it or raise --ctx")

    def _step(self) -> None:
        sched = self._sched
        try:
            events = sched.step()
        except Exception as e:  # noqa: BLE001 - a failing step ends its requests, not the server
            msg = str(e) if isinstance(e, EasdError) else f"internal error: {type(e).__name__}: {e}"
            for rid, job in list(self._running.items()):
                sched.cancel(rid)
                self._end(job, "failed")
                job.deliver(Failed(msg))
            return
        for p in sched.take_prefills():
            job = self._running.get(p.rid)
            if job is not None:
                self.metrics.prompt(job.mode, p.cached, p.evaluated)
        if sched.store is not None:
            self.metrics.cache_ram(sched.store)
        for rid, ev in events:
            job = self._running.get(rid)
            if job is None:
                continue
            if isinstance(ev, TokenEvent):
                self.metrics.token(job.mode, ev)
            elif isinstance(ev, Finished):
                self.metrics.finished(ev.stats)
                self._end(job, finish_reason(ev.stats.stop_reason))
            else:
                self._end(job, "failed")
            job.deliver(ev)

    def _end(self, job: Job, outcome: str) -> None:
        job.done = True
        self._running.pop(job.rid, None)
        with self._cv:
            self._n_running -= 1
        self.metrics.processing.set(len(self._running))
        self.metrics.ended(job.mode, outcome)

    def _shutdown(self) -> None:
        with self._cv:
            waiting, self._waiting = list(self._waiting), collections.deque()
        for job in waiting + list(self._running.values()):
            job.deliver(ShuttingDown())
        self._running.clear()
        if self.pair is not None:
            self.pair.close()
