"""The machine's cores and how busy they are: the CLI's thread default and the busy-CPU hint.

Why a hint: llama.cpp's threads wait for each other at every matrix product, so when other
processes hold the cores a reply can run ten times slower with nothing to show why (load 2.3 to
4.3 on 2 cores gave 0.5 tok/s). The load average is the kernel's count of runnable threads, so
a figure above the number of cores means threads are queuing for them.

``EASD_LOCAL_LOADAVG`` replaces the reading (the tests inject a load instead of spinning the CPU).
"""

from __future__ import annotations

import os
from pathlib import Path

LOAD_ENV = "EASD_LOCAL_LOADAVG"
# after a reply the 1-minute average also counts our own threads and Python's: allow that much
# above the cores before calling the CPU busy
OWN_SLACK = 0.75


def cores() -> int:
    """The logical CPUs this process may run on (a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def physical_cores() -> int:
    """Cores, not hyperthreads, among those this process may use: llama.cpp's own default for
    --threads (two threads on one core share its matrix units and gain little). Where the
    topology cannot be read, every logical CPU."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return cores()
    seen = set()
    for cpu in allowed:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            seen.add((topo.joinpath("physical_package_id").read_text().strip(),
                      topo.joinpath("core_id").read_text().strip()))
        except OSError:
            return cores()
    return len(seen) or cores()


def load() -> float | None:
    """The 1-minute load average (None where the system has none)."""
    forced = os.environ.get(LOAD_ENV, "").strip()
    if forced:
        try:
            return float(forced)
        except ValueError:
            pass
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_note(*readings: tuple[float | None, bool]) -> str:
    """'CPU busy: load 3.9 on 2 cores' when a reading is above the cores, else ''. Each reading
    is (load, whether our own threads were running): one taken before loading counts only
    others, one taken after a reply counts ours too and gets ``OWN_SLACK``."""
    n = cores()
    over = [ld for ld, ours in readings if ld is not None and ld > n + (OWN_SLACK if ours else 0.0)]
    return f"CPU busy: load {max(over):.1f} on {n} core{'s' if n != 1 else ''}" if over else ""
