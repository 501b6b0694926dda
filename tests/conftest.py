"""Shared pytest fixtures: the tiny deterministic GGUF model set.

``scripts/make_tiny_pair.py`` is not a package, so it is imported by path.  Its
constants (VOCAB_SIZE, EOG_IDS, ODD_FIRST_DIFF_ID, ...) are available through
the ``tiny_spec`` fixture or ``tests.conftest.make_tiny_pair``.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from easd_local.llamacpp import repack

REPO_ROOT = Path(__file__).resolve().parents[1]
_SCRIPT = REPO_ROOT / "scripts" / "make_tiny_pair.py"


def _load_make_tiny_pair():
    name = "make_tiny_pair"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


make_tiny_pair = _load_make_tiny_pair()

# The busy-CPU hint reads the load average; the suite's outputs must not depend on what else the
# machine runs, so it reads an idle one (tests/test_first_run.py injects busy ones).
os.environ.setdefault("EASD_LOCAL_LOADAVG", "0")
# Weight repacking is decided as the product decides it (issue 43): a real self-test in a child
# process the first time a kind of model (llama.cpp build, CPU, tensor types) is loaded, its
# verdict remembered. Every process of the session, this one and the CLIs it starts, keeps the
# verdicts in one file: the suite makes a fresh home per test, and a self-test per kind per home
# would cost minutes. Nothing is forced here; a test that needs a verdict sets it itself
# (tests/test_repack.py), and one a user sets for the whole run is honoured and shown.
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="easd-local-tests-"))
os.environ[repack.VERDICTS_ENV] = str(_SESSION_DIR / repack.VERDICTS_NAME)


@functools.cache
def _session_tiny_models() -> dict[str, Path]:
    return make_tiny_pair.write_tiny_models(_SESSION_DIR / "tiny", seed=0)


@functools.cache
def _tiny_verdicts() -> dict[str, repack.Repack]:
    """The tiny set's verdicts, decided (and so self-tested) once at the start of the session."""
    from easd_local.llamacpp.runtime import LoadOptions

    ngl = LoadOptions().n_gpu_layers
    return {key: repack.decide(path, requested=None, threads=2, n_gpu_layers=ngl)
            for key, path in _session_tiny_models().items()}


def tiny_repack_off() -> bool:
    """Whether this CPU's self-test turned weight repacking off for the tiny pair (an AMX Xeon
    where llama.cpp #20824 bites): commands then say so once, in a line of its own."""
    verdicts = _tiny_verdicts()
    return not (verdicts["draft"].extra_bufts and verdicts["target"].extra_bufts)


def without_repack_note(lines: list[str]) -> list[str]:
    """``lines`` less the one repacking note, which must be there exactly when this CPU's
    self-test turned repacking off for the tiny pair (never forced: the machine decides)."""
    notes = [i for i, ln in enumerate(lines) if "weight repacking off: llama.cpp" in ln]
    assert len(notes) == (1 if tiny_repack_off() else 0), lines
    return [ln for i, ln in enumerate(lines) if i not in notes]


def repack_line() -> str:
    """The CPU's AMX and AVX flags and the weight-repacking verdicts the suite runs with."""
    from easd_local.llamacpp import gguf_info
    from easd_local.llamacpp.cpu import cpu_flags, cpu_name
    from easd_local.llamacpp.devices import system_info

    flags = cpu_flags()
    amx = " ".join(f for f in flags if f.startswith("amx")) or "none"
    avx = " ".join(f for f in flags if f.startswith("avx")) or "none"
    built = dict(re.findall(r"\b(AMX_INT8|REPACK) = (\d)", system_info()))
    info = ", ".join(f"{k} = {built.get(k, 'not built')}" for k in ("AMX_INT8", "REPACK"))
    kinds = {}
    for key, r in _tiny_verdicts().items():
        types = "+".join(t for t in sorted(gguf_info.read_gguf_info(_session_tiny_models()[key]).tensor_types)
                         if t != "F32")
        how = f"{r.verdict}" + (f" ({r.detail})" if r.verdict not in ("ok",) and r.detail else "")
        kinds.setdefault(f"{types} {how}", []).append(key)
    verdicts = "; ".join(f"{'/'.join(keys)} {what}" for what, keys in kinds.items())
    forced = os.environ.get(repack.FORCE_ENV)
    return (f"repack: cpu {cpu_name()}; AMX flags: {amx}; AVX flags: {avx}; llama.cpp {info}; "
            f"tiny-set verdicts: {verdicts}" + (f" (forced by {repack.FORCE_ENV}={forced})" if forced else ""))


