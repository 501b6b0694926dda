"""Options shared by generate, chat, bench and calibrate, declared once.

Decoding flags default to None so that the precedence flag > pair profile > built-in
default can be applied after parsing (see ``decode_config``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing import Annotated

from ..config import DecodeConfig, MODES
from ..errors import ConfigError
from ..rpc import parse_endpoints, parse_tensor_split
from ..runtime import LoadOptions

DraftOpt = Annotated[Optional[Path], typer.Option("--draft", help="Draft GGUF file (bypasses the catalog).")]
TargetOpt = Annotated[Optional[Path], typer.Option("--target", help="Target GGUF file (bypasses the catalog).")]
PairOpt = Annotated[Optional[str], typer.Option("--pair", help="Pair name from the catalog (default: the default pair).")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Download without asking.")]

CtxOpt = Annotated[int, typer.Option("--ctx", help="Context length (tokens) for each model.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", help="CPU threads (default: all cores).")]
NglOpt = Annotated[int, typer.Option("--n-gpu-layers", help="Target layers to offload to the GPU (-1 = all).")]
NglDraftOpt = Annotated[Optional[int], typer.Option("--n-gpu-layers-draft", help="Draft layers to offload (default: as target).")]
FlashOpt = Annotated[bool, typer.Option("--flash-attn/--no-flash-attn", help="Use flash attention.")]
MainGpuOpt = Annotated[int, typer.Option("--main-gpu", help="GPU index for the models.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's log.")]
RpcOpt = Annotated[Optional[str], typer.Option(
    "--rpc", metavar="HOST:PORT[,...]",
    help="Put the target's offloaded layers (--n-gpu-layers) on these llama.cpp rpc-servers (and local GPUs); "
         "no authentication: trusted networks only.")]
RpcDraftOpt = Annotated[Optional[str], typer.Option(
    "--rpc-draft", metavar="HOST:PORT[,...]", help="The same for the draft (default: the draft stays local).")]
TensorSplitOpt = Annotated[Optional[str], typer.Option(
    "--tensor-split", metavar="N0,N1,...",
    help="Target: share of offloaded layers per device, in llama.cpp's order (RPC servers first, then local GPUs).")]

ModeOpt = Annotated[Optional[str], typer.Option("--mode", help=f"Decoding mode: {', '.join(MODES)}.")]
MaxTokOpt = Annotated[Optional[int], typer.Option("--max-tokens", help="Maximum tokens to generate.")]
TempOpt = Annotated[Optional[float], typer.Option("--temperature", help="Sampling temperature (0 = greedy).")]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", help="Top-k sampling (0 = off).")]
TopPOpt = Annotated[Optional[float], typer.Option("--top-p", help="Top-p sampling (1 = off).")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed.")]
GammaOpt = Annotated[Optional[int], typer.Option("--gamma", help="Draft tokens per verify (default 4).")]
PMinOpt = Annotated[Optional[float], typer.Option("--draft-p-min", help="Stop drafting when the draft's top probability is below this.")]
TopNOpt = Annotated[Optional[int], typer.Option("--top-n", help="EASD: N of the top-N overlap (default 5).")]
OverlapOpt = Annotated[Optional[float], typer.Option("--overlap", help="EASD: minimum top-N overlap in [0,1] (default 0.6).")]
TauDOpt = Annotated[Optional[float], typer.Option("--tau-draft", help="EASD: draft entropy threshold in nats (inf = gate off).")]
TauTOpt = Annotated[Optional[float], typer.Option("--tau-target", help="EASD: target entropy threshold in nats (inf = gate off).")]
PenaltyOpt = Annotated[Optional[float], typer.Option("--penalty", help="EASD: lambda, factor on a gated token's probability (0 = removed).")]


def load_options(ctx: int, threads: int | None, n_gpu_layers: int, flash_attn: bool, main_gpu: int, verbose: bool,
                 n_gpu_layers_draft: int | None = None, rpc: str | None = None, rpc_draft: str | None = None,
                 tensor_split: str | None = None) -> tuple[LoadOptions, LoadOptions]:
    """(target options, draft options), validated."""
    rpc_t, rpc_d = parse_endpoints(rpc, "--rpc"), parse_endpoints(rpc_draft, "--rpc-draft")
    split = parse_tensor_split(tensor_split)
    if ctx < 16:
        raise ConfigError(f"--ctx must be >= 16, got {ctx}")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    t = LoadOptions(n_ctx=ctx, n_threads=threads, n_gpu_layers=n_gpu_layers, flash_attn=flash_attn,
                    main_gpu=main_gpu, verbose=verbose, rpc=rpc_t, tensor_split=split)
    d = LoadOptions(n_ctx=ctx, n_threads=threads,
                    n_gpu_layers=n_gpu_layers if n_gpu_layers_draft is None else n_gpu_layers_draft,
                    flash_attn=flash_attn, main_gpu=main_gpu, verbose=verbose, rpc=rpc_d)
    return t, d


ParallelOpt = Annotated[Optional[int], typer.Option(
    "--parallel", metavar="N",
    help="Decode N problems together, one llama.cpp batch per step (bench: N problems of a method; "
    "KV cache: N × --ctx). "
    "Default 4 on a CPU build, 8 when layers are offloaded to a GPU; 1 = one at a time.")]


def parallel_options(parallel: int | None, topts: LoadOptions, dopts: LoadOptions) -> tuple[int, LoadOptions, LoadOptions]:
    """(N, target options, draft options) for ``--parallel``: contexts holding N sequences."""
    from dataclasses import replace

    from ..bench.runner import default_parallel
    from ..runtime import gpu_offload_supported

    if parallel is None:
        parallel = default_parallel(gpu_offload_supported() and topts.n_gpu_layers != 0)
    if not 1 <= parallel <= 256:
        raise ConfigError(f"--parallel must be between 1 and 256, got {parallel}")
    return parallel, replace(topts, n_seq=parallel), replace(dopts, n_seq=parallel)


DECODE_FLAGS = ("mode", "max_tokens", "temperature", "top_k", "top_p", "seed", "gamma", "draft_p_min",
                "top_n", "overlap", "tau_draft", "tau_target", "penalty")


def decode_flags(params: dict) -> dict:
    """The decoding flags of a command's parameters (None where not given)."""
    return {k: params[k] for k in DECODE_FLAGS}


def decode_config(base: DecodeConfig, **flags) -> DecodeConfig:
    """Apply the flags that were given (not None) on top of ``base`` and validate."""
    changes = {k: v for k, v in flags.items() if v is not None}
    return base.replace(**changes)
