"""Whether a model may use llama.cpp's extra buffer types on this machine: its weights repacked
at load for the CPU's faster kernels (``CPU_REPACK``) or for Intel AMX tiles (``AMX``).

Why a self-test: on some AMX Xeons llama.cpp's AMX matmul segfaults on any decode of more than
one token (llama.cpp issue #20824; Ollama #17006 and #9061), and whether it does depends on the
CPU, the llama.cpp build and the model's tensor types. So before a model is first loaded on a
machine, a child process loads it with extra buffer types on and decodes a few multi-token
batches; it may die by a signal, this process does not. The verdict is kept per llama.cpp
build, CPU and tensor types (``$EASD_LOCAL_HOME/repack-verdicts.json``), so it costs one extra
load once. A model whose self-test crashed loads with ``use_extra_bufts = false``: the plain
CPU kernels, slower (the README gives the figure) but alive.

``EASD_LOCAL_REPACK_VERDICTS`` names another verdicts file, one that several homes share: the
test suite makes a fresh home per test, and a self-test per model kind per home would cost
minutes; with one file it costs one self-test per model kind per session, decided as here.

``EASD_LOCAL_REPACK_PROBE`` forces the answer: ``crash`` acts as if the self-test had crashed
(the tests simulate an AMX machine this way), ``ok`` as if it had passed (no child runs).

The self-test child is ``python -m easd_local.llamacpp.repack_child MODEL.gguf THREADS NGL``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..fsutil import read_json_dict, update_json
from ..lifeline import child_env
from . import gguf_info
from .cpu import cpu_flags, cpu_name

FORCE_ENV = "EASD_LOCAL_REPACK_PROBE"
VERDICTS_NAME = "repack-verdicts.json"
VERDICTS_ENV = "EASD_LOCAL_REPACK_VERDICTS"  # a verdicts file shared by several homes
PROBE_TIMEOUT_S = 600.0
ISSUE = "llama.cpp #20824"
CHILD = (sys.executable, "-m", "easd_local.llamacpp.repack_child")  # the self-test's command, before its arguments
_CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, signal.SIGSYS)


@dataclass(frozen=True)
class Repack:
    """The decision for one model: whether extra buffer types are used, and why not."""

    extra_bufts: bool
    verdict: str  # "ok", "crash", "flag" (--no-repack), "forced-ok", "forced-crash", "unprobed", "timeout"
    detail: str = ""  # what crashed ("AMX", "CPU_REPACK"), or why no test ran
    seconds: float | None = None  # how long the self-test took (None: none ran now or ever)
    cached: bool = False  # the verdict came from an earlier self-test

    @property
    def note(self) -> str:
        """One line for where placement is shown; empty when repacking is on."""
        if self.extra_bufts:
            return ""
        if self.verdict == "flag":
            return "weight repacking off (--no-repack)"
        if self.verdict == "timeout":
            return f"weight repacking off: llama.cpp's self-test with repacked weights did not finish in {PROBE_TIMEOUT_S:.0f} s"
        kernels = "AMX kernels" if "AMX" in self.detail else "repacked-weight kernels"
        how = f" (simulated: {FORCE_ENV}=crash)" if self.verdict == "forced-crash" else ""
        return f"weight repacking off: llama.cpp's {kernels} crashed on this CPU in a self-test ({ISSUE}){how}"

    def to_dict(self) -> dict:
        return {"extra_bufts": self.extra_bufts, "verdict": self.verdict, "detail": self.detail,
                "seconds": self.seconds, "cached": self.cached, "note": self.note or None}


def decide(path: str | os.PathLike, *, requested: bool | None, threads: int, n_gpu_layers: int,
           rpc: bool = False) -> Repack:
    """Extra buffer types for loading ``path``: ``requested`` False (--no-repack) or True (no
    self-test, as the self-test child itself loads) wins; else the forced or remembered
    verdict; else a self-test now, in a child."""
    if requested is False:
        return Repack(False, "flag")
    if requested is True:
        return Repack(True, "ok", "requested")
    forced = os.environ.get(FORCE_ENV, "").strip().lower()
    if forced == "crash":
        return Repack(False, "forced-crash")
    if forced == "ok":
        return Repack(True, "forced-ok")
    key = verdict_key(path, n_gpu_layers)
    known = _load_verdicts().get(key)
    if known:
        return Repack(known["verdict"] == "ok", known["verdict"], known.get("detail", ""), known.get("seconds"),
                      cached=True)
    if rpc:
        # a model split over RPC servers may not fit here at all: no self-test of it alone
        return Repack(True, "unprobed", "--rpc")
    result = self_test(path, threads=threads, n_gpu_layers=n_gpu_layers)
    if result.verdict in ("ok", "crash"):
        _remember(key, path, result)
    return result


def self_test(path: str | os.PathLike, *, threads: int, n_gpu_layers: int) -> Repack:
    """Load ``path`` with extra buffer types on in a child and decode; the child may crash."""
    cmd = [*CHILD, str(path), str(threads), str(n_gpu_layers)]
    env = {k: v for k, v in child_env().items() if k not in ("EASD_LOCAL_CRASH_NOTE",)}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return Repack(False, "timeout", seconds=time.monotonic() - t0)
    seconds = round(time.monotonic() - t0, 2)
    report = {}
    for line in proc.stdout.splitlines():
        try:
            report.update(json.loads(line))
        except ValueError:
            continue
    used = ",".join(report.get("extra_buffers", [])) or "none"
    if proc.returncode < 0 and -proc.returncode in _CRASH_SIGNALS:
        return Repack(False, "crash", f"{used}; {signal.Signals(-proc.returncode).name}", seconds)
    if proc.returncode in (-signal.SIGINT, 130):
        raise KeyboardInterrupt
    if proc.returncode == 0 and report.get("decoded"):
        return Repack(True, "ok", used, seconds)
    # the child could not load or decode for another reason (the real load will say why)
    return Repack(True, "unprobed", f"self-test failed: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}",
                  seconds)


# ------------------------------------------------------------------ verdicts on disk
def verdict_key(path: str | os.PathLike, n_gpu_layers: int) -> str:
    """What the crash can depend on: llama.cpp's build, the CPU, the model's tensor types (and
    whether layers leave the CPU)."""
    from .devices import ggml_build, gpu_offload_supported, system_info

    types = sorted(gguf_info.read_gguf_info(path).tensor_types)
    offload = n_gpu_layers if gpu_offload_supported() else 0
    parts = [json.dumps(ggml_build(), sort_keys=True), system_info(), cpu_name(), " ".join(cpu_flags()),
             ",".join(types), f"ngl={offload}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def verdicts_path() -> Path:
    shared = os.environ.get(VERDICTS_ENV, "").strip()
    return Path(shared).expanduser() if shared else paths.home() / VERDICTS_NAME


def _load_verdicts() -> dict:
    return read_json_dict(verdicts_path())


def _remember(key: str, path: str | os.PathLike, r: Repack) -> None:
    verdict = {"verdict": r.verdict, "detail": r.detail, "seconds": r.seconds, "model": Path(path).name,
               "tensor_types": sorted(gguf_info.read_gguf_info(path).tensor_types), "cpu": cpu_name(),
               "date": time.strftime("%Y-%m-%d")}
    try:
        update_json(verdicts_path(), lambda data: data.update({key: verdict}))
    except OSError:
        pass  # a read-only home: the self-test runs again next time, nothing worse


def known_verdicts() -> dict:
    """Every remembered verdict (for ``doctor``)."""
    return _load_verdicts()


def extra_buffers(model_buffers) -> list[str]:
    """The extra buffer types among a load's weight buffers (``CPU_REPACK``, ``AMX``): every
    CPU-side one but the plain and the mmapped."""
    return [b for b in model_buffers if b.upper().startswith(("CPU_", "AMX")) and b not in ("CPU_Mapped",)]
