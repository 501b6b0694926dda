"""Spinners for the silent waits (loading models, evaluating the prompt), on stderr and
only on a terminal: logs and pipes get nothing."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Iterable, Iterator, TypeVar

from .common import err_console

T = TypeVar("T")


def spinner(text: str):
    """A transient spinner with ``text`` while the block runs (nothing when stderr is not a terminal)."""
    if not err_console.is_terminal:
        return nullcontext()
    return err_console.status(text, spinner="dots")


def until_first(events: Iterable[T], text: str) -> Iterator[T]:
    """Yield ``events``, with a spinner showing ``text`` until the first one arrives
    (the prompt's prefill happens before the first token)."""
    it = iter(events)
    with spinner(text):
        try:
            first = next(it)
        except StopIteration:
            return
    yield first
    yield from it
