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

from .. import paths
from ..errors import ConfigError, ModelLoadError
from ..fsutil import describe_write_error, locked, write_json_atomic
from . import filehash
from ..llamacpp.gguf_info import check_gguf_header

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
    user: bool = False  # added with `models add-pair`
    check: dict[str, Any] | None = None  # the pair check's verdict stored by `models add-pair`


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
    here = Path(__file__).resolve().parents[1]  # the easd_local package
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
    if not isinstance(data, dict) or not isinstance(data.get("models", {}), dict) \
            or not isinstance(data.get("pairs", {}), dict):
        raise ConfigError(f"user catalog {path} is malformed (expected {{\"models\": {{...}}}})")
    data.setdefault("models", {})
    return data


def load_catalog() -> Catalog:
    """Built-in models and pairs plus the user's (``models add``, ``models add-pair``, ``pull hf:``)."""
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
    for name, d in user_raw.get("pairs", {}).items():
        if name in cat.pairs or not isinstance(d, dict):
            continue  # built-in names win; `models add-pair` refuses them anyway
        draft, target = d.get("draft"), d.get("target")
        if draft not in cat.models or target not in cat.models:
            raise ConfigError(f"{upath}: pair {name!r} names a model that is not in the catalog "
                              f"({draft!r}, {target!r}); add it again with `easd-local models add-pair`")
        cat.pairs[name] = PairEntry(name=name, draft=cat.models[draft], target=cat.models[target],
                                    description=str(d.get("description", "")), user=True,
                                    check=dict(d["check"]) if isinstance(d.get("check"), dict) else None)
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
    _check_name(name, "model")
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
        check_gguf_header(p)  # garbage after the magic is refused now, not when a load fails
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
    return register_user_model(name, record)


def _check_name(name: str, what: str) -> None:
    if not name or any(c.isspace() for c in name) or "/" in name:
        raise ConfigError(f"{what} name {name!r} must be non-empty without spaces or '/'")


def _write_user_catalog(data: dict[str, Any]) -> None:
    """Replace the user catalog atomically (a crash leaves the old one or the new one)."""
    data["schema"] = 1
    upath = paths.user_catalog_path()
    try:
        write_json_atomic(upath, data)
    except OSError as exc:  # a full disk, a read-only home: the catalog stays as it was
        raise ConfigError(f"cannot update the user catalog: {describe_write_error(upath, exc)}; "
                          "nothing was registered") from None


def register_user_model(name: str, record: Mapping[str, Any]) -> ModelEntry:
    """Store a model record (``file``, ``size``, ``sha256``, ``sources``; ``path`` for a
    file that stays where it is) in the user catalog under ``name``."""
    _check_name(name, "model")
    upath = str(paths.user_catalog_path())
    entry = _model_from_dict(name, record, where=upath, user=True)  # validates before writing
    with locked(upath):  # two commands registering at once: both models kept
        data = read_user_catalog()
        data["models"][name] = dict(record)
        _write_user_catalog(data)
    return entry


def add_user_pair(name: str, draft: str, target: str, check: Mapping[str, Any], description: str = "") -> PairEntry:
    """Register a pair of catalog models under ``name`` with the verdict of its pair check
    (``check``: what the caller measured, e.g. compatible, shared vocabulary, date)."""
    _check_name(name, "pair")
    cat = load_catalog()
    if name in cat.pairs and not cat.pairs[name].user:
        raise ConfigError(f"{name!r} is a built-in pair; choose another name")
    if name in cat.models:
        raise ConfigError(f"{name!r} is the name of a model; choose another name for the pair")
    for m in (draft, target):
        cat.model(m)  # ConfigError naming the known models
    with locked(paths.user_catalog_path()):
        data = read_user_catalog()
        data.setdefault("pairs", {})[name] = {"draft": draft, "target": target, "check": dict(check),
                                              "description": description or f"{draft} drafting for {target}"}
        _write_user_catalog(data)
    return load_catalog().pair(name)
