"""The chat session: history, context trimming and turns.

No printing and no typer here: ``cli/chat.py`` reads lines, calls ``ChatSession.send`` or
``ChatSession.command`` and renders what comes back, so everything below can be tested
without a terminal. The slash commands are a table in ``commands``; what a chat leaves on
disk (the JSONL transcript, ``/save``) is written by ``transcript``.

Each turn renders the whole history with the target's GGUF chat template and calls
``decoding.generate``; ``generate`` reuses both models' KV caches by longest common prefix,
so only the new user message (and the template's glue) is evaluated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Union

from ..engine.config import RANDOM_SEED, DecodeConfig, apply_settings
from ..engine.decoding import Finished, Stats, Stopper, TokenEvent, generate
from ..engine.pair import Pair
from ..llamacpp.runtime import Model
from ..text import check_text
from ..errors import ConfigError, ContextOverflowError, EasdError
from ..jsonsafe import jsonable
from . import commands
from .commands import CommandResult
from .transcript import Conversation, TranscriptWriter, save_conversation

# Chat's own sampling defaults (generate's are greedy with 512 tokens).
CHAT_DEFAULTS = DecodeConfig(temperature=0.7, top_k=40, top_p=0.95, max_tokens=1024)


# --------------------------------------------------------------------------- data
@dataclass
class Message:
    role: str  # "user" | "assistant"
    content: str
    interrupted: bool = False  # assistant reply cut short by Ctrl-C
    in_context: bool = True  # False once trimmed out of the context window (still saved)

    def to_dict(self) -> dict:
        d = {"role": self.role, "content": self.content}
        if self.interrupted:
            d["interrupted"] = True
        if not self.in_context:
            d["in_context"] = False
        return d


@dataclass(frozen=True)
class Notice:
    """Something the user should be told before the reply (e.g. history was trimmed)."""

    text: str


@dataclass(frozen=True)
class Reply:
    """The end of one turn: the assistant's text and, unless interrupted, its statistics."""

    text: str
    stats: Stats | None
    interrupted: bool = False
    tail: str = ""  # text completed only at the end of generation (stream it last)
    n_tokens: int = 0


ChatEvent = Union[Notice, TokenEvent, Reply]


@dataclass
class SessionTotals:
    """The session's statistics: the sum of every turn's ``Stats``, interrupted ones
    included (their drafts, gate fires and times count like any other's)."""

    turns: int = 0
    interrupted: int = 0
    stats: Stats = field(default_factory=Stats)

    def add(self, s: Stats, interrupted: bool = False) -> None:
        if interrupted:
            self.interrupted += 1
        else:
            self.turns += 1
        self.stats = self.stats + s

    def summary(self) -> dict:
        s = self.stats
        return {
            "turns": self.turns + self.interrupted,  # every reply, finished or cut short
            "interrupted": self.interrupted,
            "tokens": s.tokens,
            "tokens_per_s": s.tokens_per_s,
            "acceptance_rate": s.acceptance_rate,
            "mean_accepted_len": s.mean_accepted_len,
            "drafted": s.drafted,
            "draft_accepted": s.draft_accepted,
            "lookup_accepted": s.lookup_accepted,
            "draft_consult_rate": s.draft_consult_rate,
            "easd_fires": s.easd_fires,
            "easd_fires_per_100": s.easd_fires_per_100,
            "seconds_generating": s.seconds_generating,
            "seconds_prompt": s.seconds_prompt,
        }


def check_mode(cfg: DecodeConfig, target: Model | None, draft: Model | None) -> None:
    """ConfigError when the chat lacks a model that ``cfg``'s mode (with its drafters) needs."""
    mode, info = cfg.mode, cfg.mode_info
    if cfg.needs_draft_model and draft is None:
        uses = "" if info.needs_draft else f" with --spec-type {cfg.spec_type}"
        raise ConfigError(f"mode {mode}{uses} needs a draft model, and this chat was started without one")
    if info.needs_target and target is None:
        raise ConfigError(f"mode {mode} needs a target model, and this chat was started without one")


