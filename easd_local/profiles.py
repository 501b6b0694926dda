"""Calibration profiles: per-pair EASD thresholds (tau_draft, tau_target).

Precedence everywhere: a flag given on the command line > the pair's profile > the
built-in defaults in config.py. A profile comes from the user's cache (written by
``easd-local calibrate``) or from the catalog entry of a known pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .config import DecodeConfig


@dataclass(frozen=True)
class Profile:
    tau_draft: float
    tau_target: float
    source: str  # where it came from, shown to the user ("catalog pair 'default'", a file path)
    percentile: float | None = None


def _from_mapping(d: Mapping[str, Any], source: str) -> Profile | None:
    try:
        return Profile(float(d["tau_draft"]), float(d["tau_target"]), source, d.get("percentile"))
    except (KeyError, TypeError, ValueError):
        return None


def find_profile(draft_path: Path | None, target_path: Path | None, pair_entry=None) -> Profile | None:
    """The profile in force for this pair, or None (defaults apply)."""
    if pair_entry is not None and getattr(pair_entry, "profile", None):
        return _from_mapping(pair_entry.profile, f"catalog pair '{pair_entry.name}'")
    return None


def apply_thresholds(base: DecodeConfig, profile: Profile | None, flags: Mapping[str, Any]) -> tuple[DecodeConfig, str]:
    """base -> profile -> flags; returns the config and a one-word-ish thresholds source."""
    cfg, source = base, "default"
    if profile is not None:
        cfg = cfg.replace(tau_draft=profile.tau_draft, tau_target=profile.tau_target)
        source = f"profile ({profile.source})"
    changes = {k: v for k, v in flags.items() if v is not None}
    if "tau_draft" in changes or "tau_target" in changes:
        source = "flags" if source == "default" else f"flags over {source}"
    return cfg.replace(**changes), source
