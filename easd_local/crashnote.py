"""What llama.cpp is doing right now, kept in a small file that the supervising parent
(``supervise``) reads if this process dies by a signal: which model is loading or decoding,
where its layers are, whether its weights are repacked.

Writes happen only when the activity changes (a load, the other model's turn to decode),
each one ``pwrite`` of a few hundred bytes into a file that is already open: microseconds
against a decode's tens of milliseconds. Without a supervising parent (the variable unset:
tests, ``python -c``, Windows) nothing is written.
"""

from __future__ import annotations

import os

NOTE_ENV = "EASD_LOCAL_CRASH_NOTE"
_SIZE = 1024

_fd: int | None = None
_last: str = ""


def _open() -> int | None:
    global _fd
    if _fd is None:
        path = os.environ.get(NOTE_ENV)
        if not path:
            return None
        try:
            _fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError:
            os.environ.pop(NOTE_ENV, None)  # never try again
            return None
    return _fd


def note(text: str) -> None:
    """Record ``text`` ("while decoding with X on CPU, weight repacking on") as the activity."""
    global _last
    if text == _last:
        return
    _last = text  # (unsupervised too: each decode would look the variable up again)
    fd = _open()
    if fd is None:
        return
    data = text.encode("utf-8", errors="replace")[: _SIZE - 1]
    try:
        os.pwrite(fd, data.ljust(_SIZE), 0)
    except OSError:
        pass
