"""llama.cpp's log: captured (quiet unless --verbose), and read for what llama.cpp states only
there: why a load failed, which device took each layer, how much memory the buffers took.

Part of the runtime layer (with ``runtime``, ``devices`` and ``vocab``): the only modules that
touch ctypes. ``load_errors`` (pure string work) turns the captured lines into one reason.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import llama_cpp as _ll

from .load_errors import load_failure_reason


class LogSink:
    """Receives llama.cpp's log. Quiet by default; keeps the tail so that a failed load
    can say *why* (llama.cpp returns NULL and explains only in its log)."""

    def __init__(self) -> None:
        self.verbose = False
        self.tail: deque[str] = deque(maxlen=64)
        self._lock = threading.Lock()
        self._partial = ""
        self.layer_devices: list[str] = []  # device of each layer, in order, since mark()
        self.buffer_lines: list[str] = []  # llama.cpp's "... buffer size = N MiB" lines since mark()
        # keep a reference: ctypes callbacks must outlive their registration
        self._cb = _ll.llama_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        s = text.decode("utf-8", errors="replace") if text else ""
        if self.verbose:
            try:
                os.write(2, s.encode("utf-8", errors="replace"))
            except OSError:
                pass
        with self._lock:
            self._partial += s
            while "\n" in self._partial:
                line, self._partial = self._partial.split("\n", 1)
                if line.strip():
                    self.tail.append(line.strip())
                # llama.cpp states each layer's device only in its (debug) log:
                # "load_tensors: layer   3 assigned to device RPC0, is_swa = 0"
                if line.startswith("load_tensors: layer ") and " assigned to device " in line:
                    self.layer_devices.append(line.split(" assigned to device ", 1)[1].split(",", 1)[0].strip())
                # and the memory it takes: "llama_kv_cache:        CPU KV buffer size =     0.50 MiB"
                elif " buffer size = " in line:
                    self.buffer_lines.append(line.strip())

    def mark(self) -> int:
        with self._lock:
            self.tail.clear()
            self._partial = ""
            self.layer_devices = []
            self.buffer_lines = []
        return 0

    def errors(self) -> list[str]:
        with self._lock:
            lines = list(self.tail) + ([self._partial.strip()] if self._partial.strip() else [])
        keys = ("error", "failed", "unknown", "invalid", "not within", "corrupt", "unsupported")
        return [ln for ln in lines if any(k in ln.lower() for k in keys)]

    def load_failure(self, path: Path) -> str:
        """Why llama.cpp could not load ``path``, in one line, from what it logged since mark()."""
        with self._lock:
            tail = list(self.tail)
        return load_failure_reason(path, path.stat().st_size, self.errors(), tail)


_SINK: LogSink | None = None
_INIT_LOCK = threading.Lock()


def ensure_backend(verbose: bool) -> LogSink:
    """Initialise llama.cpp once per process with its log routed to the one LogSink."""
    global _SINK
    with _INIT_LOCK:
        if _SINK is None:
            _SINK = LogSink()
            _ll.llama_log_set(_SINK._cb, ctypes.c_void_p(0))
            _ll.llama_backend_init()
        _SINK.verbose = verbose
        return _SINK


def sink() -> LogSink:
    """The process's LogSink (initialising llama.cpp, quiet, if nothing has yet)."""
    return _SINK or ensure_backend(False)


# --------------------------------------------------------------------------- memory
_BUFFER = re.compile(r"(\S+)\s+(model|KV|compute) buffer size =\s*([\d.]+) MiB")


@dataclass(frozen=True)
class LoadMemory:
    """What a loaded model takes, as llama.cpp's load log says it (its MiB, in bytes here)."""

    model_bytes: int  # weights buffers ("model buffer size"), all devices
    kv_bytes: int  # KV cache buffers ("KV buffer size")
    compute_bytes: int  # compute buffers ("compute buffer size")
    model_buffers: tuple[str, ...] = ()  # the weights' buffer types: CPU_Mapped, CPU_REPACK, AMX, CUDA0...


def parse_buffers(lines: Sequence[str]) -> LoadMemory:
    """LoadMemory from llama.cpp's "... buffer size = N MiB" lines (pure: tested without a GPU)."""
    sizes = {"model": 0.0, "KV": 0.0, "compute": 0.0}
    weights: list[str] = []
    for ln in lines:
        m = _BUFFER.search(ln)
        if m:
            sizes[m.group(2)] += float(m.group(3))
            if m.group(2) == "model" and m.group(1) not in weights:
                weights.append(m.group(1))
    mib = 1 << 20
    return LoadMemory(model_bytes=int(sizes["model"] * mib), kv_bytes=int(sizes["KV"] * mib),
                      compute_bytes=int(sizes["compute"] * mib), model_buffers=tuple(weights))
