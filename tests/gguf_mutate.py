"""Byte-level damage to GGUF files for the robustness tests: the header and metadata stay
readable while the part under test is broken, as a flipped byte or a bad conversion would."""

from __future__ import annotations

import random
from pathlib import Path

import gguf


def data_offset(path: Path) -> int:
    """Where the tensor data starts (everything before it is header, metadata, tensor infos)."""
    return int(gguf.GGUFReader(str(path)).data_offset)


def with_random_tensor_data(src: Path, dst: Path, seed: int = 0) -> Path:
    """``src`` with every byte of tensor data replaced by random bytes (valid header and
    metadata: llama.cpp loads it; the logits are garbage, NaN or infinite)."""
    blob = bytearray(Path(src).read_bytes())
    start = data_offset(src)
    blob[start:] = random.Random(seed).randbytes(len(blob) - start)
    Path(dst).write_bytes(bytes(blob))
    return Path(dst)


def with_bytes_replaced(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    """``src`` with the first ``old`` replaced by ``new`` (same length: offsets stay valid)."""
    assert len(old) == len(new)
    blob = Path(src).read_bytes()
    assert old in blob, old
    Path(dst).write_bytes(blob.replace(old, new, 1))
    return Path(dst)
