"""Models made here by quantizing another: written into the cache with llama.cpp's own
quantizer (``llamacpp.quantize``) and registered in the user catalog under a name built from
the source and the type, with the source's sha256 recorded, so that ``pair score``,
``bench --draft/--target`` and everything else that takes a model name can use them.

One quantization of a file at a time (a flock on ``<home>/locks/<file>.lock``); what a
killed one left (``<file>.part-<pid>``) is removed under that lock before writing.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import paths
from ..llamacpp import quantize as q
from ..errors import ConfigError
from ..fsutil import describe_write_error, short_of_space, try_lock
from ..units import human_size
from . import filehash
from .catalog import ModelEntry, _check_name, load_catalog, local_path, register_user_model
from .pull import check_cached

# a trailing "-f16", "_BF16", ".f32" on an unquantized source's name: the new name says the new type
_PRECISION_SUFFIX = re.compile(r"[-_.](f16|bf16|f32|fp16|fp32)$", re.IGNORECASE)


@dataclass(frozen=True)
class Source:
    """The file to quantize and what identifies it."""

    path: Path
    label: str  # the catalog name, or the file's stem
    sha256: str
    file_type: str  # llama.cpp's name of its type (F16, Q4_K_M, ...)
    entry: ModelEntry | None = None  # when it is a catalog model

    @property
    def quantized(self) -> bool:
        return self.file_type.upper() not in q.UNQUANTIZED


@dataclass(frozen=True)
class Made:
    entry: ModelEntry
    path: Path
    made: bool  # False: it was there already (same source, same type), not redone


def quantized_name(source_label: str, source_type: str, type_name: str) -> str:
    """The model name of ``source_label`` quantized to ``type_name``: the source's name with
    the type appended. An unquantized source's precision suffix is replaced (``x-f16`` ->
    ``x-q8_0``); a quantized source keeps its name whole, so a requantized model says what it
    was made from (``x-q4_k_m-q8_0``)."""
    base = "-".join(source_label.split())  # catalog names have no spaces
    if source_type.upper() in q.UNQUANTIZED:
        base = _PRECISION_SUFFIX.sub("", base) or base
    return f"{base}-{type_name.strip().lower()}"


def source(path: Path, label: str, entry: ModelEntry | None, allow_requantize: bool,
           hash_progress: Callable[[int, int], None] | None = None) -> Source:
    """Check the source (a quantized one is refused unless ``allow_requantize``) and identify it:
    the catalog's sha256 for a catalog model of the right size, else the file's (cached) hash."""
    path, ftype = q.check_source(path, allow_requantize)
    path = path.resolve()
    size = path.stat().st_size
    if entry is not None and entry.size == size:
        sha = entry.sha256
    else:
        sha = filehash.sha256_of(path, progress=hash_progress)
    return Source(path=path, label=label, sha256=sha, file_type=ftype, entry=entry)


def plan(src: Source, types: list[str], name: str | None = None) -> list[tuple[str, str, Path]]:
    """``[(type, model name, destination)]`` for every type asked for, all checked before
    anything is written: a known type, and a name (``name``, for one type, else built from the
    source's) that is free or already this very model."""
    out = []
    cat = load_catalog()
    wanted = list(dict.fromkeys(t.strip().upper() for t in types))
    for t in wanted:
        q.quant_type(t)  # ConfigError naming the known types
    if name is not None and len(wanted) != 1:
        raise ConfigError("--name names one output: give one --type with it")
    for t in wanted:
        model = name or quantized_name(src.label, src.file_type, t)
        _check_name(model, "model")
        if model in cat.pairs:
            raise ConfigError(f"{model!r} is the name of a pair; choose another with --name")
        old = cat.models.get(model)
        if old is not None and not _same_make(old, src, t):
            raise ConfigError(f"a different model is already named {model!r} "
                              f"({'built in' if not old.user else old.description}); choose another with --name")
        out.append((t, model, paths.models_dir() / f"{model}.gguf"))
    return out


def _same_make(entry: ModelEntry, src: Source, type_name: str) -> bool:
    made = _made_from(entry)
    return made is not None and made[0] == src.sha256 and made[1] == type_name


def _made_from(entry: ModelEntry) -> tuple[str, str] | None:
    """(source sha256, type) of a model this module registered, from the user catalog."""
    from .catalog import read_user_catalog

    rec = read_user_catalog()["models"].get(entry.name)
    if not isinstance(rec, dict) or not isinstance(rec.get("quantized_from"), dict):
        return None
    return str(rec["quantized_from"].get("sha256")), str(rec.get("quant_type"))


def existing(name: str) -> ModelEntry | None:
    """The catalog model ``name`` when its file is there and unchanged since it was hashed."""
    entry = load_catalog().models.get(name)
    if entry is None or check_cached(entry, read=False).state != "trusted":
        return None
    return entry


def make(src: Source, type_name: str, name: str, dest: Path, *, allow_requantize: bool = False, n_threads: int = 0,
         progress: q.Progress | None = None) -> Made:
    """Quantize ``src`` to ``dest`` (unless this very model is there already) and register it as
    ``name``. Interrupted or failed: no file, nothing registered."""
    found = existing(name)
    if found is not None and _same_make(found, src, type_name):
        return Made(found, local_path(found), made=False)
    with _lock(dest):
        for stale in dest.parent.glob(f"{dest.name}.part-*"):  # a killed quantize's, under the lock
            stale.unlink(missing_ok=True)
        _check_free_space(src, dest)
        q.quantize(src.path, dest, type_name, allow_requantize=allow_requantize, n_threads=n_threads,
                   progress=progress)
        sha = filehash.sha256_of(dest)  # recorded in the hash cache: later commands do not re-read it
        entry = register_user_model(name, _record(src, type_name, dest, sha))
    return Made(entry, dest, made=True)


def _lock(dest: Path):
    """The open, locked lock file of ``dest``, this process's PID in it; a home that cannot be
    written (read-only, full) is one ConfigError, before anything else is written."""
    path = paths.home() / "locks" / f"{dest.name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - the caller closes it
    except OSError as e:
        raise ConfigError(f"cannot quantize into {dest.parent}: {describe_write_error(path, e)}") from None
    if not try_lock(fh):
        fh.seek(0)
        held = fh.read().strip() or "?"
        fh.close()
        raise ConfigError(f"{dest.name} is being written by another quantize (pid {held})")
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
    except OSError as e:
        fh.close()
        raise ConfigError(f"cannot quantize into {dest.parent}: {describe_write_error(path, e)}") from None
    return fh


def _record(src: Source, type_name: str, dest: Path, sha: str) -> dict:
    import llama_cpp

    what = "requantized" if src.quantized else "quantized"
    return {
        "file": dest.name,
        "path": str(dest),
        "size": dest.stat().st_size,
        "sha256": sha,
        "role": src.entry.role if src.entry is not None else None,
        "description": f"{src.label} ({src.file_type}) {what} to {type_name} by llama.cpp's quantizer",
        "sources": [{"kind": "path", "path": str(dest)}],
        "quant_type": type_name,
        "quantized_from": {"name": src.label, "file": src.path.name, "path": str(src.path), "sha256": src.sha256,
                           "file_type": src.file_type, "size": src.path.stat().st_size},
        "quantized_with": f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')}",
        "quantized_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def _check_free_space(src: Source, dest: Path) -> None:
    # the output is at most the source's size for every type but an upcast (F32 from F16):
    # ask for the source's size, twice for F32
    need = src.path.stat().st_size * (2 if dest.stem.endswith("-f32") else 1)
    free = short_of_space(dest.parent, need)
    if free is not None:
        raise ConfigError(f"not enough free space in {dest.parent} for {dest.name}: up to {human_size(need)} needed, "
                          f"{human_size(free)} free")
