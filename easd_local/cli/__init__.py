"""`easd-local` command line: thin layer that parses, calls and renders.

Each sub-module registers its own commands so that they stay small and independent.
"""

from __future__ import annotations

import typer
import typer.core


def _plain_help_types() -> None:
    """--help in the usual CLI convention: flags show no type, other options TEXT /
    INTEGER / FLOAT / PATH (recent typer writes <bool>, <str>, ...), and a required
    argument reads PROMPT in the usage line (recent typer writes {PROMPT})."""
    names = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "", "path": "PATH", "file": "PATH",
             "dir": "PATH"}
    opt, arg = getattr(typer.core, "TyperOption", None), getattr(typer.core, "TyperArgument", None)
    if opt is not None and hasattr(opt, "display_type_rich"):
        original = opt.display_type_rich

        def display_type_rich(self, ctx):
            if self.metavar is None and getattr(self, "is_flag", False):
                return None
            shown = original(self, ctx)
            if isinstance(shown, str) and shown.startswith("<") and shown.endswith(">"):
                label = shown[1:-1]
                return names.get(label, label.upper()) or None
            return shown

        opt.display_type_rich = display_type_rich
    if arg is not None and hasattr(arg, "_usage_display_name"):
        original_usage = arg._usage_display_name

        def _usage_display_name(self):
            shown = original_usage(self)
            return shown[1:-1] if shown.startswith("{") and shown.endswith("}") else shown

        arg._usage_display_name = _usage_display_name
    if arg is not None and hasattr(arg, "display_type_rich"):
        original_arg = arg.display_type_rich

        def arg_display_type_rich(self, ctx):
            shown = original_arg(self, ctx)
            if isinstance(shown, str) and shown.startswith("<") and shown.endswith(">"):
                return None  # the argument's name already says what it is
            return shown

        arg.display_type_rich = arg_display_type_rich


_plain_help_types()

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
from . import doctor as _doctor  # noqa: E402
from . import quantize as _quantize  # noqa: E402
from . import pair as _pair  # noqa: E402

for _mod in (_models, _catalog_cmds, _generate, _chat, _bench, _calibrate, _serve, _doctor, _quantize, _pair):
    _mod.register(app, models_app)


def main() -> None:
    # the name, not sys.argv[0]: under the supervising parent the command runs as `python -m easd_local`
    app(prog_name="easd-local")
