"""``pair score --plot``: one figure comparing the drafts (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .. import figures
from .predict import GAMMAS


def plot_png(drafts: Sequence[dict], path: str | Path, title: str) -> Path:
    """Tokens per verify by gamma (greedy, simulated: solid; sampled, i.i.d. from α: dashed)
    and, when timed, the predicted speed-up over the target, one colour per draft."""
    timed = any("speedup_greedy_simulated" in d for d in drafts)
    fig = figures.new_figure("--plot", figsize=(11 if timed else 6, 4.5), dpi=120)
    axes = fig.subplots(1, 2 if timed else 1, squeeze=False)
    ax = axes[0][0]
    gs = list(GAMMAS)
    for k, d in enumerate(drafts):
        colour = f"C{k}"
        ax.plot(gs, [d["tokens_per_verify_greedy_simulated"][str(g)] for g in gs], "-o", color=colour, ms=3,
                label=f"{d['draft']}: greedy (simulated)")
        if d.get("tokens_per_verify_iid_from_alpha"):
            ax.plot(gs, [d["tokens_per_verify_iid_from_alpha"][str(g)] for g in gs], "--", color=colour,
                    label=f"{d['draft']}: sampled (i.i.d. from α = {d['alpha']:.3f})")
    ax.set_xlabel("gamma (draft tokens per verify)")
    ax.set_ylabel("predicted tokens per verify")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if timed:
        ax2 = axes[0][1]
        for k, d in enumerate(drafts):
            if "speedup_greedy_simulated" not in d:
                continue
            ax2.plot(gs, [d["speedup_greedy_simulated"][str(g)] for g in gs], "-o", color=f"C{k}", ms=3,
                     label=f"{d['draft']}: greedy")
            ax2.plot(gs, [d["speedup_sampled_iid"][str(g)] for g in gs], "--", color=f"C{k}",
                     label=f"{d['draft']}: sampled")
        ax2.axhline(1.0, color="grey", lw=1)
        ax2.set_xlabel("gamma")
        ax2.set_ylabel("predicted SD speed-up over the target")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return figures.save(fig, path)
