"""The chat session core: history, context trimming, slash commands, transcript.

No printing and no typer here: ``cli/chat.py`` reads lines, calls ``ChatSession.send`` or
``ChatSession.command`` and renders what comes back, so everything below can be tested
without a terminal.

Each turn renders the whole history with the target's GGUF chat template and calls
``decoding.generate``; ``generate`` reuses both models' KV caches by longest common prefix,
so only the new user message (and the template's glue) is evaluated.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterator, Union

from . import paths
from .fsutil import describe_write_error, write_text_atomic
from .engine.config import RANDOM_SEED, DecodeConfig, apply_settings, not_lossless
from .engine.modes import MODES, mode_info
from .engine.decoding import Finished, Stats, Stopper, TokenEvent, acceptance_text, generate
from .jsonsafe import jsonable
from .errors import ConfigError, ContextOverflowError, EasdError
from .engine.runtime import Model
from .engine.text import check_text

# Chat's own sampling defaults (generate's are greedy with 512 tokens).
def auto_mode(gpu_offload: bool, n_gpu_layers: int, have_draft: bool) -> tuple[str, str]:
    """The mode chat picks when none is given, and why (shown in the banner).

    On a CPU a verify batch of gamma+1 tokens costs several one-token decodes, so SD and
    EASD built on it run slower than the target alone there (scripts/bench_modes.py);
    target-first EASD keeps EASD's gate at close to the target's speed. With layers on a
    GPU, batched verification is nearly free and the SD path is the fast one."""
    if not have_draft:
        return "target", "only a target was given"
    if gpu_offload and n_gpu_layers != 0:
        return "easd", "GPU offload: EASD on speculative decoding"
    return "easd-tf", "CPU-only: target-first EASD is the faster path here (/mode easd for the SD path)"


CHAT_DEFAULTS = DecodeConfig(temperature=0.7, top_k=40, top_p=0.95, max_tokens=1024)

COMMANDS_HELP = [
    ("/mode MODE", f"switch decoding mode ({'|'.join(MODES)}); sd and target give the target's own output, "
                   "easd and easd-tf are not lossless"),
    ("/set KEY VALUE", "change a setting: temperature, gamma, tau-draft, tau-target, top-n, overlap, penalty, "
                       "top-k, top-p, max-tokens, seed, draft-p-min"),
    ("/stats", "session statistics and the settings in force"),
    ("/system [TEXT]", "set the system prompt (no TEXT: clear it)"),
    ("/reset", "clear the conversation (the system prompt stays)"),
    ("/save [PATH]", "save the conversation (.json, or .md for Markdown); default in the transcripts folder"),
    ("/help", "this list"),
    ("/quit", "leave (Ctrl-D works too)"),
]


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


@dataclass(frozen=True)
class CommandResult:
    ok: bool  # False: a hint about a bad command or value (the session goes on)
    message: str = ""
    quit: bool = False
    kind: str = ""  # the command's name ("mode", "set", ...; "unknown" for unknown ones)
    data: dict = field(default_factory=dict)


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
            "draft_consult_rate": s.draft_consult_rate,
            "easd_fires": s.easd_fires,
            "easd_fires_per_100": s.easd_fires_per_100,
            "seconds_generating": s.seconds_generating,
            "seconds_prompt": s.seconds_prompt,
        }


def settings_dict(cfg: DecodeConfig) -> dict:
    return jsonable(dataclasses.asdict(cfg))


# --------------------------------------------------------------------------- transcript
class TranscriptWriter:
    """Append-only JSONL: one line per event, written and fsynced as it happens, so a
    session that dies leaves every event before the crash on disk.

    A transcript is a convenience: when it cannot be written (no room, a home folder that
    is a file, no permission), the writer stops, cuts off any partial line and keeps the
    reason in ``error``; the chat goes on without it. ``take_warning`` hands that reason
    out once, for the caller to show."""

    def __init__(self, path: Path, *, failed: OSError | None = None):
        self.path = Path(path)
        self.error: str | None = None
        self._warned = False
        self._fd: int | None = None
        try:
            if failed is not None:
                raise failed
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            self._fail(e)

    @classmethod
    def new(cls, directory: Path | None = None) -> "TranscriptWriter":
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        name = f"chat-{stamp}-{os.getpid()}.jsonl"
        if directory is None:
            try:
                directory = paths.transcripts_dir()
            except OSError as e:  # the home is a file, or cannot be created
                return cls(paths.home() / "transcripts" / name, failed=e)
        return cls(Path(directory) / name)

    def _fail(self, e: OSError) -> None:
        self.error = describe_write_error(self.path, e)
        self.close()

    def write(self, event: str, **data) -> None:
        if self._fd is None:
            return
        row = {"event": event, "time": datetime.now().astimezone().isoformat(timespec="seconds"), **jsonable(data)}
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8", errors="replace")
        try:
            before = os.lseek(self._fd, 0, os.SEEK_END)
        except OSError as e:
            self._fail(e)
            return
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError as e:
            try:  # no half line left behind for a reader to choke on
                os.ftruncate(self._fd, before)
            except OSError:
                pass
            self._fail(e)

    def take_warning(self) -> str | None:
        """Why the transcript stopped, the first time this is asked after it did."""
        if self.error is None or self._warned:
            return None
        self._warned = True
        return f"warning: the chat transcript is off: {self.error}; the chat goes on without it"

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


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
    ):
        if target is None and draft is None:
            raise ValueError("a chat needs at least one model")
        self.target = target
        self.draft = draft
        self.n_vocab = n_vocab or min(m.n_vocab for m in (target, draft) if m is not None)
        self._check_mode(cfg.mode)
        self.cfg = cfg.validate(self.n_vocab)
        self.system = system or None
        self.thresholds_source = thresholds_source
        self.transcript = transcript
        self.label = label
        self.messages: list[Message] = []
        self.totals = SessionTotals()
        self._pending: dict | None = None  # the reply being generated
        self._template_model = target if target is not None else draft
        broken = self._template_model.vocab.chat_template_error()
        if broken is not None:  # before the first message, not at it
            raise ConfigError(f"{broken}; chat needs one (use `generate --raw` for plain completion)")
        self._log(
            "session_start",
            pair=label,
            target=str(target.path) if target is not None else None,
            draft=str(draft.path) if draft is not None else None,
            n_ctx=self.n_ctx,
            system=self.system,
            thresholds_source=thresholds_source,
            settings=settings_dict(self.cfg),
        )

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

    def _check_mode(self, mode: str) -> None:
        info = mode_info(mode)
        if info.needs_draft and self.draft is None:
            raise ConfigError(f"mode {mode} needs a draft model, and this chat was started without one")
        if info.needs_target and self.target is None:
            raise ConfigError(f"mode {mode} needs a target model, and this chat was started without one")

    # ------------------------------------------------------------------ context
    def trim_history(self, reserve: int | None = None) -> int:
        """Drop the oldest user/assistant turns (never the system prompt, never the last
        message) until the rendered history plus ``reserve`` fits in n_ctx. Returns how
        many messages were dropped from the context."""
        reserve = self.reserve if reserve is None else reserve
        dropped = 0
        while len(self.render()) + reserve > self.n_ctx:
            live = [m for m in self.messages if m.in_context]
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
            for ev in generate(self.target, self.draft, prompt, cfg, n_vocab=self.n_vocab,
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

    # ------------------------------------------------------------------ slash commands
    def command(self, line: str) -> CommandResult:
        """Run one slash command (``line`` starts with '/')."""
        parts = line.strip().split(None, 1)
        name = parts[0].lower().lstrip("/") if parts else ""
        arg = parts[1].strip() if len(parts) > 1 else ""
        handler = {
            "mode": self._cmd_mode, "set": self._cmd_set, "stats": self._cmd_stats,
            "system": self._cmd_system, "reset": self._cmd_reset, "save": self._cmd_save,
            "help": self._cmd_help, "?": self._cmd_help, "quit": self._cmd_quit, "exit": self._cmd_quit,
            "q": self._cmd_quit,
        }.get(name)
        if handler is None:
            return CommandResult(False, f"unknown command /{name}; /help lists the commands", kind="unknown")
        try:
            return handler(arg)
        except EasdError as e:
            return CommandResult(False, str(e), kind=name)

    def _cmd_mode(self, arg: str) -> CommandResult:
        if not arg:
            return CommandResult(False, f"usage: /mode {'|'.join(MODES)} (now {self.cfg.mode})", kind="mode")
        mode = arg.lower()
        self._check_mode(mode)
        self.cfg = self.cfg.replace(mode=mode)
        self._log("mode", mode=mode)
        why = not_lossless(mode)
        note = f" ({why}; /mode sd gives the target's own output)" if why else " (lossless: the target's own output)"
        return CommandResult(True, f"mode {mode}{note}", kind="mode", data={"mode": mode})

    def _cmd_set(self, arg: str) -> CommandResult:
        parts = arg.split()
        if len(parts) != 2:
            return CommandResult(False, "usage: /set KEY VALUE (e.g. /set temperature 0.3, /set tau-target 0.8)",
                                 kind="set")
        key, value = parts
        cfg = apply_settings(self.cfg, {key: value}).validate(self.n_vocab)
        if cfg.mode != self.cfg.mode:
            self._check_mode(cfg.mode)
        changed = {k: v for k, v in dataclasses.asdict(cfg).items() if getattr(self.cfg, k) != v}
        self.cfg = cfg
        if {"tau_draft", "tau_target"} & changed.keys():
            self.thresholds_source = "/set"
        self._log("set", key=key, value=value, changes=changed, settings=settings_dict(cfg))
        shown = ", ".join(f"{k.replace('_', '-')} = {v:g}" if isinstance(v, float) else f"{k.replace('_', '-')} = {v}"
                          for k, v in changed.items()) or "unchanged"
        if "mode" in changed and not_lossless(cfg.mode):
            shown += f" ({not_lossless(cfg.mode)}; /mode sd gives the target's own output)"
        return CommandResult(True, shown, kind="set", data=changed)

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
            "settings": settings_dict(self.cfg),
        }

    def _cmd_stats(self, arg: str) -> CommandResult:
        s = self.stats()
        # only the figures that the modes used so far have: acceptance for SD turns,
        # consults for target-first turns
        spec = []
        if s["drafted"]:
            spec.append(acceptance_text(s["drafted"], s["draft_accepted"], s["mean_accepted_len"]))
        if s["draft_consult_rate"] is not None:
            spec.append(f"draft consulted at {100 * s['draft_consult_rate']:.0f}% of easd-tf positions")
        spec.append(f"EASD fires {s['easd_fires']} ({s['easd_fires_per_100']:.1f}/100 tokens)")
        lines = [
            f"turns {s['turns']} ({s['interrupted']} interrupted) · {s['tokens']} tokens · "
            f"{s['tokens_per_s']:.1f} tok/s",
            " · ".join(spec),
            f"history {s['context_tokens']} tokens rendered · context {s['n_ctx']} · "
            f"{s['messages_in_context']}/{s['messages']} messages in context · thresholds: {s['thresholds_source']}",
            "settings: " + " ".join(f"{k.replace('_', '-')}={v}" for k, v in s["settings"].items()),
        ]
        return CommandResult(True, "\n".join(lines), kind="stats", data=s)

    def _cmd_system(self, arg: str) -> CommandResult:
        self.system = check_text(arg, "the system prompt") or None
        self._log("system", content=self.system)
        return CommandResult(True, "system prompt set" if arg else "system prompt cleared", kind="system")

    def reset(self) -> None:
        if self._pending is not None:
            self.interrupt()
        self.messages.clear()
        self._log("reset")

    def _cmd_reset(self, arg: str) -> CommandResult:
        self.reset()
        return CommandResult(True, "conversation cleared" + (" (system prompt kept)" if self.system else ""),
                             kind="reset")

    def save(self, path: Path | str | None = None) -> Path:
        """Write the conversation as JSON, or Markdown for .md/.markdown (atomic)."""
        if path is None:
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            path = paths.transcripts_dir() / f"chat-{stamp}.json"
        path = Path(path).expanduser()
        if path.suffix.lower() in (".md", ".markdown"):
            text = self.to_markdown()
        else:
            text = json.dumps(self.to_json(), ensure_ascii=False, indent=2) + "\n"
        write_text_atomic(path, text)
        self._log("save", path=str(path))
        return path

    def _cmd_save(self, arg: str) -> CommandResult:
        try:
            path = self.save(arg or None)
        except OSError as e:
            where = Path(arg).expanduser() if arg else paths.home() / "transcripts"
            return CommandResult(False, f"could not save: {describe_write_error(where, e)}", kind="save")
        return CommandResult(True, f"saved {path}", kind="save", data={"path": str(path)})

    def _cmd_help(self, arg: str) -> CommandResult:
        width = max(len(c) for c, _ in COMMANDS_HELP)
        lines = [f"{c:<{width}}  {h}" for c, h in COMMANDS_HELP]
        lines.append("Ctrl-C stops a reply; Ctrl-C or Ctrl-D at the prompt leaves; end a line with \\ to continue it.")
        return CommandResult(True, "\n".join(lines), kind="help")

    def _cmd_quit(self, arg: str) -> CommandResult:
        return CommandResult(True, "", quit=True, kind="quit")

    # ------------------------------------------------------------------ export / close
    def to_json(self) -> dict:
        return {
            "pair": self.label,
            "target": str(self.target.path) if self.target is not None else None,
            "draft": str(self.draft.path) if self.draft is not None else None,
            "saved_at": datetime.now().astimezone().isoformat(timespec="seconds"),
            "settings": settings_dict(self.cfg),
            "system": self.system,
            "messages": [m.to_dict() for m in self.messages],
            "stats": jsonable(self.totals.summary()),
        }

    def to_markdown(self) -> str:
        out = [f"# easd-local chat{f' ({self.label})' if self.label else ''}", ""]
        out.append(f"*{datetime.now().astimezone().isoformat(timespec='seconds')} · mode {self.cfg.mode}*")
        out.append("")
        if self.system:
            out += ["## System", "", self.system, ""]
        for m in self.messages:
            title = "User" if m.role == "user" else "Assistant"
            notes = [n for n, on in (("interrupted", m.interrupted), ("dropped from context", not m.in_context)) if on]
            out += [f"## {title}{' (' + ', '.join(notes) + ')' if notes else ''}", "", m.content, ""]
        return "\n".join(out)

    def close(self) -> None:
        if self._pending is not None:
            self.interrupt()
        self._log("session_end", stats=self.totals.summary())
        if self.transcript is not None:
            self.transcript.close()
