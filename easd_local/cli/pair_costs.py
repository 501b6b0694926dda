"""`easd-local pair costs`: measure the lossless ways to decode a pair on this machine (the
target alone, sd with prompt lookup, sd with the draft model, both) and record them: the
default mode of chat, generate and serve is then the fastest (``engine.ways.choose``)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ..llamacpp.devices import system_info
from ..engine.near_ties import ARGMAX_NEAR_TIE
from ..engine.pair import open_models
from ..engine.ways import WAY_TABLE, choose
from ..errors import ConfigError
from ..fsutil import describe_write_error
from ..pairscore import ways_measure as wm
from ..store import costs as store
from ..store import provenance
from ..store.resolve import resolve_pair
from . import options as o
from .common import console, err_console, friendly
from .progress import spinner
from .pull_ui import DownloadUI

DEFAULT_TOKENS = 96


def register_on(pair_app: typer.Typer) -> None:
    @pair_app.command("costs")
    @friendly
    @o.with_options(before=(o.MODEL_OPTIONS,), after=(o.LLAMA_OPTIONS,))
    def costs(
        max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", metavar="N",
                                                help="Tokens each way generates per prompt.")] = DEFAULT_TOKENS,
        json_out: Annotated[bool, typer.Option("--json", help="Print the recorded entry as JSON.")] = False,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Measure and print; record nothing.")] = False,
        **kw,
    ) -> None:
        """Measure, on this machine, how fast each lossless way decodes the pair (the target alone; sd with prompt lookup; sd with the draft model; both), greedily on 4 built-in prompts (2 code edits, 2 maths questions), after a timing probe of the verify costs; record it, so that chat, generate and serve default to the fastest. About 3 minutes on 2 CPU cores for the default pair."""
        if max_tokens < 8:
            raise ConfigError(f"--max-tokens must be >= 8, got {max_tokens}")
        topts, dopts = o.llama_options(kw)
        with DownloadUI(kw["yes"]) as dl:  # a target alone is enough: the draft model's ways are then left out
            spec = resolve_pair(kw["pair"], kw["draft"], kw["target"], mode="sd", spec_type="ngram-simple",
                                confirm=dl.confirm, progress=dl.progress)
        if spec.target is None:
            raise ConfigError("pair costs needs a target (--target or a --pair)")
        load_before = provenance.load_average()
        with spinner(f"loading {spec.label}"):
            models = open_models(spec.draft, spec.target, topts, dopts)
        with models:
            target, draft = models.target, models.draft
            prompts = [target.vocab.chat_tokens([{"role": "user", "content": p}]) for p in wm.PROMPTS]
            with spinner("measuring") as sp:
                runs, probe_costs = wm.measure(target, draft, prompts, max_tokens,
                                               on_progress=lambda s: sp and sp.update(f"measuring: {s}"))
            threads = topts.n_threads or target.n_threads
            entry = wm.entry(runs, probe_costs, max_tokens=max_tokens, n_threads=threads,
                             load=(load_before, provenance.load_average()), system=system_info(),
                             labels={"target": spec.target.name, "draft": spec.draft.name if spec.draft else None})
            if draft is None:
                entry["draft_token"] = None
        key = store.costs_key(spec.draft, spec.target, kw["threads"], kw["n_gpu_layers"],
                              False if kw["no_repack"] else None)
        where, failed = None, None
        try:
            where = None if dry_run else store.record(key, entry)
        except OSError as e:  # a read-only or full home: the figures are shown all the same
            failed = describe_write_error(store.costs_path(), OSError(e.errno, e.strerror, str(store.costs_path())))
        if json_out:
            sys.stdout.write(json.dumps({**entry, "key": key, "recorded": str(where) if where else None}) + "\n")
        else:
            _print(entry, spec.draft is not None)
            way, why = choose(entry["ratios"], spec.draft is not None)
            console.print(Text(f"default now: {way.name} ({why})" if where else f"would default to: {way.name} ({why})"),
                          soft_wrap=True)
            if where:
                err_console.print(Text(f"recorded in {where}", style="dim"))
        if failed:
            raise ConfigError(f"the costs above were not recorded: {failed}")


def partings_text(entry: dict) -> Text | None:
    """What the "texts ≠ target" column means on this run: where the lossless ways' replies
    parted from the target alone's, at argmax near-ties (``ways_measure.parting_gap``), or a
    warning where one did not. None when every text was the target's."""
    n = sum((entry.get("texts_differing") or {}).values())
    gaps = entry.get("parting_gaps")
    if not n or gaps is None:
        return None
    far = [(g, w) for w, gs in gaps.items() for g in gs if g >= ARGMAX_NEAR_TIE]
    if far:
        g, w = max(far)
        return Text(f"{w} parted from the target alone where the target's two tokens were {g:.2f} logits apart: not "
                    f"a near-tie, so not the target's output as a lossless way must give; please report it with "
                    f"`easd-local doctor`'s output", style="yellow")
    near = [g for gs in gaps.values() for g in gs]
    rest = n - len(near)
    return Text(f"texts ≠ target: replies that part from the target alone's; {len(near)} of {n} at a near-tie (the "
                f"target's logits of the two tokens within {max(near, default=0.0):.2f} of each other), which a "
                f"verify's batch may round the other way (docs/speculation.md)"
                + (f"; {rest} where one reply ends and the other goes on" if rest else ""), style="dim")


def _print(entry: dict, have_draft: bool) -> None:
    t = Table(title=f"lossless ways on this machine · {entry['prompts']} prompts × {entry['max_tokens']} tokens · "
                    f"{entry['threads']} threads · load {entry['load_avg'][0]:.1f}→{entry['load_avg'][1]:.1f}")
    t.add_column("way")
    t.add_column("what")
    t.add_column("tok/s", justify="right")
    t.add_column("× target", justify="right")
    t.add_column("by prompt", justify="right")
    t.add_column("texts ≠ target", justify="right")
    by_prompt = entry.get("prompt_ratios") or {}
    for name, r in entry["ratios"].items():
        t.add_row(name, WAY_TABLE[name].words, f"{entry['tokens_per_s'][name]:.2f}", f"{r:.2f}",
                  " ".join(f"{x:.2f}" for x in by_prompt.get(name, [])), str(entry["texts_differing"][name]))
    console.print(t)
    console.print(Text("× target by prompt: the 2 code edits, then the 2 maths questions", style="dim"), soft_wrap=True)
    partings = partings_text(entry)
    if partings is not None:
        console.print(partings, soft_wrap=True)
    vc = entry.get("verify_costs")
    if vc:
        shown = ", ".join(f"{k}: {c:.2f}" for k, c in enumerate(vc) if k in (1, 4, 7, 8, 15, len(vc) - 1))
        extra = f" · a draft-model token {entry['draft_token']:.2f} of a target token" if have_draft and entry.get("draft_token") else ""
        console.print(Text(f"verify costs, in one-token decodes per k drafted tokens: {shown}{extra}"), soft_wrap=True)
