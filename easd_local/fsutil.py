"""Writing files so that a crash or Ctrl-C never leaves one half-written."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write to a temporary file beside ``path``, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read_json_dict(path: str | Path) -> dict:
    """A JSON object kept in a file of the home (verdicts, costs, notes shown), or {} when the
    file is missing, unreadable or not an object: such a file is a cache, rebuilt when lost."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> Path:
    return write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def describe_write_error(path: str | Path, exc: OSError) -> str:
    """What went wrong writing ``path``, in words: in particular a folder on the way that
    is a file (mkdir says only "File exists", open "Not a directory")."""
    path = Path(path)
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        for parent in [path, *path.parents]:
            if parent.exists() and not parent.is_dir():
                if parent == path and exc.errno == errno.EEXIST:
                    break
                return f"{parent} is a file, not a folder"
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device holding {path}"
    return f"{exc.filename or path}: {exc.strerror or exc}"


def short_of_space(folder: str | Path, need: int) -> int | None:
    """The free bytes in ``folder`` when fewer than ``need``; None when there is room, or
    when the disk cannot be asked (the write then finds out for itself)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    return free if free < need else None


def try_lock(fh) -> bool:
    """Take an exclusive lock on an open file without waiting: False when another process
    holds it. A flock: the kernel drops it when its holder dies, so a killed run never
    leaves it held. Where there is no flock (not POSIX, or a filesystem without locks) every
    caller gets it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return True
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a filesystem without locks (some NFS mounts): as if not POSIX
        return True
    return True


def wait_lock(fh) -> None:
    """Wait for the exclusive lock on an open file (see :func:`try_lock`)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return
    fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
