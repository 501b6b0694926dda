"""`easd-local serve`: the OpenAI-compatible HTTP server (uvicorn over easd_local.server)."""

from __future__ import annotations

import asyncio
import ipaddress
import math
import re
import socket
from dataclasses import replace
from typing import Annotated, Optional

import typer

from ..store import provenance
from ..engine.config import MODES, DecodeConfig
from ..engine.prompt_store import DEFAULT_CACHE_RAM_MIB
from ..errors import ConfigError, EasdError
from ..server.protocol import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY
from ..engine.pair import open_models
from . import options as o
from .common import err_console, friendly
from .render import placement_line, repack_news


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def listen_socket(host: str, port: int) -> socket.socket:
    """Bind before the models load, so that a taken port is one clear error at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)  # connections wait in the backlog until uvicorn accepts them
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    @app.command("serve")
    @friendly
    @o.with_options(before=(o.MODEL_OPTIONS, o.DECODE_OPTIONS), after=(o.LLAMA_OPTIONS,))
    def serve(
        host: Annotated[str, typer.Option("--host", help="Address to bind (default: loopback only).")] = "127.0.0.1",
        port: Annotated[int, typer.Option("--port", help="Port (0 = any free port, printed at start).")] = 8080,
        parallel: Annotated[int, typer.Option("--parallel", help="Requests decoded together in one batch per step "
                                                                 "(slots; KV cache: N x --ctx).")] = 4,
        queue: Annotated[int, typer.Option("--queue", help="Requests that may wait for a slot; past it: 503.")] = 64,
        api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="EASD_LOCAL_API_KEY",
                           help="Require 'Authorization: Bearer KEY' (all endpoints but /health). \\[default: none: no key]")] = None,
        max_body: Annotated[int, typer.Option("--max-body", help="Largest request body in bytes (413 past it).")] = DEFAULT_MAX_BODY,
        timeout: Annotated[float, typer.Option("--timeout", "-to", help="Seconds a request (its headers or its "
                           "body) may go without a byte arriving before it is answered 408 and its connection "
                           "closed (llama-server's --timeout).")
                           ] = DEFAULT_BODY_TIMEOUT_S,
        cors_origin: Annotated[Optional[list[str]], typer.Option("--cors-origin", metavar="ORIGIN",
                               help="A browser origin (https://chat.example.org) whose pages may call the API, "
                                    "besides this machine's own (http://localhost:PORT...); repeatable; '*': any, "
                                    "as llama-server. \\[default: none: this machine's pages only]")] = None,
        log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level (info shows each request).")] = "info",
        webui: Annotated[bool, typer.Option("--webui/--no-webui", help="Serve the chat page at / (tokens coloured "
                                                                      "by origin).")] = True,
        cache_prompt: Annotated[bool, typer.Option("--cache-prompt/--no-cache-prompt",
                                help="Reuse a slot's cached prompt prefix (KV cells) for the next request that "
                                     "starts with it; a request may opt out with \"cache_prompt\": false.")] = True,
        slot_similarity: Annotated[float, typer.Option("--slot-prompt-similarity", help="Send a request to the idle "
                                   "slot sharing the longest prefix with it when that prefix is more than this share "
                                   "of the prompt (0: always the least recently used slot).")] = 0.1,
        cache_ram: Annotated[int, typer.Option("--cache-ram", "-cram", metavar="MiB", help="Host memory for "
                             "prompts whose slot another request takes: saved before their cells are discarded, "
                             "loaded back when their conversation returns (llama-server's --cache-ram; 0: off).")
                             ] = DEFAULT_CACHE_RAM_MIB,
        **kw,
    ) -> None:
        """Serve the pair over an OpenAI-compatible API (/v1/chat/completions, /v1/completions,
        /v1/models, /health, /metrics, /props) and a chat page in the browser at / (--no-webui: off).

        The decoding flags set the defaults; a request may override them with its own fields
        (temperature, top_p, seed, max_tokens, and mode, gamma, tau_draft, tau_target, top_n,
        overlap, penalty, top_k). Every response carries the request's decoding statistics in
        "timings". EASD (modes easd, easd-tf with the gate on) is not lossless.
        """
        flags = o.decode_flags(kw)
        o.decode_config(DecodeConfig(), **flags)  # every value is checked before any model loads
        topts, dopts = o.llama_options(kw)
        if not 1 <= parallel <= 256:  # 256: llama.cpp's LLAMA_MAX_SEQ
            raise ConfigError(f"--parallel must be between 1 and 256, got {parallel}")
        # contexts that hold one sequence per slot, each with --ctx tokens of its own
        topts, dopts = replace(topts, n_seq=parallel), replace(dopts, n_seq=parallel)
        if queue < 0:
            raise ConfigError(f"--queue must be >= 0, got {queue}")
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port must be in 0..65535, got {port}")
        if max_body < 1024:
            raise ConfigError(f"--max-body must be >= 1024 bytes, got {max_body}")
        if not 0 < timeout < math.inf:
            raise ConfigError(f"--timeout must be a number of seconds > 0, got {timeout:g}")
        if cache_ram < 0:
            raise ConfigError(f"--cache-ram must be >= 0 (MiB; 0: off), got {cache_ram}")
        if not 0.0 <= slot_similarity <= 1.0:
            raise ConfigError(f"--slot-prompt-similarity must be between 0 and 1, got {slot_similarity}")
        for origin in cors_origin or ():
            # a browser sends scheme://host[:port] and nothing more: a path or a bare host never matches
            if origin != "*" and not re.fullmatch(r"[a-z][a-z0-9+.-]*://[^/\s]+", origin):
                raise ConfigError(f"--cors-origin must be '*' or an origin such as https://chat.example.org "
                                  f"(scheme, host, port; no path), got {origin!r}")
        if api_key is not None and not api_key.strip():
            raise ConfigError("--api-key (or EASD_LOCAL_API_KEY) is empty")
        log_level = log_level.lower()
        if log_level not in ("critical", "error", "warning", "info", "debug"):
            raise ConfigError(f"--log-level must be critical, error, warning, info or debug, got {log_level!r}")
        spec, cfg, source, why = o.pair_and_config(kw, flags, DecodeConfig())
        sock = listen_socket(host, port)
        _run(sock, spec, cfg, source, why, topts, dopts, parallel, queue, api_key, max_body, log_level, host, webui,
             cache_prompt=cache_prompt, slot_similarity=slot_similarity, cache_ram=cache_ram,
             verify_costs=o.verify_costs(spec, kw), body_timeout=timeout, cors_origins=tuple(cors_origin or ()))


def _stopping_engine_first(server_class, engine):
    """uvicorn's Server, its shutdown stopping the engine first: the engine then answers every
    request it holds (ShuttingDown), so each client gets an error while its connection is
    still open, rather than waiting out the graceful timeout to be cut off with a traceback."""
    class Server(server_class):
        async def shutdown(self, sockets=None) -> None:
            await asyncio.to_thread(engine.stop)
            await super().shutdown(sockets)

    return Server


def _run(sock, spec, cfg, source, why, topts, dopts, parallel, queue, api_key, max_body, log_level, host,
         webui=True, cache_prompt=True, slot_similarity=0.1, cache_ram=0, verify_costs=None, *,
         body_timeout: float, cors_origins: tuple[str, ...] = ()) -> None:
    import uvicorn

    from ..server.app import ServeConfig, create_app
    from ..server.connection import protocol_class
    from ..server.engine import Engine

    server_box: list = []

    def on_load_failed(_e: BaseException) -> None:
        if server_box:
            server_box[0].should_exit = True

    def on_loaded(pair) -> dict:
        # the banner's placement line, and the provenance that /v1/models and every response's
        # env_id carry (model hashes come from the hash cache: only unknown files are read)
        err_console.print(placement_line(pair, repack=repack_news(pair, topts.verbose)), style="dim", soft_wrap=True)
        return provenance.collect(spec.draft, spec.target, topts, dopts, parallel=parallel).to_dict()

    def load():
        pair = open_models(o.load_draft(spec, cfg), spec.target, topts, dopts)
        pair.verify_costs = verify_costs
        return pair

    engine = Engine(load, parallel, queue, load_draft=o.draft_loader(spec, dopts),
                    on_load_failed=on_load_failed, on_loaded=on_loaded, cache_prompt=cache_prompt,
                    slot_similarity=slot_similarity, cache_ram=cache_ram << 20)
    losses = {m: lost for m in MODES if (lost := o.easd_loss(spec, m))}
    app = create_app(engine, ServeConfig(model_name=spec.label, base=cfg, thresholds_source=source,
                                         api_key=api_key, max_body=max_body, webui=webui, easd_losses=losses,
                                         body_timeout=body_timeout, cors_origins=cors_origins))
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5, lifespan="off",
                            http=protocol_class(body_timeout))
    server = _stopping_engine_first(uvicorn.Server, engine)(config)
    server_box.append(server)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    err_console.print(f"easd-local serve · {spec.label} · mode {o.mode_label(cfg)}{f' (auto: {why})' if why else ''} · "
                      f"--parallel {parallel} · prompt cache "
                      f"{(f'on (+ {cache_ram} MiB host memory)' if cache_ram else 'on') if cache_prompt else 'off'} · "
                      f"thresholds: {source}")
    if cfg.gate_enabled:
        lost = losses.get(cfg.mode)
        err_console.print("note: EASD is not lossless: its gate lets the target re-pick tokens SD would keep"
                          + (f"; {lost}" if lost else ""), soft_wrap=True)
    if not is_loopback(host) and api_key is None:
        err_console.print(f"[bold yellow]warning:[/] listening on {host} without --api-key: anyone who can reach "
                          "this address can use the models", markup=True)
    err_console.print(f"listening on http://{shown}:{bound_port}/v1 (models loading; /health says when ready)",
                      soft_wrap=True)
    if webui:
        err_console.print(f"chat page: http://{shown}:{bound_port}/", soft_wrap=True)
    engine.start()
    try:
        server.run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
    if engine.load_error is not None:
        e = engine.load_error
        if isinstance(e, EasdError):
            raise e
        raise EasdError(f"the models failed to load: {type(e).__name__}: {e}")
