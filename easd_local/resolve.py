"""From command-line choices to files and settings: which draft/target files (catalog pair,
or paths given by the user) and which thresholds (flags > profile > defaults).

Nothing here prints; downloads report through the ``progress`` callback and ask through
``confirm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from .config import DecodeConfig
from .errors import ConfigError
from .profiles import Profile, apply_thresholds, find_profile


@dataclass(frozen=True)
class PairSpec:
    draft: Path | None
    target: Path | None
    label: str  # a name for reports: the catalog pair's name or "draft-file+target-file"
    entry: Any = None  # catalog PairEntry when it came from the catalog

    def profile(self) -> Profile | None:
        return find_profile(self.draft, self.target, self.entry)


def resolve_pair(
    pair: str | None,
    draft: Path | None,
    target: Path | None,
    *,
    mode: str = "easd",
    confirm: Callable[[int], bool] = lambda n: True,
    progress=None,
) -> PairSpec:
    """Paths given on the command line win; otherwise the catalog pair (default: the
    default pair), pulled first if missing."""
    if draft is not None or target is not None:
        if pair is not None:
            raise ConfigError("give either --pair or --draft/--target, not both")
        one_model = (mode == "target" and target is not None) or (mode == "draft" and draft is not None)
        if (draft is None or target is None) and not one_model:
            missing = "--draft" if draft is None else "--target"
            raise ConfigError(f"{missing} is missing: give both --draft and --target (or --pair NAME)")
        label = "+".join(p.stem for p in (draft, target) if p is not None)
        return PairSpec(draft=draft, target=target, label=label)
    from .catalog import load_catalog
    from .pull import ensure_pair

    cat = load_catalog()
    entry = cat.pair(pair) if pair else cat.default_pair
    d, t = ensure_pair(entry, confirm, progress)
    return PairSpec(draft=d, target=t, label=entry.name, entry=entry)


def resolve_config(base: DecodeConfig, spec: PairSpec, flags: Mapping[str, Any]) -> tuple[DecodeConfig, str]:
    """Decoding settings for this pair: base defaults, the pair's profile, then the flags."""
    return apply_thresholds(base, spec.profile(), flags)
