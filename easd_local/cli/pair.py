"""`easd-local pair score`: predict what SD and EASD do with a pair (or several drafts for one
target) from one teacher-forced pass over a corpus, without generating."""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import figures
from ..bench.runner import DEFAULT_MAX_TOKENS
from ..engine.config import DecodeConfig
from ..engine.pair import check_pair_files
from ..llamacpp.runtime import Model
from ..errors import ConfigError
from ..pairscore import corpus as corp
from ..pairscore import passes, plot, summary, written
from ..pairscore.predict import GAMMAS
from ..pairscore.probe import PROBE_GAMMA, probe
from ..store import provenance
from ..store.catalog import load_catalog, local_path
from ..store.profiles import file_id
from ..store.resolve import PairFiles, catalog_model, model_label, resolve_config, resolve_model
from . import options as o
from . import pair_costs
from .common import console, err_console, friendly
from .progress import spinner
from .pull_ui import DownloadUI

DEFAULT_LIMIT = 20
DEFAULT_DATASET = "gsm8k"
DEFAULT_WRITE_TOKENS = DEFAULT_MAX_TOKENS  # bench's: the answers --target-writes generates are the ones bench's target rows hold
PROBE_TOKENS = 256  # of text after the prompt: the probe's context, a typical length

DraftsOpt = Annotated[Optional[list[str]], typer.Option(
    "--draft", "-md", metavar="PATH|NAME",
    help=o.with_default("A draft: a GGUF file or a catalog model name; repeat to compare drafts (one row each).",
                        "the pair's draft"))]


def _command(argv: list[str]) -> str:
    return shlex.join(["easd-local", *argv])


def _models(pair: str | None, target: str | None, drafts: list[str], yes: bool):
    """(target path, target label, catalog entry of the target or None, [(draft path, label, entry)])."""
    if pair is not None or target is None or not drafts:
        cat = load_catalog()
        entry = cat.pair(pair) if pair else cat.default_pair
        target = target or entry.target.name
        drafts = drafts or [entry.draft.name]
    labels: dict[str, int] = {}
    with DownloadUI(yes) as dl:
        t_path = resolve_model(target, confirm=dl.confirm, progress=dl.progress)
        out = []
        for d in drafts:
            label = model_label(d)
            labels[label] = labels.get(label, 0) + 1
            if labels[label] > 1:
                raise ConfigError(f"--draft {d} is given twice")
            out.append((resolve_model(d, confirm=dl.confirm, progress=dl.progress), label, catalog_model(d)))
    return t_path, model_label(target), catalog_model(target), out


def _pair_entry(d_path: Path, t_path: Path):
    """The catalog pair of these two files (its profile has the thresholds), or None."""
    for pe in load_catalog().pairs.values():
        try:
            if local_path(pe.draft).resolve() == d_path.resolve() and local_path(pe.target).resolve() == t_path.resolve():
                return pe
        except OSError:
            continue
    return None


