"""Terminal side of downloads: the confirmation question and the progress bar."""

from __future__ import annotations

import sys

import typer

from .common import err_console


def confirm_download(yes: bool):
    def confirm(total_bytes: int) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty():
            err_console.print(
                f"the default pair needs a {total_bytes / 1e9:.2f} GB download; rerun with --yes to allow it"
            )
            return False
        return typer.confirm(f"Download {total_bytes / 1e9:.2f} GB of model files?", default=True)

    return confirm


def pull_progress():
    """A progress callback (bytes_done, bytes_total, message) drawing a rich bar on stderr."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    state: dict = {}

    def cb(done: int, total: int, message: str = "") -> None:
        if "bar" not in state:
            bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                           TimeRemainingColumn(), console=err_console, transient=False)
            bar.start()
            state["bar"] = bar
            state["task"] = bar.add_task(message or "download", total=total)
        bar = state["bar"]
        bar.update(state["task"], completed=done, total=total, description=message or "download")
        if total and done >= total:
            bar.stop()
            state.clear()

    return cb
