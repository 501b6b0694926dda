"""Stop strings over streamed text.

A stop string may be split across tokens, so text that could be the start of one is held
back until the next piece shows whether it is; nothing past (or of) the stop string is ever
emitted. OpenAI semantics: the returned text does not contain the stop string.
"""

from __future__ import annotations

from typing import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The part of ``text`` (with what was held back) that is safe to emit now.
        After a stop string is found, ``stopped`` is True and later calls return ""."""
        if self.stopped:
            return ""
        buf = self._held + text
        if not self.stops:
            self._held = ""
            return buf
        hit = self._first_hit(buf)
        # a longer stop that began before the hit may still complete (stops "a\na" and
        # "\n", text "a\n" then "a"): the earliest start wins, as when cutting the whole text
        pending = self._first_pending(buf, len(buf) if hit is None else hit)
        if hit is not None and pending is None:
            self.stopped = True
            self._held = ""
            return buf[:hit]
        cut = len(buf) if pending is None else pending
        self._held = buf[cut:]
        return buf[:cut]

    def flush(self) -> str:
        """At the end of generation: what is still held back, cut at a stop string it holds."""
        if self.stopped:
            return ""
        buf, self._held = self._held, ""
        hit = self._first_hit(buf)
        if hit is None:
            return buf
        self.stopped = True
        return buf[:hit]

    def _first_hit(self, buf: str) -> int | None:
        """Where the earliest complete stop string in ``buf`` starts."""
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def _first_pending(self, buf: str, limit: int) -> int | None:
        """The earliest position before ``limit`` from which the rest of ``buf`` is a proper
        prefix of a stop string (so the next piece may complete it)."""
        longest = max(len(s) for s in self.stops)
        for p in range(max(0, len(buf) - longest + 1), limit):
            rest = buf[p:]
            if any(len(rest) < len(s) and s.startswith(rest) for s in self.stops):
                return p
        return None
