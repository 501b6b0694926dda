"""The cheap checks a GGUF file gets before llama.cpp sees it.

Its own module because the catalog (which must not load llama.cpp) and the runtime both
need it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelLoadError

GGUF_MAGIC = b"GGUF"


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Cheap checks before llama.cpp sees the file, so the common mistakes get a precise
    message: missing, a directory, empty, not GGUF."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(f"{p}: file not found")
    if p.is_dir():
        raise ModelLoadError(f"{p}: is a directory, not a GGUF file")
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelLoadError(f"{p}: cannot read ({e.strerror})") from None
    if not head:
        raise ModelLoadError(f"{p}: empty file (0 bytes), not a GGUF model")
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(f"{p}: not a GGUF file (no 'GGUF' magic at the start)")
    if len(head) < 8:
        raise ModelLoadError(f"{p}: truncated GGUF ({len(head)} bytes, the header alone needs 24)")
    return p
