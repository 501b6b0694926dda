"""Whether a completion that ran out of tokens was stuck in a loop.

Greedy decoding of a small model sometimes falls into a cycle: the same few lines, token for
token, until max tokens. Such a row says little about whether max tokens was large enough: more
tokens would most likely only lengthen the loop (the quality study re-runs a few such problems
with twice the tokens to check it). The report tells these rows apart from answers that were
still making progress when they were cut off, which a larger max tokens could have finished.
"""

from __future__ import annotations

from typing import Sequence

# A tail this long that is periodic with a short period is a loop, not chance: 200 tokens is
# a paragraph of ordinary text, far longer than any repetition a finished answer makes.
MIN_SPAN = 200
MAX_PERIOD = 256
MIN_REPEATS = 3


def loop_period(tokens: Sequence[int], max_period: int = MAX_PERIOD, min_span: int = MIN_SPAN,
                min_repeats: int = MIN_REPEATS) -> int | None:
    """The smallest period p ≤ max_period such that the last max(min_repeats·p, min_span) tokens
    repeat with period p (token i equals token i + p throughout); None if there is none."""
    n = len(tokens)
    for p in range(1, max_period + 1):
        span = max(min_repeats * p, min_span)
        if span > n:
            return None
        tail = tokens[n - span:]
        if all(tail[i] == tail[i + p] for i in range(span - p)):
            return p
    return None


def is_truncated(row: dict) -> bool:
    """A row that stopped at max tokens or the context, not at an end of generation."""
    return row["stats"].get("stop_reason") in ("length", "context")


def is_looping(row: dict) -> bool:
    """A truncated row with a looping tail (rows without token ids: False)."""
    return is_truncated(row) and loop_period(row.get("completion_tokens") or []) is not None
