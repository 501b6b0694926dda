"""What ``easd-local pair costs`` measured on this machine, on disk: one entry per machine
(llama.cpp build, CPU), thread count, offload, repacking and pair of files, in
``$EASD_LOCAL_HOME/pair-costs.json``. The default mode reads it (``engine.ways.choose``)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .. import paths
from ..fsutil import read_json_dict, update_json

COSTS_NAME = "pair-costs.json"


def costs_path() -> Path:
    return paths.home() / COSTS_NAME


def costs_key(draft: Path | None, target: Path, n_threads: int | None, n_gpu_layers: int,
              repack: bool | None) -> str:
    """What the speeds depend on: the build and the CPU, the threads, offload and repacking,
    and the files (by name, size and modification time: a re-downloaded file is measured
    again)."""
    from ..llamacpp.cpu import cpu_flags, cpu_name
    from ..llamacpp.devices import ggml_build, gpu_offload_supported, system_info

    def file_part(p: Path | None) -> str:
        if p is None:
            return "-"
        st = Path(p).stat()
        return f"{Path(p).name}:{st.st_size}:{int(st.st_mtime)}"

    threads = n_threads or os.cpu_count() or 1
    offload = n_gpu_layers if gpu_offload_supported() else 0
    parts = [json.dumps(ggml_build(), sort_keys=True), system_info(), cpu_name(), " ".join(cpu_flags()),
             f"threads={threads}", f"ngl={offload}", f"repack={repack}", file_part(target), file_part(draft)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _load() -> dict:
    return read_json_dict(costs_path())


def find(key: str) -> dict[str, Any] | None:
    entry = _load().get(key)
    return entry if isinstance(entry, dict) and isinstance(entry.get("ratios"), dict) else None


def record(key: str, entry: dict[str, Any]) -> Path:
    return update_json(costs_path(), lambda data: data.update({key: entry}))
