"""One convention for sizes shown to the user: decimal units with two decimals
(1 kB = 10^3 bytes, 1 MB = 10^6, 1 GB = 10^9), as disk and download tools count them.
llama.cpp's MiB figures are converted to bytes first."""

from __future__ import annotations

SIZE_UNITS_NOTE = "sizes in decimal units: 1 GB = 10^9 bytes"


def human_size(n: int | float) -> str:
    """1117320768 -> '1.12 GB'; 999 -> '999 B'."""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"
