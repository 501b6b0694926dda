"""The HTTP layer: Starlette routes over the engine thread (the only module that speaks HTTP).

Every error a client can cause is answered with the OpenAI error shape
``{"error": {"message", "type", "param", "code"}}`` and a 4xx status; a failure inside
decoding ends that request (500 before the first byte, an error event in a stream) and the
server goes on. Streams are server-sent events (sse-starlette), ending with ``data: [DONE]``;
a client that goes away, streamed or not, has its sequence cancelled at once. Each streamed
chunk also says which tokens its text came from (``easd_tokens``, server/spans.py), which the
chat page at GET / (server/webui.py) colours by origin.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Mapping
from urllib.parse import urlsplit

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine.config import DecodeConfig
from ..engine.decoding import Finished, TokenEvent
from ..errors import ContextOverflowError, EasdError
from .engine import Admitted, Engine, Failed, Job, NotReady, QueueFull, Rejected, Request, ShuttingDown
from .metrics import CONTENT_TYPE
from .protocol import (DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY, ApiError, ApiRequest, bad, param_of, parse_request,
                       request_config)
from .responses import (Tally, chunk, completion, finish_reason, new_id, timings_from_stats, timings_from_tally,
                        usage, usage_chunk)
from .spans import TokenSpans
from .stops import StopMatcher
from . import webui

DRAIN_LIMIT = 64 * 1024 * 1024  # an oversized body is read and dropped up to this, so the client sees the 413
RETRY_AFTER_S = 1
# pages served from this machine (another local UI, a notebook) may call the API from their own
# origin, as Ollama allows by default; any other origin only through --cors-origin
LOOPBACK_ORIGINS = r"https?://(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d{1,5})?"
SHUTDOWN_GRACE_S = 3.0  # less than uvicorn's graceful-shutdown timeout (cli/serve.py: 5 s)


@dataclass(frozen=True)
class ServeConfig:
    model_name: str  # the name /v1/models lists and requests may give as "model"
    base: DecodeConfig  # the server's decoding defaults (flags > pair profile > built-in)
    thresholds_source: str
    api_key: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S  # seconds a request body may stall (--timeout)
    webui: bool = True  # the chat page at GET / (--no-webui: off)
    # EASD mode -> what a recorded comparison on this pair found where it was significantly
    # worse (``cli.options.easd_loss``): /props says it beside "not lossless", the page with it
    easd_losses: Mapping[str, str] = field(default_factory=dict)
    cors_origins: tuple[str, ...] = ()  # browser origins besides the loopback ones ("*": any, as llama-server)


class ClientGone(Exception):
    pass


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down; retry once it is back", type="server_error",
                    code="shutting_down", headers={"Retry-After": str(RETRY_AFTER_S)})


def ended_early(msg) -> ApiError:
    """The error for an engine message that ends a request without its answer."""
    if isinstance(msg, ShuttingDown):
        return shutting_down()
    text = msg.message if isinstance(msg, Failed) else str(msg)
    return ApiError(500, f"decoding failed: {text}", type="server_error", code="decoding_failed")


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: HttpRequest, limit: int, idle_s: float = DEFAULT_BODY_TIMEOUT_S):
    """The body as JSON, refused with 413 past ``limit`` bytes before anything is parsed, and
    with 408 when ``idle_s`` seconds pass without a byte of it arriving."""
    declared = request.headers.get("content-length")
    too_big = ApiError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    parts = _body_parts(request, idle_s)
    if declared is not None:
        if not declared.strip().isdigit():
            raise bad("invalid Content-Length header")
        if int(declared) > limit:
            await _drain(parts, int(declared))
            raise too_big
    chunks, size = [], 0
    try:
        async for part in parts:
            size += len(part)
            if size > limit:
                await _drain(parts, size)
                raise too_big
            chunks.append(part)
    except ClientDisconnect:  # gone before its body was all sent: nobody to answer
        raise ClientGone() from None
    try:
        return json.loads(b"".join(chunks), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise bad(f"malformed JSON body: {e}") from None


async def _body_parts(request: HttpRequest, idle_s: float) -> AsyncIterator[bytes]:
    """The body's parts as they arrive. uvicorn never gives up on a body, so a client that
    declares one and stalls would hold its connection and this coroutine for ever: past
    ``idle_s`` seconds without a part, a 408 (a slow upload that keeps sending is never cut)."""
    stream = request.stream().__aiter__()
    while True:
        try:
            part = await asyncio.wait_for(stream.__anext__(), idle_s)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            # the rest of the body may still come: the connection cannot carry another request
            raise ApiError(408, f"no part of the request body arrived for {idle_s:g} s (--timeout)",
                           code="request_timeout", headers={"Connection": "close"}) from None
        yield part


async def _drain(parts: AsyncIterator[bytes], seen: int) -> None:
    if seen > DRAIN_LIMIT:
        return
    try:
        async for part in parts:
            seen += len(part)
            if seen > DRAIN_LIMIT:
                return
    except Exception:  # noqa: BLE001 - the client may be gone or stalled: the 413 goes out regardless
        return


async def _disconnected(request: HttpRequest) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: HttpRequest, coro):
    """Await ``coro``; if the client disconnects first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            if not t.done():
                t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if not task.cancelled():
        return task.result()
    raise ClientGone()


