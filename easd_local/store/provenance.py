"""What produced a result: the environment and the model files.

Greedy decoding reproduces only up to the first near-tie, and where near-ties fall depends
on the llama.cpp build, the CPU's instruction set, the thread count, batch shapes and
offload. So every result (bench rows, ``generate --json``, a server's statistics) carries
a :class:`Provenance`: an :class:`Environment` (everything but the models) and the
draft's and target's files by sha256.

Two results come from the same environment when every field of :class:`Environment` is
equal; ``env_id`` is a short hash of those fields. A row records its ``env_id`` as it was
computed then, so a field added here later does not change the ids of old rows; compare
environments field by field with :func:`env_difference`.

Nothing here prints. The machine id is a salted hash of ``/etc/machine-id`` (else of the
host name and MAC address), never the raw host name.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .. import __version__
from . import filehash
from ..llamacpp.cpu import cpu_name
from ..llamacpp.devices import backends, gpu_offload_supported, system_info
from ..llamacpp.runtime import LoadOptions

UNKNOWN_ENV = "unknown"  # how reports name the environment of rows written before provenance


@dataclass(frozen=True)
class Environment:
    """Everything about a run that can move logits, except the model files."""

    easd_local: str  # package version
    git_commit: str | None  # of the checkout easd_local runs from (None: installed from a wheel)
    git_dirty: bool | None  # the checkout's easd_local/ or pyproject.toml differs from the commit
    llama_cpp_python: str
    llama_system_info: str  # llama_print_system_info(): backends and the CPU features compiled in
    backend: str  # e.g. "CPU", "CUDA+CPU", "Metal+CPU"
    cpu: str  # the CPU model as the OS names it
    machine_id: str  # salted hash, 12 hex digits
    n_ctx: int
    threads: int
    n_batch: int
    n_ubatch: int
    flash_attn: bool
    n_gpu_layers: int  # target; 0 on a build that cannot offload (the flag is ignored there)
    n_gpu_layers_draft: int
    main_gpu: int | None  # None on a build that cannot offload
    parallel: int = 1  # sequences decoded together (batched engine); 1 = one at a time
    rpc: tuple[str, ...] = ()  # llama.cpp RPC servers holding target layers
    rpc_draft: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()
    no_repack: bool = False  # --no-repack: llama.cpp's extra buffer types (repacked weights) off
    no_mmap: bool = False  # --no-mmap: the weights read into memory, not mapped (decode speed differs)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("rpc", "rpc_draft", "tensor_split", "no_repack", "no_mmap"):
            # absent when unused, so that environments without RPC keep their env_id
            if not d[key]:
                del d[key]
            elif isinstance(d[key], tuple):
                d[key] = list(d[key])
        return d

    @property
    def env_id(self) -> str:
        return env_id(self.to_dict())

    def load_options(self, *, draft: bool = False) -> LoadOptions:
        """The llama.cpp options that reproduce this environment's contexts."""
        return LoadOptions(
            n_ctx=self.n_ctx, n_threads=self.threads,
            n_gpu_layers=self.n_gpu_layers_draft if draft else self.n_gpu_layers,
            flash_attn=self.flash_attn, main_gpu=self.main_gpu or 0, n_batch=self.n_batch,
            rpc=self.rpc_draft if draft else self.rpc, tensor_split=() if draft else self.tensor_split,
            extra_bufts=False if self.no_repack else None, mmap=not self.no_mmap,
        )


@dataclass(frozen=True)
class ModelFile:
    file: str  # the file name (not the path: paths differ across machines and name users)
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Provenance:
    env: Environment
    draft: ModelFile | None
    target: ModelFile | None

    def to_dict(self) -> dict[str, Any]:
        """The stored form: ``{"env_id", "env": {...}, "draft": {file, size, sha256} | null,
        "target": {...} | null}``."""
        return {
            "env_id": self.env.env_id,
            "env": self.env.to_dict(),
            "draft": self.draft.to_dict() if self.draft else None,
            "target": self.target.to_dict() if self.target else None,
        }


