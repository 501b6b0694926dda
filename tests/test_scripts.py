"""The measurement scripts the README quotes still start: each imports what it needs from
the package and prints its usage. A layout move once left four of them importing modules
that had moved (and CI's RPC backend unbuilt, so the --rpc tests skipped); nothing else
runs them in CI, since they need the default pair."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


def test_scripts_are_found():
    assert {"bench_modes.py", "build_rpc.py", "make_tiny_pair.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_prints_its_usage(script):
    r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage" in r.stdout.lower(), r.stdout[-2000:]
    assert "Traceback" not in r.stderr
