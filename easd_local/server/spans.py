"""Which token each piece of streamed text came from: the ``easd_tokens`` stream extension.

The HTTP layer sends text only once the stop strings allow it (``StopMatcher`` may hold
some back), so a chunk's text and the tokens decoded since the last chunk need not line
up. ``TokenSpans`` keeps the decoded tokens in order and, for each run of characters sent,
says which tokens' text it was: one record per token part, in order, with the token's
index ``i`` in the completion, its origin and the gate's figures where they were computed.
A token whose text is split between two chunks (a stop string was still possible) appears
in both with the same ``i``; a token with no text (an end-of-generation token, or the first
bytes of a character that a later token completes) appears once with ``text`` "".
Pure: no HTTP, no models.
"""

from __future__ import annotations

import collections
import math

from ..engine.decoding import TokenEvent

DIGITS = 4  # of the entropies (nats) and the overlap sent with each token


def _figure(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), DIGITS)


class TokenSpans:
    def __init__(self) -> None:
        # [index, event, text still to send, offset into it, sent yet]
        self._pending: collections.deque[list] = collections.deque()
        self._n = 0
        self._last: TokenEvent | None = None

    def token(self, ev: TokenEvent) -> None:
        """A token decoded (its text not sent yet)."""
        self._pending.append([self._n, ev, ev.text, 0, False])
        self._n += 1
        self._last = ev

    def tail(self, text: str) -> None:
        """Text completed only at the end (a dangling partial character): it belongs to the
        last token."""
        if not text or self._last is None:
            return
        if self._pending:
            self._pending[-1][2] += text
        else:  # the last token's own text was sent already: a continuation of it
            self._pending.append([self._n - 1, self._last, text, 0, True])

    def take(self, n: int) -> list[dict]:
        """The records of the next ``n`` characters sent (and of any text-less tokens
        before or among them)."""
        out = []
        while self._pending:
            entry = self._pending[0]
            i, ev, text, off, _ = entry
            k = min(n, len(text) - off)
            if k == 0 and off < len(text):
                break  # this token's text waits for a later chunk
            out.append(_record(i, ev, text[off:off + k]))
            entry[3] += k
            entry[4] = True
            n -= k
            if entry[3] < len(text):
                break
            self._pending.popleft()
        return out

    def finish(self) -> list[dict]:
        """The records of tokens not sent yet when the request ends: the rest of their text
        was cut by a stop string (or never came), so each is sent once with no text."""
        out = [_record(i, ev, "") for i, ev, _, _, sent in self._pending if not sent]
        self._pending.clear()
        return out


def _record(i: int, ev: TokenEvent, text: str) -> dict:
    return {"i": i, "text": text, "origin": ev.origin, "h_draft": _figure(ev.h_draft),
            "h_target": _figure(ev.h_target), "overlap": _figure(ev.overlap)}
