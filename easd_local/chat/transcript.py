"""A chat on disk: the running JSONL transcript and the conversation saved by ``/save``.

Both guarantee that nothing is left half-written: the transcript cuts off a partial line,
``/save`` writes a temporary file and renames it. The formats live here and only here, so
this is the one file to change when what a chat leaves on disk changes.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .. import paths
from ..fsutil import describe_write_error, write_text_atomic
from ..jsonsafe import jsonable


def _stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


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
        name = f"chat-{_stamp()}-{os.getpid()}.jsonl"
        if directory is None:
            try:
                directory = paths.transcripts_dir()
            except OSError as e:  # the home is a file, or cannot be created
                return cls(paths.home() / "transcripts" / name, failed=e)
        return cls(Path(directory) / name)

    def _fail(self, e: OSError) -> None:
        self.error = describe_write_error(self.path, e)
        self.close()
        try:  # a file with no line in it is no transcript, only litter in the folder
            st = self.path.stat()
            if stat.S_ISREG(st.st_mode) and st.st_size == 0:  # never a device (/dev/full)
                self.path.unlink()
        except OSError:
            pass

    def write(self, event: str, **data) -> None:
        if self._fd is None:
            return
        row = {"event": event, "time": _now(), **jsonable(data)}
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

    def where(self) -> str:
        """Where the transcript is, for the line a chat ends with: the path, or why there is
        none (an empty file left by a writer that failed at once is no transcript)."""
        if self.error is None:
            return str(self.path)
        try:
            kept = self.path.stat().st_size > 0
        except OSError:
            kept = False
        return f"{self.path} (incomplete: {self.error})" if kept else f"none ({self.error})"

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


# --------------------------------------------------------------------------- /save
@dataclass(frozen=True)
class Conversation:
    """A conversation as the session hands it over to be saved."""

    label: str  # the pair's name ("" when none)
    target: str | None  # model paths
    draft: str | None
    mode: str
    settings: dict  # JSON-safe
    system: str | None
    messages: list[dict]  # {"role", "content"[, "interrupted": True][, "in_context": False]}
    stats: dict  # the session's totals


def conversation_json(c: Conversation) -> dict:
    """The conversation as ``/save PATH.json`` writes it."""
    return {
        "pair": c.label,
        "target": c.target,
        "draft": c.draft,
        "saved_at": _now(),
        "settings": c.settings,
        "system": c.system,
        "messages": c.messages,
        "stats": jsonable(c.stats),
    }


def conversation_markdown(c: Conversation) -> str:
    """The conversation as ``/save PATH.md`` writes it."""
    out = [f"# easd-local chat{f' ({c.label})' if c.label else ''}", ""]
    out.append(f"*{_now()} · mode {c.mode}*")
    out.append("")
    if c.system:
        out += ["## System", "", c.system, ""]
    for m in c.messages:
        title = "User" if m["role"] == "user" else "Assistant"
        notes = [n for n, on in (("interrupted", m.get("interrupted", False)),
                                 ("dropped from context", not m.get("in_context", True))) if on]
        out += [f"## {title}{' (' + ', '.join(notes) + ')' if notes else ''}", "", m["content"], ""]
    return "\n".join(out)


def save_conversation(c: Conversation, path: Path | str | None = None) -> Path:
    """Write the conversation as JSON, or Markdown for .md/.markdown, atomically (a new
    file in the transcripts folder when ``path`` is None). Raises OSError."""
    if path is None:
        path = paths.transcripts_dir() / f"chat-{_stamp()}.json"
    path = Path(path).expanduser()
    if path.suffix.lower() in (".md", ".markdown"):
        text = conversation_markdown(c)
    else:
        text = json.dumps(conversation_json(c), ensure_ascii=False, indent=2) + "\n"
    return write_text_atomic(path, text)


def save_error(path: Path | str | None, e: OSError) -> str:
    """Why ``save_conversation(c, path)`` failed with ``e``, in words."""
    where = Path(path).expanduser() if path else paths.home() / "transcripts"
    return f"could not save: {describe_write_error(where, e)}"
