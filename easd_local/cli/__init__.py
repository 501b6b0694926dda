"""`easd-local` command line: thin layer that parses, calls and renders.

Each sub-module registers its own commands so that they stay small and independent.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="easd-local",
    help="Entropy-Aware Speculative Decoding (EASD) on local GGUF draft/target pairs (llama.cpp).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
models_app = typer.Typer(help="Inspect, check, list and add GGUF models.", no_args_is_help=True)
app.add_typer(models_app, name="models")

from . import models as _models  # noqa: E402
from . import catalog_cmds as _catalog_cmds  # noqa: E402
from . import generate as _generate  # noqa: E402
from . import chat as _chat  # noqa: E402
from . import bench as _bench  # noqa: E402
from . import calibrate as _calibrate  # noqa: E402
from . import serve as _serve  # noqa: E402

for _mod in (_models, _catalog_cmds, _generate, _chat, _bench, _calibrate, _serve):
    _mod.register(app, models_app)


def main() -> None:
    app()
