"""`pull`, `models list`, `models add`: the catalog and the model cache."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import typer
from rich import box
from rich.table import Table

from ..catalog import add_user_model, is_present, load_catalog, local_path
from ..errors import PullError
from ..pull import missing_models, pull_model
from .common import console, friendly
from .pull_ui import ask_download, download_bar, human_size


@contextmanager
def _file_bars() -> Iterator:
    """One rich bar per file on stderr; yields ``start(label, total) -> callback``."""
    with download_bar() as prog:

        def start(label: str, total: int):
            task = prog.add_task(label, total=total)

            def cb(done: int, total_: int, message: str) -> None:
                prog.update(task, completed=done, total=total_, description=message)

            return cb

        yield start


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    @app.command("pull")
    @friendly
    def pull(
        name: Optional[str] = typer.Argument(
            None, help="A model or pair from the catalog (default: the default pair)."
        ),
        yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before large downloads."),
    ) -> None:
        """Download catalog models into the cache and verify their sha256."""
        cat = load_catalog()
        _kind, entries = cat.resolve(name)
        missing = missing_models(entries)
        total = sum(e.size for e in missing)
        if not ask_download(total, yes):
            raise PullError("download declined")
        seen: set[str] = set()
        done_lines = []
        with _file_bars() as start:
            for e in entries:
                if e.name in seen:
                    continue
                seen.add(e.name)
                cb = start(e.name, e.size)
                path = pull_model(e, progress=cb)
                done_lines.append(f"{e.name}: sha256 {e.sha256[:12]}… verified  {path}")
        for line in done_lines:
            console.print(line, soft_wrap=True)

    @models_app.command("list")
    @friendly
    def models_list() -> None:
        """Catalog models (built-in and user-added) and pairs, and whether they are cached."""
        cat = load_catalog()
        t = Table(title="models", title_justify="left", box=box.SIMPLE_HEAD)
        t.add_column("name", overflow="fold")
        t.add_column("role", no_wrap=True)
        t.add_column("file", overflow="fold")
        t.add_column("size", justify="right", no_wrap=True)
        t.add_column("present", no_wrap=True)
        t.add_column("path", overflow="fold")
        for m in cat.models.values():
            t.add_row(
                m.name + (" (user)" if m.user else ""),
                m.role or "-",
                m.file,
                human_size(m.size),
                "yes" if is_present(m) else "no",
                str(local_path(m)),
            )
        console.print(t)
        p = Table(title="pairs", title_justify="left", box=box.SIMPLE_HEAD)
        p.add_column("name", overflow="fold")
        p.add_column("draft", overflow="fold")
        p.add_column("target", overflow="fold")
        p.add_column("present", no_wrap=True)
        p.add_column("profile", no_wrap=True)
        for pr in cat.pairs.values():
            both = is_present(pr.draft) and is_present(pr.target)
            p.add_row(
                pr.name + (" (default)" if pr.name == cat.default_pair_name else ""),
                pr.draft.name,
                pr.target.name,
                "yes" if both else "no",
                "yes" if pr.profile else "-",
            )
        console.print(p)

    @models_app.command("add")
    @friendly
    def models_add(
        name: str = typer.Argument(..., help="Name to register the model under."),
        path: str = typer.Argument(..., help="A local GGUF file (stays where it is)."),
        role: Optional[str] = typer.Option(None, "--role", help="draft or target."),
    ) -> None:
        """Register a local GGUF file in the user catalog (records size and sha256)."""
        with download_bar(transient=True) as prog:
            task = prog.add_task(f"hashing {name}", total=None)
            entry = add_user_model(
                name, path, role=role, progress=lambda d, t: prog.update(task, completed=d, total=t)
            )
        console.print(
            f"added {entry.name}: {human_size(entry.size)}, sha256 {entry.sha256[:12]}…, "
            f"role {entry.role or '-'}  {entry.path}",
            soft_wrap=True,
        )
