"""From a pass's per-position figures to what ``pair score`` reports per draft, as plain data
(its ``--json``). Every key says what it holds; figures keyed by gamma use the gamma as text
("1".."8")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..calibrate import PERCENTILES, percentiles
from ..engine import rules
from ..engine.config import DecodeConfig
from ..engine.modes import mode_info
from ..bench.schema import read_number
from ..jsonsafe import json_number
from .corpus import Measured
from .passes import Pass
from .predict import GAMMAS, Costs, Rows, Simulated, iid_speedup, iid_tokens_per_verify, simulate, speedup


@dataclass(frozen=True)
class DraftInfo:
    label: str
    path: str
    cfg: DecodeConfig  # the pair's gate settings (thresholds: flags > profile > defaults)
    thresholds_source: str


def _r(x: float, nd: int = 4):
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def gate_fires(rows: Rows, tau_draft: float, tau_target: float, tau_overlap: float) -> np.ndarray:
    """Where greedy ``easd-tf`` fires along the text: the gate is open and the two argmaxes
    agree (then it emits the target's runner-up)."""
    return rules.gate(rows.h_draft, rows.h_target, rows.overlap, tau_draft, tau_target, tau_overlap) & rows.agree


def _sim(ps: Pass, d: int, gamma: int, labels: set[str] | None = None, gate: tuple[float, float, float] | None = None
         ) -> Simulated:
    total = Simulated(verify_sizes={})
    for s in ps.scored:
        if labels is not None and s.item.label not in labels:
            continue
        r = s.drafts[d]
        fires = None
        if gate is not None:
            fires = rules.gate(r.h_draft, r.h_target, r.overlap, *gate)
        total.add(simulate(r.agree, gamma, s.item.budget, fires))
    return total


def _pct(values: np.ndarray) -> dict:
    ps = percentiles(values, PERCENTILES) if values.size else {p: math.nan for p in PERCENTILES}
    out = {f"p{p:g}": _r(v) for p, v in ps.items()}
    out["mean"] = _r(float(values.mean())) if values.size else None
    out["max"] = _r(float(values.max())) if values.size else None
    return out


def draft_summary(ps: Pass, d: int, info: DraftInfo, costs: Costs | None, settings, measured: Sequence[Measured] = ()
                  ) -> dict:
    rows = ps.rows(d)
    n = rows.agree.size
    agree = float(rows.agree.mean()) if n else math.nan
    alpha = float(rows.alpha.mean()) if n else math.nan
    sims = {g: _sim(ps, d, g) for g in GAMMAS}
    out: dict = {
        "draft": info.label,
        "draft_path": info.path,
        "positions": n,
        "greedy_agreement": _r(agree),
        "alpha": _r(alpha),
        "alpha_sampling": {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p},
        "kl_target_draft_nats": _r(float(rows.kl.mean())) if n else None,
        "tokens_per_verify_greedy_simulated": {str(g): _r(sims[g].tokens_per_verify) for g in GAMMAS},
        "tokens_per_verify_iid_from_alpha": {str(g): _r(iid_tokens_per_verify(alpha, g)) for g in GAMMAS}
        if n else {},
        "tokens_per_verify_iid_from_greedy_agreement": {str(g): _r(iid_tokens_per_verify(agree, g)) for g in GAMMAS}
        if n else {},
        "h_draft_nats": _pct(rows.h_draft),
        "h_target_nats": _pct(rows.h_target),
    }
    if costs is not None and n:
        sp = {g: speedup(sims[g], costs) for g in GAMMAS}
        isp = {g: iid_speedup(alpha, g, costs) for g in GAMMAS}
        out.update({
            "speedup_greedy_simulated": {str(g): _r(v, 3) for g, v in sp.items()},
            "speedup_sampled_iid": {str(g): _r(v, 3) for g, v in isp.items()},
            "best_gamma_greedy": max(GAMMAS, key=lambda g: sp[g]),
            "best_gamma_sampled": max(GAMMAS, key=lambda g: isp[g]),
            "draft_cost_over_target_cost": _r(costs.draft_token / costs.target_token, 3),
            "verify_cost_over_decode": {str(g): _r(costs.target_verify[g + 1] / costs.target_token, 3) for g in GAMMAS},
            "seconds_per_decode": {
                "target_one_token": _r(costs.target_token, 5),
                "target_verify_by_tokens": {str(k): _r(v, 5) for k, v in sorted(costs.target_verify.items())},
                "draft_one_token": _r(costs.draft_token, 5),
                "draft_two_tokens": _r(costs.draft_two, 5),
            },
        })
    cfg = info.cfg
    fires = gate_fires(rows, cfg.tau_draft, cfg.tau_target, cfg.overlap) if n else np.zeros(0, bool)
    open_ = rules.gate(rows.h_draft, rows.h_target, rows.overlap, cfg.tau_draft, cfg.tau_target, cfg.overlap)
    easd = _sim(ps, d, cfg.gamma, gate=(cfg.tau_draft, cfg.tau_target, cfg.overlap))
    out["gate"] = {
        "tau_draft": json_number(cfg.tau_draft), "tau_target": json_number(cfg.tau_target),
        "overlap": cfg.overlap, "top_n": cfg.top_n, "thresholds_source": info.thresholds_source,
        "fires_per_100_easd_tf_greedy": _r(100.0 * fires.mean()) if n else None,
        "fires_per_100_easd_tf_sampled": _r(100.0 * float((open_ * rows.alpha).mean())) if n else None,
        "gamma": cfg.gamma,
        "fires_per_100_easd_greedy_simulated": _r(100.0 * easd.fires / easd.tokens) if easd.tokens else None,
        "tokens_per_verify_easd_greedy_simulated": _r(easd.tokens_per_verify),
    }
    cal = []
    if n:
        pd, pt = percentiles(rows.h_draft, PERCENTILES), percentiles(rows.h_target, PERCENTILES)
        for p in PERCENTILES:
            f = gate_fires(rows, pd[p], pt[p], cfg.overlap)
            cal.append({"percentile": p, "tau_draft": _r(pd[p]), "tau_target": _r(pt[p]),
                        "fires_per_100_easd_tf_greedy": _r(100.0 * f.mean())})
    out["gate_at_calibration_percentiles"] = cal
    out["measured"] = [_check(ps, d, m, settings) for m in measured]
    return out


def _check(ps: Pass, d: int, m: Measured, settings) -> dict:
    """A measured run set against the prediction on exactly its problems and settings."""
    labels = set(m.qids)
    c = m.config
    gamma = int(c.get("gamma", 4))
    out = {"method": m.method, "mode": m.mode, "problems": len(m.qids), "gamma": gamma}
    gate = tuple(read_number(c.get(k)) for k in ("tau_draft", "tau_target", "overlap"))
    info = mode_info(m.mode)
    if info.speculative:
        sim = _sim(ps, d, gamma, labels, gate if info.gated else None)
        out["tokens_per_verify_measured"] = _r(m.tokens_per_verify)
        out["tokens_per_verify_predicted"] = _r(sim.tokens_per_verify)
        out["tokens_per_verify_error_pct"] = _r(100.0 * (sim.tokens_per_verify / m.tokens_per_verify - 1.0), 1)
        if info.gated:
            out["fires_per_100_measured"] = _r(m.fires_per_100)
            out["fires_per_100_predicted"] = _r(100.0 * sim.fires / sim.tokens) if sim.tokens else None
    else:  # easd-tf
        if int(c.get("top_n", settings.top_n)) != settings.top_n:
            out["note"] = f"run with top-n {c.get('top_n')}, scored with {settings.top_n}: not compared"
            return out
        rows = ps.rows(d, labels)
        out["tau_draft"], out["tau_target"], out["overlap"] = (_r(x) if math.isfinite(x) else json_number(x) for x in gate)
        out["fires_per_100_measured"] = _r(m.fires_per_100)
        out["fires_per_100_predicted"] = _r(100.0 * gate_fires(rows, *gate).mean()) if rows.agree.size else None
    return out
