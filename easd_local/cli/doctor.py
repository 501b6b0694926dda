"""``easd-local doctor``: what this install has, in one screen a user runs first or pastes into
a bug report; exit 0 when `chat` on the default pair is ready, 2 with what to do otherwise."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.text import Text

from .common import console, err_console, friendly


def register(app: typer.Typer, models_app: typer.Typer) -> None:  # noqa: ARG001 - every module's signature
    @app.command("doctor")
    @friendly
    def doctor(
        json_out: Annotated[bool, typer.Option("--json", help="One JSON object instead of text.")] = False,
        no_self_test: Annotated[bool, typer.Option(
            "--no-self-test", help="Do not run the weight-repacking self-test on models not tested yet.")] = False,
    ) -> None:
        """Versions, llama.cpp's system info and devices, the weight-repacking self-test, the RPC backend, the
        model cache and the default pair: run it first, or paste it into a bug report. Exit 0 when `easd-local
        chat` is ready to run, 2 otherwise (with what to do)."""
        from ..doctor import diagnose

        report = diagnose(self_test=not no_self_test)
        if json_out:
            sys.stdout.write(json.dumps({**report.fields, "ready": report.ready, "problems": report.problems},
                                        ensure_ascii=False) + "\n")
        else:
            for name, value in report.fields.items():
                if isinstance(value, list):
                    console.print(Text(f"{name}:"))
                    for item in value or ["none"]:
                        console.print(Text(f"  {item}"), soft_wrap=True)
                else:
                    console.print(Text(f"{name}: {value}"), soft_wrap=True)
            console.print(Text("ready: " + ("yes, `easd-local chat` can run" if report.ready else "no")))
        for p in report.problems:
            err_console.print(Text(f"to do: {p}"))
        if not report.ready:
            raise typer.Exit(2)
