"""near_ties: which gate decisions a 0.05-nat change of an entropy could flip."""

from __future__ import annotations

import math
from types import SimpleNamespace as Ev

import pytest

from easd_local.engine.near_ties import GATE_MARGIN, gate_margin, gate_near_tie

TD, TT, TO = 0.9, 0.7, 0.6  # tau_draft, tau_target, tau_overlap


@pytest.mark.parametrize("h_d, h_t, ov, near", [
    # open gate: near when either entropy is less than the margin above its threshold
    (1.5, 0.72, 0.8, True),
    (0.93, 1.5, 0.8, True),
    (1.5, 1.5, 0.8, False),
    (0.96, 0.76, 0.8, False),  # both more than the margin above
    # closed by H_t alone (H_d and the overlap not computed): near when H_t is
    (None, 0.68, None, True),
    (math.nan, 0.60, math.nan, False),
    # closed by H_d: near when it is close below
    (0.87, 1.5, 0.8, True),
    (0.5, 1.5, 0.8, False),
    # closed by both entropies: near only when both are close
    (0.87, 0.68, 0.8, True),
    (0.5, 0.68, 0.8, False),
    # closed by the overlap: no entropy change opens it
    (1.5, 0.72, 0.4, False),
])
def test_gate_near_tie(h_d, h_t, ov, near):
    assert gate_near_tie(h_d, h_t, ov, TD, TT, TO) is near


def test_gate_margin_counts_evaluated_positions_only():
    events = [Ev(h_draft=None, h_target=None, overlap=None),  # not evaluated (bonus, SD rejection)
              Ev(h_draft=math.nan, h_target=math.nan, overlap=math.nan),
              Ev(h_draft=None, h_target=0.68, overlap=None),
              Ev(h_draft=1.5, h_target=1.5, overlap=0.8),
              Ev(h_draft=0.2, h_target=1.5, overlap=0.8)]
    m = gate_margin(events, TD, TT, TO)
    assert (m.decisions, m.near, m.share, m.margin) == (3, 1, 1 / 3, GATE_MARGIN)
    assert m.to_stats() == {"gate_decisions": 3, "gate_near": 1, "gate_near_share": 1 / 3, "gate_margin": GATE_MARGIN}
    # a gate that cannot fire decides nothing
    assert gate_margin(events, math.inf, TT, TO).decisions == 0
    assert gate_margin(events, TD, TT, 1.5).to_stats()["gate_near_share"] is None


def test_first_difference():
    from easd_local.engine.near_ties import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2 and first_difference([], [4]) == 0


def test_classify():
    from easd_local.engine.near_ties import ARGMAX, GATE, REAL, GateState, classify

    near_gate = GateState(h_target=0.72, h_draft=1.5, overlap=0.8, tau_target=TT, tau_draft=TD, tau_overlap=TO)
    far_gate = GateState(h_target=1.5, h_draft=1.5, overlap=0.8, tau_target=TT, tau_draft=TD, tau_overlap=TO)
    assert near_gate.open and near_gate.near and not far_gate.near
    assert classify(3.0, near_gate) == GATE
    assert classify(-0.2, far_gate) == ARGMAX and classify(0.2, None) == ARGMAX
    assert classify(3.0, far_gate) == REAL and classify(-0.7, None) == REAL
    assert classify(0.2, far_gate, gate_differs=True) == REAL  # the gates differed with nothing near
    assert "H_t 0.720 vs tau_target 0.700 (+0.020)" in near_gate.describe()


def test_topn_boundary_gap_and_overlap_near_ties():
    import numpy as np

    from easd_local.engine.near_ties import GATE, REAL, ARGMAX, GateState, classify, topn_boundary_gap

    assert topn_boundary_gap(np.array([1.0, 5, 3, 4.5, 2]), 2) == 1.5 and topn_boundary_gap(np.array([1.0, 2]), 5) == math.inf
    base = dict(h_target=1.5, h_draft=1.5, tau_target=TT, tau_draft=TD, tau_overlap=TO, top_n=5)
    # closed by the overlap alone, one shared token short, on a top-5 boundary 0.1 logits wide
    st = GateState(overlap=0.4, topn_gaps=(0.1, 2.0), **base)
    assert not st.open and not st.near and st.overlap_near and st.flippable
    assert classify(2.0, st, gate_differs=True) == GATE  # the runs' gates differed: a top-N near-tie
    assert classify(2.0, st, gate_differs=False) == REAL and classify(0.2, st, gate_differs=False) == ARGMAX
    # the same with wide top-5 boundaries, or two tokens short: a real difference
    assert classify(2.0, GateState(overlap=0.4, topn_gaps=(1.0, 2.0), **base), gate_differs=True) == REAL
    assert not GateState(overlap=0.2, topn_gaps=(0.1, 0.1), **base).flippable
    # open exactly at the minimum: one token fewer closes it
    assert GateState(overlap=0.6, topn_gaps=(2.0, 0.3), **base).flippable
