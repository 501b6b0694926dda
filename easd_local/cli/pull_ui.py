"""Terminal side of downloads, shared by `pull` and every command that may fetch the
default pair: the size question and the progress bar (both on stderr)."""

from __future__ import annotations

import sys

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from ..errors import PullError
from ..pull import CONFIRM_ABOVE_BYTES
from .common import err_console


def human_size(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def download_bar(transient: bool = False) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=err_console, transient=transient)


def ask_download(total: int, yes: bool = False) -> bool:
    """Ask before downloading more than 1 GB (``--yes`` skips; without a terminal it
    refuses with a hint instead of waiting for an answer that cannot come)."""
    if yes or total <= CONFIRM_ABOVE_BYTES:
        return True
    if not sys.stdin.isatty():
        raise PullError(f"this needs a {human_size(total)} download; pass --yes to allow it")
    return typer.confirm(f"Download {human_size(total)}?", default=True, err=True)


def confirm_download(yes: bool):
    """``ask_download`` as the ``confirm(total_bytes)`` callback that ``ensure_pair`` takes."""
    return lambda total: ask_download(total, yes)


def pull_progress():
    """A progress callback (bytes_done, bytes_total, message) drawing one bar per file."""
    state: dict = {}

    def cb(done: int, total: int, message: str = "") -> None:
        if "bar" not in state:
            state["bar"] = bar = download_bar()
            bar.start()
            state["task"] = bar.add_task(message or "download", total=total)
        bar = state["bar"]
        bar.update(state["task"], completed=done, total=total, description=message or "download")
        if total and done >= total:
            bar.stop()
            state.clear()

    return cb
