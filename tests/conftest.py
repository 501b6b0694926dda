"""Shared pytest fixtures: the tiny deterministic GGUF model set.

``scripts/make_tiny_pair.py`` is not a package, so it is imported by path.  Its
constants (VOCAB_SIZE, EOG_IDS, ODD_FIRST_DIFF_ID, ...) are available through
the ``tiny_spec`` fixture or ``tests.conftest.make_tiny_pair``.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

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

# Loading a model first runs llama.cpp's weight-repacking self-test in a child process, once per
# home; the suite makes many fresh homes, so it says "passed" here. tests/test_repack.py unsets
# it to run the real self-test (and sets "crash" to simulate an AMX machine).
os.environ.setdefault("EASD_LOCAL_REPACK_PROBE", "ok")
# The busy-CPU hint reads the load average; the suite's outputs must not depend on what else the
# machine runs, so it reads an idle one (tests/test_first_run.py injects busy ones).
os.environ.setdefault("EASD_LOCAL_LOADAVG", "0")


@pytest.fixture(scope="session")
def tiny_spec():
    """The ``make_tiny_pair`` module (constants: VOCAB_SIZE, EOG_IDS, ODD_FIRST_DIFF_ID, ...)."""
    return make_tiny_pair


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Paths of the tiny model set (seed 0): keys draft, target, target_q4, odd."""
    out = tmp_path_factory.mktemp("tiny")
    return make_tiny_pair.write_tiny_models(out, seed=0)


@pytest.fixture(scope="session")
def realistic_models(tmp_path_factory) -> dict[str, Path]:
    """The realistic-shape pair (512 wide; Q4_K_M target, Q5_0 and Q8_0 drafts, F16 sources):
    shapes and types that take llama.cpp's repacked (and, on AMX CPUs, AMX) kernels."""
    out = tmp_path_factory.mktemp("realistic")
    return make_tiny_pair.write_realistic_models(out, seed=0)


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
    """Say up front whether the --rpc tests (tests/test_rpc.py) can run or will skip."""
    from easd_local.engine import rpc

    folder = rpc.backend_dir()
    if (folder / rpc.SERVER_NAME).is_file() and (folder / rpc.LIB_NAME).is_file():
        return f"rpc: llama.cpp RPC backend and rpc-server in {folder}"
    return f"rpc: no RPC backend built in {folder}: --rpc tests skip (python scripts/build_rpc.py builds it)"
