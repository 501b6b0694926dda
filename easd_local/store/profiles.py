"""Calibration profiles: per-pair EASD thresholds (tau_draft, tau_target), and the verdicts of
comparisons of EASD against a lossless mode on the pair (``engine.verdict``).

Precedence everywhere: a flag given on the command line > the user's profile for the pair
(written by ``easd-local calibrate --percentile P``) > the catalog's profile for the pair
(``[pairs.NAME.profile]`` in models/catalog.toml) > the built-in defaults in config.py.

A pair is identified by the sha256 of its two files, never by their paths: a profile
follows the files wherever they are (catalog cache, a user's download, a symlink) and is
not applied to a different file that happens to have the same name. For catalog models
the catalog's sha256 is used; other files are hashed once and the hash is cached
(``filehash``), so a 1 GB model is read once, not on every command. Hashing is skipped entirely when no profile (user or catalog)
has the right file sizes, so commands on uncalibrated pairs never pay for it.

User profiles are small JSON files in ``paths.profiles_dir()`` named
``<draft sha256[:16]>-<target sha256[:16]>.json`` (format: ``PROFILE_SCHEMA``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from . import filehash
from .. import paths
from ..engine.config import DecodeConfig
from ..engine.verdict import Verdict
from ..engine.verdict import from_mapping as verdict_from_mapping
from ..fsutil import write_json_atomic
from ..errors import ConfigError

PROFILE_SCHEMA = 1


@dataclass(frozen=True)
class Profile:
    tau_draft: float
    tau_target: float
    source: str  # where it came from, shown to the user ("catalog pair 'default'", a file path)
    percentile: float | None = None
    kind: str = "catalog"  # "user" (written by calibrate) or "catalog"
    path: Path | None = None  # the user profile's file


@dataclass(frozen=True)
class FileId:
    """What identifies a model file for profiles."""

    sha256: str
    size: int
    name: str = ""


def _from_mapping(d: Mapping[str, Any], source: str, kind: str = "catalog", path: Path | None = None) -> Profile | None:
    try:
        p = d.get("percentile")
        return Profile(float(d["tau_draft"]), float(d["tau_target"]), source,
                       float(p) if p is not None else None, kind, path)
    except (KeyError, TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------ hashing


def file_id(path: str | os.PathLike, model_entry=None) -> FileId:
    """A file's identity: the catalog's sha256 when the file is that catalog model (same
    size), else its own (cached) hash."""
    p = Path(path).expanduser()
    size = p.stat().st_size
    if model_entry is not None and getattr(model_entry, "size", None) == size and getattr(model_entry, "sha256", None):
        return FileId(model_entry.sha256, size, p.name)
    return FileId(filehash.sha256_of(p), size, p.name)


# ------------------------------------------------------------------------ user profiles


def profile_path(draft_sha: str, target_sha: str) -> Path:
    return paths.profiles_dir() / f"{draft_sha[:16]}-{target_sha[:16]}.json"


def write_profile(draft: FileId, target: FileId, tau_draft: float, tau_target: float, *,
                  percentile: float | None = None, **info: Any) -> Path:
    """Write (atomically) the user profile of a pair and return its path. ``info`` is kept
    verbatim (positions, dataset, command, percentiles, ...)."""
    for name, v in (("tau_draft", tau_draft), ("tau_target", tau_target)):
        if not (v == v) or v < 0:
            raise ConfigError(f"{name} must be a number >= 0, got {v}")
    obj = {
        "schema": PROFILE_SCHEMA,
        "draft": {"sha256": draft.sha256, "size": draft.size, "name": draft.name},
        "target": {"sha256": target.sha256, "size": target.size, "name": target.name},
        "tau_draft": float(tau_draft),
        "tau_target": float(tau_target),
        "percentile": percentile,
        **info,
    }
    path = profile_path(draft.sha256, target.sha256)
    try:  # a recorded verdict survives a new calibration
        old = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(old, dict) and old.get("verdicts"):
            obj["verdicts"] = old["verdicts"]
    except (OSError, ValueError):
        pass
    write_json_atomic(path, obj)
    return path


def _profiles_dir_if_any() -> Path | None:
    d = paths.home() / "profiles"
    return d if d.is_dir() else None


def _user_profiles() -> list[tuple[Path, dict]]:
    d = _profiles_dir_if_any()
    if d is None:
        return []
    out = []
    for f in sorted(d.glob("*.json")):
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("draft"), dict) and isinstance(data.get("target"), dict):
            out.append((f, data))
    return out


def read_profile(path: str | os.PathLike) -> Profile:
    """Load one profile file (ConfigError if it is not one)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"profile {p} is unreadable: {e}") from None
    prof = _from_mapping(data, str(p), "user", p) if isinstance(data, dict) else None
    if prof is None:
        raise ConfigError(f"profile {p} has no numeric tau_draft and tau_target")
    return prof


