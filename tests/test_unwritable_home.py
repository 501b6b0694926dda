"""An EASD_LOCAL_HOME that cannot be written (read-only, full, or a file in its way): the
commands that only read it work, and one that must write says so in one line, after showing
what it measured. Real processes, as the console script runs them; the home is made unwritable
by a file where a folder goes, which fails as a read-only mount does, without mounting one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from easd_local.store import costs as store

EASD = [sys.executable, "-m", "easd_local"]


def _run(args, home):
    return subprocess.run(EASD + [str(a) for a in args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "EASD_LOCAL_HOME": str(home)})


@pytest.mark.parametrize("args", [["models", "list"], ["models", "verify"], ["doctor", "--no-self-test"]],
                         ids=lambda a: " ".join(a))
def test_reading_commands_need_no_writable_home(args, tmp_path):
    (tmp_path / "file").write_text("")
    r = _run(args, tmp_path / "file" / "home")  # every mkdir under it fails (ENOTDIR)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode in (0, 2) and r.stdout.strip(), (r.returncode, r.stdout, r.stderr)


def test_pair_costs_that_cannot_be_recorded_shows_them_and_says_so(tiny_draft, tiny_target, tmp_path):
    (tmp_path / store.COSTS_NAME).mkdir()  # the atomic write refuses to replace a folder
    r = _run(["pair", "costs", "-md", tiny_draft, "-m", tiny_target, "--threads", "1", "-n", "8", "--json"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["recorded"] is None  # the measurement is there all the same
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: the costs above were not recorded: {tmp_path / store.COSTS_NAME}: is a folder, not a file")
