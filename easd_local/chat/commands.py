"""The chat's slash commands: one table of name, arguments, help and handler.

``run`` dispatches a line through the table, ``/help`` and ``chat --help`` are written from
it, so a command is added or changed here and nowhere else. A handler reads the line's
argument, asks the session to act (the session validates, changes its state and logs it)
and words the answer; nothing here prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from ..engine.config import FIELD_TYPES, LOSSLESS_HELP, MODES, DecodeConfig, not_lossless
from ..engine.events import acceptance_text
from ..engine.modes import parse_way_label, way_label
from ..errors import EasdError
from .transcript import save_error


class Session(Protocol):
    """What the commands ask of a chat session (``session.ChatSession``, which runs them)."""

    cfg: DecodeConfig
    system: str | None
    about: Callable[[], str] | None  # the front end's details (mode and why, sampling, placement)
    easd_loss: Callable[[str], str | None] | None  # a recorded loss of an EASD mode on this pair

    def set_mode(self, mode: str, spec_type: str | None = None) -> None: ...

    def apply_setting(self, key: str, value: str) -> dict: ...

    def stats(self) -> dict: ...

    def set_system(self, text: str) -> None: ...

    def reset(self) -> None: ...

    def save(self, path: Path | str | None = None) -> Path: ...


@dataclass(frozen=True)
class CommandResult:
    ok: bool  # False: a hint about a bad command or value (the session goes on)
    message: str = ""
    quit: bool = False
    kind: str = ""  # the command's name ("mode", "set", ...; "unknown" for unknown ones)
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Command:
    name: str
    args: str  # as /help shows them: "MODE", "KEY VALUE", "[PATH]" (optional), "" (none)
    help: str
    handler: Callable[[Session, str], CommandResult]
    aliases: tuple[str, ...] = ()

    @property
    def usage(self) -> str:
        return f"/{self.name} {self.args}".rstrip()


def _not_lossless_note(mode: str, s: Session) -> str:
    loss = getattr(s, "easd_loss", None)
    why = not_lossless(mode, loss(mode) if loss else None)
    return f" ({why}; /mode sd gives the target's own output)" if why else ""


def _shown(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------- handlers
def _mode(s: Session, arg: str) -> CommandResult:
    if not arg:
        return CommandResult(False, f"usage: /mode {'|'.join(MODES)}, or sd:DRAFTERS as in sd:ngram-simple "
                                    f"(now {way_label(s.cfg.mode, s.cfg.drafters)})", kind="mode")
    mode, kinds = parse_way_label(arg)  # as the banner names it: sd:ngram-simple
    s.set_mode(mode, kinds)
    note = _not_lossless_note(mode, s) or " (lossless: the target's own output)"
    return CommandResult(True, f"mode {way_label(mode, s.cfg.drafters)}{note}", kind="mode", data={"mode": mode})


def _set(s: Session, arg: str) -> CommandResult:
    parts = arg.split()
    if len(parts) != 2:
        return CommandResult(False, "usage: /set KEY VALUE (e.g. /set temperature 0.3, /set tau-target 0.8)",
                             kind="set")
    changed = s.apply_setting(*parts)
    shown = ", ".join(f"{k.replace('_', '-')} = {_shown(v)}" for k, v in changed.items()) or "unchanged"
    if "mode" in changed:
        shown += _not_lossless_note(s.cfg.mode, s)
    return CommandResult(True, shown, kind="set", data=changed)


def _stats(s: Session, arg: str) -> CommandResult:
    st = s.stats()
    # only the figures that the modes used so far have: acceptance for SD turns,
    # consults for target-first turns
    spec = []
    if st["drafted"]:
        spec.append(acceptance_text(st["drafted"], st["draft_accepted"] + st.get("lookup_accepted", 0),
                                    st["mean_accepted_len"]))
    if st["draft_consult_rate"] is not None:
        spec.append(f"draft consulted at {100 * st['draft_consult_rate']:.0f}% of easd-tf positions")
    spec.append(f"EASD fires {st['easd_fires']} ({st['easd_fires_per_100']:.1f}/100 tokens)")
    lines = [
        f"turns {st['turns']} ({st['interrupted']} interrupted) · {st['tokens']} tokens · "
        f"{st['tokens_per_s']:.1f} tok/s",
        " · ".join(spec),
        f"history {st['context_tokens']} tokens rendered · context {st['n_ctx']} · "
        f"{st['messages_in_context']}/{st['messages']} messages in context · thresholds: {st['thresholds_source']}",
        "settings: " + " ".join(f"{k.replace('_', '-')}={v}" for k, v in st["settings"].items()),
    ]
    return CommandResult(True, "\n".join(lines), kind="stats", data=st)


def _system(s: Session, arg: str) -> CommandResult:
    s.set_system(arg)
    return CommandResult(True, "system prompt set" if arg else "system prompt cleared", kind="system")


def _reset(s: Session, arg: str) -> CommandResult:
    s.reset()
    return CommandResult(True, "conversation cleared" + (" (system prompt kept)" if s.system else ""), kind="reset")


def _save(s: Session, arg: str) -> CommandResult:
    try:
        path = s.save(arg or None)
    except OSError as e:
        return CommandResult(False, save_error(arg or None, e), kind="save")
    return CommandResult(True, f"saved {path}", kind="save", data={"path": str(path)})


def _about(s: Session, arg: str) -> CommandResult:
    return CommandResult(True, s.about() if s.about else f"mode {s.cfg.mode}", kind="about")


def _help(s: Session, arg: str) -> CommandResult:
    return CommandResult(True, help_text(), kind="help")


def _quit(s: Session, arg: str) -> CommandResult:
    return CommandResult(True, "", quit=True, kind="quit")


# --------------------------------------------------------------------------- the table
_SETTINGS = ", ".join(k.replace("_", "-") for k in FIELD_TYPES if k != "mode")  # /mode sets the mode

COMMANDS: tuple[Command, ...] = (
    Command("mode", "MODE", f"switch decoding mode ({'|'.join(MODES)}); {LOSSLESS_HELP.rstrip('.')}", _mode),
    Command("set", "KEY VALUE", f"change a setting: {_SETTINGS}", _set),
    Command("stats", "", "session statistics and the settings in force", _stats),
    Command("system", "[TEXT]", "set the system prompt (no TEXT: clear it)", _system),
    Command("reset", "", "clear the conversation (the system prompt stays)", _reset),
    Command("save", "[PATH]", "save the conversation (.json, or .md for Markdown); default in the transcripts folder",
            _save),
    Command("about", "", "the pair, the mode and why, sampling, where the layers are", _about),
    Command("help", "", "this list", _help, aliases=("?",)),
    Command("quit", "", "leave the chat", _quit, aliases=("exit", "q")),
)


def find(name: str) -> Command | None:
    """The command called ``name`` (without the slash, lower case) or one of its aliases."""
    return next((c for c in COMMANDS if name in (c.name, *c.aliases)), None)


def help_text() -> str:
    """One line a command: its usage and what it does."""
    width = max(len(c.usage) for c in COMMANDS)
    return "\n".join(f"{c.usage:<{width}}  {c.help}" for c in COMMANDS)


def synopsis() -> str:
    """The commands on one line ("/mode MODE, /set KEY VALUE, ...")."""
    return ", ".join(c.usage for c in COMMANDS)


def run(s: Session, line: str) -> CommandResult:
    """Run one slash command (``line`` starts with '/') on session ``s``. An unknown
    command or a bad value gives a result that is not ``ok``, never an exception."""
    parts = line.strip().split(None, 1)
    name = parts[0].lower().lstrip("/") if parts else ""
    arg = parts[1].strip() if len(parts) > 1 else ""
    cmd = find(name)
    if cmd is None:
        return CommandResult(False, f"unknown command /{name}; /help lists the commands", kind="unknown")
    try:
        return cmd.handler(s, arg)
    except EasdError as e:
        return CommandResult(False, str(e), kind=cmd.name)