def env_id(env: Mapping[str, Any]) -> str:
    """Short stable hash of an environment's fields (12 hex digits)."""
    text = json.dumps(dict(env), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def env_difference(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """The fields whose values differ, e.g. ``["threads 2 -> 1", "git_commit 1a2b3c4 ->
    5d6e7f8"]``; long values (the system info) are named, not shown."""
    if old is None or new is None:
        return ["environment unknown (written before provenance)"]
    out = []
    for key in list(dict.fromkeys([*new, *old])):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "git_commit":
            a, b = (str(v)[:7] if v else v for v in (a, b))
        if any(isinstance(v, str) and len(v) > 24 for v in (a, b)):
            out.append(f"{key} differs")
        else:
            out.append(f"{key} {_show(a)} -> {_show(b)}")
    return out


def _show(v: Any) -> str:
    return "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


# ------------------------------------------------------------------------ the parts


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout easd_local is imported from; (None, None) when
    it is not a checkout (an installed wheel) or git is missing."""
    root = Path(__file__).resolve().parents[2]  # easd_local/store/provenance.py -> the checkout
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
        return None, None

    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20,
                           env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
        if r.returncode != 0:
            raise subprocess.SubprocessError(r.stderr)
        return r.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        # the code only: results files and notes elsewhere in the checkout do not make it dirty
        dirty = bool(git("status", "--porcelain", "--", "easd_local", "pyproject.toml"))
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, dirty


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the OS has none). Not part of the
    environment: it is a circumstance of a row, not what produced it, but tokens/s compare
    only between rows made under like loads. Read afresh at every call (a row's own load)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


@functools.lru_cache(maxsize=1)
def machine_id() -> str:
    """A short stable id of this machine: a hash salted with "easd-local" (so it matches no
    other tool's) of /etc/machine-id, else of the host name and MAC address."""
    raw = ""
    for f in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            raw = Path(f).read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue
        if raw:
            break
    if not raw:
        raw = f"{socket.gethostname()}|{uuid.getnode():012x}"
    return hashlib.sha256(f"easd-local|{raw}".encode()).hexdigest()[:12]


def _llama_cpp_python_version() -> str:
    import llama_cpp

    return str(getattr(llama_cpp, "__version__", "unknown"))


def environment(target_opts: LoadOptions, draft_opts: LoadOptions | None = None, *, parallel: int = 1) -> Environment:
    """The environment that models loaded with these options run in (nothing is loaded)."""
    draft_opts = draft_opts or target_opts
    info = system_info()
    offload = gpu_offload_supported()
    commit, dirty = git_state()
    n_batch, n_ubatch = target_opts.batch_sizes()
    return Environment(
        easd_local=__version__,
        git_commit=commit,
        git_dirty=dirty,
        llama_cpp_python=_llama_cpp_python_version(),
        llama_system_info=info,
        backend="+".join(backends(info)) or "unknown",
        cpu=cpu_name(),
        machine_id=machine_id(),
        n_ctx=target_opts.n_ctx,
        threads=target_opts.threads(),
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        flash_attn=bool(target_opts.flash_attn),
        n_gpu_layers=target_opts.n_gpu_layers if offload or target_opts.rpc else 0,
        n_gpu_layers_draft=draft_opts.n_gpu_layers if offload or draft_opts.rpc else 0,
        main_gpu=target_opts.main_gpu if offload else None,
        parallel=parallel,
        rpc=target_opts.rpc,
        rpc_draft=draft_opts.rpc,
        tensor_split=target_opts.tensor_split,
        no_repack=target_opts.extra_bufts is False,
        no_mmap=not target_opts.mmap,
    )


def model_file(path: str | os.PathLike, *, progress: filehash.Progress | None = None) -> ModelFile:
    """A model file by name, size and sha256 (hashed once per file: ``filehash``)."""
    p = Path(path).expanduser()
    return ModelFile(p.name, p.stat().st_size, filehash.sha256_of(p, progress=progress))


def collect(
    draft: str | os.PathLike | None,
    target: str | os.PathLike | None,
    target_opts: LoadOptions,
    draft_opts: LoadOptions | None = None,
    *,
    parallel: int = 1,
    env: Environment | None = None,
) -> Provenance:
    """The provenance of results made with these files and options (what ``generate
    --json``, bench rows and a server's statistics record)."""
    return Provenance(
        env=env or environment(target_opts, draft_opts, parallel=parallel),
        draft=model_file(draft) if draft is not None else None,
        target=model_file(target) if target is not None else None,
    )
