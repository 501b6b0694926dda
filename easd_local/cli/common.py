"""Shared CLI plumbing: error handling and consoles."""

from __future__ import annotations

import functools
import sys

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import EasdError
from ..interrupts import EXIT_INTERRUPTED, raise_on_interrupt

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def _fatal(message: str) -> None:
    """llama.cpp is about to end the process (an RPC server dropped): say it in one line."""
    try:
        sys.stdout.flush()
        if sys.stdout.isatty():
            sys.stdout.write("\n")
            sys.stdout.flush()
    except (OSError, ValueError):
        pass
    err_console.show_cursor(True)  # a progress bar may have hidden it
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)


def friendly(fn):
    """Turn EasdError into one line on stderr + its exit code; Ctrl-C into exit 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from ..llamacpp.devices import set_fatal_handler

        set_fatal_handler(_fatal)
        raise_on_interrupt()  # the command handles Ctrl-C from here on
        try:
            return fn(*args, **kwargs)
        except EasdError as e:
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, soft_wrap=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            # stdout closed (e.g. piped into `head`): nothing more to say
            try:
                sys.stdout = open("/dev/null", "w")  # noqa: SIM115
            except OSError:
                pass
            raise typer.Exit(0) from None

    return wrapper


def run_script(main, argv=None) -> int:
    """A script's ``main(argv)``, with the package's errors (a missing or broken model file, a
    bad pair) told in one line on stderr and their exit code, not a traceback."""
    try:
        return main(argv)
    except EasdError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
