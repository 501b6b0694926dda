"""What llama.cpp is doing right now, kept in a small file that the supervising parent
(``supervise``) reads if this process dies by a signal: which model is loading or decoding,
where its layers are, whether its weights are repacked.

Writes happen only when the activity changes (a load, the other model's turn to decode:
twice a step in sd with a draft model), each a copy of a few hundred bytes into the file's page,
mapped shared (the parent's ``pread`` sees it at once, even after this process died by a
signal); where the file cannot be mapped, a ``pwrite`` (a system call: microseconds after a
decode has swept the caches). Without a supervising parent (the variable unset: tests,
``python -c``, Windows) nothing is written.

The file has no name: the parent makes it and unlinks it at once, and passes its descriptor
(``EASD_LOCAL_CRASH_NOTE`` holds the number). A named file would stay behind in the temporary
folder each time the parent is killed with SIGKILL, the one end it cannot clean up after.
"""

from __future__ import annotations

import mmap
import os

NOTE_ENV = "EASD_LOCAL_CRASH_NOTE"
_SIZE = 1024

_fd: int | None = None
_page: mmap.mmap | None = None  # the file mapped shared, where it could be
_last: str = ""


def adopt() -> None:
    """In the supervised worker, first thing: take the descriptor the parent passed. The
    variable goes, and the descriptor is not inherited: in a child of this process the number
    could name any file."""
    global _fd, _page
    given = os.environ.pop(NOTE_ENV, "")
    if not given.isdigit():
        return
    try:
        os.set_inheritable(int(given), False)
    except OSError:
        return
    _fd = int(given)
    try:
        # the page written through first: its block exists, so a copy into the mapping
        # cannot fault on a full disk (SIGBUS); blanks read back as no note
        if os.pwrite(_fd, b" " * _SIZE, 0) == _SIZE:
            _page = mmap.mmap(_fd, _SIZE)
    except (OSError, ValueError):
        _page = None


def note(text: str) -> None:
    """Record ``text`` ("while decoding with X on CPU, weight repacking on") as the activity."""
    global _last
    if text == _last:
        return
    _last = text
    if _fd is None:
        return
    data = text.encode("utf-8", errors="replace")[: _SIZE - 1].ljust(_SIZE)
    if _page is not None:
        _page[:] = data
        return
    try:
        os.pwrite(_fd, data, 0)
    except OSError:
        pass
