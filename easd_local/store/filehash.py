"""sha256 of model files, computed once per file and cached.

A model file is 0.5-2 GB: reading it costs seconds to minutes, so its hash is computed
once and cached in ``<home>/hash-cache.json`` (``$EASD_LOCAL_HOME``), keyed by the file's
resolved path and trusted while the file's *stamp* is unchanged: size, ``st_mtime_ns`` and
inode. Replacing a file (a new download renamed over it, an edit, a copy) changes at least
one of them, so a stale hash is never returned for a changed file; touching a file only
costs a re-hash.

API (nothing here prints; ``progress(bytes_done, bytes_total)`` reports long hashes):

- :func:`sha256_of` -- the hash, from the cache when the stamp matches, else computed
  (and cached); ``rehash=True`` reads the file whatever the cache says;
- :func:`lookup` -- the cached hash or None, never reading the file;
- :func:`record` -- cache a hash known by other means (a verified pull checked the
  catalog's sha256 while writing the file), so that file is never read again to hash it;
- :func:`paths_with` -- the files the cache recorded with a given hash;
- :func:`hash_file` -- the uncached hash of any file.

Concurrent writers (two commands at once) may each drop the other's new entry: the cost is
one more hash later, never a wrong one. Entries whose file is gone are pruned on write.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable

from .. import paths
from ..fsutil import locked, write_json_atomic

CACHE_NAME = "hash-cache.json"
BLOCK = 1 << 20

Progress = Callable[[int, int], None]

_LOCK = threading.Lock()


def cache_path() -> Path:
    return paths.home() / CACHE_NAME


def hash_file(path: str | os.PathLike, progress: Progress | None = None) -> tuple[int, str]:
    """``(bytes read, sha256 hex)`` of a file, read in 1 MiB blocks; no cache."""
    h = hashlib.sha256()
    p = Path(path)
    total = p.stat().st_size
    done = 0
    with open(p, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
            done += len(block)
            if progress is not None:
                progress(done, total)
    return done, h.hexdigest()


def _key_and_stamp(path: str | os.PathLike) -> tuple[str, dict[str, int]]:
    p = Path(path).expanduser().resolve()
    st = p.stat()
    return str(p), {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _read() -> dict[str, Any]:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _valid_sha(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def lookup(path: str | os.PathLike) -> str | None:
    """The cached sha256 of ``path`` if its stamp (size, mtime, inode) is unchanged since it
    was cached, else None. Never reads the file's contents. OSError if the file is missing."""
    key, stamp = _key_and_stamp(path)
    with _LOCK:
        rec = _read().get(key)
    if not isinstance(rec, dict) or any(rec.get(k) != v for k, v in stamp.items()):
        return None
    sha = rec.get("sha256")
    return sha if _valid_sha(sha) else None


def record(path: str | os.PathLike, sha256: str) -> None:
    """Cache ``sha256`` for ``path`` as it is now (the caller vouches for the hash). A cache
    that cannot be written (read-only home) only costs a hash later."""
    sha256 = sha256.lower()
    if not _valid_sha(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    key, stamp = _key_and_stamp(path)
    with _LOCK, locked(cache_path()):  # another command may be recording another file's hash
        cache = _read()
        new = {**stamp, "sha256": sha256}
        if cache.get(key) == new:
            return
        cache[key] = new
        cache = {k: v for k, v in cache.items() if k == key or os.path.exists(k)}
        try:
            write_json_atomic(cache_path(), cache)
        except OSError:
            pass


def sha256_of(path: str | os.PathLike, *, progress: Progress | None = None, rehash: bool = False) -> str:
    """The sha256 of a file: cached while its stamp is unchanged, else (or with ``rehash``:
    always) read and cached. OSError if the file cannot be read."""
    cached = None if rehash else lookup(path)
    if cached is not None:
        return cached
    key, before = _key_and_stamp(path)
    _, sha = hash_file(key, progress)
    if _key_and_stamp(key)[1] == before:  # not rewritten while we read it
        record(key, sha)
    return sha


def paths_with(sha256: str, *, unchanged_only: bool = True) -> list[Path]:
    """Existing files the cache recorded with ``sha256``: only those unchanged since (stamp
    equal), or with ``unchanged_only=False`` also those changed since (whose hash is then
    unknown: check it with :func:`sha256_of`). Never reads a file's contents."""
    sha256 = sha256.lower()
    with _LOCK:
        cache = _read()
    out = []
    for key, rec in cache.items():
        if not (isinstance(rec, dict) and rec.get("sha256") == sha256):
            continue
        try:
            if lookup(key) == sha256 or (not unchanged_only and Path(key).is_file()):
                out.append(Path(key))
        except OSError:
            continue
    return out
