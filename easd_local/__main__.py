"""The ``easd-local`` console script and ``python -m easd_local``.

Ctrl-C is turned into one line and exit status 130 here, before the heavy imports: typer,
rich, numpy and llama.cpp take most of a second to import, and a Ctrl-C in that second
would otherwise print a KeyboardInterrupt traceback (see ``interrupts``). The commands
handle Ctrl-C themselves once they run; the ``except`` is the net under them.

On POSIX the command runs in a child process under a small supervising parent
(``supervise``), so that a crash inside llama.cpp ends in one line rather than a bare
``Segmentation fault``. The child dies with that parent (``lifeline``): a supervisor killed
with SIGKILL leaves no worker behind.
"""

from __future__ import annotations

import sys

from .interrupts import EXIT_INTERRUPTED, Terminated, end_terminated, exit_on_interrupt


def main() -> None:
    exit_on_interrupt()
    from . import supervise

    if supervise.wanted():
        sys.exit(supervise.run(sys.argv[1:]))
    from . import crashnote
    from .lifeline import die_with_parent

    die_with_parent()  # before any work: the supervisor may already be gone
    crashnote.adopt()
    supervise.child_ready()
    try:
        from .cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        try:
            sys.stderr.write("interrupted\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        sys.exit(EXIT_INTERRUPTED)
    except Terminated as t:  # what it was writing is removed: now end as the signal would have
        end_terminated(t)


if __name__ == "__main__":
    main()
