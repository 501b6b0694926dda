"""`easd-local chat`: an interactive multi-turn chat, streamed, with slash commands.

Only parsing, the input loop and rendering live here; the session itself (history,
context trimming, turns) is ``easd_local.chat.ChatSession``, its slash commands are the
table in ``easd_local.chat.commands`` and its transcript is ``easd_local.chat.transcript``.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.text import Text

from .. import host
from ..chat import CHAT_DEFAULTS, ChatSession, Notice, Reply, TranscriptWriter
from ..chat.commands import synopsis
from ..engine.config import DecodeConfig, not_lossless
from ..errors import EasdError
from ..text import check_text
from ..engine.pair import open_models
from . import options as o
from .common import console, err_console, friendly
from .progress import spinner, until_first
from .render import (LEGEND, ORIGIN_STYLE, OutputError, placement_line, repack_news, repack_note, status_line,
                     stdout_guard)


# the keys that _Input and _loop give a meaning to; /help ends with them
KEYS = "Ctrl-C stops a reply; Ctrl-C or Ctrl-D at the prompt leaves; end a line with \\ to continue it."


class _Input:
    """Reads one message: ``input('>>> ')`` on a terminal, plain lines from a pipe.
    A line ending in a backslash continues on the next line. EOF -> None."""

    def __init__(self) -> None:
        self.closed = sys.stdin is None  # started with stdin closed (``<&-``): as at EOF
        self.tty = not self.closed and sys.stdin.isatty()
        # bytes that are not UTF-8 reach the session as surrogates, which it refuses with a
        # message, instead of a UnicodeDecodeError ending the chat
        if hasattr(sys.stdin, "reconfigure"):
            sys.stdin.reconfigure(errors="surrogateescape")
        if self.tty:
            try:
                import readline  # noqa: F401  (line editing and history for input())
            except ImportError:  # pragma: no cover - not on every platform
                pass

    def _line(self, prompt: str) -> str | None:
        if self.closed:
            return None
        if self.tty:
            try:
                return input(prompt)
            except EOFError:
                return None
        line = sys.stdin.readline()
        if not line:
            return None
        return line.rstrip("\r\n")

    def read(self) -> str | None:
        lines: list[str] = []
        prompt = ">>> "
        while True:
            line = self._line(prompt)
            if line is None:
                # EOF in the middle of a continued message still sends what was typed
                return "\n".join(lines) if lines else None
            if line.endswith("\\"):
                lines.append(line[:-1])
                prompt = "... "
                continue
            lines.append(line)
            return "\n".join(lines)


class _Writer:
    """Streams reply text: coloured by origin through rich on a terminal with
    --show-origin, plain writes otherwise (and always when stdout is piped)."""

    def __init__(self, show_origin: bool) -> None:
        self.tty = sys.stdout is not None and sys.stdout.isatty()
        self.colour = show_origin and self.tty and console.is_terminal
        self.at_line_start = True

    def token(self, text: str, origin: str) -> None:
        if not text:
            return
        with stdout_guard():
            if self.colour:
                console.print(Text(text, style=ORIGIN_STYLE.get(origin, "")), end="", soft_wrap=True)
            else:
                sys.stdout.write(text)
                sys.stdout.flush()
        self.at_line_start = text.endswith("\n")

    def end_reply(self) -> None:
        with stdout_guard():
            if not self.at_line_start:
                sys.stdout.write("\n")
            sys.stdout.flush()
        self.at_line_start = True


def _note(text: str, style: str = "dim") -> None:
    # on a terminal, wrapped at word boundaries (a soft wrap lets the terminal cut words);
    # pipes and logs get whole lines
    err_console.print(Text(text, style=style), soft_wrap=not err_console.is_terminal)


def _run_turn(session: ChatSession, text: str, writer: _Writer, load_before: float | None = None) -> None:
    try:
        stream = session.send(text)
    except EasdError as e:
        _note(str(e), "yellow")
        return
    reply: Reply | None = None
    try:
        for ev in until_first(stream, "evaluating the prompt"):
            if isinstance(ev, Notice):
                _note(ev.text, "yellow")
            elif isinstance(ev, Reply):
                reply = ev
            else:
                writer.token(ev.text, ev.origin)
    except KeyboardInterrupt:
        # Ctrl-C landed while we were rendering: the session keeps the partial reply
        reply = session.interrupt()
        stream.close()
    except OutputError:
        # nowhere to show this reply or any later one: keep what was made, end the chat
        session.interrupt()
        stream.close()
        raise
    except EasdError as e:
        writer.end_reply()
        _note(f"error: {e}", "red")
        return
    if reply is not None and reply.tail:
        writer.token(reply.tail, "")
    writer.end_reply()
    if reply is None:
        return
    if reply.interrupted:
        _note(f"[interrupted after {reply.n_tokens} tokens; the partial reply is kept in the history]", "yellow")
    elif reply.stats is not None:
        busy = host.busy_note((load_before, False), (host.load(), True))
        _note(status_line(reply.stats, busy=busy))


def _notices(session: ChatSession) -> None:
    for n in session.take_notices():
        _note(n.text, "yellow")


def _loop(session: ChatSession, show_origin: bool, load_before: float | None = None) -> None:
    """``load_before``: the load before the models loaded; it counts for the first reply only
    (later, the average still carries our own last reply)."""
    reader = _Input()
    writer = _Writer(show_origin)
    while True:
        _notices(session)
        try:
            text = reader.read()
        except KeyboardInterrupt:
            if reader.tty:
                sys.stdout.write("\n")
            return
        if text is None:
            if reader.tty:
                sys.stdout.write("\n")
            return
        if not text.strip():
            continue
        if text.lstrip().startswith("/"):
            try:
                res = session.command(text.strip())
            except KeyboardInterrupt:
                # e.g. while /mode loads the draft model: the command is dropped, not the chat
                _note("[stopped; the command changed nothing]", "yellow")
                continue
            if res.quit:
                return
            if res.message:
                _note(res.message, "dim" if res.ok else "yellow")
            if res.kind == "help":
                _note(KEYS, "dim")
            continue
        try:
            _run_turn(session, text, writer, load_before)
            load_before = None
        except KeyboardInterrupt:
            # a Ctrl-C outside the token loop (e.g. while printing the status line)
            session.interrupt()
            writer.end_reply()


CHAT = o.DecodeOpts(CHAT_DEFAULTS, mode_default=o.AUTO_MODE_RULE)


def _sampling(cfg: DecodeConfig) -> str:
    return f"temperature {cfg.temperature:g}, top-k {cfg.top_k}, top-p {cfg.top_p:g}"


def _load_draft(models, spec, load):
    """The draft model, loaded into ``models`` (which closes it) when a mode first needs it."""
    if models.draft is None:
        with spinner(f"loading the draft model {spec.draft.name}"):
            models.draft = load()
    return models.draft


def banner(label: str, mode: str, why: str, n_ctx: int, asked_ctx: int | None = None,
           evidence: str | None = None) -> list[tuple[str, str]]:
    """The two lines chat starts with, and their styles: what runs, and where the rest is
    (``asked_ctx``: --ctx, when llama.cpp may have rounded it; ``evidence``: what a recorded
    comparison on this pair found against the EASD mode that runs, ``options.easd_loss``)."""
    head = (f"easd-local chat · {label} · mode {mode}{' (auto)' if why else ''} · "
            f"context {n_ctx} tokens{o.ctx_note(asked_ctx, n_ctx)}", "dim")
    keys = "/about, /help, Ctrl-D to leave"
    if not_lossless(mode):
        found = f" ({evidence})" if evidence else ""
        return [head, (f"note: not lossless{found}; /mode sd gives the target's own output · {keys}", "yellow")]
    return [head, ("/about for the mode, sampling and layers · /help for commands · Ctrl-D to leave", "dim")]


def details(label: str, mode: str, why: str, n_ctx: int, cfg, placement: str,
            asked_ctx: int | None = None) -> list[tuple[str, str]]:
    """What /about and --verbose show: the mode and why, sampling, where the layers are."""
    lines = [(f"easd-local chat · {label} · mode {mode}{f' (auto: {why})' if why else ''} · "
              f"context {n_ctx} tokens{o.ctx_note(asked_ctx, n_ctx)}", "dim")]
    sampling = "greedy" if cfg.greedy else f"sampling: {_sampling(cfg)}"
    lines.append((f"{sampling}, up to {cfg.max_tokens} tokens a reply · {placement}", "dim"))
    reason = not_lossless(mode)
    if reason:
        lines.append((f"note: {reason}. For the target's own output: /mode sd here, or --mode sd.", "yellow"))
    return lines


# the commands and keys come from where they are defined, so --help cannot fall behind them
HELP = f"""Chat with a draft/target pair, streamed, with slash commands.