def load_draft_if_needed(s: "ChatSession", cfg: DecodeConfig) -> None:
    """Load the draft model if ``cfg`` needs it and the chat can (its ``load_draft``, which also
    closes it): a chat starts without it when its default way does not use it."""
    if cfg.needs_draft_model and s.draft is None and s._load_draft is not None:
        s.draft = s.pair.draft = s._load_draft()
        s.n_vocab = s.pair.n_vocab = min(s.n_vocab, s.draft.n_vocab)
        s._log("draft_loaded", draft=str(s.draft.path))
    check_mode(cfg, s.target, s.draft)


def drop_oldest(messages: list[Message], too_long) -> int:
    """Take the oldest user/assistant turns out of the context (never the system prompt,
    never the last message) while ``too_long()``; how many messages were taken out."""
    dropped = 0
    while too_long():
        live = [m for m in messages if m.in_context]
        if len(live) <= 1:
            break
        live[0].in_context = False
        dropped += 1
        # keep whole turns: never leave an assistant reply at the start of the context
        rest = live[1:]
        if len(rest) > 1 and rest[0].role == "assistant":
            rest[0].in_context = False
            dropped += 1
    return dropped


# --------------------------------------------------------------------------- session
class ChatSession:
    """A multi-turn conversation over a loaded draft/target pair.

    ``send(text)`` checks the context (refusing a message that cannot fit, trimming the
    oldest turns otherwise), appends the user message and returns an iterator of
    ``Notice`` / ``TokenEvent`` / one final ``Reply``. ``command(line)`` runs a slash
    command and returns a ``CommandResult``. Nothing here prints.
    """

    def __init__(
        self,
        target: Model | None,
        draft: Model | None,
        cfg: DecodeConfig,
        *,
        n_vocab: int | None = None,
        system: str | None = None,
        thresholds_source: str = "default",
        transcript: TranscriptWriter | None = None,
        label: str = "",
        verify_costs=None,
        load_draft: Callable[[], Model] | None = None,
    ):
        if target is None and draft is None:
            raise ValueError("a chat needs at least one model")
        self.target = target
        self.draft = draft
        self.n_vocab = n_vocab or min(m.n_vocab for m in (target, draft) if m is not None)
        self._load_draft = load_draft  # see load_draft_if_needed
        check_mode(cfg, self.target, self.draft)
        self.cfg = cfg.validate(self.n_vocab)
        # one pair for the whole chat: its drafters (a learning lookup) keep what they saw
        self.pair = Pair(draft=draft, target=target, n_vocab=self.n_vocab, verify_costs=verify_costs)
        self.system = system or None
        self.thresholds_source = thresholds_source
        self.transcript = transcript
        self.label = label
        self.about: Callable[[], str] | None = None  # set by the front end for /about
        self.easd_loss: Callable[[str], str | None] | None = None  # and for /mode (``options.easd_loss``)
        self.messages: list[Message] = []
        self.totals = SessionTotals()
        self._pending: dict | None = None  # the reply being generated
        self._template_model = target if target is not None else draft
        broken = self._template_model.vocab.chat_template_error()
        if broken is not None:  # before the first message, not at it
            raise ConfigError(f"{broken}; chat needs one (use `generate --raw` for plain completion)")
        self._log("session_start", pair=label, target=str(target.path) if target is not None else None,
                  draft=str(draft.path) if draft is not None else None, n_ctx=self.n_ctx, system=self.system,
                  thresholds_source=thresholds_source, settings=self.settings())

    # ------------------------------------------------------------------ basics
    def _log(self, event: str, **data) -> None:
        if self.transcript is not None:
            self.transcript.write(event, **data)

    def take_notices(self) -> list[Notice]:
        """Things to tell the user that happened outside a reply (the transcript stopped)."""
        warning = self.transcript.take_warning() if self.transcript is not None else None
        return [Notice(warning)] if warning else []

    @property
    def n_ctx(self) -> int:
        return min(m.n_ctx for m in (self.target, self.draft) if m is not None)

    @property
    def reserve(self) -> int:
        """Tokens kept free for the reply when deciding what history fits."""
        return max(1, min(self.cfg.max_tokens, self.n_ctx // 4))

    def context_messages(self) -> list[dict]:
        """The messages the next prompt is rendered from (system first)."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        out += [{"role": m.role, "content": m.content} for m in self.messages if m.in_context]
        return out

    def render(self, messages: list[dict] | None = None) -> list[int]:
        return self._template_model.vocab.chat_tokens(self.context_messages() if messages is None else messages)

    # ------------------------------------------------------------------ context
    def trim_history(self, reserve: int | None = None) -> int:
        """Drop the oldest turns from the context until the rendered history plus
        ``reserve`` fits in n_ctx (see ``drop_oldest``); how many messages were dropped."""
        reserve = self.reserve if reserve is None else reserve
        return drop_oldest(self.messages, lambda: len(self.render()) + reserve > self.n_ctx)

    # ------------------------------------------------------------------ a turn
    def send(self, text: str) -> Iterator[ChatEvent]:
        """Add a user message and generate the reply.

        Raises ContextOverflowError at once (history untouched) when the message, with the
        system prompt and room for a reply, cannot fit in the context at all."""
        if self._pending is not None:
            self.interrupt()
        check_text(text, "the message")
        alone = ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": text}
        ]
        n_alone = len(self.render(alone))
        if n_alone + self.reserve > self.n_ctx:
            self._log("refused", content=text, tokens=n_alone, n_ctx=self.n_ctx, reserve=self.reserve)
            room = self.n_ctx - self.reserve
            raise ContextOverflowError(
                f"message not sent: it needs {n_alone} tokens{' with the system prompt' if self.system else ''}, "
                f"but only {room} of the {self.n_ctx}-token context are left after keeping {self.reserve} for "
                "the reply; shorten it or raise --ctx"
            )
        self.messages.append(Message("user", text))
        self._log("user", content=text)
        dropped = self.trim_history()
        if dropped:
            self._log("trim", dropped=dropped, n_ctx=self.n_ctx)
        prompt = self.render()
        return self._stream(prompt, dropped)

    def _stream(self, prompt: list[int], dropped: int) -> Iterator[ChatEvent]:
        if dropped:
            yield Notice(
                f"dropped the {dropped} oldest message{'s' if dropped != 1 else ''} to fit the "
                f"{self.n_ctx}-token context (the system prompt is kept)"
            )
        # a different seed each turn: sampling is reproducible per session, not repeated per
        # turn (a random seed stays random)
        cfg = self.cfg
        if cfg.seed != RANDOM_SEED:
            cfg = cfg.replace(seed=cfg.seed + self.totals.turns + self.totals.interrupted)
        stopper = Stopper()
        self._pending = {"pieces": [], "n": 0, "mode": cfg.mode, "stopper": stopper}
        try:
            for ev in generate(self.target, self.draft, prompt, cfg, n_vocab=self.n_vocab, pair=self.pair,
                               thresholds_source=self.thresholds_source, stopper=stopper):
                if isinstance(ev, Finished):
                    yield self._finish(ev)
                    return
                self._pending["pieces"].append(ev.text)
                self._pending["n"] += 1
                yield ev
        except KeyboardInterrupt:
            reply = self.interrupt()
            if reply is not None:
                yield reply
            return
        except EasdError as e:
            # the turn failed (e.g. llama.cpp error): forget it and let the caller report
            self._pending = None
            if self.messages and self.messages[-1].role == "user":
                self.messages.pop()
            self._log("error", message=str(e))
            raise
        finally:
            # closed early (GeneratorExit) or an unexpected error: keep what was generated
            if self._pending is not None:
                self.interrupt()

    def _finish(self, fin: Finished) -> Reply:
        self._pending = None
        self.messages.append(Message("assistant", fin.text))
        self.totals.add(fin.stats)
        self._log("assistant", content=fin.text, interrupted=False, stats=fin.stats.to_dict())
        return Reply(fin.text, fin.stats, False, fin.tail, fin.stats.tokens)

    def interrupt(self) -> Reply | None:
        """Finish the reply in progress as interrupted: its partial text goes into the
        history flagged ``interrupted``. Returns None when no reply is in progress."""
        p = self._pending
        if p is None:
            return None
        self._pending = None
        text = "".join(p["pieces"])
        self.messages.append(Message("assistant", text, interrupted=True))
        fin = p["stopper"].stop()
        # the tokens and times of the work done (a step may have emitted more tokens than
        # were shown); a turn stopped before it started counts only as interrupted
        self.totals.add(fin.stats if fin is not None else Stats(), interrupted=True)
        self._log("assistant", content=text, interrupted=True, tokens=p["n"], mode=p["mode"])
        return Reply(text, None, True, "", p["n"])

    # ------------------------------------------------------------------ what the commands change
    def command(self, line: str) -> CommandResult:
        """Run one slash command (``line`` starts with '/'); see ``commands``."""
        return commands.run(self, line)

    def settings(self) -> dict:
        """The settings in force, JSON-safe (as the transcript, /stats and /save show them)."""
        return jsonable(dataclasses.asdict(self.cfg))

    def set_mode(self, mode: str, spec_type: str | None = None) -> None:
        cfg = self.cfg.replace(mode=mode, spec_type=spec_type or self.cfg.spec_type)
        load_draft_if_needed(self, cfg)
        self.cfg = cfg
        self._log("mode", mode=mode, spec_type=cfg.spec_type)

    def apply_setting(self, key: str, value: str) -> dict:
        """Set ``key`` (a DecodeConfig field, as typed: "tau-target") to ``value`` (text);
        returns the fields that changed. ConfigError, with nothing changed, for a bad key or
        value."""
        cfg = apply_settings(self.cfg, {key: value}).validate(self.n_vocab)
        if (cfg.mode, cfg.spec_type) != (self.cfg.mode, self.cfg.spec_type):
            load_draft_if_needed(self, cfg)
        changed = {k: v for k, v in dataclasses.asdict(cfg).items() if getattr(self.cfg, k) != v}
        self.cfg = cfg
        if {"tau_draft", "tau_target"} & changed.keys():
            self.thresholds_source = "/set"
        self._log("set", key=key, value=value, changes=changed, settings=self.settings())
        return changed

    def set_system(self, text: str) -> None:
        """Set the system prompt ("" clears it)."""
        self.system = check_text(text, "the system prompt") or None
        self._log("system", content=self.system)

    def stats(self) -> dict:
        """Cumulative session statistics, the settings in force and the context use."""
        n_ctx_used = len(self.render()) if self.context_messages() else 0
        return {
            **self.totals.summary(),
            "messages": len(self.messages),
            "messages_in_context": sum(m.in_context for m in self.messages),
            "context_tokens": n_ctx_used,
            "n_ctx": self.n_ctx,
            "thresholds_source": self.thresholds_source,
            "settings": self.settings(),
        }

    def reset(self) -> None:
        if self._pending is not None:
            self.interrupt()
        self.messages.clear()
        self._log("reset")

    def save(self, path: Path | str | None = None) -> Path:
        """Write the conversation as JSON, or Markdown for .md/.markdown (atomic; a new file
        in the transcripts folder when ``path`` is None). Raises OSError."""
        path = save_conversation(self.conversation(), path)
        self._log("save", path=str(path))
        return path

    def conversation(self) -> Conversation:
        """The conversation so far, as ``/save`` writes it."""
        return Conversation(self.label, *(str(m.path) if m is not None else None for m in (self.target, self.draft)),
                            self.cfg.mode, self.settings(), self.system, [m.to_dict() for m in self.messages],
                            self.totals.summary())

    def close(self) -> None:
        if self._pending is not None:
            self.interrupt()
        self._log("session_end", stats=self.totals.summary())
        if self.transcript is not None:
            self.transcript.close()
