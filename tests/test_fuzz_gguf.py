"""Fuzz: seeded mutations of the tiny target (header, metadata, tensor infos, tensor data,
truncation) through `easd-local generate`, each in its own process. Every run must end
cleanly: exit 0, or a non-zero exit with one error line and no traceback; never a signal
(a crash in llama.cpp) and never a hang (issue 13).

Kept cheap for CI: 32 mutations, two processes at a time (about 25 s on 2 busy cores)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import pytest

N_MUTATIONS = 32
TIMEOUT_S = 120


def _regions(path: Path) -> dict[str, tuple[int, int]]:
    """Byte ranges of the parts of a GGUF file: header, metadata (key/values), tensor
    infos and tensor data."""
    reader = gguf.GGUFReader(str(path))
    infos = min(int(t.field.offset) for t in reader.tensors)
    size = path.stat().st_size
    return {"header": (4, 24), "metadata": (24, infos), "tensor_infos": (infos, int(reader.data_offset)),
            "tensor_data": (int(reader.data_offset), size)}


def _mutate(blob: bytes, regions: dict[str, tuple[int, int]], rng: random.Random) -> tuple[bytes, str]:
    region = rng.choice(sorted(regions) + ["truncate"])
    data = bytearray(blob)
    if region == "truncate":
        cut = rng.randrange(8, len(blob))
        return bytes(data[:cut]), f"truncated at {cut}"
    lo, hi = regions[region]
    kind = rng.choice(["flip", "ff", "zero", "random8"])
    at = rng.randrange(lo, hi)
    if kind == "flip":
        data[at] ^= 1 << rng.randrange(8)
    elif kind == "ff":
        data[at] = 0xFF
    elif kind == "zero":
        data[at : at + 4] = bytes(len(data[at : at + 4]))
    else:
        n = len(data[at : at + 8])
        data[at : at + n] = rng.randbytes(n)
    return bytes(data), f"{region} {kind} at {at}"


def _run(path: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EASD_LOCAL_HOME": str(home), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    cmd = [sys.executable, "-m", "easd_local", "generate", "Tell me", "--mode", "target", "--target", str(path),
           "--max-tokens", "4", "--ctx", "128", "--threads", "1", "--temperature", "0.7"]
    return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          errors="replace", timeout=TIMEOUT_S)


def test_mutated_targets_end_cleanly(tiny_target, tmp_path):
    blob = tiny_target.read_bytes()
    regions = _regions(tiny_target)
    rng = random.Random(13)
    cases = []
    for i in range(N_MUTATIONS):
        data, what = _mutate(blob, regions, rng)
        path = tmp_path / f"m{i:02d}.gguf"
        path.write_bytes(data)
        cases.append((path, what))
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: _run(c[0], tmp_path / "home"), cases))
    outcomes = {"ok": 0, "error": 0}
    for (path, what), r in zip(cases, results):
        where = f"{path.name} ({what}): rc {r.returncode}\n{r.stderr[-2000:]}"
        assert r.returncode >= 0, f"killed by signal {-r.returncode}: {where}"
        assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, where
        if r.returncode == 0:
            outcomes["ok"] += 1
            continue
        outcomes["error"] += 1
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), where
    # the mutations must reach both outcomes, or they test less than they seem to
    assert outcomes["ok"] and outcomes["error"], outcomes
