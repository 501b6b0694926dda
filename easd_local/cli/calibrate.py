"""`easd-local calibrate`: entropy statistics of a pair on a calibration set, and (with
--percentile) the pair's EASD thresholds written to a profile that chat/generate/bench use."""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .. import calibrate as cal
from .. import figures
from ..engine.config import DecodeConfig
from ..errors import ConfigError
from ..engine.pair import open_models
from ..store.resolve import resolve_pair
from ..fsutil import describe_write_error
from . import options as o
from .common import console, err_console, friendly
from .pull_ui import DownloadUI

_BLOCKS = " ▏▎▍▌▋▊▉█"


def _bar(frac: float, width: int) -> str:
    """A bar of ``frac`` (0..1) of ``width`` cells, in eighths."""
    eighths = int(round(max(0.0, min(1.0, frac)) * width * 8))
    full, rest = divmod(eighths, 8)
    return "█" * full + (_BLOCKS[rest] if rest else "")


def _percentile_table(s: dict, tau_overlap: float) -> Table:
    t = Table(title=f"entropy (nats) over {s['positions']:,} positions, {s['questions']} questions")
    t.add_column("percentile", justify="right")
    t.add_column("H_draft", justify="right")
    t.add_column("H_target", justify="right")
    t.add_column("gate open¹", justify="right")
    t.add_column("… where SD accepts²", justify="right")
    for r in s["percentiles"]:
        t.add_row(f"p{r['percentile']:g}", f"{r['h_draft']:.3f}", f"{r['h_target']:.3f}",
                  f"{100 * r['gate_open']:.1f}%", f"{100 * r['gate_open_accepted']:.1f}%")
    t.add_row("mean", f"{s['mean']['h_draft']:.3f}", f"{s['mean']['h_target']:.3f}", "", "", style="dim")
    t.add_row("max", f"{s['max']['h_draft']:.3f}", f"{s['max']['h_target']:.3f}", "", "", style="dim")
    t.caption = (f"¹ share of positions with H_d ≥ τd, H_t ≥ τt (both at that percentile) and overlap ≥ {tau_overlap:g}\n"
                 f"² the same among the {100 * s['agree']:.0f}% of positions where the draft's greedy token is the "
                 "target's (greedy SD accepts it: where EASD would fire)")
    return t


def _overlap_table(s: dict) -> Table:
    t = Table(title=f"top-{s['top_n']} overlap of draft and target")
    t.add_column("overlap", justify="right")
    t.add_column("positions", justify="right")
    t.add_column("share", justify="right")
    t.add_column("", no_wrap=True)
    top = max((r["share"] for r in s["overlap"]), default=1.0) or 1.0
    n = s["top_n"]
    for r in s["overlap"]:
        k = int(round(r["overlap"] * n))
        t.add_row(f"{k}/{n}", f"{r['count']:,}", f"{100 * r['share']:.1f}%",
                  f"[magenta]{_bar(r['share'] / top, 30)}[/]")
    return t


def _histogram_table(trace: cal.Trace, bins: int = 12) -> Table:
    edges, cd, ct = cal.histogram(trace.h_draft, trace.h_target, bins=bins)
    top = math.sqrt(max(int(cd.max()), int(ct.max()), 1))
    t = Table(title="entropy histogram (bar length ∝ √count)")
    t.add_column("H (nats)", justify="right", no_wrap=True)
    t.add_column("draft", justify="right", min_width=6)
    t.add_column("", no_wrap=True)
    t.add_column("target", justify="right", min_width=6)
    t.add_column("", no_wrap=True)
    for i in range(len(cd)):
        t.add_row(f"{edges[i]:.2f}–{edges[i + 1]:.2f}",
                  f"{int(cd[i]):,}", f"[blue]{_bar(math.sqrt(cd[i]) / top, 24)}[/]",
                  f"{int(ct[i]):,}", f"[yellow]{_bar(math.sqrt(ct[i]) / top, 24)}[/]")
    return t


