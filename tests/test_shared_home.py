"""Two commands at once sharing EASD_LOCAL_HOME: the files every command reads, changes and
writes back (the hash cache, the weight-repacking verdicts, the recorded costs, the user
catalog) keep every process's change. Without a lock, each process wrote back what it had
read, and the others' changes made in between were lost (a `pair costs` measurement, a
model `quantize` had just registered). Real processes writing at the same moment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

PROCS, EACH = 4, 15

_WRITER = """
import os, sys, time
kind, me, go, files = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
from easd_local.store import catalog, costs, filehash
from easd_local.llamacpp import repack
while time.time() < go:
    time.sleep(0.001)
for j in range(int(os.environ["EACH"])):
    key = f"p{me}-{j}"
    if kind == "costs":
        costs.record(key, {"ratios": {"target": 1.0}})
    elif kind == "verdicts":
        repack._remember(key, files[0], repack.Repack(True, "ok"))
    elif kind == "hashes":
        filehash.record(files[me * int(os.environ["EACH"]) + j], f"{me:02d}{j:02d}".ljust(64, "0"))
    else:
        catalog.register_user_model(key, {"file": "x.gguf", "size": 1, "sha256": "0" * 64,
                                          "sources": [{"kind": "path", "path": files[0]}]})
"""


def _all_at_once(kind: str, home, files) -> None:
    env = {**os.environ, "EASD_LOCAL_HOME": str(home), "EACH": str(EACH)}
    env.pop("EASD_LOCAL_REPACK_VERDICTS", None)  # the home's own verdicts file
    go = time.time() + 3  # every process imported and waiting by then
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, kind, str(i), str(go), *map(str, files)], env=env,
                              stderr=subprocess.PIPE) for i in range(PROCS)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read().decode()


def test_costs_verdicts_and_the_catalog_keep_every_change(tiny_target, tmp_path):
    from easd_local.llamacpp.repack import VERDICTS_NAME
    from easd_local.store.costs import COSTS_NAME

    expected = {f"p{i}-{j}" for i in range(PROCS) for j in range(EACH)}
    for kind, name in (("costs", COSTS_NAME), ("verdicts", VERDICTS_NAME), ("catalog", "user-catalog.json")):
        home = tmp_path / kind
        _all_at_once(kind, home, [tiny_target])
        data = json.loads((home / name).read_text())
        assert set(data["models"] if kind == "catalog" else data) == expected, kind
        assert not [p for p in home.iterdir() if p.suffix == ".tmp"]


def test_the_hash_cache_keeps_every_file(tmp_path):
    from easd_local.store.filehash import CACHE_NAME

    files = []
    for i in range(PROCS * EACH):
        files.append(tmp_path / f"f{i}")
        files[-1].write_text(str(i))
    _all_at_once("hashes", tmp_path / "home", files)
    data = json.loads((tmp_path / "home" / CACHE_NAME).read_text())
    assert set(data) == {str(f.resolve()) for f in files}
