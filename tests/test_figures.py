"""Figures (calibrate --png, pair score --plot, bench report --plot) share one writer: whole
PNG or none, one message for a missing matplotlib, a bad path or a full disk."""

from __future__ import annotations

import errno
import sys

import numpy as np
import pytest

from easd_local import figures
from easd_local.calibrate import Trace, plot_png
from easd_local.errors import ConfigError

pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


def _trace() -> Trace:
    rng = np.random.default_rng(0)
    n = 200
    tr = Trace(top_n=3)
    tr.h_draft = list(rng.gamma(2.0, 0.5, n))
    tr.h_target = list(rng.gamma(2.0, 0.4, n))
    return tr


def test_calibrate_png_is_written_whole(tmp_path):
    tr = _trace()
    out = plot_png(tr, tmp_path / "sub" / "h.png", taus=(1.0, 0.8), title="t")
    assert out.read_bytes()[:8] == PNG
    assert [p.name for p in out.parent.iterdir()] == ["h.png"]  # no temporary file left beside it


def test_missing_matplotlib_names_the_flag(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ConfigError, match=r"^--png needs matplotlib.*pip install 'easd-local\[plot\]'"):
        figures.require("--png")


def test_a_full_disk_leaves_nothing_half_written(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def full(self, f, **kw):
        f.write(b"\x89PNG partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    fig = figures.new_figure("--png")
    fig.subplots().plot([0, 1], [0, 1])
    with pytest.raises(ConfigError, match="no space left"):
        figures.save(fig, tmp_path / "p.png")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_png_survives_a_failed_write(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    out = tmp_path / "p.png"
    out.write_bytes(b"old")
    monkeypatch.setattr(Figure, "savefig", lambda self, f, **kw: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        figures.save(figures.new_figure("--png"), out)
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"]


def test_bad_paths_and_formats_are_one_message(tmp_path):
    fig = figures.new_figure("--png")
    fig.subplots()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        figures.save(fig, tmp_path / "afile" / "p.png")
    with pytest.raises(ConfigError, match="cannot write"):
        figures.save(fig, tmp_path / "p.notaformat")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    # no suffix: PNG
    assert figures.save(fig, tmp_path / "plain").read_bytes()[:8] == PNG


def test_a_figure_never_replaces_a_pipe_and_is_readable_as_a_plain_file_is(tmp_path):
    """The rename of the atomic write would put a plain file where a pipe or a device was
    (run as root, /dev/null became one); and the temporary file's 0600 hid the PNG from others."""
    import os
    import stat

    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        plot_png(_trace(), fifo, taus=(1.0, 0.8), title="t")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    umask = os.umask(0o022)
    try:
        out = plot_png(_trace(), tmp_path / "h.png", taus=(1.0, 0.8), title="t")
    finally:
        os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o644
