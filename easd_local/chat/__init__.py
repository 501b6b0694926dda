"""`easd-local chat`'s library part, one job a module; nothing here prints.

- ``session``: the conversation over a loaded pair: history, context trimming, turns,
  session totals.
- ``commands``: the slash commands, one table that runs them and writes ``/help``.
- ``transcript``: what a chat leaves on disk: the JSONL transcript and ``/save``'s files.
"""

from .commands import COMMANDS, CommandResult
from .session import CHAT_DEFAULTS, ChatEvent, ChatSession, Message, Notice, Reply, SessionTotals
from .transcript import TranscriptWriter

__all__ = ["CHAT_DEFAULTS", "COMMANDS", "ChatEvent", "ChatSession", "CommandResult", "Message", "Notice", "Reply",
           "SessionTotals", "TranscriptWriter"]
