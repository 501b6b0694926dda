"""What a finished comparison found about an EASD mode on one pair: its accuracy against a
lossless mode's on the same problems, paired wins and losses, and the exact McNemar p-value.

A pair's verdicts are named where its default mode is chosen (``ways.auto_mode``): EASD is not lossless, so
where the project's own measurement says it is significantly worse for a pair, that pair is
not given it unless asked for by name. Pure data; ``store.verdicts`` keeps them on disk and
``bench report --record-verdict`` writes them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Mapping

from ..errors import ConfigError
from .modes import mode_info

ALPHA = 0.05  # a loss counts when its two-sided McNemar p is below this


@dataclass(frozen=True)
class Verdict:
    dataset: str
    problems: int  # problems both methods answered
    method: str  # the EASD mode compared (easd, easd-tf)
    against: str  # the lossless mode it was compared with (target, sd)
    accuracy: float  # of ``method``, 0..1
    against_accuracy: float
    wins: int  # problems ``method`` got right and ``against`` wrong
    losses: int
    p: float  # exact two-sided McNemar p-value of wins vs losses
    temperature: float  # 0 = greedy
    settings: str = ""  # the decoding settings the rows share, as bench report titles them
    date: str = ""
    env_id: str = ""  # the environment the rows came from (several: joined with ',')
    source: str = ""  # where it was read from (not stored)

    @property
    def points(self) -> float:
        """method's accuracy minus against's, in percentage points."""
        return 100.0 * (self.accuracy - self.against_accuracy)

    @property
    def significant_loss(self) -> bool:
        return mode_info(self.method).gated and self.p < ALPHA and self.losses > self.wins

    def summary(self) -> str:
        """'EASD lost 4.9 points on GSM8K for this pair (1,319 problems, p < 0.001)'."""
        verb = "lost" if self.points < 0 else "gained"
        sampling = "greedy" if self.temperature == 0 else f"T = {self.temperature:g}"
        return (f"EASD ({self.method}) {verb} {abs(self.points):.1f} points against {self.against} on "
                f"{self.dataset.upper() if self.dataset.isalnum() else self.dataset} for this pair "
                f"({self.problems:,} problems, {sampling}, {p_text(self.p)})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        return d


def p_text(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def from_mapping(d: Mapping[str, Any], source: str = "") -> Verdict | None:
    """A Verdict from stored fields, or None when they are not one (a file from another version)."""
    try:
        kw = {f.name: d[f.name] for f in fields(Verdict) if f.name in d and f.name != "source"}
        v = Verdict(**kw, source=source)
        mode_info(v.method), mode_info(v.against)
        if not (0 <= v.accuracy <= 1 and 0 <= v.against_accuracy <= 1 and v.problems > 0 and 0 <= v.p <= 1
                and math.isfinite(v.temperature)):
            return None
        return v
    except (KeyError, TypeError, ValueError, ConfigError):
        return None


def losing(verdicts: Iterable[Verdict]) -> Verdict | None:
    """The verdict that shows an EASD mode significantly worse than a lossless one (the one
    on the most problems), or None."""
    worse = [v for v in verdicts if v.significant_loss]
    return max(worse, key=lambda v: (v.problems, -v.p)) if worse else None
