"""Where easd-local keeps its files (models, transcripts, calibration profiles).

``home()`` is ``$EASD_LOCAL_HOME``, else ``$XDG_CACHE_HOME/easd-local``, else
``~/.cache/easd-local``. Sub-directories are created on demand, where the home can be written.
"""

from __future__ import annotations

import os
from pathlib import Path

USER_CATALOG_NAME = "user-catalog.json"


def home() -> Path:
    """The root of easd-local's cache (not created here)."""
    explicit = os.environ.get("EASD_LOCAL_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "easd-local"
    return Path.home() / ".cache" / "easd-local"


def _sub(name: str) -> Path:
    path = home() / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # a read-only or full home: reading needs no folder, and a write says why it fails
    return path


def models_dir() -> Path:
    """Downloaded GGUF files (created on demand)."""
    return _sub("models")


def transcripts_dir() -> Path:
    """Saved chat transcripts (created on demand)."""
    return _sub("transcripts")


def profiles_dir() -> Path:
    """Calibration profiles (created on demand)."""
    return _sub("profiles")


def user_catalog_path() -> Path:
    """JSON file of models registered with ``easd-local models add`` (may not exist)."""
    return home() / USER_CATALOG_NAME
