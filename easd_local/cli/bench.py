"""`easd-local bench`: accuracy and speed of decoding methods on reasoning benchmarks.

``easd-local bench [run options]`` runs a benchmark (``bench run`` is the same thing, for
scripts that prefer an explicit verb); ``easd-local bench report FILE`` summarises a
results file. The work itself is ``easd_local.bench.runner``; the tables are
``easd_local.bench.report``.
"""

from __future__ import annotations

import copy
import time
import typing
from pathlib import Path
from typing import Annotated, Optional, Sequence

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.console import Console
from rich.text import Text

from ..bench import report as rep
from ..bench import parted as parted_mod
from ..bench import regrade as regrade_mod
from ..bench import rerun as rerun_mod
from ..bench import runner
from ..engine.near_ties import ARGMAX, ARGMAX_NEAR_TIE
from ..bench.datasets import GRADERS, PRESETS, load_dataset, preset_names
from ..store import provenance
from ..engine.config import LOSSLESS_HELP, MODES, DecodeConfig
from .. import figures
from ..errors import ConfigError
from ..fsutil import describe_write_error, write_text_atomic
from ..llamacpp.runtime import fmt_bytes
from . import options as o
from .common import console, err_console, friendly
from .pull_ui import DownloadUI

P_DATA = "Dataset"
P_METHODS = "Methods"
P_MODELS = "Models"
P_DECODE = "Decoding (all methods; a method's own settings win)"
P_OUT = "Results"
P_LLAMA = "llama.cpp"


def _panel(opt, panel: str):
    """A shared option from options.py shown under ``panel`` in --help."""
    base, info = typing.get_args(opt)[:2]
    info = copy.copy(info)
    info.rich_help_panel = panel
    return Annotated[base, info]


DatasetOpt = Annotated[Optional[str], typer.Option(
    "--dataset", help=f"A preset ({', '.join(n for n in preset_names() if n != 'gsm8k-train')}) or a JSONL file "
    "(then give --question-key and --answer-key). Required (no default).", rich_help_panel=P_DATA)]
QKeyOpt = Annotated[Optional[str], typer.Option(
    "--question-key", help="JSON field holding the question (JSONL files; overrides a preset's; default: the preset's).", rich_help_panel=P_DATA)]
AKeyOpt = Annotated[Optional[str], typer.Option(
    "--answer-key", help="JSON field holding the gold answer (JSONL files; overrides a preset's; default: the preset's).", rich_help_panel=P_DATA)]
GraderOpt = Annotated[Optional[str], typer.Option(
    "--grader", help=f"Answer grader: {' or '.join(GRADERS)} (default: the preset's; numeric for files).",
    rich_help_panel=P_DATA)]
LimitOpt = Annotated[Optional[int], typer.Option("--limit", help="Use N problems (after --offset; default: all).", rich_help_panel=P_DATA)]
OffsetOpt = Annotated[int, typer.Option("--offset", help="Skip the first N problems.", rich_help_panel=P_DATA)]
SampleOpt = Annotated[Optional[int], typer.Option(
    "--sample", help="Draw N problems at random (with --seed) from the --offset/--limit slice (default: none, in order).", rich_help_panel=P_DATA)]
QidsOpt = Annotated[Optional[list[str]], typer.Option(
    "--qid", metavar="QID[,QID...]",
    help="Only these problems of the --offset/--limit slice (the qid field of a results row, e.g. gsm8k-test-00007; "
    "comma-separated or repeated; default: all).", rich_help_panel=P_DATA)]
BenchSeedOpt = Annotated[Optional[int], typer.Option(
    "--seed", help="Seed for --sample and for sampling when --temperature > 0 (default 0).", rich_help_panel=P_DATA)]

ModesOpt = Annotated[Optional[str], typer.Option(
    "--modes", help=f"Comma-separated modes to run, each a method named by its mode: {', '.join(MODES)} "
    f"(default target,sd,easd; none by default when --easd-config or --sweep is given). {LOSSLESS_HELP}",
    rich_help_panel=P_METHODS)]
EasdConfigOpt = Annotated[Optional[list[str]], typer.Option(
    "--easd-config", metavar="NAME:KEY=VAL,...",
    help="A method NAME with its own settings, e.g. hot:tau-target=1.5,penalty=0.5 (mode from mode=, else easd). "
    "Repeatable (default: none).", rich_help_panel=P_METHODS)]
