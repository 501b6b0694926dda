"""``easd-local doctor``: everything about this install that decides whether ``chat`` will run
and how fast, gathered in one place for the user and for bug reports. Nothing here prints: it
returns the facts, and whether the default pair is ready, with what to do if it is not.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, host, paths
from .llamacpp import devices, repack, rpc
from .llamacpp.cpu import cpu_name, has_amx
from .store.catalog import load_catalog, local_path
from .store.provenance import git_state
from .store.pull import check_cached
from .units import human_size

PRESENT = {"trusted": "yes, sha256 verified (stamp unchanged)", "unverified": "yes, not verified since it changed",
           "missing": "no", "wrong-size": "no (wrong size)", "corrupt": "CORRUPT (sha256 differs)"}


@dataclass
class Report:
    fields: dict = field(default_factory=dict)  # name -> value (str, list or dict), in display order
    problems: list[str] = field(default_factory=list)  # what stops `chat`, each with what to do

    @property
    def ready(self) -> bool:
        return not self.problems


def diagnose(*, self_test: bool = True) -> Report:
    r = Report()
    f = r.fields
    commit, dirty = git_state()
    f["easd-local"] = __version__ + (f" (git {commit[:10]}{', modified' if dirty else ''})" if commit else "")
    f["llama-cpp-python"] = rpc.llama_cpp_python_version()
    build = devices.ggml_build()
    f["ggml"] = f"{build['ggml_version']} (commit {build['ggml_commit']})"
    f["python"] = f"{platform.python_version()} on {platform.system()} {platform.machine()}"
    f["cpu"] = f"{cpu_name()} ({os.cpu_count()} logical cores{', AMX' if has_amx() else ''})"
    f["load"] = _load_state()
    info = devices.system_info()
    f["llama.cpp system info"] = info
    f["backends"] = ", ".join(devices.backends(info)) or "none"
    f["gpu offload"] = "yes" if devices.gpu_offload_supported() else "no (a CPU-only build; docs/cpus-and-gpus.md says how to build for a GPU)"
    f["devices"] = [f"{d['name']} ({d['kind']}): {d['description']}" for d in devices.list_devices()]
    f["rpc backend"] = _rpc_state()

    home = paths.home()
    f["home"] = str(home)
    try:
        free = shutil.disk_usage(home if home.exists() else home.parent).free
        f["free space"] = human_size(free)
    except OSError as e:
        f["free space"] = f"unknown ({e.strerror or e})"
    if home.exists() and not os.access(home, os.W_OK):
        r.problems.append(f"{home} is not writable: set EASD_LOCAL_HOME to a folder you can write")

    cat = load_catalog()
    states = {}
    models = []
    for m in cat.models.values():
        states[m.name] = check_cached(m, read=False).state
        models.append(f"{m.name} ({human_size(m.size)}): {PRESENT.get(states[m.name], states[m.name])}")
    f["models"] = models
    pair = cat.pairs.get(cat.default_pair_name) if cat.default_pair_name else None
    if pair is None:
        r.problems.append("the catalog names no default pair: give --pair or -md/-m to every command")
        return r
    f["default pair"] = f"{pair.name}: draft {pair.draft.name}, target {pair.target.name}" + (
        "; calibrated thresholds shipped" if pair.profile else "")
    missing = [m for m in (pair.draft, pair.target) if states.get(m.name) not in ("trusted", "unverified")]
    for m in missing:
        state = states.get(m.name, "missing")
        do = "easd-local pull" + ("" if pair.name == cat.default_pair_name else f" {m.name}")
        r.problems.append(f"{m.name} is {'corrupt' if state == 'corrupt' else 'not downloaded'}: run `{do}`")
    if not missing:
        f["default mode"] = default_way(local_path(pair.draft), local_path(pair.target))
    tests = []
    for role, m in (("target", pair.target), ("draft", pair.draft)):
        if m in missing:
            tests.append(f"{role} {m.name}: not run (model not downloaded)")
            continue
        if not self_test:
            tests.append(f"{role} {m.name}: not run (--no-self-test)")
            continue
        d = repack.decide(local_path(m), requested=None, threads=os.cpu_count() or 4, n_gpu_layers=-1)
        if d.verdict.startswith("forced"):
            how = f"forced by {repack.FORCE_ENV}"
        else:
            took = f"self-test took {d.seconds:.1f} s" if d.seconds is not None else "no self-test"
            how = took + (", remembered from an earlier run" if d.cached else ", run now")
        said = d.note or f"weight repacking on ({d.detail or 'no extra buffers'})"
        tests.append(f"{role} {m.name}: {d.verdict} · {said} · {how}")
    f["self-test"] = tests
    f["verdicts file"] = str(repack.verdicts_path())
    return r


def default_way(draft: Path, target: Path) -> str:
    """What ``chat``, ``generate`` and ``serve`` run on this pair with no --mode and the default
    threads and offload, and why: the fastest lossless way `easd-local pair costs` recorded on
    this machine, with when (``ways.auto_mode``), or that nothing was measured."""
    from .engine.ways import auto_mode
    from .store import costs

    try:
        m = costs.find(costs.costs_key(draft, target, None, -1, None))
    except OSError as e:
        return f"unknown ({e.strerror or e})"
    c = auto_mode(devices.gpu_offload_supported(), True, m)
    return f"{c.way}: {c.why}"


def _load_state() -> str:
    """The load now against the cores, and the thread default it competes with."""
    ld = host.load()
    busy = host.busy_note((ld, False))
    if busy:
        now = f"{busy} (1-minute average): replies will be slower until it falls"
    else:
        now = "unknown" if ld is None else f"{ld:.1f} (1-minute average) on {host.cores()} cores"
    return f"{now} · threads by default: {host.physical_cores()} (physical cores)"


def _rpc_state() -> str:
    folder = rpc.backend_dir()
    if (folder / rpc.LIB_NAME).is_file() and (folder / rpc.SERVER_NAME).is_file():
        return f"built ({folder})"
    return "not built: --rpc needs `python scripts/build_rpc.py` (optional)"