class Completion:
    """One admitted request: turns the engine's messages into text pieces (through the stop
    strings), then into the OpenAI response or the SSE stream."""

    def __init__(self, engine: Engine, job: Job, queue: asyncio.Queue, req: ApiRequest, cfg: DecodeConfig,
                 source: str, prompt_n: int, queue_s: float, model: str):
        self.engine, self.job, self.queue, self.req = engine, job, queue, req
        self.cfg, self.source, self.prompt_n, self.queue_s, self.model = cfg, source, prompt_n, queue_s, model
        self.id = new_id(req.kind)
        self.created = int(time.time())
        self.end: tuple[str, dict, dict] | None = None  # finish_reason, usage, timings
        self.last_tokens: list[dict] = []  # easd_tokens records not sent with a piece of text

    async def pieces(self) -> AsyncIterator[tuple[str, list[dict]]]:
        """(text, the easd_tokens records of that text) as the stop strings release it."""
        stop = StopMatcher(self.req.stop)
        tally = Tally(self.prompt_n)
        spans = TokenSpans()
        over = False
        try:
            while True:
                msg = await self.queue.get()
                if isinstance(msg, TokenEvent):
                    tally.add(msg)
                    spans.token(msg)
                    text = stop.feed(msg.text)
                    if text:
                        yield text, spans.take(len(text))
                    if stop.stopped:
                        over = True
                        self.last_tokens = spans.finish()
                        self.engine.cancel(self.job, "stop")
                        stats = await self._stats_after_stop()
                        if stats is not None:
                            timings = timings_from_stats(stats, self.cfg, self.queue_s)
                        else:
                            timings = timings_from_tally(tally, self.cfg, self.source, self.queue_s, "stop_string")
                        # usage: the tokens whose text was returned; timings: all that was decoded
                        self.end = ("stop", usage(self.prompt_n, tally.tokens), self._stamped(timings))
                        return
                elif isinstance(msg, Finished):
                    over = True
                    spans.tail(msg.tail)
                    text = stop.feed(msg.tail)
                    text += stop.flush()
                    if text:
                        yield text, spans.take(len(text))
                    self.last_tokens = spans.finish()
                    s = msg.stats
                    reason = "stop" if stop.stopped else finish_reason(s.stop_reason)
                    self.end = (reason, usage(s.prompt_tokens, s.tokens),
                                self._stamped(timings_from_stats(s, self.cfg, self.queue_s)))
                    return
                else:  # Failed, or a shutdown
                    over = True
                    raise ended_early(msg)
        finally:
            if not over:  # the client went away (the consumer was cancelled)
                self.engine.cancel(self.job)

    def _stamped(self, timings: dict) -> dict:
        """The server's environment id on every response's statistics, so that a client that
        keeps them can tell which build, machine and model files produced them."""
        prov = self.engine.provenance
        return {**timings, "env_id": prov.get("env_id") if prov else None}

    async def _stats_after_stop(self, timeout: float = 30.0):
        """Decoding's statistics of a request cut by a stop string: the engine answers the
        "stop" cancel with a Finished (or had already finished it); tokens decoded past the
        cut are dropped on the way. None if that never comes (the server is shutting down)."""
        async def wait():
            while True:
                msg = await self.queue.get()
                if isinstance(msg, Finished):
                    return msg.stats
                if not isinstance(msg, TokenEvent):
                    return None
        try:
            return await asyncio.wait_for(wait(), timeout)
        except asyncio.TimeoutError:
            return None

    async def collect(self) -> dict:
        text = "".join([p async for p, _ in self.pieces()])
        reason, usage_, timings = self.end
        return completion(self.req.kind, self.id, self.created, self.model, text, reason, usage_, timings)

    async def events(self) -> AsyncIterator[str]:
        kind, args = self.req.kind, (self.req.kind, self.id, self.created, self.model)
        if kind == "chat":
            yield json.dumps(chunk(*args, "", role=True))
        try:
            async for text, tokens in self.pieces():
                yield json.dumps(chunk(*args, text, tokens=tokens), ensure_ascii=False)
        except ApiError as e:
            yield json.dumps(e.body())
            yield "[DONE]"
            return
        reason, usage_, timings = self.end
        yield json.dumps(chunk(*args, None if kind == "chat" else "", finish=reason, timings=timings,
                               tokens=self.last_tokens), ensure_ascii=False)
        if self.req.include_usage:
            yield json.dumps(usage_chunk(kind, self.id, self.created, self.model, usage_, timings))
        yield "[DONE]"


