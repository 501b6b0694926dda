"""`easd-local models inspect`, `models check` and `models add-pair`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ..store.catalog import add_user_pair, load_catalog
from ..errors import ConfigError, PairError
from ..llamacpp.gguf_info import read_gguf_info
from ..engine.pair import check_pair_files, open_models
from ..store.resolve import catalog_model, resolve_model
from ..units import SIZE_UNITS_NOTE, human_size
from . import options as o
from .catalog_cmds import add_model_with_bar, pair_check_record
from .common import console, friendly
from .progress import spinner
from .pull_ui import DownloadUI
from .render import placement, placement_line

ModelArg = Annotated[str, typer.Argument(metavar="PATH|NAME", help="A GGUF file or a catalog model name.",
                                         show_default=False)]

LAYOUT_CTX = 64  # models check loads the weights to see where they go; the context hardly matters (--ctx)


def _model_name_for(ref: str, role: str, yes: bool) -> tuple[str, Path, bool]:
    """(catalog name, local path, needs registering) for a model given to add-pair."""
    entry = catalog_model(ref)
    if entry is not None:
        with DownloadUI(yes) as dl:
            return entry.name, resolve_model(ref, confirm=dl.confirm, progress=dl.progress), False
    path = Path(ref).expanduser().resolve()
    cat = load_catalog()
    for m in cat.models.values():
        if m.path is not None and Path(m.path) == path:
            return m.name, path, False  # this file is registered already
    name = path.stem
    if name in cat.models or name in cat.pairs:
        raise ConfigError(f"{ref}: the name {name!r} is taken; register the file first with "
                          f"`easd-local models add NAME {ref}` and give NAME to --{role}")
    return name, path, True


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    @models_app.command("inspect")
    @friendly
    def inspect(model: ModelArg) -> None:
        """Show a GGUF model's facts from its header (no llama.cpp load): architecture, size, quantization, vocabulary."""
        f = read_gguf_info(resolve_model(model, pull=False))
        t = Table(title=f.name, show_header=False, caption=SIZE_UNITS_NOTE, caption_justify="left")
        t.add_column("fact", style="bold")
        t.add_column("value")
        rows = [
            ("file", f.path),
            ("file size", f"{human_size(f.file_size)} ({f.file_size:,} bytes)"),
            ("architecture", f.architecture),
            ("layers", f"{f.n_layers:,}"),
            ("parameters", f"{f.n_params:,}"),
            ("quantization", f.file_type),
            ("tensor types", ", ".join(f"{k}×{v}" for k, v in f.tensor_types.items())),
            ("vocabulary", f"{f.n_vocab:,} tokens ({f.vocab_type})"),
            ("context (trained)", f"{f.n_ctx_train:,}"),
            ("chat template", ("no" if not f.chat_template else "yes" if f.chat_template_error is None
                               else f"broken ({f.chat_template_error}); generate --raw prompts without it")),
            ("KV rollback", "no (recurrent/hybrid)" if f.recurrent else "yes"),
            ("GGUF version", str(f.version)),
        ]
        for k, v in rows:
            t.add_row(k, Text(str(v)))
        console.print(t)

    @models_app.command("check")
    @friendly
    def check(
        draft: Annotated[str, typer.Argument(metavar="DRAFT", help="Draft: a GGUF file or a catalog model name.",
                                             show_default=False)],
        target: Annotated[str, typer.Argument(metavar="TARGET", help="Target: a GGUF file or a catalog model name.",
                                              show_default=False)],
        load: Annotated[bool, typer.Option("--load", help="Also load both models as chat would (with the flags "
                                           "below) and say where their layers and memory went.")] = False,
        json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
        ctx: o.CtxOpt = LAYOUT_CTX,
        rpc: o.RpcOpt = None,
        rpc_draft: o.RpcDraftOpt = None,
        tensor_split: o.TensorSplitOpt = None,
        n_gpu_layers: o.NglOpt = -1,
        n_gpu_layers_draft: o.NglDraftOpt = None,
        main_gpu: o.MainGpuOpt = 0,
        no_repack: o.NoRepackOpt = False,
    ) -> None:
        """Check that DRAFT can draft for TARGET, as llama.cpp checks it (exit 0 compatible, 2 not). With --load
        (implied by --rpc, --rpc-draft or --tensor-split) the pair is also loaded: the backend, each model's
        layers by device and its memory."""
        topts, dopts = o.load_options(ctx, 1, n_gpu_layers, False, main_gpu, False, n_gpu_layers_draft,
                                      rpc, rpc_draft, tensor_split, no_repack)
        d, t = resolve_model(draft, pull=False), resolve_model(target, pull=False)
        n_shared = check_pair_files(d, t)
        where = None
        if load or rpc or rpc_draft or tensor_split:
            with spinner("loading both models"), open_models(d, t, topts, dopts) as models:
                where, lines = placement(models), placement_line(models, "check")
        if json_out:
            sys.stdout.write(json.dumps({"compatible": True, "shared_vocab": n_shared, "draft": str(d),
                                         "target": str(t), "placement": where}) + "\n")
            return
        console.print(Text(f"compatible: {d.name} can draft for {t.name} (shared vocabulary {n_shared:,} tokens)"),
                      soft_wrap=True)
        if where is not None:
            for text in lines.splitlines():
                console.print(Text(text), soft_wrap=True)

    @models_app.command("add-pair")
    @friendly
    def add_pair(
        name: Annotated[str, typer.Argument(metavar="NAME", help="Name for the pair (then: --pair NAME).",
                                            show_default=False)],
        draft: Annotated[str, typer.Option("--draft", "-md", metavar="PATH|NAME",
                                           help="Draft: a GGUF file or a catalog model name.", show_default=False)],
        target: Annotated[str, typer.Option("--target", "-m", metavar="PATH|NAME",
                                            help="Target: a GGUF file or a catalog model name.", show_default=False)],
        yes: o.YesOpt = False,
    ) -> None:
        """Register a draft/target pair under NAME after checking it as llama.cpp does; the verdict is stored.

        A file given by path is registered as a model too (named after the file), and stays where it is.
        """
        d_name, d_path, d_new = _model_name_for(draft, "draft", yes)
        t_name, t_path, t_new = _model_name_for(target, "target", yes)
        cat = load_catalog()
        if name in cat.pairs and not cat.pairs[name].user:
            raise ConfigError(f"{name!r} is a built-in pair; choose another name")
        try:
            n_shared = check_pair_files(d_path, t_path)
        except PairError as e:
            raise PairError(f"pair {name} not added: {d_path.name} cannot draft for {t_path.name}: {e}") from None
        # registered only once the check passed: a failed add-pair leaves the catalog as it was
        if d_new:
            add_model_with_bar(d_name, str(d_path), role="draft")
        if t_new and t_path != d_path:
            add_model_with_bar(t_name, str(t_path), role="target")
        old = cat.pairs.get(name)
        entry = add_user_pair(name, d_name, t_name, pair_check_record(n_shared))
        if old is not None:  # a user pair (a built-in one was refused above): re-adding is how one is updated
            console.print(Text(f"replaced pair {name} (was {old.draft.name} -> {old.target.name})"), soft_wrap=True)
        console.print(Text(f"added pair {entry.name}: {d_name} drafting for {t_name}; compatible, shared vocabulary "
                           f"{n_shared:,} tokens. Use it with --pair {entry.name}."), soft_wrap=True)
