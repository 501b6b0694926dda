"""Writing files so that a crash or Ctrl-C never leaves one half-written."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """``write(f)`` into a temporary file beside ``path``, fsync, then rename it over ``path``:
    the whole file or none. OSError, with nothing written, when ``path`` is there and is not a
    regular file. The file keeps its permissions, or a new one gets a plain write's (the
    temporary file's 0600 would hide a report or a results file from whoever could read it
    before). Whatever ``write`` raises leaves no temporary file."""
    path = Path(path)
    refuse_non_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = plain_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
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


def plain_mode(path: Path) -> int:
    """The permissions a rewrite of ``path`` should have: its own, or a plain new file's."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux says it; os.umask can only read it by setting it, for every thread at once
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def refuse_non_file(path: str | Path) -> None:
    """OSError when ``path`` exists and is not a regular file (a folder, a device, a pipe).
    The rename of an atomic write would otherwise replace it: run as root, ``/dev/null``
    or ``/dev/full`` became a plain file."""
    path = Path(path)
    if path.is_dir():
        raise OSError(errno.EISDIR, "is a folder, not a file", str(path))
    if path.exists() and not path.is_file():
        raise OSError(errno.EINVAL, "is not a regular file (a device or a pipe?)", str(path))


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


@contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold ``<folder>/locks/<name>.lock`` (a flock, dropped by the kernel if its holder dies)
    while ``path``, a file that several processes keep, is read, changed and replaced: two
    commands sharing a home would otherwise each write back what they had read, and the first
    one's change would be lost. Where the lock file cannot be made (a read-only or full home)
    nothing is held; the write fails there too."""
    path = Path(path)
    lock = path.parent / "locks" / f"{path.name}.lock"
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fh = open(lock, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError:
        yield
        return
    with fh:
        try:
            wait_lock(fh)
        except OSError:  # a filesystem without locks (some NFS mounts)
            pass
        yield


def update_json(path: str | Path, change: Callable[[dict], None]) -> Path:
    """Apply ``change(data)`` to the JSON object kept in ``path`` ({} when there is none), under
    :func:`locked`, and write it back atomically."""
    with locked(path):
        data = read_json_dict(path)
        change(data)
        return write_json_atomic(path, data)