SweepOpt = Annotated[Optional[list[str]], typer.Option(
    "--sweep", metavar="KEY=V1,V2,...",
    help="One easd method per value, named like easd\\[tau_target=1.5]; repeat for a grid (default: none).", rich_help_panel=P_METHODS)]

PairsOpt = Annotated[Optional[list[str]], typer.Option(
    "--pair", metavar="NAME", help="Catalog pair name; repeat to compare pairs (default: the default pair).", rich_help_panel=P_MODELS)]
DraftsOpt = Annotated[Optional[list[str]], typer.Option(
    "--draft", "-md", metavar="PATH|NAME", help="Draft GGUF file or catalog model name; repeat with --target to compare "
    "pairs (paired in order; default: the pair's).", rich_help_panel=P_MODELS)]
TargetsOpt = Annotated[Optional[list[str]], typer.Option(
    "--target", "-m", metavar="PATH|NAME", help="Target GGUF file or catalog model name; the i-th --target goes with "
    "the i-th --draft (default: the pair's).", rich_help_panel=P_MODELS)]

OutOpt = Annotated[Optional[Path], typer.Option(
    "--out", metavar="FILE", help="Results file (JSON lines, one row per problem × method × pair, appended as each finishes). Required (no default).",
    rich_help_panel=P_OUT)]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume", help="Continue an interrupted run: keep --out's rows and compute only the missing ones.",
    rich_help_panel=P_OUT)]
StrictEnvOpt = Annotated[bool, typer.Option(
    "--strict-env", help="With --resume: refuse (instead of warning) when this run's environment (llama.cpp build, "
    "threads, batch sizes, offload, machine, code version) differs from that of the file's rows.",
    rich_help_panel=P_OUT)]
BenchMaxTokOpt = Annotated[Optional[int], typer.Option(
    "--max-tokens", help=f"Maximum tokens per answer (default {runner.DEFAULT_MAX_TOKENS}).", rich_help_panel=P_DECODE)]


def _check_no_run_options(ctx: typer.Context) -> None:
    # (typer vendors its own click: compare by name, not by class)
    given = [p.opts[0] for p in ctx.command.params
             if getattr(p, "param_type_name", "") == "option"
             and getattr(ctx.get_parameter_source(p.name), "name", "") == "COMMANDLINE"]
    if given:
        raise ConfigError(
            f"{', '.join(given)} belong{'s' if len(given) == 1 else ''} to a benchmark run, not to "
            f"'bench {ctx.invoked_subcommand}'; put the subcommand's own options after its name"
        )


class _BenchProgress(Progress):
    """A progress bar with a running-accuracy line under it."""

    accuracy = Text("")

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        if self.accuracy.plain:
            yield self.accuracy


class _Accuracy:
    """Running accuracy per method (per pair/method when several pairs run)."""

    def __init__(self, several_pairs: bool) -> None:
        self.several = several_pairs
        self.counts: dict[str, list[int]] = {}

    def add(self, row: dict) -> None:
        key = f"{row['pair']}/{row['method']}" if self.several else row["method"]
        c = self.counts.setdefault(key, [0, 0])
        c[0] += bool(row["correct"])
        c[1] += 1

    def text(self) -> str:
        parts = [f"{k} {c}/{n} {100 * c / n:.0f}%" for k, (c, n) in self.counts.items() if n]
        return ("accuracy: " + " · ".join(parts)) if parts else ""


def print_report(paths: Sequence[Path], markdown: Path | None = None, plot: Path | None = None, same_env: bool = False,
                 methods: list[str] | None = None, common: bool = False, record_verdict: bool = False) -> None:
    # several files report as one, in the order given: a later file's row for the same problem,
    # method and pair replaces an earlier one's (a re-run of some problems with other settings)
    results: list[dict] = []
    for path in paths:
        loaded = rep.load_results(path)
        if loaded.torn_lines:
            err_console.print(
                Text(f"note: the last line of {path} was cut off mid-write (the run was killed) and is skipped; "
                     "rerun the benchmark with --resume to redo that row", style="yellow")
            )
        results += loaded
    names = ", ".join(map(str, paths))
    rows = rep.select_rows(results, methods=methods, common=common)
    summaries = rep.summarize(rows, same_env=same_env)
    if not summaries:
        console.print(Text(f"{names}: no results yet" if not results else
                           f"{names}: no problem was answered by every method shown (--common)"))
    # a log file or pipe gets whole tables rather than 80 columns of ellipses
    out = console if console.is_terminal else Console(highlight=False, width=max(console.width, 200))
    env_note = rep.env_lines(rep.environments(rep.latest_rows(rows)[0]), same_env)
    for i, line in enumerate(env_note):  # above the tables: they may compare across environments
        out.print(Text(("warning: " if i == 0 else "  ") + line, style="yellow"))
    for table in rep.render_rich(summaries):
        out.print(table)
    loads = rep.load_lines(summaries)
    for line in loads:
        out.print(Text(f"note: {line}"))
    if markdown is not None:
        try:
            shown = ([f"files: {names} (a later file's row replaces an earlier one's for the same problem and method)"]
                     if len(paths) > 1 else []) + ([f"methods shown: {', '.join(methods)}"] if methods else []) + (
                ["only the problems every shown method answered (--common)"] if common else [])
            write_text_atomic(markdown.expanduser(), rep.render_markdown(summaries, [*env_note, *shown], loads))
        except OSError as exc:
            raise ConfigError(f"cannot write {str(markdown)!r}: {describe_write_error(markdown, exc)}") from None
        console.print(Text(f"markdown: {markdown}"))
    if plot is not None and summaries:
        console.print(Text(f"plot: {rep.plot(summaries, plot)}"))
    if record_verdict:
        _record_verdicts(summaries, rows)


def _record_verdicts(summaries, rows) -> None:
    from ..bench.verdicts import verdicts
    from ..store.profiles import record_verdict

    found = verdicts(summaries, rep.latest_rows(rows)[0])
    if not found:
        raise ConfigError("nothing to record: --record-verdict needs an EASD mode (easd, easd-tf) and a lossless one "
                          "(target, sd) answered on the same problems, in rows that record their model files")
    for pv in found:
        try:
            path = record_verdict(pv.draft, pv.target, pv.verdict)
        except OSError as exc:
            raise ConfigError(f"cannot record the verdict: {exc.strerror or exc}") from None
        worse = (" (significantly worse: said wherever this mode is picked for this pair)"
                 if pv.verdict.significant_loss else "")
        console.print(Text(f"verdict for {pv.pair}: {pv.verdict.summary()}, {pv.verdict.wins} wins / "
                           f"{pv.verdict.losses} losses{worse} -> {path}"), soft_wrap=True)


def _run(
    dataset, question_key, answer_key, grader, limit, offset, sample, seed, qids, modes, easd_config, sweep,
    pair, draft, target, yes, out, resume, strict_env, max_tokens, temperature, top_k, top_p, gamma, draft_p_min,
    top_n, overlap, tau_draft, tau_target, penalty, ctx, threads, n_gpu_layers, n_gpu_layers_draft,
    flash_attn, main_gpu, verbose, rpc=None, rpc_draft=None, tensor_split=None, parallel=None, no_repack=False,
    no_mmap=False,
    spec_type=None, draft_min=None, spec_ngram_size_n=None, spec_ngram_size_m=None, spec_ngram_mod_n_match=None,
) -> None:
    if dataset is None:
        raise ConfigError("--dataset is missing: give a preset (" + ", ".join(
            n for n in preset_names() if n != "gsm8k-train") + ") or a JSONL file; see easd-local bench --help")
    if out is None:
        raise ConfigError("--out is missing: give the results file (JSON lines), e.g. --out results.jsonl")
    # ---- everything is checked before any model loads: methods, settings, dataset, --out
    methods = runner.build_methods(modes, easd_config or (), sweep or ())
    flags = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                 gamma=gamma, draft_p_min=draft_p_min, top_n=top_n, overlap=overlap, tau_draft=tau_draft,
                 tau_target=tau_target, penalty=penalty, spec_type=spec_type, draft_min=draft_min,
                 spec_ngram_size_n=spec_ngram_size_n, spec_ngram_size_m=spec_ngram_size_m,
                 spec_ngram_mod_n_match=spec_ngram_mod_n_match)
    base = DecodeConfig(max_tokens=runner.DEFAULT_MAX_TOKENS)
    runner.check_methods(methods, base, flags)
    topts, dopts = o.load_options(ctx, threads, n_gpu_layers, flash_attn, main_gpu, verbose, n_gpu_layers_draft,
                                  rpc, rpc_draft, tensor_split, no_repack, no_mmap)
    parallel, topts, dopts = o.parallel_options(parallel, topts, dopts)
    problems = load_dataset(dataset, question_key, answer_key, grader, limit=limit, offset=offset, sample=sample,
                            seed=0 if seed is None else seed,
                            qids=None if qids is None else [q for arg in qids for q in arg.split(",")])
    if not problems:
        raise ConfigError(f"no problems selected from {dataset} (check --offset/--limit)")
    if dataset in PRESETS and PRESETS[dataset].calibration_only:
        err_console.print(Text(f"warning: {dataset} is the calibration split; scores on it are not test scores",
                               style="yellow"))
    results = runner.ResultsFile(out, resume)
    env = provenance.environment(topts, dopts, parallel=parallel)
    env_note = runner.env_mismatch(list(results.rows.values()), env)
    if env_note and strict_env:  # before any download or model load
        raise ConfigError(f"{env_note}; --strict-env refuses to mix environments in {out}")
    with DownloadUI(yes) as dl:
        specs = runner.pair_specs(pair or (), draft or (), target or (), methods, confirm=dl.confirm,
                                  progress=dl.progress)
    plan = runner.prepare(problems, specs, methods, base, flags, topts, dopts, env=env)

    with results.open():
        if results.torn_bytes:
            err_console.print(Text(f"{out}: removed a torn last line ({results.torn_bytes} bytes, written when the "
                                   "run was killed); that row is computed again", style="yellow"))
        events = runner.run_plan(plan, results)
        info = next(events)
        assert isinstance(info, runner.Started)
        _announce(info, plan, out)
        if env_note:
            err_console.print(Text(f"note: {env_note}; continuing (--strict-env refuses instead)", style="yellow"))
        try:
            skips = _drive(events, info, plan)
        except KeyboardInterrupt:
            err_console.print(Text(f"interrupted: {len(results.rows)} rows are saved in {out}; "
                                   "rerun with --resume to continue"))
            raise typer.Exit(130) from None
    print_report([out])
    _summarize_skips(skips)


def _summarize_skips(skips: list[runner.Skipped]) -> None:
    # last, under the report: its tables leave these problems out, and this says why
    lines = runner.skip_summary(skips)
    for line in lines:
        err_console.print(Text(line, style="yellow"))
    if lines:
        err_console.print(Text("no rows were written for skipped problems", style="yellow"))


def _announce(info: runner.Started, plan: runner.Plan, out: Path) -> None:
    n_pairs = len(plan.pairs)
    line = (f"{plan.problems[0].dataset}: {len(plan.problems)} problems × {len(plan.methods)} method{'s' if len(plan.methods) != 1 else ''}"
            f"{f' × {n_pairs} pairs' if n_pairs > 1 else ''} = {info.total} rows → {out}")
    if info.resumed:
        line += f" ({len(info.resumed)} already there, {info.todo} to go)"
    err_console.print(Text(line))
    if info.changed:
        err_console.print(Text(
            f"warning: {len(info.changed)} rows kept from {out} were made with other settings than this run's, "
            f"e.g. {info.changed[0]}", style="yellow"))


def _drive(events, info: runner.Started, plan: runner.Plan) -> list[runner.Skipped]:
    """Show the run's progress; return the problems it skipped."""
    acc = _Accuracy(len(plan.pairs) > 1)
    skips: list[runner.Skipped] = []
    for row in info.resumed:
        acc.add(row)
    live = err_console.is_terminal
    bar = _BenchProgress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[speed]}"),
        console=err_console, transient=False, disable=not live,
        speed_estimate_period=3600.0,  # rows can take minutes: average over the whole run
    )
    bar.accuracy = Text(acc.text(), style="dim")
    t0 = last_line = time.perf_counter()
    n_tokens = 0  # generated by the rows of this run: the aggregate tokens/s of all sequences
    t_decode = None  # when the first pair finished loading
    speed = ""
    expected = info.todo  # rows this run will write: skipped rows leave the count
    skipped_rows = 0
    done = logged = 0

    def log_progress() -> None:
        nonlocal last_line, logged
        last_line, logged = time.perf_counter(), done
        elapsed = last_line - t0
        eta = elapsed / done * (expected - done) if done else 0.0
        skipped = f" ({skipped_rows} skipped)" if skipped_rows else ""
        err_console.print(Text(f"{done}/{expected} rows{skipped} · {elapsed:.0f} s · eta {eta:.0f} s · "
                               f"{speed} · {acc.text()}"))

    with bar:
        task = bar.add_task("starting", total=expected, speed="")
        for ev in events:
            if isinstance(ev, runner.PairLoading):
                bar.update(task, description=f"loading pair {ev.pair}")
                if not live:
                    err_console.print(Text(f"pair {ev.pair}: loading ({ev.todo} rows to go)"))
            elif isinstance(ev, runner.PairLoaded):
                t_decode = t_decode or time.perf_counter()
                err_console.print(Text(
                    f"pair {ev.pair}: {ev.parallel} sequence{'s' if ev.parallel != 1 else ''} at a time (--parallel) × "
                    f"{ev.n_ctx} tokens of context: KV cache {fmt_bytes(ev.kv_bytes)}"
                    + ("; a row's speed is its sequence's within the batch (--parallel 1 times one stream)"
                       if ev.parallel > 1 else ""), style="dim"))
            elif isinstance(ev, runner.Working):
                where = f"{ev.pair} · " if len(plan.pairs) > 1 else ""
                bar.update(task, description=f"{where}{ev.problem.qid} · {ev.method}")
            elif isinstance(ev, runner.Skipped):
                skips.append(ev)
                where = f" on pair {ev.pair}" if len(plan.pairs) > 1 else ""
                err_console.print(Text(f"skipped {ev.problem.qid}{where} ({ev.rows} row{'s' if ev.rows != 1 else ''}): "
                                       f"{ev.reason}; {ev.detail}", style="dim"))
                # those rows will not come: the bar counts only rows that are written
                expected -= ev.rows
                skipped_rows += ev.rows
                bar.update(task, total=expected)
            elif isinstance(ev, runner.RowDone):
                acc.add(ev.row)
                bar.accuracy = Text(acc.text(), style="dim")
                n_tokens += int(ev.row["stats"].get("tokens", 0))
                wall = time.perf_counter() - (t_decode or t0)
                speed = f"{n_tokens / wall:.1f} tok/s" if wall > 0 else ""
                bar.update(task, speed=speed)
                bar.advance(task)
                done += 1
                # a log file: a line now and then (first row, every 30 s, last row)
                if not live and (done in (1, expected) or time.perf_counter() - last_line >= 30.0):
                    log_progress()
        if not live and done != logged:  # the last rows were skipped: say where the run ended
            log_progress()
        bar.update(task, description="done")
    return skips


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    bench_app = typer.Typer(
        name="bench",
        invoke_without_command=True,
        rich_markup_mode="rich",
        subcommand_metavar="[report RESULTS... | rerun RESULTS --qid Q --method M | parted RESULTS --method M | regrade RESULTS]",
    )
    app.add_typer(bench_app, name="bench")

    run_params = dict(
        dataset=(DatasetOpt, None), question_key=(QKeyOpt, None), answer_key=(AKeyOpt, None),
        grader=(GraderOpt, None), limit=(LimitOpt, None), offset=(OffsetOpt, 0), sample=(SampleOpt, None),
        qids=(QidsOpt, None), seed=(BenchSeedOpt, None), modes=(ModesOpt, None), easd_config=(EasdConfigOpt, None),
        sweep=(SweepOpt, None), pair=(PairsOpt, None), draft=(DraftsOpt, None), target=(TargetsOpt, None),
        yes=(_panel(o.YesOpt, P_MODELS), False), out=(OutOpt, None), resume=(ResumeOpt, False),
        strict_env=(StrictEnvOpt, False),
        max_tokens=(BenchMaxTokOpt, None),
        # bench has its own --modes, --seed and --max-tokens
        **{k: (_panel(ann, P_DECODE), None) for k, (ann, _) in o.DECODE_OPTIONS.items()
           if k not in ("mode", "seed", "max_tokens")},
        ctx=(_panel(o.CtxOpt, P_LLAMA), 4096), threads=(_panel(o.ThreadsOpt, P_LLAMA), None),
        n_gpu_layers=(_panel(o.NglOpt, P_LLAMA), -1), n_gpu_layers_draft=(_panel(o.NglDraftOpt, P_LLAMA), None),
        flash_attn=(_panel(o.FlashOpt, P_LLAMA), False), main_gpu=(_panel(o.MainGpuOpt, P_LLAMA), 0),
        verbose=(_panel(o.VerboseOpt, P_LLAMA), False),
        rpc=(_panel(o.RpcOpt, P_LLAMA), None), rpc_draft=(_panel(o.RpcDraftOpt, P_LLAMA), None),
        tensor_split=(_panel(o.TensorSplitOpt, P_LLAMA), None),
        parallel=(_panel(o.ParallelOpt, P_LLAMA), None), no_repack=(_panel(o.NoRepackOpt, P_LLAMA), False),
        no_mmap=(_panel(o.NoMmapOpt, P_LLAMA), False),
    )

    def with_run_options(fn):
        """Give ``fn(ctx, **run options)`` the run options as typer parameters."""
        import inspect

        params = [inspect.Parameter("ctx_", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
        params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=default)
                   for name, (ann, default) in run_params.items()]
        fn.__signature__ = inspect.Signature(params)
        return fn

    doc = (
        "Benchmark decoding methods on a reasoning dataset: accuracy, speed and EASD statistics.\n\n"
        "Runs every problem with every method (--modes, --easd-config, --sweep) on every pair, appending one "
        "JSON line per problem × method × pair to --out, then prints the report. Greedy by default.\n\n"
        "Example: easd-local bench --dataset gsm8k --limit 50 --modes target,sd,easd --out results.jsonl\n\n"
        "Summarise a results file again with: easd-local bench report RESULTS"
    )

    @bench_app.callback(help=doc)
    @friendly
    @with_run_options
    def bench(ctx_: typer.Context, **kw) -> None:
        if ctx_.invoked_subcommand is not None:
            _check_no_run_options(ctx_)
            return
        _run(**kw)

    @bench_app.command("run", help=doc.split("\n\n")[0] + " Same as 'easd-local bench' with these options.")
    @friendly
    @with_run_options
    def bench_run(ctx_: typer.Context, **kw) -> None:
        _run(**kw)

    @bench_app.command("report")
    @friendly
    def report(
        results: Annotated[list[Path], typer.Argument(metavar="RESULTS...", help="Results files written by 'easd-local bench --out'; several report as one, a later file's row replacing an earlier one's for the same problem, method and pair.")],
        markdown: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the tables as Markdown to this file (default: none).")] = None,
        plot: Annotated[Optional[Path], typer.Option("--plot", help="Also plot accuracy against tokens/s to this PNG (needs matplotlib; default: none).")] = None,
        same_env: Annotated[bool, typer.Option("--same-env", help="Paired wins/losses only on problems whose two rows come from one environment (same llama.cpp build, threads, batch sizes, machine...).")] = False,
        methods: Annotated[Optional[str], typer.Option("--methods", metavar="M1,M2,...", help="Only these methods (the rows' method names, comma-separated; default: all).")] = None,
        common: Annotated[bool, typer.Option("--common", help="Only the problems every shown method answered, so that each accuracy is taken on the same problems.")] = False,
        record_verdict: Annotated[bool, typer.Option("--record-verdict", help="Keep what each EASD mode scored against each lossless one (paired wins/losses, p) in the pair's profile: where an EASD mode is significantly worse, picking it then says so (the default is lossless in any case).")] = False,
    ) -> None:
        """Summarise results files (several as one): accuracy (95% CI), paired wins/losses vs sd and target (McNemar), speed, acceptance, EASD fires, time shares. Says first when the rows come from more than one environment."""
        if plot is not None:
            figures.require("--plot")
        names = None if methods is None else [m.strip() for m in methods.split(",") if m.strip()]
        if names is not None and not names:
            raise ConfigError("--methods is empty: give method names, e.g. --methods target,easd-tf")
        print_report(results, markdown, plot, same_env, names, common, record_verdict)

    @bench_app.command("rerun")
    @friendly
    def rerun(
        results: Annotated[Path, typer.Argument(metavar="RESULTS", help="A results file written by 'easd-local bench --out'.")],
        qid: Annotated[str, typer.Option("--qid", help="The problem's id (the row's qid).")],
        method: Annotated[str, typer.Option("--method", help="The row's method (e.g. target, easd-tf, easd\\[tau_target=1.5]).")],
        pair: Annotated[Optional[str], typer.Option("--pair", help="The row's pair, when the file has several (default: the only one).")] = None,
        draft: Annotated[Optional[Path], typer.Option("--draft", help="The draft file, when it is not where this machine's hash cache or catalog knows it (default: the row's).")] = None,
        target: Annotated[Optional[Path], typer.Option("--target", help="The target file, likewise (default: the row's).")] = None,
        no_repack: o.NoRepackOpt = False,
    ) -> None:
        """Re-run one row with the settings and model files it records (refused when a file's sha256 no longer matches) and print 'identical' or where the texts first differ and why: an argmax near-tie (logit gap), a gate near-tie (entropies near their thresholds) or a real difference. Exit 0 identical, 1 different."""
        print_rerun(results, qid, method, pair, draft, target, no_repack)


    @bench_app.command("regrade")
    @friendly
    def regrade(
        results: Annotated[Path, typer.Argument(metavar="RESULTS", help="A results file written by 'easd-local bench --out'.")],
        grader: Annotated[Optional[str], typer.Option("--grader", help=f"For rows that do not record their grader: {' or '.join(GRADERS)} (default: the dataset preset's).")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Only print what would change; leave the file as it is.")] = False,
    ) -> None:
        """Grade every row again from its stored completion and gold with this version's grader, so that one file is graded one way after the grader was mended; print each row whose answer or verdict changes and rewrite only those (each records what it held before and the code version that regraded it). Refused while a bench run writes the file."""
        print_regrade(results, grader, dry_run)

    @bench_app.command("parted")
    @friendly
    def parted(
        results: Annotated[Path, typer.Argument(metavar="RESULTS", help="A results file written by 'easd-local bench --out'.")],
        method: Annotated[str, typer.Option("--method", help="A lossless greedy method of the file (e.g. sd).")],
        against: Annotated[str, typer.Option("--against", help="The method it should equal (default target).")] = "target",
        pair: Annotated[Optional[str], typer.Option("--pair", help="The rows' pair, when the file has several (default: the only one).")] = None,
        limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="Only the first N problems both methods answered (default: all).")] = None,
        target: Annotated[Optional[Path], typer.Option("--target", help="The target file, when it is not where this machine's hash cache or catalog knows it (default: the rows').")] = None,
        no_repack: o.NoRepackOpt = False,
    ) -> None:
        """For every problem two lossless greedy methods (sd, target) both answered, say whether their recorded texts are identical and, where they part, whether the first differing token was an argmax near-tie (the target's logit gap between the two tokens, evaluated again from the rows; no generation). Exit 1 when a text parts at a real difference (a defect of a lossless method)."""
        print_parted(results, method, against, pair, limit, target, no_repack)


def print_regrade(results: Path, grader: str | None, dry_run: bool) -> None:
    done = regrade_mod.regrade(results, grader, write=not dry_run)
    for c in done.changes:
        verdict = f"{'right' if c.correct_was else 'wrong'} -> {'right' if c.correct else 'wrong'}"
        answer = (f"answer {c.extracted!r}" if c.extracted == c.extracted_was else
                  f"answer {c.extracted_was!r} -> {c.extracted!r}")
        console.print(Text(f"line {c.line}: {c.qid} · {c.method} · pair {c.pair}: {answer} · {verdict}"), soft_wrap=True)
    gained = sum(c.correct and not c.correct_was for c in done.changes)
    lost = sum(c.correct_was and not c.correct for c in done.changes)
    what = ("rewritten" if done.written else "unchanged (--dry-run)") if done.changes else "unchanged"
    console.print(Text(f"{results}: {len(done.changes)} of {done.rows} rows changed ({gained} wrong -> right, "
                       f"{lost} right -> wrong); file {what}"), soft_wrap=True)


def print_rerun(results: Path, qid: str, method: str, pair: str | None, draft: Path | None,
                target: Path | None, no_repack: bool = False) -> None:
    rows = rep.load_results(results)
    plan = rerun_mod.plan_rerun(rows, qid, method, pair, draft=draft, target=target, no_repack=no_repack)
    row = plan.row
    err_console.print(Text(f"rerun of {results.name} line {plan.line}: {row['qid']} · {row['method']} · pair "
                           f"{row['pair']} ({plan.cfg.mode}, {row['stats'].get('tokens', '?')} tokens recorded)"))
    for note in plan.notes:
        err_console.print(Text(f"note: {note}", style="yellow"))
    env_note = rerun_mod.environment_note(plan)
    if env_note:
        err_console.print(Text(f"note: {env_note}", style="yellow"))
    res = rerun_mod.rerun(plan)
    how = " (recorded tokens from re-tokenizing the row's text: it records no token ids)" if res.retokenized else ""
    d = res.difference
    if d is None:
        console.print(Text(f"identical ({res.tokens} tokens){how}"), soft_wrap=True)
        return
    rec = "the recorded completion ends" if d.recorded is None else f"recorded {d.recorded_text!r} (id {d.recorded})"
    new = "the new completion ends" if d.new is None else f"new {d.new_text!r} (id {d.new})"
    console.print(Text(f"first difference at token {d.index} (character {d.char}): {rec}, {new}{how}"), soft_wrap=True)
    if d.kind == "length":
        console.print(Text("why: one completion stops where the other goes on (max tokens or context reached)"), soft_wrap=True)
    else:
        where = (f"{'draft' if plan.cfg.mode == 'draft' else 'target'} logits after the prompt and the {d.index} "
                 "common tokens, evaluated again in one batch")
        lines = [f"why: {d.kind}"]
        lines.append(f"  logit gap new - recorded: {d.logit_gap:+.3f} ({where}: {d.logits[0]:.3f} vs {d.logits[1]:.3f}; "
                     f"an argmax near-tie is under {ARGMAX_NEAR_TIE})")
        if d.fired[0] is not None:
            rec = {True: "fired (its token is the target's runner-up)", False: "did not fire (its token is the target's "
                   "best)", None: "unknown (its token is neither the target's best nor its runner-up)"}[d.fired[1]]
            lines.append(f"  gate: {'fired' if d.fired[0] else 'did not fire'} in the new run; in the recorded run: {rec}")
        if d.gate is not None:
            lines.append(f"  gate {'open' if d.gate.open else 'closed'} there ({d.gate_source}): {d.gate.describe()} "
                         f"(a gate near-tie is within {d.gate.margin} nats)")
        for line in lines:
            console.print(Text(line), soft_wrap=True)
    raise typer.Exit(1)


def print_parted(results: Path, method: str, against: str, pair: str | None, limit: int | None,
                 target: Path | None, no_repack: bool = False) -> None:
    rows = rep.load_results(results)
    plan = parted_mod.plan_parted(rows, method, against, pair, target=target, limit=limit, no_repack=no_repack)
    n = len(plan.pairs)
    err_console.print(Text(f"{method} against {against} in {results.name}: {n} problems both answered; "
                           f"target {plan.target.name}"))
    for note in plan.notes:
        err_console.print(Text(f"note: {note}", style="yellow"))
    partings = []
    for p in parted_mod.explain(plan):
        partings.append(p)
        if p.kind == parted_mod.IDENTICAL:
            continue
        where = f"token {p.index}: {method} {p.text!r} (id {p.token}), {against} {p.baseline_text!r} (id {p.baseline_token})"
        if p.kind == parted_mod.LENGTH:
            why = "one completion stops where the other goes on"
        else:
            why = f"{p.kind}, logit gap {p.logit_gap:+.3f}"
        answer = "answer changed" if p.answer_changed else "same answer"
        console.print(Text(f"{p.qid} parts at {where} · {why} · {answer}"), soft_wrap=True)
    s = parted_mod.summarize(partings)
    c = s.counts
    line = (f"{s.compared} problems: {c[parted_mod.IDENTICAL]} identical, {s.parted} parted "
            f"({c[ARGMAX]} at an argmax near-tie, {c[parted_mod.REAL]} at a real difference, "
            f"{c[parted_mod.LENGTH]} where one stopped first)")
    if s.gaps:
        line += f"; |logit gap| median {s.median_gap:.3f}, max {s.max_gap:.3f} (a near-tie is under {ARGMAX_NEAR_TIE})"
    line += f"; answers changed {s.answers_changed}: {method} right and {against} wrong {s.wins}, the reverse {s.losses}"
    console.print(Text(line), soft_wrap=True)
    if c[parted_mod.REAL]:
        raise typer.Exit(1)
