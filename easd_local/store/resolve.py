"""From command-line choices to files and settings: which draft/target files (catalog pair,
or paths given by the user) and which thresholds (flags > profile > defaults).

Nothing here prints; downloads report through the ``progress`` callback and ask through
``confirm(missing_entries)`` (called once, when anything must be downloaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..engine.config import DecodeConfig
from ..errors import ConfigError
from ..engine.modes import mode_info, needs_draft_model
from .profiles import Profile, apply_thresholds, find_profile


def _looks_like_path(ref: str) -> bool:
    return any(c in ref for c in "/\\") or ref.lower().endswith(".gguf") or ref.startswith("~")


def catalog_model(ref: str | Path):
    """The catalog entry that ``ref`` names, or None when ``ref`` is a path (an existing
    file, or anything that looks like a path)."""
    if isinstance(ref, Path) or Path(ref).expanduser().exists() or _looks_like_path(str(ref)):
        return None
    from .catalog import load_catalog

    cat = load_catalog()
    if str(ref) not in cat.models:
        raise ConfigError(
            f"{ref}: no such file, and no model of that name in the catalog "
            f"(`easd-local models list` shows the names)"
        )
    return cat.models[str(ref)]


def resolve_model(
    ref: str | Path,
    *,
    confirm: Callable[[list], bool] = lambda missing: True,
    progress=None,
    pull: bool = True,
) -> Path:
    """A model given on the command line: an existing file, else a catalog model name
    (pulled first if it is missing, unless ``pull`` is False), else the path as given (its
    loader says what is wrong)."""
    entry = catalog_model(ref)
    if entry is None:
        return Path(ref).expanduser()
    from .catalog import is_present, local_path
    from .pull import ensure_models

    if not pull:
        if not is_present(entry):
            raise ConfigError(f"{ref} is not downloaded yet: easd-local pull {ref}")
        return local_path(entry)
    (found,) = ensure_models([entry], confirm, progress, label=str(ref))
    return found


def model_label(ref: str | Path) -> str:
    """A short name for a model given on the command line: the name, or the file's stem."""
    p = Path(ref)
    return p.stem if p.suffix.lower() == ".gguf" or _looks_like_path(str(ref)) else str(ref)


@dataclass(frozen=True)
class PairFiles:
    """The files of a pair to load (before loading: ``pair.Pair`` holds the loaded models;
    ``catalog.PairEntry`` is a catalog row)."""

    draft: Path | None
    target: Path | None
    label: str  # a name for reports: the catalog pair's name or "draft-file+target-file"
    entry: Any = None  # catalog PairEntry when it came from the catalog

    def profile(self) -> Profile | None:
        return find_profile(self.draft, self.target, self.entry)


def resolve_pair(
    pair: str | None,
    draft: str | Path | None,
    target: str | Path | None,
    *,
    mode: str = "easd",
    spec_type: str = "draft",
    confirm: Callable[[list], bool] = lambda missing: True,
    progress=None,
) -> PairFiles:
    """Models given on the command line (paths or catalog model names) win; otherwise the
    catalog pair (default: the default pair), pulled first if missing."""
    if draft is not None or target is not None:
        if pair is not None:
            raise ConfigError("give either --pair or --draft/--target, not both")
        info = mode_info(mode)
        one_model = ((not needs_draft_model(mode, spec_type) and target is not None)
                     or (not info.needs_target and draft is not None))
        if (draft is None or target is None) and not one_model:
            missing = "--draft" if draft is None else "--target"
            raise ConfigError(f"{missing} is missing: give both --draft and --target (or --pair NAME)")
        label = "+".join(model_label(p) for p in (draft, target) if p is not None)
        d = resolve_model(draft, confirm=confirm, progress=progress) if draft is not None else None
        t = resolve_model(target, confirm=confirm, progress=progress) if target is not None else None
        return PairFiles(draft=d, target=t, label=label)
    from .catalog import load_catalog
    from .pull import ensure_models

    cat = load_catalog()
    entry = cat.pair(pair) if pair else cat.default_pair
    d, t = ensure_models([entry.draft, entry.target], confirm, progress, label=entry.name)
    return PairFiles(draft=d, target=t, label=entry.name, entry=entry)


def resolve_config(base: DecodeConfig, spec: PairFiles, flags: Mapping[str, Any]) -> tuple[DecodeConfig, str]:
    """Decoding settings for this pair: base defaults, the pair's profile, then the flags."""
    return apply_thresholds(base, spec.profile(), flags)