def _command(pair, draft, target, dataset, question_key, limit, max_tokens, top_n, percentile, allow_test) -> str:
    parts = ["easd-local", "calibrate"]
    if draft is not None or target is not None:
        if draft is not None:
            parts += ["--draft", str(draft)]
        if target is not None:
            parts += ["--target", str(target)]
    else:
        parts += ["--pair", pair or "default"]
    parts += ["--dataset", dataset]
    if question_key:
        parts += ["--question-key", question_key]
    parts += ["--limit", str(limit), "--max-tokens", str(max_tokens), "--top-n", str(top_n)]
    if allow_test:
        parts.append("--allow-test-split")
    if percentile is not None:
        parts += ["--percentile", f"{percentile:g}"]
    return shlex.join(parts)


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    @app.command("calibrate")
    @friendly
    @o.with_options(before=(o.MODEL_OPTIONS,), after=(o.LLAMA_OPTIONS,))
    def calibrate(
        dataset: Annotated[str, typer.Option(
            "--dataset", help="Calibration questions: a bundled preset or a JSONL file (default: gsm8k-train).")
        ] = cal.DEFAULT_DATASET,
        question_key: Annotated[Optional[str], typer.Option(
            "--question-key", help="JSON field holding the question (JSONL files; default 'question').")] = None,
        limit: Annotated[int, typer.Option("--limit", help="Number of questions (the first N).")] = cal.DEFAULT_LIMIT,
        max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens generated per question.")] = cal.DEFAULT_MAX_TOKENS,
        top_n: o.GEN.top_n = None,
        overlap: o.GEN.overlap = None,
        percentile: Annotated[Optional[float], typer.Option(
            "--percentile", help="Write tau_draft/tau_target at this percentile (0-100) into the pair's profile (default: none, nothing written).")] = None,
        png: Annotated[Optional[Path], typer.Option("--png", help="Also save the histograms as a PNG (needs matplotlib; default: none).")] = None,
        trace: Annotated[Optional[Path], typer.Option("--trace", help="Write every position's figures (JSONL; default: none).")] = None,
        allow_test_split: Annotated[bool, typer.Option(
            "--allow-test-split", help="Allow a test-split preset (its scores are then biased by the calibration).")] = False,
        system: Annotated[Optional[str], typer.Option("--system", help="System message for the chat template (default: none).")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
        parallel: o.ParallelOpt = None,
        **kw,
    ) -> None:
        """Measure both models' entropies on a calibration set (target greedy) and optionally write the pair's EASD thresholds."""
        draft, target, pair, yes = (kw[k] for k in ("draft", "target", "pair", "yes"))
        base = DecodeConfig()
        top_n_ = base.top_n if top_n is None else top_n
        tau_o = base.overlap if overlap is None else overlap
        # every value is checked before any model loads
        base.replace(top_n=top_n_, overlap=tau_o, max_tokens=max_tokens)
        if percentile is not None and not (0.0 <= percentile <= 100.0):
            raise ConfigError(f"--percentile must be in [0, 100], got {percentile:g}")
        if png is not None:
            figures.require("--png")
        o.check_output_path("--png", png)
        o.check_output_path("--trace", trace)
        name, questions = cal.load_questions(dataset, question_key, limit, allow_test_split)
        topts, dopts = o.llama_options(kw)
        parallel, topts, dopts = o.parallel_options(parallel, topts, dopts)
        with DownloadUI(yes) as dl:
            spec = resolve_pair(pair, draft, target, mode="sd", confirm=dl.confirm, progress=dl.progress)
        with open_models(spec.draft, spec.target, topts, dopts) as models:
            base.replace(top_n=top_n_, overlap=tau_o).validate(models.n_vocab)
            sys_msg = [{"role": "system", "content": system}] if system else []
            prompts = [models.target.vocab.chat_tokens(sys_msg + [{"role": "user", "content": q}]) for q in questions]
            with Progress(TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[pos]}"),
                          TimeElapsedColumn(), console=err_console, transient=True,
                          disable=json_out or not err_console.is_terminal) as prog:
                task = prog.add_task("q", total=len(prompts), pos="")

                t0 = time.perf_counter()
                plain = not json_out and not err_console.is_terminal  # logs: a line every 10 questions

                def on_progress(done: int, total: int, positions: int) -> None:
                    prog.update(task, completed=done, pos=f"{positions:,} positions")
                    if plain and (done % 10 == 0 or done == total):
                        err_console.print(f"calibrating: {done}/{total} questions, {positions:,} positions, "
                                          f"{time.perf_counter() - t0:.0f} s")

                tr = cal.collect(models.draft, models.target, prompts, max_tokens=max_tokens, top_n=top_n_,
                                 n_vocab=models.n_vocab, parallel=parallel, progress=on_progress)
        if tr.skipped:
            n_ctx = min(models.target.n_ctx, models.draft.n_ctx)
            n = len(tr.skipped)
            shown = ", ".join(f"question {q + 1} ({t} tokens)" for q, t in tr.skipped[:3]) + (", ..." if n > 3 else "")
            err_console.print(Text(f"skipped {n} question{'s' if n != 1 else ''} longer than the {n_ctx}-token context"
                                   f"{o.ctx_note(kw['ctx'], n_ctx)}: {shown} (raise --ctx to include them)",
                                   style="yellow"), soft_wrap=True)
        if tr.positions == 0:
            why = "every question was longer than the context" if tr.skipped and not tr.n_questions else "every question ended at once"
            raise ConfigError(f"no positions were generated ({why}); nothing to calibrate")
        s = cal.summary(tr, tau_o)
        s.update(pair=spec.label, dataset=name, max_tokens=max_tokens,
                 seconds_target=tr.seconds_target, seconds_draft=tr.seconds_draft)
        cmd = _command(pair, draft, target, dataset, question_key, limit, max_tokens, top_n_, percentile,
                       allow_test_split)
        written, failed = None, None
        if percentile is not None:
            try:
                written = cal.write_pair_profile(tr, s, spec, percentile, dataset=name, max_tokens=max_tokens,
                                                 top_n=top_n_, command=cmd)
            except OSError as e:  # a read-only or full home: the figures are shown all the same
                failed = describe_write_error(e.filename or "the profile", e)
        s["profile"] = written
        s["command"] = cmd
        if trace is not None:
            cal.write_trace(trace, tr)
        png_path = None
        if png is not None:
            png_path = cal.plot_png(tr, png, (written["tau_draft"], written["tau_target"]) if written else None,
                                    title=f"{spec.label}: entropy over {tr.positions:,} positions ({name})")
        if json_out:
            sys.stdout.write(json.dumps(s) + "\n")
        else:
            _print(s, tr, tau_o, trace, png_path, failed)
        if failed:
            raise ConfigError(f"the thresholds were not written: {failed}")