def pytest_sessionstart(session):
    line = repack_line()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and session.config.get_verbosity() < 0:  # -q hides the header: say it anyway
        reporter.write_line(line)


def pytest_terminal_summary(terminalreporter):
    """Every model kind the session self-tested, with its verdict (the realistic pair's too)."""
    try:
        import json

        known = json.loads(Path(os.environ[repack.VERDICTS_ENV]).read_text())
    except (KeyError, OSError, ValueError):
        return
    terminalreporter.write_line("repack verdicts this session: " + "; ".join(
        f"{v.get('model')} ({','.join(v.get('tensor_types', []))}) {v.get('verdict')}"
        + (f" ({v['detail']})" if v.get("verdict") != "ok" and v.get("detail") else "")
        for v in known.values()))


def pytest_unconfigure(config):
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_spec():
    """The ``make_tiny_pair`` module (constants: VOCAB_SIZE, EOG_IDS, ODD_FIRST_DIFF_ID, ...)."""
    return make_tiny_pair


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """Paths of the tiny model set (seed 0): keys draft, target, target_q4, odd. Written once
    per session, at its start, where their self-tests ran."""
    return _session_tiny_models()


@pytest.fixture(scope="session")
def realistic_models(tmp_path_factory) -> dict[str, Path]:
    """The realistic-shape pair (512 wide; Q4_K_M target, Q5_0 and Q8_0 drafts, F16 sources):
    shapes and types that take llama.cpp's repacked (and, on AMX CPUs, AMX) kernels."""
    out = tmp_path_factory.mktemp("realistic")
    return make_tiny_pair.write_realistic_models(out, seed=0)


@pytest.fixture(scope="session")
def wide_models(tmp_path_factory) -> dict[str, Path]:
    """The wide pair: the tiny pair's weights and tokens with the default pair's 151,936-token
    vocabulary (fillers far below the head): keys draft, target (Q8_0, about 45 MB each)."""
    out = tmp_path_factory.mktemp("wide")
    return make_tiny_pair.write_wide_models(out, seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tiny_models) -> Path:
    return tiny_models["draft"]


@pytest.fixture(scope="session")
def tiny_target(tiny_models) -> Path:
    return tiny_models["target"]


@pytest.fixture(scope="session")
def tiny_target_q4(tiny_models) -> Path:
    return tiny_models["target_q4"]


@pytest.fixture(scope="session")
def tiny_odd(tiny_models) -> Path:
    return tiny_models["odd"]


@pytest.fixture
def easd_home(tmp_path, monkeypatch) -> Path:
    """A fresh EASD_LOCAL_HOME under tmp_path and the built-in catalog only."""
    home = tmp_path / "home"
    monkeypatch.setenv("EASD_LOCAL_HOME", str(home))
    monkeypatch.delenv("EASD_LOCAL_CATALOG", raising=False)
    return home


def pytest_report_header(config):
    """Say up front which weight-repacking path is tested, and whether the --rpc tests
    (tests/test_rpc.py) can run or will skip."""
    from easd_local.llamacpp import rpc

    folder = rpc.backend_dir()
    if (folder / rpc.SERVER_NAME).is_file() and (folder / rpc.LIB_NAME).is_file():
        line = f"rpc: llama.cpp RPC backend and rpc-server in {folder}"
    else:
        line = f"rpc: no RPC backend built in {folder}: --rpc tests skip (python scripts/build_rpc.py builds it)"
    return [repack_line(), line]