# ------------------------------------------------------------------------------- lookup


def _catalog_pairs(pair_entry) -> list:
    if pair_entry is not None:
        return [pair_entry]
    try:
        from .catalog import load_catalog

        return list(load_catalog().pairs.values())
    except Exception:  # a broken catalog must not break decoding with explicit files
        return []


def _pair_records(draft_path: Path | None, target_path: Path | None, pair_entry=None) -> list[tuple[str, str, Path | None, Mapping]]:
    """Every profile record of this pair as (kind, source, file, data), the user's first.

    User profiles are matched by both files' sha256, then the catalog's profile: of
    ``pair_entry`` when given, else of any catalog pair whose two models are these files
    (same sha256). Files are hashed only if some profile has their sizes."""
    if draft_path is None or target_path is None:
        # one-model modes: a catalog pair's profile still describes it
        if pair_entry is not None and getattr(pair_entry, "profile", None):
            return [("catalog", f"catalog pair '{pair_entry.name}'", None, pair_entry.profile)]
        return []
    try:
        d_size = Path(draft_path).expanduser().stat().st_size
        t_size = Path(target_path).expanduser().stat().st_size
    except OSError:
        return []
    users = [(f, data) for f, data in _user_profiles()
             if data["draft"].get("size") == d_size and data["target"].get("size") == t_size]
    cats = [pe for pe in _catalog_pairs(pair_entry)
            if getattr(pe, "profile", None) and pe.draft.size == d_size and pe.target.size == t_size]
    if not users and not cats:
        return []
    entry_d = pair_entry.draft if pair_entry is not None else None
    entry_t = pair_entry.target if pair_entry is not None else None
    did = file_id(draft_path, entry_d)
    tid = file_id(target_path, entry_t)
    out: list[tuple[str, str, Path | None, Mapping]] = [
        ("user", str(f), f, data) for f, data in users
        if data["draft"].get("sha256") == did.sha256 and data["target"].get("sha256") == tid.sha256]
    out += [("catalog", f"catalog pair '{pe.name}'", None, pe.profile) for pe in cats
            if pe.draft.sha256 == did.sha256 and pe.target.sha256 == tid.sha256]
    return out


def find_profile(draft_path: Path | None, target_path: Path | None, pair_entry=None) -> Profile | None:
    """The thresholds in force for this pair, or None (defaults apply): the user's profile
    (written by calibrate), else the catalog's."""
    for kind, source, f, data in _pair_records(draft_path, target_path, pair_entry):
        prof = _from_mapping(data, source, kind, f)
        if prof is not None:
            return prof
    return None


def find_verdicts(draft_path: Path | None, target_path: Path | None, pair_entry=None) -> list[Verdict]:
    """What comparisons of EASD against a lossless mode found for this pair: the user's
    (``bench report --record-verdict``) over the catalog's for the same dataset, methods and
    temperature."""
    seen: dict[tuple, Verdict] = {}
    for _kind, source, _f, data in _pair_records(draft_path, target_path, pair_entry):
        for raw in data.get("verdicts") or ():
            v = verdict_from_mapping(raw, source) if isinstance(raw, Mapping) else None
            if v is not None:
                seen.setdefault(_verdict_key(v), v)
    return list(seen.values())


def _verdict_key(v: Verdict) -> tuple:
    return (v.dataset, v.method, v.against, v.temperature)


def record_verdict(draft: FileId, target: FileId, verdict: Verdict) -> Path:
    """Keep ``verdict`` in the pair's user profile (replacing one for the same dataset,
    methods and temperature); its thresholds, if calibrated, stay as they are."""
    path = profile_path(draft.sha256, target.sha256)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        obj = obj if isinstance(obj, dict) else {}
    except (OSError, ValueError):
        obj = {}
    obj.update(schema=PROFILE_SCHEMA, draft={"sha256": draft.sha256, "size": draft.size, "name": draft.name},
               target={"sha256": target.sha256, "size": target.size, "name": target.name})
    kept = [raw for raw in obj.get("verdicts") or () if not (
        isinstance(raw, Mapping) and (v := verdict_from_mapping(raw)) is not None
        and _verdict_key(v) == _verdict_key(verdict))]
    obj["verdicts"] = kept + [verdict.to_dict()]
    write_json_atomic(path, obj)
    return path


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
