"""`easd-local quantize SRC --type Q4_K_M[,Q8_0,...]`: llama.cpp's quantizer into the cache,
each output registered as a model named after the source and the type."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from ..llamacpp import quantize as q
from ..errors import ConfigError
from ..store import quantized
from ..store.resolve import catalog_model, resolve_model
from ..units import human_size
from .common import console, err_console, friendly
from .pull_ui import DownloadUI, download_bar

_TYPES_HELP = ", ".join(t for t in q.QUANT_TYPES)


def _types(text: str) -> list[str]:
    types = [t.strip() for t in text.split(",") if t.strip()]
    if not types:
        raise ConfigError("--type names no type (e.g. --type Q4_K_M or --type Q4_K_M,Q8_0)")
    for t in types:
        q.quant_type(t)
    return types


def register(app: typer.Typer, models_app: typer.Typer) -> None:  # noqa: ARG001 - every module's signature
    @app.command("quantize")
    @friendly
    def quantize_cmd(
        src: Annotated[str, typer.Argument(
            metavar="SRC", show_default=False,
            help="The GGUF to quantize: a file or a catalog model name (best an F16/BF16/F32 one).")],
        types: Annotated[str, typer.Option(
            "--type", metavar="TYPE[,TYPE...]", show_default=False,
            help=f"llama.cpp quantization types, comma-separated: {_TYPES_HELP}. Required.")],
        allow_requantize: Annotated[bool, typer.Option(
            "--allow-requantize",
            help="Quantize a source that is already quantized (llama.cpp warns that this loses much more quality "
                 "than quantizing from 16 or 32 bits).")] = False,
        threads: Annotated[Optional[int], typer.Option(
            "--threads", "-t", metavar="N", help="Threads for the quantizer \\[default: llama.cpp's: all cores]")] = None,
        name: Annotated[Optional[str], typer.Option(
            "--name", metavar="NAME", help="The model name of the output (one --type) \\[default: the source's name "
            "and the type]")] = None,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="Download a catalog source without asking.")] = False,
    ) -> None:
        """Quantize a GGUF with llama.cpp's own quantizer into the cache and register each output as a model.

        Each output is named after the source and the type (x-f16 -> x-q4_k_m; an already quantized source keeps its name: x-q4_k_m-q8_0), with the source's sha256 recorded, so that `pair score`, `bench --draft/--target` and every command that takes a model name can use it. Ctrl-C stops at once: no half-written file, nothing registered.
        """
        wanted = _types(types)  # every type checked before anything is read or written
        if name is not None and len(set(t.upper() for t in wanted)) != 1:
            raise ConfigError("--name names one output: give one --type with it")
        if threads is not None and threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {threads}")
        entry = catalog_model(src)
        with DownloadUI(yes) as dl:
            path = resolve_model(src, confirm=dl.confirm, progress=dl.progress)
        label = entry.name if entry is not None else Path(src).stem
        with download_bar(transient=True, disable=not err_console.is_terminal) as prog:
            task = prog.add_task(label, total=None, stage="hashing")
            source = quantized.source(path, label, entry, allow_requantize,
                                      hash_progress=lambda d, t: prog.update(task, completed=d, total=t))
        if source.quantized:
            err_console.print(Text(f"warning: {source.path.name} is already quantized ({source.file_type}): "
                                   f"{q.REQUANTIZE_WARNING}", style="yellow"), soft_wrap=True)
        todo = quantized.plan(source, wanted, name)
        console.print(Text(f"{label}: {source.file_type}, {human_size(source.path.stat().st_size)}, "
                           f"sha256 {source.sha256[:12]}…  {source.path}"), soft_wrap=True)
        names = []
        for type_name, model, dest in todo:
            with Progress(TextColumn(f"quantizing to {type_name}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("tensors"), TimeElapsedColumn(), console=err_console, transient=True,
                          disable=not err_console.is_terminal) as prog:
                task = prog.add_task(type_name, total=None)
                made = quantized.make(source, type_name, model, dest, allow_requantize=allow_requantize,
                                      n_threads=threads or 0,
                                      progress=lambda i, n: prog.update(task, completed=i, total=n))
            e = made.entry
            what = "written" if made.made else "already there (same source, same type), not redone"
            console.print(Text(f"{e.name}: {type_name}, {human_size(e.size)}, sha256 {e.sha256[:12]}…, {what}  "
                               f"{made.path}"), soft_wrap=True)
            names.append(e.name)
        if names:
            drafts = " ".join(f"-md {n}" for n in names)
            console.print(Text(f"registered; compare them with: easd-local pair score -m TARGET -md {src} {drafts} "
                               "(as drafts) or use them anywhere a model name goes (-m / -md)"), soft_wrap=True)