def _fmt(x, nd: int = 2, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{100 * x:.1f}%" if pct else f"{x:.{nd}f}"


def _main_table(res: dict, gamma: int) -> Table:
    s = res["settings"]
    t = Table(title=f"predicted per draft · γ = {gamma} · α at T = {s['temperature']:g}"
                    + (f", top-k {s['top_k']}" if s["top_k"] else "") + (f", top-p {s['top_p']:g}" if s["top_p"] < 1 else ""))
    for name, just in (("draft", "left"), ("agree", "right"), ("α", "right"), ("KL(p‖q)", "right"),
                       (f"tok/verify γ={gamma}\ngreedy · sampled", "right"), ("best γ\n→ speed-up", "right"),
                       ("draft ÷\ntarget", "right"), (f"verify({gamma + 1})\n÷ decode", "right"),
                       ("gate fires\n/100 tok", "right")):
        t.add_column(name, justify=just)
    for d in res["drafts"]:
        g = str(gamma)
        best = "—"
        if "best_gamma_greedy" in d:
            bg = d["best_gamma_greedy"]
            best = f"{bg} → {_fmt(d['speedup_greedy_simulated'][str(bg)])}×"
        t.add_row(
            d["draft"], _fmt(d["greedy_agreement"], pct=True), _fmt(d["alpha"], 3), _fmt(d["kl_target_draft_nats"], 3),
            f"{_fmt(d['tokens_per_verify_greedy_simulated'][g])} · {_fmt(d['tokens_per_verify_iid_from_alpha'].get(g))}",
            best, _fmt(d.get("draft_cost_over_target_cost")),
            _fmt((d.get("verify_cost_over_decode") or {}).get(g)),
            _fmt(d["gate"]["fires_per_100_easd_tf_greedy"]),
        )
    t.caption = ("agree: the draft's greedy token is the target's · α: Σ min(p, q), sampled SD's acceptance rate · "
                 "tok/verify greedy: greedy SD simulated block by block along the text; sampled: (1 − α^(γ+1)) / (1 − α) · "
                 "speed-up: over the target alone, from the timing probe (decode time only) · gate fires: greedy "
                 "easd-tf at the pair's thresholds")
    return t


def _gamma_table(res: dict) -> Table:
    t = Table(title="predicted tokens per verify and speed-up over the target, by γ")
    t.add_column("draft · what")
    for g in GAMMAS:
        t.add_column(f"γ={g}", justify="right")
    for d in res["drafts"]:
        rows = [("tok/verify greedy (simulated)", "tokens_per_verify_greedy_simulated", 2),
                ("tok/verify sampled (i.i.d. α)", "tokens_per_verify_iid_from_alpha", 2),
                ("speed-up greedy", "speedup_greedy_simulated", 2),
                ("speed-up sampled", "speedup_sampled_iid", 2)]
        for what, key, nd in rows:
            if key in d:
                t.add_row(f"{d['draft']} · {what}", *(_fmt(d[key].get(str(g)), nd) for g in GAMMAS))
    return t


def _entropy_table(res: dict) -> Table:
    t = Table(title="entropy (nats, untempered) over the scored positions")
    t.add_column("model")
    keys = [k for k in res["drafts"][0]["h_target_nats"]]
    for k in keys:
        t.add_column(k, justify="right")
    t.add_row(f"target {res['target']}", *(_fmt(res["drafts"][0]["h_target_nats"][k], 3) for k in keys))
    for d in res["drafts"]:
        t.add_row(f"draft {d['draft']}", *(_fmt(d["h_draft_nats"][k], 3) for k in keys))
    return t


def _gate_table(res: dict) -> Table:
    t = Table(title="EASD gate (greedy easd-tf fires per 100 tokens): at the pair's thresholds and at the thresholds "
                    "`calibrate --percentile P` would write")
    t.add_column("draft")
    t.add_column("thresholds")
    t.add_column("τ_draft", justify="right")
    t.add_column("τ_target", justify="right")
    t.add_column("fires /100", justify="right")
    for d in res["drafts"]:
        gt = d["gate"]
        td, tt = gt["tau_draft"], gt["tau_target"]
        t.add_row(d["draft"], f"the pair's ({gt['thresholds_source']})",
                  td if isinstance(td, str) else f"{td:.3f}", tt if isinstance(tt, str) else f"{tt:.3f}",
                  _fmt(gt["fires_per_100_easd_tf_greedy"]))
        for c in d["gate_at_calibration_percentiles"]:
            t.add_row("", f"p{c['percentile']:g}", f"{c['tau_draft']:.3f}", f"{c['tau_target']:.3f}",
                      _fmt(c["fires_per_100_easd_tf_greedy"]))
    t.caption = (f"overlap ≥ {res['drafts'][0]['gate']['overlap']:g} (top-{res['settings']['top_n']}); a fire is counted "
                 "where the gate is open and the two greedy tokens agree")
    return t


def _measured_table(res: dict) -> Table | None:
    rows = [(d["draft"], m) for d in res["drafts"] for m in d["measured"]]
    if not rows:
        return None
    t = Table(title="prediction against what the results file measured on the same problems (greedy rows of these files)")
    for c in ("draft", "method", "problems", "γ", "tok/verify measured", "predicted", "error",
              "fires/100 measured", "predicted"):
        t.add_column(c, justify="left" if c in ("draft", "method") else "right")
    for name, m in rows:
        err = m.get("tokens_per_verify_error_pct")
        t.add_row(name, m["method"], str(m["problems"]), str(m["gamma"]),
                  _fmt(m.get("tokens_per_verify_measured")), _fmt(m.get("tokens_per_verify_predicted")),
                  "—" if err is None else f"{err:+.1f}%",
                  _fmt(m.get("fires_per_100_measured")), _fmt(m.get("fires_per_100_predicted")))
    return t


def register(app: typer.Typer, models_app: typer.Typer) -> None:  # noqa: ARG001
    pair_app = typer.Typer(help="Know a draft/target pair: `pair score` (without generating), `pair costs` (the "
                                "lossless ways' speeds on this machine).", no_args_is_help=True)
    app.add_typer(pair_app, name="pair")
    pair_costs.register_on(pair_app)

    @pair_app.command("score")
    @friendly
    @o.with_options(after=(o.LLAMA_OPTIONS,))
    def score(
        target: o.TargetOpt = None,
        draft: DraftsOpt = None,
        pair: o.PairOpt = None,
        from_: Annotated[Optional[Path], typer.Option(
            "--from", metavar="RESULTS.jsonl",
            help=o.with_default("Score along the texts of a bench results file's rows (--method's): the target's own "
                                "answers, the faithful corpus; nothing is generated.", "none"))] = None,
        method: Annotated[str, typer.Option("--method", metavar="M",
                                            help="With --from: whose rows' texts to score along.")] = "target",
        dataset: Annotated[Optional[str], typer.Option(
            "--dataset", metavar="PRESET",
            help=o.with_default("Score along a preset's reference solutions (gsm8k, math500, aime24, olympiadbench): "
                                "an approximation, written in another style than the target's; with --target-writes, "
                                "along the target's own answers to its questions (any preset or JSONL file).",
                                f"{DEFAULT_DATASET} when neither --from nor --text is given"))] = None,
        text: Annotated[Optional[Path], typer.Option(
            "--text", metavar="FILE", help=o.with_default("Score along a text file (plain text, in parts of --ctx "
                                                          "tokens).", "none"))] = None,
        target_writes: Annotated[bool, typer.Option(
            "--target-writes", help="Let the target answer --dataset's questions first (greedy, target alone) and score "
            "along its answers: the faithful corpus without a results file, at the cost of one target-only generation."
        )] = False,
        max_tokens: Annotated[Optional[int], typer.Option(
            "--max-tokens", metavar="N", help=o.with_default("With --target-writes: tokens per answer at most.",
                                                             f"{DEFAULT_WRITE_TOKENS}, as bench"))] = None,
        limit: Annotated[int, typer.Option("--limit", metavar="N", help="Texts to score (the first N).")] = DEFAULT_LIMIT,
        temperature: Annotated[float, typer.Option(
            "--temperature", "--temp", metavar="T", help="Temperature of α's p and q (sampled SD's acceptance); 0: α is "
            "the greedy agreement. Entropies and KL are always untempered.")] = 1.0,
        top_k: Annotated[int, typer.Option("--top-k", metavar="K", help="Top-k of α's p and q (0 = off).")] = 0,
        top_p: Annotated[float, typer.Option("--top-p", metavar="P", help="Top-p of α's p and q (1 = off).")] = 1.0,
        gamma: o.GEN.gamma = None,
        top_n: o.GEN.top_n = None,
        overlap: o.GEN.overlap = None,
        tau_draft: o.GEN.tau_draft = None,
        tau_target: o.GEN.tau_target = None,
        chunk: Annotated[int, typer.Option("--chunk", metavar="N",
                                           help="Positions per batched decode (logits held: N rows per model).")
                         ] = passes.DEFAULT_CHUNK,
        timing: Annotated[bool, typer.Option("--probe/--no-probe",
                                             help="Time the decodes SD is made of here, for the predicted speed-up.")
                          ] = True,
        json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
        plot_to: Annotated[Optional[Path], typer.Option(
            "--plot", metavar="FILE.png", help=o.with_default("Also draw one figure comparing the drafts (needs "
                                                              "matplotlib).", "none"))] = None,
        yes: o.YesOpt = False,
        **kw,
    ) -> None:
        """Predict SD and EASD for a target and one or more drafts from one teacher-forced pass, without generating.

        Per draft: greedy agreement, α = E[Σ min(p, q)], KL(p‖q), predicted tokens per verify for γ = 1..8 (greedy SD simulated block by block along the text; sampled SD by the i.i.d. formula from α), the best γ and the predicted speed-up from a short timing probe, entropy percentiles and the EASD gate's fire rate at the pair's thresholds and at calibration percentiles. With --from, methods of the same file that ran sd / easd / easd-tf greedy on the same problems with the same files are set beside the prediction.
        """
        t_start = time.perf_counter()
        load_before = provenance.load_average()
        corpora = [x for x in (from_, dataset, text) if x is not None]
        if len(corpora) > 1:
            raise ConfigError("give one corpus: --from, --dataset or --text")
        if target_writes and (from_ is not None or text is not None):
            raise ConfigError("--target-writes answers a dataset's questions (--dataset); it does not go with "
                              "--from or --text")
        if max_tokens is not None and not target_writes:
            raise ConfigError("--max-tokens is the budget of the answers --target-writes generates; give it with "
                              "--target-writes (--from takes each row's own)")
        if from_ is None and text is None and dataset is None:
            dataset = DEFAULT_DATASET
        if limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {limit}")
        if chunk < 1:
            raise ConfigError(f"--chunk must be >= 1, got {chunk}")
        flags = {"gamma": gamma, "top_n": top_n, "overlap": overlap, "tau_draft": tau_draft, "tau_target": tau_target}
        base = o.decode_config(DecodeConfig(mode="easd"), **flags)
        # α's sampling settings are checked as decoding's are (temperature 0 allowed: greedy)
        DecodeConfig(temperature=temperature, top_k=top_k, top_p=top_p).validate()
        if plot_to is not None:
            figures.require("--plot")
        topts, dopts = o.llama_options(kw)
        # the corpus is read and checked before any model is downloaded or loaded
        if from_ is not None:
            src = corp.read_results(from_, method)
        elif text is not None:
            src = corp.read_text(text)
        elif target_writes:
            src = corp.read_questions(dataset, limit, DEFAULT_WRITE_TOKENS if max_tokens is None else max_tokens)
        else:
            src = corp.read_dataset(dataset, limit)
        t_path, t_label, t_entry, drafts = _models(pair, target, list(draft or []), yes)
        for d_path, _, _ in drafts:
            check_pair_files(d_path, t_path)  # vocabulary only: every pair checked before anything loads
        settings = passes.Settings(temperature=temperature, top_k=top_k, top_p=top_p, top_n=base.top_n)
        loaded: list[Model] = []
        try:
            with spinner(f"loading {t_label} and {len(drafts)} draft{'s' if len(drafts) != 1 else ''}"):
                tgt = Model(t_path, topts)
                loaded.append(tgt)
                for d_path, _, _ in drafts:
                    loaded.append(Model(d_path, dopts))
            dms = loaded[1:]
            base.validate(min(m.n_vocab for m in loaded))
            t_sha = file_id(t_path, t_entry).sha256
            t_write = time.perf_counter()
            if src.kind == corp.WRITTEN:
                cp = _write(tgt, src)
            else:
                cp = corp.tokenize(src, tgt.vocab, limit=limit, window=min(m.n_ctx for m in loaded), target_sha=t_sha)
            t_write = time.perf_counter() - t_write
            if not json_out:
                for note in cp.notes:
                    err_console.print(Text(f"note: {note}", style="yellow"), soft_wrap=True)
            ps = _run_pass(tgt, dms, cp, settings, chunk)
            if ps.skipped:
                n_ctx = min(m.n_ctx for m in loaded)
                shown = ", ".join(f"{lab} ({n} tokens)" for lab, n in ps.skipped[:3]) + (", ..." if len(ps.skipped) > 3 else "")
                err_console.print(Text(f"skipped {len(ps.skipped)} text{'s' if len(ps.skipped) != 1 else ''} longer than "
                                       f"the {n_ctx}-token context{o.ctx_note(kw['ctx'], n_ctx)}: {shown} "
                                       "(raise --ctx to include them)", style="yellow"), soft_wrap=True)
            if not ps.scored:
                raise ConfigError("no text could be scored (every one was longer than the context)")
            costs, no_probe = [None] * len(dms), "--no-probe"
            if timing:
                context = _probe_context(ps)
                if context is None:
                    no_probe = (f"no timing probe: every text is shorter than the {PROBE_GAMMA + 2} tokens of context "
                                "it needs, so no speed-up is predicted")
                    if not json_out:
                        err_console.print(Text(f"note: {no_probe}", style="yellow"), soft_wrap=True)
                else:
                    with spinner("timing probe"):
                        costs = probe(tgt, dms, context)
        finally:
            for m in reversed(loaded):
                m.close()
        infos, measured = [], []
        for (d_path, d_label, d_entry) in drafts:
            entry = _pair_entry(d_path, t_path)
            spec = PairFiles(draft=d_path, target=t_path, label=f"{d_label}+{t_label}", entry=entry)
            cfg, source = resolve_config(base, spec, flags)
            infos.append(summary.DraftInfo(d_label, str(d_path), cfg, source))
            if cp.kind == corp.FAITHFUL:
                d_sha = file_id(d_path, d_entry).sha256
                measured.append(corp.measured_runs(cp.rows, {s.item.label for s in ps.scored}, d_sha, t_sha))
            else:
                measured.append([])
        lookup = _lookup(ps, costs[0], base, no_probe)
        res = {
            "lookup": lookup,
            "target": t_label,
            "target_path": str(t_path),
            "corpus": {"kind": cp.kind, "source": cp.source, "texts": len(ps.scored), "positions": ps.positions,
                       "skipped": [lab for lab, _ in ps.skipped], "notes": cp.notes,
                       "faithful": cp.faithful,
                       "target_argmax_is_text": round(float(sum(s.target_is_text.sum() for s in ps.scored))
                                                      / max(1, ps.positions), 4)},
            "settings": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "top_n": base.top_n,
                         "gamma": base.gamma, "chunk": chunk},
            "drafts": [summary.draft_summary(ps, k, infos[k], costs[k], settings, measured[k]) for k in range(len(dms))],
            "seconds": {"corpus": round(t_write, 1), "pass": round(ps.seconds, 1), "pass_target": round(ps.seconds_target, 1),
                        "pass_drafts": [round(x, 1) for x in ps.seconds_drafts],
                        "total": round(time.perf_counter() - t_start, 1)},
            "load_avg": {"start": load_before, "end": provenance.load_average()},
            "environment": provenance.environment(topts, dopts).to_dict(),
            "command": _command(sys.argv[1:]),
        }
        png = None
        if plot_to is not None:
            png = plot.plot_png(res["drafts"], plot_to, f"target {t_label} · {cp.source}")
        if json_out:
            sys.stdout.write(json.dumps(res) + "\n")
            return
        _print(res, base.gamma, png)