Default mode ({o.AUTO_MODE_RULE}): the same rule as generate and serve.

easd and easd-tf are not lossless: the gate replaces some of the target's tokens. For the target's own output use --mode sd (or /mode sd in the chat).

Chat samples ({_sampling(CHAT_DEFAULTS)}, up to {CHAT_DEFAULTS.max_tokens} tokens a reply) as chat UIs do; generate is greedy (temperature {DecodeConfig().temperature:g}, {DecodeConfig().max_tokens} tokens) so that its runs repeat exactly. --temp 0 makes chat greedy.

Each turn re-renders the history with the target's chat template; only the new tokens are evaluated. Commands: {synopsis()}. {KEYS} Every session is logged as JSONL in the transcripts folder (the path is printed when you leave).
"""


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    @app.command("chat", help=HELP)
    @friendly
    @o.with_options(before=(o.MODEL_OPTIONS, o.decode_group(CHAT)), after=(o.LLAMA_OPTIONS,))
    def chat(
        system: Annotated[Optional[str], typer.Option("--system", metavar="TEXT", help=o.with_default("System message.", "none"))] = None,
        show_origin: Annotated[bool, typer.Option("--show-origin", help="Colour each token by where it came from.")] = False,
        **kw,
    ) -> None:
        flags = o.decode_flags(kw)
        o.decode_config(CHAT_DEFAULTS, **flags)  # every value is checked before any model loads
        if system is not None:  # else every message would be refused, each naming "the text"
            check_text(system, "the system prompt")
        topts, dopts = o.llama_options(kw)
        load_before = host.load()  # before our own threads add to it
        spec, cfg, source, why = o.pair_and_config(kw, flags, CHAT_DEFAULTS)
        # the draft model only when the chosen way uses it (/mode easd then asks for a restart)
        with spinner(f"loading {spec.label}"):
            models = open_models(o.load_draft(spec, cfg), spec.target, topts, dopts)
        with models:
            transcript = TranscriptWriter.new()
            loader = o.draft_loader(spec, dopts)
            session = ChatSession(
                models.target, models.draft, cfg, n_vocab=models.n_vocab, system=system,
                thresholds_source=source, transcript=transcript, label=spec.label,
                verify_costs=o.verify_costs(spec, kw),
                load_draft=(lambda: _load_draft(models, spec, loader)) if loader is not None else None,
            )
            where = placement_line(models)  # all of it, the repacking note too: for /about and --verbose

            def about() -> str:
                # the mode and settings now, after any /mode or /set
                return "\n".join(line for line, _ in details(spec.label, o.mode_label(session.cfg), why, session.n_ctx,
                                                               session.cfg, where, kw["ctx"]))

            session.about = about
            session.easd_loss = lambda mode: o.easd_loss(spec, mode)
            try:
                for line, style in banner(spec.label, o.mode_label(cfg), why, session.n_ctx, asked_ctx=kw["ctx"],
                                          evidence=o.easd_loss(spec, cfg.mode)):
                    _note(line, style)
                if kw["verbose"]:
                    _note(about())
                elif repack_news(models):
                    _note(repack_note(models) + " (shown once; easd-local doctor repeats it)", "yellow")
                if show_origin and sys.stdout.isatty():
                    err_console.print(LEGEND)
                _loop(session, show_origin, load_before)
            finally:
                session.close()
                _note(f"transcript: {transcript.where()}")
