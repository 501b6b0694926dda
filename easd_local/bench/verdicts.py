"""Verdicts from a finished comparison: for each pair (by its files' sha256) and each EASD
mode in a report, what it scored against each lossless mode on the problems both answered
(``bench report --record-verdict``). The pair's profile keeps them, and they decide the
pair's default mode (``engine.modes.auto_mode``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..engine.modes import MODE_TABLE
from ..engine.verdict import Verdict
from ..store.profiles import FileId
from .report import GroupSummary, row_env_id


@dataclass(frozen=True)
class PairVerdict:
    pair: str
    draft: FileId
    target: FileId
    verdict: Verdict


def _file(rec: dict | None) -> FileId | None:
    if not isinstance(rec, dict) or not rec.get("sha256"):
        return None
    return FileId(rec["sha256"], int(rec.get("size") or 0), rec.get("file") or "")


def verdicts(summaries: Sequence[GroupSummary], rows: Iterable[dict]) -> list[PairVerdict]:
    """One verdict per (group, EASD mode, lossless baseline) that the report compared.
    Only methods named exactly after a gated mode count (``easd-tf``, not a threshold
    variant ``easd-tf[tau_target=1.5]``: the default a verdict decides is the plain mode),
    and only rows that record their files (the verdict belongs to those files)."""
    rows = list(rows)
    today = time.strftime("%Y-%m-%d")
    out = []
    for g in summaries:
        for m in g.methods:
            if m.method not in MODE_TABLE or not MODE_TABLE[m.method].gated:
                continue
            mine = [r for r in rows if r["dataset"] == g.dataset and r["pair"] == g.pair and r["method"] == m.method]
            prov = next((r.get("provenance") for r in mine if r.get("provenance")), None) or {}
            draft, target = _file(prov.get("draft")), _file(prov.get("target"))
            if draft is None or target is None:
                continue
            temps = {r.get("config", {}).get("temperature") for r in mine}
            if len(temps) != 1:
                continue  # a comparison across sampling settings says nothing about either
            temperature = float(temps.pop() or 0.0)
            for c in (m.vs_target, m.vs_sd):
                if c is None or c.n == 0:
                    continue
                envs = sorted({e for r in rows if r["dataset"] == g.dataset and r["pair"] == g.pair
                               and r["method"] in (m.method, c.baseline) and (e := row_env_id(r))})
                v = Verdict(dataset=g.dataset, problems=c.n, method=m.method, against=c.baseline,
                            accuracy=round(c.accuracy, 6), against_accuracy=round(c.baseline_accuracy, 6),
                            wins=c.wins, losses=c.losses, p=c.p_value, temperature=temperature,
                            settings=g.settings, date=today, env_id=",".join(envs))
                out.append(PairVerdict(g.pair, draft, target, v))
    return out
