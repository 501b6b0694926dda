"""`easd-local models inspect` and `models check`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..pair import check_pair_files, open_models
from ..runtime import Model
from . import options as o
from .common import console, friendly

LAYOUT_CTX = 64  # models check loads the weights to see where they go; the context hardly matters


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    @models_app.command("inspect")
    @friendly
    def inspect(path: Annotated[Path, typer.Argument(help="GGUF file")]) -> None:
        """Show a GGUF model's facts: architecture, size, quantization, vocabulary."""
        with Model(path, vocab_only=True) as m:
            f = m.facts(with_tensor_types=True)
        t = Table(title=f.name, show_header=False)
        t.add_column("fact", style="bold")
        t.add_column("value")
        rows = [
            ("file", f.path),
            ("file size", f"{_size(f.file_size)} ({f.file_size:,} bytes)"),
            ("architecture", f.architecture),
            ("description", f.description),
            ("parameters", f"{f.n_params:,}"),
            ("quantization", f.file_type),
            ("tensor types", ", ".join(f"{k}×{v}" for k, v in f.tensor_types.items())),
            ("vocabulary", f"{f.n_vocab:,} tokens ({f.vocab_type})"),
            ("context (trained)", f"{f.n_ctx_train:,}"),
            ("chat template", "yes" if f.chat_template else "no"),
            ("KV rollback", "no (recurrent/hybrid)" if f.recurrent else "yes"),
        ]
        for k, v in rows:
            t.add_row(k, str(v))
        console.print(t)

    @models_app.command("check")
    @friendly
    def check(
        draft: Annotated[Path, typer.Argument(help="Draft GGUF file")],
        target: Annotated[Path, typer.Argument(help="Target GGUF file")],
        rpc: o.RpcOpt = None,
        rpc_draft: o.RpcDraftOpt = None,
        tensor_split: o.TensorSplitOpt = None,
        n_gpu_layers: o.NglOpt = -1,
        n_gpu_layers_draft: o.NglDraftOpt = None,
        main_gpu: o.MainGpuOpt = 0,
    ) -> None:
        """Check that DRAFT can draft for TARGET (exit 0 compatible, 2 not). With --rpc, --rpc-draft or
        --tensor-split the pair is also loaded, and each model's layers are listed by device."""
        topts, dopts = o.load_options(LAYOUT_CTX, 1, n_gpu_layers, False, main_gpu, False, n_gpu_layers_draft,
                                      rpc, rpc_draft, tensor_split)
        n_shared = check_pair_files(draft, target)
        console.print(f"compatible: {draft.name} can draft for {target.name} (shared vocabulary {n_shared:,} tokens)")
        if rpc or rpc_draft or tensor_split:
            with open_models(draft, target, topts, dopts) as models:
                for role, m in (("target", models.target), ("draft", models.draft)):
                    total = sum(m.placement.values())
                    where = ", ".join(f"{n}/{total} on {dev}" for dev, n in m.placement.items()) or "unknown"
                    console.print(f"{role} layers: {where}")
