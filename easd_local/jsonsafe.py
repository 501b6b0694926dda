"""Values for strict JSON, which has no Infinity or NaN: the one place that says how a
non-finite float is written (settings such as ``tau_draft = inf`` turn the gate off); and
the one way JSON-lines text is split into lines."""

from __future__ import annotations

import math
from pathlib import Path


def json_number(value):
    """A non-finite float becomes "inf" / "-inf", NaN becomes None; anything else is
    returned as is."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def jsonable(value):
    """``json_number`` through dicts, lists and tuples; paths become strings."""
    if isinstance(value, dict):
        return {k: jsonable(x) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(x) for x in value]
    if isinstance(value, Path):
        return str(value)
    return json_number(value)


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSON-lines text, split at "\\n" only: ``str.splitlines`` also splits at
    U+2028, U+0085 and others, which JSON strings may hold raw (``json.dumps(...,
    ensure_ascii=False)`` writes them so), and would cut such a row in two. A final newline
    ends the last line rather than starting an empty one."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines
