"""Options shared by generate, chat, serve, bench and calibrate, declared once.

Decoding flags default to None so that the precedence flag > pair profile > built-in
default can be applied after parsing (see ``decode_config``); ``DecodeOpts(defaults)``
gives each command the same options with its own defaults shown in ``--help``.
Short names follow llama.cpp's (``-m`` target, ``-md`` draft, ``-c``, ``-n``, ``-t``,
``-ngl``, ``-ngld``, ``-s``, ``--draft-max``, ``--temp``) with llama.cpp's meanings.
"""

from __future__ import annotations

import errno
import inspect
from pathlib import Path
from typing import Annotated, Optional, Sequence

import typer

from ..engine.config import DEFAULT_TAU_DRAFT, DEFAULT_TAU_TARGET, FIELD_TYPES, MODES, DecodeConfig, LOSSLESS_HELP
from .. import host
from ..errors import ConfigError
from ..fsutil import describe_write_error, refuse_non_file
from ..engine.ways import auto_mode
from ..engine.modes import resolve_way_label, way_label
from ..llamacpp.rpc import parse_endpoints, parse_tensor_split
from ..llamacpp.devices import gpu_offload_supported
from ..engine.pair import check_pair_files
from ..llamacpp.runtime import LoadOptions, Model
from ..store.resolve import PairFiles, resolve_config, resolve_pair


def with_default(help: str, shown) -> str:
    """``help`` ending in the default, for options whose parsed default is None (the value
    in force is decided after parsing, so typer cannot show it by itself)."""
    return f"{help} \\[default: {shown}]"


# Model options take a GGUF path or a model name from the catalog (`models list`).
DraftOpt = Annotated[Optional[str], typer.Option(
    "--draft", "-md", metavar="PATH|NAME",
    help=with_default("Draft model: a GGUF file or a catalog model name (llama.cpp: -md).", "the pair's"))]
TargetOpt = Annotated[Optional[str], typer.Option(
    "--target", "-m", metavar="PATH|NAME",
    help=with_default("Target model: a GGUF file or a catalog model name (llama.cpp: -m).", "the pair's"))]
PairOpt = Annotated[Optional[str], typer.Option(
    "--pair", metavar="NAME",
    help=with_default("Pair name from the catalog, built-in or added with `models add-pair`.", "the default pair"))]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Download without asking.")]

CtxOpt = Annotated[int, typer.Option("--ctx", "-c", metavar="N", help="Context length (tokens) for each model.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", "-t", metavar="N",
                                                   help=with_default("CPU threads.", "physical cores, as llama.cpp"))]
NglOpt = Annotated[int, typer.Option("--n-gpu-layers", "-ngl", metavar="N",
                                     help="Target layers to offload to the GPU (-1 = all; ignored on a CPU build).")]
NglDraftOpt = Annotated[Optional[int], typer.Option("--n-gpu-layers-draft", "-ngld", metavar="N",
                                                    help=with_default("Draft layers to offload.", "as --n-gpu-layers"))]
FlashOpt = Annotated[bool, typer.Option("--flash-attn", "-fa", help="Use flash attention (llama.cpp: -fa).")]
MainGpuOpt = Annotated[int, typer.Option("--main-gpu", metavar="I", help="GPU index for the models.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's log.")]
NoRepackOpt = Annotated[bool, typer.Option(
    "--no-repack", "-nr",
    help="Do not repack weights for llama.cpp's faster CPU (CPU_REPACK, AMX) kernels (llama.cpp: -nr). Without it, "
         "a self-test decides once per CPU, build and model type (it turns repacking off where those kernels "
         "crash: llama.cpp #20824).")]
NoMmapOpt = Annotated[bool, typer.Option(
    "--no-mmap",
    help="Read the weights into memory instead of mapping the file (llama.cpp: --no-mmap): slower to load, "
         "faster to decode on some CPUs (`python scripts/bench_modes.py --mmap both` measures yours).")]
RpcOpt = Annotated[Optional[str], typer.Option(
    "--rpc", metavar="HOST:PORT[,...]",
    help=with_default("Put the target's offloaded layers (--n-gpu-layers) on these llama.cpp rpc-servers (and local "
                      "GPUs); no authentication: trusted networks only.", "none: local devices"))]
RpcDraftOpt = Annotated[Optional[str], typer.Option(
    "--rpc-draft", metavar="HOST:PORT[,...]",
    help=with_default("The same for the draft.", "none: the draft stays local"))]
TensorSplitOpt = Annotated[Optional[str], typer.Option(
    "--tensor-split", "-ts", metavar="N0,N1,...",
    help=with_default("Target: share of offloaded layers per device, in llama.cpp's order (RPC servers first, then "
                      "local GPUs), as llama.cpp's --tensor-split/-ts.", "llama.cpp's choice"))]

_MODE_HELP = f"Decoding mode: {', '.join(MODES)}. {LOSSLESS_HELP}"


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


class DecodeOpts:
    """The decoding options of one command, each showing ``defaults``' value in --help.

    ``mode_default`` is the text shown for --mode (chat and generate pick it at run time)."""

    def __init__(self, defaults: DecodeConfig = DecodeConfig(), mode_default: str | None = None) -> None:
        d = defaults

        def opt(kind, *names: str, help: str, shown, metavar: str | None = None):
            return Annotated[Optional[kind], typer.Option(*names, help=with_default(help, shown), metavar=metavar)]

        self.mode = opt(str, "--mode", help=_MODE_HELP, shown=mode_default or d.mode, metavar="MODE")
        self.max_tokens = opt(int, "--max-tokens", "-n", help="Maximum tokens to generate.", shown=d.max_tokens,
                              metavar="N")
        self.temperature = opt(float, "--temperature", "--temp", help="Sampling temperature (0 = greedy).",
                               shown=_num(d.temperature), metavar="T")
        self.top_k = opt(int, "--top-k", help="Top-k sampling (0 = off).", shown=d.top_k, metavar="K")
        self.top_p = opt(float, "--top-p", help="Top-p sampling (1 = off).", shown=_num(d.top_p), metavar="P")
        self.seed = opt(int, "--seed", "-s", help="Random seed (-1: a random one).", shown=d.seed, metavar="N")
        self.gamma = opt(int, "--gamma", "--draft-max", help="Draft tokens per verify (llama.cpp: --draft-max).",
                         shown=d.gamma, metavar="N")
        self.draft_p_min = opt(float, "--draft-p-min", help="Stop drafting when the draft's top probability is below this.",
                               shown=_num(d.draft_p_min), metavar="P")
        self.spec_type = opt(str, "--spec-type", help=(
            "Drafters, comma-separated, tried in order (llama.cpp's names): draft (the draft model), ngram-simple "
            "(prompt lookup), ngram-mod (an n-gram table shared across requests). Lookups have no model and are "
            "lossless in sd; easd and easd-tf always use the draft model."), shown=d.spec_type, metavar="TYPES")
        self.draft_min = opt(int, "--draft-min", help="Drop a proposal shorter than this (llama.cpp: --draft-min).",
                             shown=d.draft_min, metavar="N")
        self.spec_ngram_size_n = opt(int, "--spec-ngram-size-n", help="ngram-simple: the shortest match, in tokens.",
                                     shown=d.spec_ngram_size_n, metavar="N")
        self.spec_ngram_size_m = opt(int, "--spec-ngram-size-m", help="ngram-simple, ngram-mod: most tokens proposed.",
                                     shown=d.spec_ngram_size_m, metavar="M")
        self.spec_ngram_mod_n_match = opt(int, "--spec-ngram-mod-n-match", help="ngram-mod: the key's length in tokens.",
                                          shown=d.spec_ngram_mod_n_match, metavar="N")
        self.top_n = opt(int, "--top-n", help="EASD: N of the top-N overlap.", shown=d.top_n, metavar="N")
        self.overlap = opt(float, "--overlap", help="EASD: minimum top-N overlap in [0,1].", shown=_num(d.overlap),
                           metavar="F")
        self.tau_draft = opt(float, "--tau-draft", help="EASD: draft entropy threshold in nats (inf = gate off).",
                             shown=f"the pair's profile, else {_num(DEFAULT_TAU_DRAFT)}", metavar="NATS")
        self.tau_target = opt(float, "--tau-target", help="EASD: target entropy threshold in nats (inf = gate off).",
                              shown=f"the pair's profile, else {_num(DEFAULT_TAU_TARGET)}", metavar="NATS")
        self.penalty = opt(float, "--penalty", help="EASD: lambda, factor on a gated token's probability (0 = removed).",
                           shown=_num(d.penalty), metavar="LAMBDA")


# generate's and calibrate's defaults (chat has its own: easd_local.chat.CHAT_DEFAULTS)
# the one wording of auto_mode's rule, for every command's --help
AUTO_MODE_RULE = ("auto: the fastest lossless way (target, sd with prompt lookup, sd with the draft model, or "
                  "both) as `easd-local pair costs` measured it on this machine; unmeasured: target (sd with GPU "
                  "offload)")
GEN = DecodeOpts(DecodeConfig(), mode_default=AUTO_MODE_RULE)


def load_options(ctx: int, threads: int | None, n_gpu_layers: int, flash_attn: bool, main_gpu: int, verbose: bool,
                 n_gpu_layers_draft: int | None = None, rpc: str | None = None, rpc_draft: str | None = None,
                 tensor_split: str | None = None, no_repack: bool = False,
                 no_mmap: bool = False) -> tuple[LoadOptions, LoadOptions]:
    """(target options, draft options), validated."""
    rpc_t, rpc_d = parse_endpoints(rpc, "--rpc"), parse_endpoints(rpc_draft, "--rpc-draft")
    split = parse_tensor_split(tensor_split)
    if ctx < 16:
        raise ConfigError(f"--ctx must be >= 16, got {ctx}")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    repack = False if no_repack else None  # None: the self-test decides
    if threads is None:
        threads = host.physical_cores()  # llama.cpp's own default: hyperthreads add little to its matmuls
    t = LoadOptions(n_ctx=ctx, n_threads=threads, n_gpu_layers=n_gpu_layers, flash_attn=flash_attn,
                    main_gpu=main_gpu, verbose=verbose, rpc=rpc_t, tensor_split=split, extra_bufts=repack,
                    mmap=not no_mmap)
    d = LoadOptions(n_ctx=ctx, n_threads=threads,
                    n_gpu_layers=n_gpu_layers if n_gpu_layers_draft is None else n_gpu_layers_draft,
                    flash_attn=flash_attn, main_gpu=main_gpu, verbose=verbose, rpc=rpc_d, extra_bufts=repack,
                    mmap=not no_mmap)
    return t, d


def check_output_path(flag: str, path: Path | None) -> None:
    """ConfigError of one line when ``path`` (an output flag's file) could not be written: a
    folder, a device, or a file on the way where a folder should be. Checked before a long run,
    not after it."""
    if path is None:
        return
    path = Path(path).expanduser()
    try:
        refuse_non_file(path)
        if any(p.exists() and not p.is_dir() for p in path.parents):
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(path))
    except OSError as e:
        raise ConfigError(f"{flag}: {describe_write_error(path, e)}") from None


def ctx_note(asked: int | None, got: int) -> str:
    """" (llama.cpp rounds --ctx 64 up to 256)" when the context is not the size asked for,
    else "": a user who asked for 64 should not wonder where 256 came from."""
    return f" (llama.cpp rounds --ctx {asked} up to {got})" if asked and got != asked else ""


ParallelOpt = Annotated[Optional[int], typer.Option(
    "--parallel", metavar="N",
    help="Decode N problems together, one llama.cpp batch per step (bench: N problems of a method; "
    "KV cache: N × --ctx). "
    "Default 4 on a CPU build, 8 when layers are offloaded to a GPU; 1 = one at a time.")]