def _print(s: dict, tr: cal.Trace, tau_o: float, trace: Path | None, png_path: Path | None, failed: str | None) -> None:
    console.print(f"[bold]{s['pair']}[/] · {s['dataset']}: {tr.n_questions} questions, {tr.positions:,} positions, "
                  f"greedy target, max {s['max_tokens']} tokens · {tr.seconds:.0f} s "
                  f"(target {tr.seconds_target:.0f} s, draft {tr.seconds_draft:.0f} s)")
    console.print(_percentile_table(s, tau_o))
    console.print(_overlap_table(s))
    console.print(_histogram_table(tr))
    if trace is not None:
        console.print(f"trace: {trace}")
    if png_path is not None:
        console.print(f"histogram: {png_path}")
    written = s["profile"]
    if written:
        console.print(
            f"wrote profile {written['path']}: τd={written['tau_draft']:g} τt={written['tau_target']:g} "
            f"(p{written['percentile']:g} over {tr.positions:,} positions). chat, generate and bench now use it for "
            "this pair; --tau-draft/--tau-target still override it."
        )
        if written["warning"]:
            err_console.print(Text(f"warning: {written['warning']}", style="yellow"), soft_wrap=True)
    elif not failed:
        console.print("no profile written (give --percentile P to write the thresholds at percentile P)", style="dim")