def allowed_origin(origin: str, host: str, allowed: tuple[str, ...]) -> bool:
    """Whether a browser page at ``origin`` may use the API of the server reached as ``host``
    (the Host header): its own page, this machine's pages, and --cors-origin's."""
    return (urlsplit(origin).netloc == host or re.fullmatch(LOOPBACK_ORIGINS, origin) is not None
            or "*" in allowed or origin in allowed)


def create_app(engine: Engine, conf: ServeConfig) -> Starlette:
    def check_key(request: HttpRequest) -> None:
        # CORS only hides the answer from another site's page: a plain form-like POST from it
        # would still run a generation on this machine (Ollama refuses those as well)
        origin = request.headers.get("origin")
        if origin is not None and not allowed_origin(origin, request.headers.get("host", ""), conf.cors_origins):
            raise ApiError(403, f"a web page at {origin} may not use this server; start it with --cors-origin "
                           f"{origin} to allow it", type="permission_error", code="origin_not_allowed")
        if conf.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), conf.api_key.encode())
        if not ok:
            raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)",
                           type="authentication_error", code="invalid_api_key")

    def check_ready() -> None:
        if engine.crashed is not None:
            raise ApiError(503, f"the decoding engine stopped: {engine.crashed}", type="server_error")
        if engine.load_error is not None:
            raise ApiError(503, f"the models failed to load: {engine.load_error}", type="server_error")
        if engine.stopping:
            raise shutting_down()
        if not engine.ready:
            raise ApiError(503, "the models are still loading", type="server_error", code="loading",
                           headers={"Retry-After": str(RETRY_AFTER_S)})

    async def health(request: HttpRequest) -> Response:
        problem = engine.crashed or engine.load_error
        if problem is not None:
            return JSONResponse({"status": "error", "message": str(problem)}, status_code=503)
        if engine.stopping:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        if not engine.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def models(request: HttpRequest) -> Response:
        try:
            check_key(request)
        except ApiError as e:
            return error_response(e)
        entry = {"id": conf.model_name, "object": "model", "created": 0, "owned_by": "easd-local"}
        if engine.provenance is not None:  # what produces this server's results (as bench rows record it)
            entry["meta"] = {"provenance": engine.provenance}
        return JSONResponse({"object": "list", "data": [entry]})

    async def props(request: HttpRequest) -> Response:
        try:
            check_key(request)
            check_ready()
        except ApiError as e:
            return error_response(e)
        return JSONResponse(webui.props(conf.model_name, conf.base, conf.thresholds_source, engine.pair, conf.webui,
                                        draft_loadable=engine.draft_loadable, losses=conf.easd_losses))

    async def metrics(request: HttpRequest) -> Response:
        try:
            check_key(request)
        except ApiError as e:
            return error_response(e)
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE)

    def tokens_for(req: ApiRequest) -> list[int]:
        pair = engine.pair
        main = pair.target if pair.target is not None else pair.draft
        if req.kind == "chat":
            return main.vocab.chat_tokens(list(req.messages))
        return main.vocab.tokenize(req.prompt, add_special=True, parse_special=False)

    async def complete(request: HttpRequest, kind: str) -> Response:
        try:
            check_key(request)
            check_ready()
            req = parse_request(kind, await read_json(request, conf.max_body, conf.body_timeout))
            if req.model is not None and req.model != conf.model_name:
                raise ApiError(400, f"unknown model {req.model!r}: this server serves {conf.model_name!r}",
                               param="model", code="model_not_found")
            cfg, source = request_config(conf.base, conf.thresholds_source, req.overrides, engine.pair.n_vocab)
            if "max_tokens" not in req.overrides and cfg.max_tokens > engine.slot_context:
                # the server's default, not the client's: capped at a slot's context (the answer
                # ends with "length" there, as llama-server's does) rather than refusing every
                # request that gives no max_tokens to a server started with a small --ctx
                cfg = cfg.replace(max_tokens=engine.slot_context)
            if "seed" not in req.overrides and not cfg.greedy:
                cfg = cfg.replace(seed=secrets.randbits(31))  # no seed given: a fresh sample each request
            try:
                prompt = await asyncio.to_thread(tokens_for, req)
            except EasdError as e:
                raise bad(str(e), "messages" if kind == "chat" else "prompt") from None
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()

            def deliver(msg) -> None:  # engine thread -> this request's queue
                try:
                    loop.call_soon_threadsafe(queue.put_nowait, msg)
                except RuntimeError:  # the event loop is closed: the server is going down
                    pass

            try:
                job = engine.submit(Request(prompt=prompt, cfg=cfg, thresholds_source=source,
                                            reuse_cache=req.cache_prompt), deliver)
            except QueueFull:
                raise ApiError(503, "the server is busy: every slot and queue place is taken; retry shortly",
                               type="server_error", code="queue_full",
                               headers={"Retry-After": str(RETRY_AFTER_S)}) from None
            except NotReady:
                check_ready()
                raise
        except ApiError as e:
            return error_response(e)
        except ClientGone:
            return Response(status_code=499)

        try:
            first = await until_disconnect(request, queue.get())
        except ClientGone:
            engine.cancel(job)
            return Response(status_code=499)
        if isinstance(first, Rejected):
            if isinstance(first.error, ContextOverflowError):
                return error_response(bad(str(first.error), "messages" if kind == "chat" else "prompt",
                                          code="context_length_exceeded"))
            why = str(first.error)
            return error_response(bad(why, param_of(why, req.overrides), code="invalid_value"))
        if not isinstance(first, Admitted):
            return error_response(ended_early(first))
        run = Completion(engine, job, queue, req, cfg, source, len(prompt), first.queue_s, conf.model_name)
        if req.stream:
            # at a shutdown signal sse-starlette would cancel the stream at once, cutting it
            # short; the grace lets the engine's stop end it with an error event and [DONE]
            return EventSourceResponse(run.events(), sep="\n", shutdown_grace_period=SHUTDOWN_GRACE_S)
        try:
            return JSONResponse(await until_disconnect(request, run.collect()))
        except ClientGone:
            return Response(status_code=499)
        except ApiError as e:
            return error_response(e)

    async def chat_completions(request: HttpRequest) -> Response:
        return await complete(request, "chat")

    async def completions(request: HttpRequest) -> Response:
        return await complete(request, "completion")

    async def http_error(request: HttpRequest, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(ApiError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}",
                                       type=kind, headers=getattr(exc, "headers", None)))

    async def server_error(request: HttpRequest, exc: Exception) -> Response:
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}", type="server_error"))

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/props", props, methods=["GET"]),
    ]
    if conf.webui:
        routes += webui.page_routes()
    # a browser page from another origin (a hosted chat UI) gets the CORS headers it needs,
    # its preflight (OPTIONS) answered before any key is asked for, as llama-server does
    cors = Middleware(CORSMiddleware, allow_origins=list(conf.cors_origins), allow_origin_regex=LOOPBACK_ORIGINS,
                      allow_methods=["GET", "POST"], allow_headers=["*"], allow_private_network=True, max_age=600)
    return Starlette(routes=routes, middleware=[cors],
                     exception_handlers={HTTPException: http_error, Exception: server_error})
