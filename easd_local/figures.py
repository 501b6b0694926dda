"""Figures for --png / --plot: matplotlib when it is installed, and a PNG that is whole or
absent. The check runs at the edge, before a model loads, so that a missing matplotlib is
known before minutes of decoding; ``save`` writes beside the target and renames, so that a
full disk or Ctrl-C leaves no half-written file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ConfigError
from .fsutil import describe_write_error, write_atomic

INSTALL = "pip install 'easd-local[plot]' (or matplotlib)"


def require(flag: str) -> None:
    """ConfigError naming ``flag`` when matplotlib is not installed."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        raise ConfigError(f"{flag} needs matplotlib, which is not installed: {INSTALL}") from None


def new_figure(flag: str, **kw: Any):
    """A matplotlib Figure, without pyplot: no global figure list to leak and no GUI
    backend to pick (the server's threads may plot one day)."""
    require(flag)
    from matplotlib.figure import Figure

    return Figure(**kw)


def save(fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (format from its suffix, PNG without one); ConfigError on
    a bad path, a full disk or a format matplotlib does not know."""
    out = Path(path).expanduser()
    fmt = out.suffix[1:].lower() or "png"
    try:
        write_atomic(out, lambda f: fig.savefig(f, format=fmt))
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {describe_write_error(out, exc)}") from None
    except ValueError as exc:  # an unknown format
        raise ConfigError(f"cannot write {out}: {exc}") from None
    return out
