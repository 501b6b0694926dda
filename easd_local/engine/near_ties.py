"""Near-ties: decisions that a tiny numerical difference could have turned the other way.

Two correct implementations (another llama.cpp build, thread count, batch shape) give
logits that differ by a few hundredths, so greedy text parts at an **argmax near-tie**
(two tokens whose logits are that close) and EASD parts at a **gate near-tie** (an entropy
within a few hundredths of a nat of its threshold). This module measures how much of a
run rests on such coin tosses and explains where two runs part; pure functions, no I/O.

The gate (``gate.Gate``) is open when H_d >= tau_d and H_t >= tau_t and O >= tau_O; it is
read lazily, so a position records H_t only, or nothing (NaN / None) where the gate was not
read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from .gate import Gate, Reading, conditions, opens

GATE_MARGIN = 0.05  # nats: a gate decision this close to a threshold is a coin toss


def _known(x: float | None) -> bool:
    return x is not None and not math.isnan(x)


def gate_near_tie(
    h_draft: float | None,
    h_target: float,
    overlap: float | None,
    tau_draft: float,
    tau_target: float,
    tau_overlap: float,
    margin: float = GATE_MARGIN,
) -> bool:
    """Whether moving each entropy by at most ``margin`` nats could flip this gate decision.

    Open gate: either entropy is less than ``margin`` above its threshold. Closed gate:
    every failing condition is an entropy less than ``margin`` below its threshold (a
    failing overlap, a count of shared top-N tokens, is not a matter of nats). Where the
    gate stopped at H_t (H_d and the overlap not computed), they are assumed to pass:
    the decision counts as near when H_t is."""
    dt = h_target - tau_target
    d_known = _known(h_draft)
    dd = h_draft - tau_draft if d_known else math.inf
    ov_ok = conditions(math.inf, math.inf, overlap, tau_draft, tau_target, tau_overlap)[2] if _known(overlap) else True
    # figures the gate did not compute are assumed to pass
    if opens(h_draft if d_known else math.inf, h_target, overlap if _known(overlap) else math.inf,
             tau_draft, tau_target, tau_overlap):
        return dt < margin or (d_known and dd < margin)
    if not ov_ok:
        return False
    return all(-margin < d < 0 for d in (dt, dd) if d < 0)


@dataclass(frozen=True)
class GateMargin:
    decisions: int  # positions where the gate was evaluated
    near: int  # of which within the margin of flipping (gate_near_tie)
    margin: float = GATE_MARGIN

    @property
    def share(self) -> float | None:
        return self.near / self.decisions if self.decisions else None

    def to_stats(self) -> dict:
        """The row/JSON statistics: ``gate_decisions``, ``gate_near``, ``gate_near_share``
        (null without decisions), ``gate_margin``."""
        return {"gate_decisions": self.decisions, "gate_near": self.near,
                "gate_near_share": self.share, "gate_margin": self.margin}


def gate_margin(
    events: Iterable,
    tau_draft: float,
    tau_target: float,
    tau_overlap: float,
    margin: float = GATE_MARGIN,
) -> GateMargin:
    """Count the gate decisions among token events (anything with ``h_draft``,
    ``h_target``, ``overlap``; H_t None or NaN = not evaluated) and those within
    ``margin`` of flipping. A gate that cannot fire (an infinite threshold, overlap > 1)
    decides nothing."""
    if not Gate(tau_draft, tau_target, tau_overlap, top_n=0).can_fire:
        return GateMargin(0, 0, margin)
    decisions = near = 0
    for ev in events:
        if not _known(ev.h_target):
            continue
        decisions += 1
        near += gate_near_tie(ev.h_draft, ev.h_target, ev.overlap, tau_draft, tau_target, tau_overlap, margin)
    return GateMargin(decisions, near, margin)


# ------------------------------------------------------------- where two runs part

# logits: a gap this small between the two tokens is an argmax near-tie. llama.cpp's
# one-token decode and its batched verify differ by up to ~0.4 logits on the default pair
# (tests/test_runtime.py measures it), and other builds, thread counts and CPUs do likewise.
ARGMAX_NEAR_TIE = 0.5

ARGMAX = "argmax near-tie"
GATE = "gate near-tie"
REAL = "a real difference"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (the shorter one's
    length when one is a prefix of the other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def topn_boundary_gap(z, n: int) -> float:
    """Logit gap between a row's n-th and (n+1)-th largest logits: how little it takes to
    change which tokens are its top-N (and so the top-N overlap)."""
    import numpy as np

    z = np.asarray(z, dtype=np.float64).reshape(-1)
    if n >= z.size:
        return math.inf
    top = np.partition(z, z.size - n - 1)[z.size - n - 1:]  # the n+1 largest, unordered
    top.sort()
    return float(top[1] - top[0])


@dataclass(frozen=True)
class GateState:
    """The gate's inputs at one position and their distances to the thresholds.

    The entropies are near-ties within ``margin`` nats of their thresholds. The overlap is a
    count of shared top-N tokens; it is a near-tie when one token more or less in the
    intersection flips its test and either model's N-th and (N+1)-th logits are within
    ARGMAX_NEAR_TIE (``topn_gaps``)."""

    h_target: float
    h_draft: float
    overlap: float
    tau_target: float
    tau_draft: float
    tau_overlap: float
    margin: float = GATE_MARGIN
    top_n: int = 0  # 0: overlap near-ties not assessed
    topn_gaps: tuple[float, float] = (math.inf, math.inf)  # (target, draft)

    @classmethod
    def of(cls, gate: Gate, reading: Reading, topn_gaps: tuple[float, float] = (math.inf, math.inf),
           margin: float = GATE_MARGIN) -> "GateState":
        """The state of ``gate`` at a position where it read ``reading``."""
        return cls(h_target=reading.h_target, h_draft=reading.h_draft, overlap=reading.overlap,
                   tau_target=gate.tau_target, tau_draft=gate.tau_draft, tau_overlap=gate.tau_overlap, margin=margin,
                   top_n=gate.top_n, topn_gaps=topn_gaps)

    @property
    def gate(self) -> Gate:
        return Gate(self.tau_draft, self.tau_target, self.tau_overlap, self.top_n)

    @property
    def open(self) -> bool:
        return bool(self.gate.opens(self.h_draft, self.h_target, self.overlap))

    @property
    def near(self) -> bool:
        """An entropy near-tie could flip the decision (what gate_margin counts)."""
        return gate_near_tie(self.h_draft, self.h_target, self.overlap, self.tau_draft, self.tau_target,
                             self.tau_overlap, self.margin)

    @property
    def overlap_near(self) -> bool:
        """One top-N membership change (on a top-N boundary within ARGMAX_NEAR_TIE) would
        flip the overlap's test."""
        if not self.top_n or min(self.topn_gaps) >= ARGMAX_NEAR_TIE:
            return False
        step = 1.0 / self.top_n + 1e-9
        passes = self.overlap >= self.tau_overlap
        return (self.overlap - step < self.tau_overlap) if passes else (self.overlap + step >= self.tau_overlap)

    @property
    def flippable(self) -> bool:
        """Some near-tie (an entropy within the margin, or the overlap) could flip the decision."""
        d_ok, t_ok, o_ok = conditions(self.h_draft, self.h_target, self.overlap, self.tau_draft, self.tau_target,
                                      self.tau_overlap)
        checks = [(t_ok, abs(self.h_target - self.tau_target) < self.margin),
                  (d_ok, abs(self.h_draft - self.tau_draft) < self.margin),
                  (o_ok, self.overlap_near)]
        if self.open:
            return any(near for _, near in checks)
        return all(near for ok, near in checks if not ok)

    def describe(self) -> str:
        def one(name: str, v: float, tau: float, what: str) -> str:
            return f"{name} {v:.3f} vs {what} {tau:.3f} ({v - tau:+.3f})"

        parts = [one("H_t", self.h_target, self.tau_target, "tau_target"),
                 one("H_d", self.h_draft, self.tau_draft, "tau_draft"),
                 one("overlap", self.overlap, self.tau_overlap, "minimum")]
        if self.top_n:
            parts[-1] += (f" [top-{self.top_n} boundary gaps: target {self.topn_gaps[0]:.3f}, "
                          f"draft {self.topn_gaps[1]:.3f} logits]")
        return ", ".join(parts)


def classify(logit_gap: float | None, gate_state: GateState | None = None, gate_differs: bool | None = None) -> str:
    """Why two runs part at a position.

    ``gate_differs``: whether the gate decided differently in the two runs (True / False),
    or None when that cannot be told. A gate that decided differently is a gate near-tie
    when a near-tie could flip it (:attr:`GateState.flippable`), else a real difference;
    unknown, an entropy near-tie counts. Otherwise the two tokens' logit gap decides: an
    argmax near-tie under ARGMAX_NEAR_TIE, else a real difference."""
    if gate_state is not None and gate_differs is not False:
        if gate_state.near or (gate_differs and gate_state.flippable):
            return GATE
        if gate_differs:
            return REAL
    if logit_gap is not None and abs(logit_gap) < ARGMAX_NEAR_TIE:
        return ARGMAX
    return REAL
