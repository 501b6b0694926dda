"""glibc's allocator, told to keep what the controller frees.

Every logits row the controller works on is 600 KB at a real vocabulary (151,936 float32),
and glibc serves a block that large with a fresh ``mmap``, so each numpy temporary of a row
is paid again in page faults, which cost more than the arithmetic done in it (docs/controller.md,
session 20). Raising the mmap threshold
to 16 MB, and the trim threshold with it, lets those blocks be reused from the heap. The
model's weights and llama.cpp's large buffers stay mmapped. Elsewhere than glibc: nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 16 << 20
TRIM_THRESHOLD = 64 << 20

_done: bool | None = None


def keep_freed_blocks() -> bool:
    """Set the thresholds once per process; whether glibc took them."""
    global _done
    if _done is None:
        _done = False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt)
            return False
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        _done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
