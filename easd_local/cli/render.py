"""Rendering shared by generate, chat and bench: the status line and origin colours."""

from __future__ import annotations

import math
from typing import Iterable

from ..decoding import BONUS, DRAFT, EASD, TARGET, TRACE_NAMES, Stats, TokenEvent

ORIGIN_STYLE = {DRAFT: "green", TARGET: "yellow", EASD: "bold magenta", BONUS: "cyan"}
LEGEND = (
    "[green]draft-accepted[/]  [yellow]target-resampled[/]  "
    "[bold magenta]EASD-resampled[/]  [cyan]bonus[/]"
)


def placement_text(models) -> str:
    """Where each model's layers live, e.g. ``target RPC0 (10.0.0.2:50052) 25/25 · draft CPU 25/25``;
    empty when every layer is on the local CPU (the usual case, nothing to say)."""
    parts = []
    for role in ("target", "draft"):
        m = getattr(models, role, None)
        where = getattr(m, "placement", None) or {}
        if where:
            total = sum(where.values())
            parts.append(f"{role} " + " + ".join(f"{dev} {n}/{total}" for dev, n in where.items()))
    everywhere = {dev for role in ("target", "draft") for dev in (getattr(getattr(models, role, None), "placement", None) or {})}
    return " · ".join(parts) if everywhere - {"CPU"} else ""


def status_line(s: Stats, where: str = "") -> str:
    parts = [f"{s.mode}", f"{s.tokens} tokens", f"{s.tokens_per_s:.1f} tok/s", f"ttft {s.ttft_s:.2f}s"]
    if s.mode in ("sd", "easd"):
        parts += [f"accepted {100 * s.acceptance_rate:.0f}%", f"mean accepted {s.mean_accepted_len:.2f}/verify"]
    if s.mode in ("easd", "easd-tf"):
        parts.append(f"EASD fires {s.easd_fires}")
        if s.mode == "easd-tf":
            parts.append(f"draft consulted {s.draft_consults}")
        parts.append(f"τd={s.tau_draft:g} τt={s.tau_target:g} from {s.thresholds_source}")
    if s.stop_reason and s.stop_reason != "eos":
        parts.append(f"stop: {s.stop_reason}")
    if where:
        parts.append(f"layers: {where}")
    return " · ".join(parts)


def _num(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return round(float(x), 5) if isinstance(x, float) else x


def trace_rows(events: Iterable[TokenEvent]) -> Iterable[dict]:
    for i, ev in enumerate(events):
        yield {
            "i": i,
            "token": ev.token,
            "text": ev.text,
            "origin": TRACE_NAMES.get(ev.origin, ev.origin),
            "h_draft": _num(ev.h_draft),
            "h_target": _num(ev.h_target),
            "overlap": _num(ev.overlap),
        }


