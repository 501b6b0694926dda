"""`easd-local generate PROMPT`: one completion, streamed, with statistics."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from .. import host
from ..chat import CHAT_DEFAULTS
from ..store import provenance
from ..engine.config import DecodeConfig, not_lossless
from ..errors import ChatTemplateError, ConfigError
from ..engine.decoding import Finished, generate as decode_stream
from ..engine.near_ties import gate_margin
from ..engine.pair import open_models
from . import options as o
from .common import console, err_console, friendly
from ..fsutil import describe_write_error, write_jsonl_atomic
from ..text import check_text, decode_input
from .progress import spinner, until_first
from .render import (LEGEND, ORIGIN_STYLE, placement, placement_line, repack_news, run_settings, status_line,
                     stdout_guard, trace_rows)


# the rule comes from where it is defined, so --help cannot fall behind it
HELP = f"""Generate one completion and print statistics.

Default mode ({o.AUTO_MODE_RULE}): the same rule as chat and serve.

easd and easd-tf are not lossless: the gate replaces some of the target's tokens. For the target's own output use --mode sd (or --mode target).

generate is greedy (temperature {DecodeConfig().temperature:g}, up to {DecodeConfig().max_tokens} tokens) so that a run repeats exactly; chat samples (temperature {CHAT_DEFAULTS.temperature:g}) as chat UIs do.
"""


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    @app.command("generate", help=HELP)
    @friendly
    @o.with_options(before=(o.MODEL_OPTIONS, o.DECODE_OPTIONS), after=(o.LLAMA_OPTIONS,))
    def generate(
        prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="Prompt text ('-' reads standard input).",
                                              show_default=False)],
        chat: Annotated[bool, typer.Option("--chat/--raw", help="Wrap the prompt in the target's chat template.")] = True,
        system: Annotated[Optional[str], typer.Option("--system", metavar="TEXT", help=o.with_default("System message (with --chat).", "none"))] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object with the text and every statistic.")] = False,
        show_origin: Annotated[bool, typer.Option("--show-origin", help="Colour each token by where it came from.")] = False,
        trace: Annotated[Optional[Path], typer.Option("--trace", metavar="FILE", help=o.with_default("Write a per-token trace (JSONL).", "none"))] = None,
        **kw,
    ) -> None:
        flags = o.decode_flags(kw)
        o.decode_config(DecodeConfig(), **flags)  # every value is checked before any model loads
        topts, dopts = o.llama_options(kw)
        if prompt == "-":
            if sys.stdin is None:  # started with stdin closed (``<&-``)
                raise ConfigError("PROMPT is '-' but standard input is closed")
            prompt = decode_input(sys.stdin.buffer.read(), "the prompt read from standard input")
        if trace is not None:
            trace = trace.expanduser()
            o.check_output_path("--trace", trace)  # before the models load, not after the whole completion
        check_text(prompt, "the prompt")
        if system is not None:
            if not chat:  # a raw prompt has nowhere to put it: ignoring it would answer another question
                raise ConfigError("--system needs --chat: a --raw prompt has no system message")
            check_text(system, "the system message")
        load_before = host.load()  # before our own threads add to it
        spec, cfg, source, why = o.pair_and_config(kw, flags, DecodeConfig())
        info = cfg.mode_info
        with spinner(f"loading {spec.label}"):
            models = open_models(
                # target mode given only a draft file: loaded so that the mode's check names the missing target
                o.load_draft(spec, cfg),
                spec.target if info.needs_target else None,
                topts, dopts,
            )
        models.verify_costs = o.verify_costs(spec, kw)
        with models:
            if why and not json_out and o.worth_saying(why):  # once loaded: a load error stays the one line
                err_console.print(Text(f"note: mode {o.mode_label(cfg)}: {why}", style="dim"), soft_wrap=True)
            main = models.target if models.target is not None else models.draft
            cfg.validate(models.n_vocab)
            if chat:
                msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
                try:
                    tokens = main.vocab.chat_tokens(msgs)
                except ChatTemplateError as e:
                    raise ConfigError(f"{e}; use --raw to prompt without it") from None
            else:
                tokens = main.vocab.tokenize(prompt, add_special=True, parse_special=False)
            if show_origin and not json_out:
                err_console.print(LEGEND)
            reason = None if cfg.lossless else not_lossless(cfg.mode, o.easd_loss(spec, cfg.mode))
            if reason and not json_out:
                err_console.print(Text(f"note: {reason}; --mode sd gives the target's own output", style="yellow"),
                                  soft_wrap=not err_console.is_terminal)
            events = []
            fin = None
            out = sys.stdout
            stream = decode_stream(models.target, models.draft, tokens, cfg, n_vocab=models.n_vocab, pair=models,
                                   thresholds_source=source)
            for ev in until_first(stream, f"evaluating the prompt ({len(tokens)} tokens)"):
                if isinstance(ev, Finished):
                    fin = ev
                    break
                events.append(ev)
                if not json_out and ev.text:
                    with stdout_guard():
                        if show_origin:
                            console.print(Text(ev.text, style=ORIGIN_STYLE.get(ev.origin, "")), end="")
                        else:
                            out.write(ev.text)
                            out.flush()
            assert fin is not None
            if trace is not None:
                try:
                    write_jsonl_atomic(trace, trace_rows(events))
                except OSError as e:
                    raise ConfigError(f"could not write the trace: {describe_write_error(trace, e)}") from None
            load_after = host.load()
            busy = host.busy_note((load_before, False), (load_after, True))
            if json_out:
                prov = provenance.collect(spec.draft, spec.target, topts, dopts)
                margin = gate_margin(events, cfg.tau_draft, cfg.tau_target, cfg.overlap)
                obj = {"text": fin.text, "pair": spec.label, **fin.stats.to_dict(), **margin.to_stats(),
                       **run_settings(cfg, spec), "lossless": cfg.lossless, "completion_tokens": fin.tokens,
                       "auto_mode_reason": why or None, "placement": placement(models),
                       "cpu_load": {"before": load_before, "after": load_after, "cores": host.cores(),
                                    "busy": busy or None},
                       "provenance": prov.to_dict()}
                with stdout_guard():
                    out.write(json.dumps(obj, ensure_ascii=False) + "\n")
                    out.flush()
            else:
                with stdout_guard():
                    out.write(fin.tail + "\n")
                    out.flush()
                where = placement_line(models, "status", repack=repack_news(models, topts.verbose))
                err_console.print(status_line(fin.stats, where, busy), style="dim")