def parallel_options(parallel: int | None, topts: LoadOptions, dopts: LoadOptions) -> tuple[int, LoadOptions, LoadOptions]:
    """(N, target options, draft options) for ``--parallel``: contexts holding N sequences."""
    from dataclasses import replace

    from ..bench.runner import default_parallel

    if parallel is None:
        parallel = default_parallel(gpu_offload_supported() and topts.n_gpu_layers != 0)
    if not 1 <= parallel <= 256:
        raise ConfigError(f"--parallel must be between 1 and 256, got {parallel}")
    return parallel, replace(topts, n_seq=parallel), replace(dopts, n_seq=parallel)


# ------------------------------------------------------------------- option groups
# name: (annotated type, default). A command takes a group with ``with_options`` and reads
# it from its ``**kw``; one definition for every command that has these flags.
MODEL_OPTIONS = dict(draft=(DraftOpt, None), target=(TargetOpt, None), pair=(PairOpt, None), yes=(YesOpt, False))
# every DecodeConfig field is a flag, in the dataclass's order (--help's); DecodeOpts words them
DECODE_FLAGS = tuple(FIELD_TYPES)


def decode_group(opts: "DecodeOpts") -> dict:
    """The decoding option group with ``opts``' help (chat shows its own defaults)."""
    return {name: (getattr(opts, name), None) for name in DECODE_FLAGS}


DECODE_OPTIONS = decode_group(GEN)


LLAMA_OPTIONS = dict(
    ctx=(CtxOpt, 4096), threads=(ThreadsOpt, None), n_gpu_layers=(NglOpt, -1), n_gpu_layers_draft=(NglDraftOpt, None),
    flash_attn=(FlashOpt, False), main_gpu=(MainGpuOpt, 0), rpc=(RpcOpt, None), rpc_draft=(RpcDraftOpt, None),
    tensor_split=(TensorSplitOpt, None), no_repack=(NoRepackOpt, False), no_mmap=(NoMmapOpt, False),
    verbose=(VerboseOpt, False),
)


def with_options(before: Sequence[dict] = (), after: Sequence[dict] = ()):
    """Give a command the option groups as typer parameters: ``before`` ahead of its own
    options (after its arguments), ``after`` at the end, in --help's order. The command
    declares its own parameters and ``**kw``, which receives the groups' values."""

    def deco(fn):
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
        kw_only = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        args = [p for p in kw_only if p.default is inspect.Parameter.empty]
        opts = [p for p in kw_only if p.default is not inspect.Parameter.empty]

        def group(groups):
            return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=default)
                    for g in groups for name, (ann, default) in g.items()]

        fn.__signature__ = inspect.Signature(args + group(before) + opts + group(after))
        return fn

    return deco


def llama_options(kw: dict) -> tuple[LoadOptions, LoadOptions]:
    """(target options, draft options) from the LLAMA_OPTIONS values of ``kw``, validated."""
    return load_options(**{k: kw[k] for k in LLAMA_OPTIONS})


def decode_flags(params: dict) -> dict:
    """The decoding flags of a command's parameters (None where not given). --mode may be a
    way's label as the tool prints it (``sd:ngram-simple``): its drafters become --spec-type."""
    flags = {k: params[k] for k in DECODE_FLAGS}
    if flags["mode"] is not None:
        flags["mode"], flags["spec_type"] = resolve_way_label(flags["mode"], flags["spec_type"])
    return flags


def decode_config(base: DecodeConfig, **flags) -> DecodeConfig:
    """Apply the flags that were given (not None) on top of ``base`` and validate."""
    changes = {k: v for k, v in flags.items() if v is not None}
    return base.replace(**changes)


def mode_label(cfg: DecodeConfig) -> str:
    """The mode with its drafters (``modes.way_label``): ``sd:ngram-simple``."""
    return way_label(cfg.mode, cfg.drafters)


