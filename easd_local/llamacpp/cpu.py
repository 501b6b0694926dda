"""The CPU as the operating system names it, and its feature flags: what a result's
provenance records and what llama.cpp's kernel choice (and a kernel's crash) depends on."""

from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path


def _cpuinfo_field(*names: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(names):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    name = _cpuinfo_field("model name", "hardware", "cpu model")
    if name:
        return name
    if platform.system() == "Darwin":
        try:
            r = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5)
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


@functools.lru_cache(maxsize=1)
def cpu_flags() -> tuple[str, ...]:
    """The CPU's feature flags (Linux ``flags`` / Arm ``Features``), sorted; () where unknown."""
    flags = _cpuinfo_field("flags", "features")
    return tuple(sorted(set(flags.split()))) if flags else ()


def has_amx() -> bool:
    """Whether the CPU has Intel AMX tiles (the kernels of llama.cpp #20824)."""
    return any(f.startswith("amx") for f in cpu_flags())