def _write(tgt, src):
    with Progress(TextColumn("the target writes"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("answers · {task.fields[tokens]} tokens"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=err_console, transient=True, disable=not err_console.is_terminal) as prog:
        task = prog.add_task("write", total=len(src.problems), tokens=0)
        t0 = time.perf_counter()
        plain = not err_console.is_terminal

        def on_progress(done: int, total: int, tokens: int) -> None:
            prog.update(task, completed=done, tokens=f"{tokens:,}")
            if plain and (done % 5 == 0 or done == total):
                err_console.print(f"the target writes: {done}/{total} answers, {tokens:,} tokens, "
                                  f"{time.perf_counter() - t0:.0f} s")

        return written.target_writes(tgt, src, progress=on_progress)


def _run_pass(tgt, dms, cp, settings, chunk):
    with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TextColumn("positions · {task.fields[texts]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=True,
                  disable=not err_console.is_terminal) as prog:
        task = prog.add_task("pass", total=cp.positions, texts="")
        t0 = time.perf_counter()
        plain = not err_console.is_terminal  # logs: a line every 5 texts (stderr: --json's stdout stays clean)
        last = [0]

        def on_progress(done_texts: int, texts: int, done: int, total: int) -> None:
            prog.update(task, completed=done, total=total, texts=f"{done_texts}/{texts} texts")
            if plain and done_texts != last[0] and (done_texts % 5 == 0 or done_texts == texts):
                last[0] = done_texts
                err_console.print(f"scoring: {done_texts}/{texts} texts, {done:,}/{total:,} positions, "
                                  f"{time.perf_counter() - t0:.0f} s")

        return passes.run(tgt, dms, cp.items, settings, chunk=chunk, progress=on_progress)


def _probe_context(ps) -> list[int] | None:
    """The timing probe's context: the prompt and up to PROBE_TOKENS of the text of the first
    scored text long enough for it; None when none is."""
    for sc in ps.scored:
        context = list(sc.item.prompt) + list(sc.item.text[:PROBE_TOKENS])
        if len(context) >= PROBE_GAMMA + 2:
            return context
    return None


def _lookup(ps, costs, base, no_probe: str) -> dict:
    """Prompt lookup's prediction along the scored texts (one drafter through the corpus)."""
    from ..engine.drafters.policy import AcceptanceBook, extend_costs, linear_costs
    from ..pairscore.lookup import K_MAX, LookupSim, simulate
    from ..pairscore.ways_measure import verify_costs

    vc = extend_costs(verify_costs(costs), K_MAX) if costs is not None else linear_costs(K_MAX)
    book = AcceptanceBook(vc)
    total = LookupSim()
    for sc in ps.scored:
        total.add(simulate(sc.item.prompt, sc.item.text, book, size_n=base.spec_ngram_size_n,
                           size_m=base.spec_ngram_size_m))
    return {"speedup": round(total.speedup, 4), "tokens_per_verify": round(total.tokens_per_verify, 4),
            "drafted": total.drafted, "accepted": total.accepted, "tokens": total.tokens,
            "costs": "timing probe" if costs is not None else f"assumed: 1 + 0.29 k decodes ({no_probe})"}


def _print(res: dict, gamma: int, png) -> None:
    # a pipe or log gets whole rows rather than cells folded at 80 columns
    out = console if console.is_terminal else Console(highlight=False, width=max(console.width, 220))
    c = res["corpus"]
    load = res["load_avg"]
    out.print(Text(
        f"target {res['target']} · {c['source']}: {c['texts']} texts, {c['positions']:,} positions "
        f"(the target's greedy token is the text's at {100 * c['target_argmax_is_text']:.1f}% of them) · "
        f"{res['seconds']['total']:.0f} s (pass {res['seconds']['pass']:.0f} s) · load {load['start']} → {load['end']}"),
        soft_wrap=True)
    if not c["faithful"]:
        out.print(Text("approximation: not the target's own text (the note above says why); --from RESULTS.jsonl is "
                       "the faithful corpus", style="yellow"), soft_wrap=True)
    out.print(_main_table(res, gamma))
    out.print(_gamma_table(res))
    out.print(_entropy_table(res))
    out.print(_gate_table(res))
    lk = res["lookup"]
    out.print(Text(
        f"prompt lookup (--mode sd --spec-type ngram-simple, no draft model): predicted {lk['speedup']:.2f}× the "
        f"target alone · {lk['tokens_per_verify']:.2f} tok/verify · n_drafted {lk['drafted']} · n_accept "
        f"{lk['accepted']} (verify costs: {lk['costs']})"), soft_wrap=True)
    mt = _measured_table(res)
    if mt is not None:
        out.print(mt)
    if "seconds_per_decode" in res["drafts"][0]:
        sp = res["drafts"][0]["seconds_per_decode"]
        out.print(Text(
            f"timing probe (median of 5, {res['environment'].get('threads')} thread(s), this machine, load {load['end']}): target {1000 * sp['target_one_token']:.1f} ms "
            f"a token, verify of {gamma + 1} tokens {1000 * sp['target_verify_by_tokens'][str(gamma + 1)]:.1f} ms; "
            + "; ".join(f"draft {d['draft']} {1000 * d['seconds_per_decode']['draft_one_token']:.1f} ms"
                        for d in res["drafts"])), style="dim", soft_wrap=True)
    if png is not None:
        out.print(f"figure: {png}")