def load_draft(spec: PairFiles, cfg: DecodeConfig):
    """The draft file to load: only when the mode and drafters use it (or it is the only model).
    A pair given whole is checked either way (vocabularies only, no weights): an incompatible
    pair is refused at once, not when a later mode first needs the draft (``open_models``
    checks a pair it loads whole itself)."""
    load = cfg.needs_draft_model or spec.target is None
    if spec.draft is not None and spec.target is not None and not load:
        check_pair_files(spec.draft, spec.target)
    return spec.draft if load else None


def draft_loader(spec: PairFiles, dopts: LoadOptions):
    """A loader of the draft model for when a mode first needs it (chat's /mode, serve's first
    request that asks for it), the pair checked first; None without a draft file."""
    if spec.draft is None:
        return None

    def load():
        check_pair_files(spec.draft, spec.target)
        return Model(spec.draft, dopts)

    return load


def worth_saying(why: str) -> bool:
    """Whether to print auto's reason: a measured choice every time (it names its figures), the
    hint that nothing was measured once per machine (``once``): after that it is noise."""
    from ..engine.ways import MEASURE_HINT
    from .once import first_time

    return MEASURE_HINT not in why or first_time(why)


def easd_loss(spec: PairFiles, mode: str) -> str | None:
    """For an EASD mode, what a recorded comparison on this pair found where the mode was
    significantly worse than a lossless one ("EASD (easd-tf) lost 4.9 points against target on
    GSM8K for this pair (...)"; the default pair ships its study's, ``bench report
    --record-verdict`` adds a user's), else None: said beside "not lossless" wherever such a
    mode is picked (generate's note, chat's banner, serve's load line)."""
    from ..engine.modes import mode_info
    from ..engine.verdict import losing
    from ..store.profiles import find_verdicts

    if mode not in MODES or not mode_info(mode).gated:
        return None
    try:
        worse = losing(v for v in find_verdicts(spec.draft, spec.target, spec.entry) if v.method == mode)
    except OSError:  # a profile or model file that cannot be read: "not lossless" alone
        return None
    return worse.summary() if worse else None


def measured(spec: PairFiles, kw: dict) -> dict | None:
    """What ``easd-local pair costs`` recorded for this pair with these load options on this
    machine (speed ratios of the lossless ways, verify costs), or None."""
    if spec.target is None:
        return None
    from ..store import costs

    try:
        key = costs.costs_key(spec.draft, spec.target, kw["threads"], kw["n_gpu_layers"],
                              False if kw["no_repack"] else None)
    except OSError:
        return None
    return costs.find(key)


def verify_costs(spec: PairFiles, kw: dict):
    """The recorded verify costs (one-token decodes per k drafted tokens) for the lookup
    drafters' proposal lengths, or None (they then assume ``drafters.policy.DEFAULT_SLOPE``)."""
    m = measured(spec, kw)
    return m.get("verify_costs") if m else None


def pair_and_config(kw: dict, flags: dict, base: DecodeConfig) -> tuple[PairFiles, DecodeConfig, str, str]:
    """The pair that ``kw``'s MODEL_OPTIONS name (downloaded as --yes says) and the decoding
    settings for it: ``flags`` > the pair's profile > ``base``, with ``ways.auto_mode``'s
    pick (mode and drafters: the fastest lossless way measured on this machine) when --mode
    is not given (one rule for every command). Returns (pair, settings, where the thresholds
    came from, why this mode: "" when --mode chose it)."""
    from .pull_ui import DownloadUI

    mode = flags["mode"]
    with DownloadUI(kw["yes"]) as dl:
        spec = resolve_pair(kw["pair"], kw["draft"], kw["target"], mode=mode or "target",
                            spec_type=flags.get("spec_type") or "draft", confirm=dl.confirm, progress=dl.progress)
    why = ""
    chosen = {}
    if mode is None:
        on_gpu = gpu_offload_supported() and kw["n_gpu_layers"] != 0
        choice = auto_mode(on_gpu, spec.draft is not None, measured(spec, kw))
        mode, why = choice.mode, choice.why
        if flags.get("spec_type") is None:
            chosen["spec_type"] = choice.spec_type
    cfg, source = resolve_config(base, spec, {**flags, **chosen, "mode": mode})
    return spec, cfg, source, why
