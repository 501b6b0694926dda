"""Re-run one results row with the settings and model files it records, and say whether the
new completion is identical or where and why the two part.

:func:`plan_rerun` picks the row and finds its files (nothing is loaded; a missing file or
one whose sha256 no longer matches is a ConfigError of one line); :func:`rerun` loads the
models with the row's llama.cpp settings, decodes again and compares token ids as they come
(stopping at the first difference). Rows
written before ``completion_tokens`` existed are compared by re-tokenizing their text
(``retokenized``: a tokenization of the same text may differ from the generated tokens).

Where the tokens part, the prompt plus the common prefix is evaluated again (one batched
decode, logits at the last position only) on the deciding model to give the logit gap
between the two tokens; in the EASD modes the gate's distances to its thresholds come from
the new run's own figures at that position (evaluated again on the draft too where the
lazy gate did not compute them). ``near_ties.classify`` names an argmax near-tie, a gate
near-tie or a real difference. Nothing here prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from ..engine import decoding, rules
from ..engine.gate import Gate, Reading
from ..store import filehash, provenance
from ..engine.config import DecodeConfig
from ..errors import ConfigError
from ..engine.near_ties import GateState, classify, topn_boundary_gap
from ..engine.pair import open_models
from ..llamacpp.runtime import LoadOptions, Model
from .prompt import build_messages
from .schema import read_number, row_env, row_model_sha

# what `easd-local bench` loads with when no flag is given: the settings of rows that
# record no environment, as far as anyone can tell
BENCH_DEFAULT_OPTIONS = LoadOptions(n_ctx=4096, n_threads=None, n_gpu_layers=-1, flash_attn=False, main_gpu=0)



@dataclass(frozen=True)
class RerunPlan:
    row: dict
    line: int  # the row's line in the results file (1-based)
    cfg: DecodeConfig
    draft: Path | None  # None when the mode does not use it
    target: Path | None
    target_opts: LoadOptions
    draft_opts: LoadOptions
    notes: list[str] = field(default_factory=list)  # what the reader should know (assumptions)


@dataclass(frozen=True)
class Difference:
    index: int  # token index of the first difference
    char: int  # character offset in the completion where the texts part
    recorded: int | None  # token id; None when that completion ended here
    new: int | None
    recorded_text: str
    new_text: str
    kind: str  # near_ties.ARGMAX / GATE / REAL, or "length" when one completion ended
    logit_gap: float | None  # deciding model's logit(new) - logit(recorded) at this position
    logits: tuple[float, float] | None  # (new, recorded)
    gate: GateState | None  # EASD modes: the gate's inputs at this position
    gate_source: str = ""  # where those figures come from
    # (new run's gate fired, recorded run's gate fired): greedy EASD only; the recorded one
    # inferred from its token (the target's runner-up: a fire; its best token: none), None unknown
    fired: tuple[bool | None, bool | None] = (None, None)


@dataclass(frozen=True)
class RerunResult:
    tokens: int  # tokens the new run generated (up to and including the first difference)
    recorded_tokens: int
    retokenized: bool  # the recorded tokens come from re-tokenizing the recorded text
    difference: Difference | None  # None: identical


# --------------------------------------------------------------------- the plan


def find_row(rows: Sequence[dict], qid: str, method: str, pair: str | None) -> tuple[int, dict]:
    """(index, row) of the last row for (qid, method[, pair]); ConfigError naming what is
    missing or ambiguous."""
    hits = [(i, r) for i, r in enumerate(rows) if r["qid"] == qid and r["method"] == method
            and (pair is None or r["pair"] == pair)]
    if not hits:
        methods = sorted({r["method"] for r in rows if r["qid"] == qid})
        if not methods:
            raise ConfigError(f"no row for qid {qid!r} in the results file")
        raise ConfigError(f"no row for qid {qid!r} with method {method!r}"
                          f"{f' on pair {pair!r}' if pair else ''}; its methods: {', '.join(methods)}")
    pairs = sorted({r["pair"] for _, r in hits})
    if len(pairs) > 1:
        raise ConfigError(f"qid {qid!r} method {method!r} has rows on pairs {', '.join(pairs)}: choose one with --pair")
    return hits[-1]


def row_config(row: dict) -> DecodeConfig:
    """The row's decoding configuration (infinities stored as "inf")."""
    stored = dict(row.get("config") or {})
    known = DecodeConfig.__dataclass_fields__
    values = {}
    for k, v in stored.items():
        if k not in known:
            continue
        if v in ("inf", "-inf"):
            v = read_number(v)
        values[k] = v
    try:
        return DecodeConfig(**values).validate()
    except (TypeError, ConfigError) as e:
        raise ConfigError(f"the row's config cannot be used: {e}") from None


def _candidates(sha: str, name: str) -> list[Path]:
    out = filehash.paths_with(sha, unchanged_only=False)  # a changed one is refused by name
    try:
        from ..store.catalog import load_catalog, local_path

        for entry in load_catalog().models.values():
            if entry.sha256 == sha or entry.file == name:
                p = local_path(entry)
                if p.exists() and p not in out:
                    out.append(p)
    except Exception:  # a broken catalog must not hide files found otherwise
        pass
    return out


def locate(role: str, row: dict, given: Path | None) -> Path:
    """The ``role`` file the row records, found (``given``, the hash cache, the catalog) and
    checked against its sha256; ConfigError of one line when it is missing or changed."""
    rec = (row.get("provenance") or {}).get(role) or {}
    sha, name = rec.get("sha256"), rec.get("file", "?")
    if not sha:
        if given is not None:
            return Path(given).expanduser()
        raise ConfigError(f"the row records no {role} file: give one with --{role} PATH")
    paths = [Path(given).expanduser()] if given is not None else _candidates(sha, name)
    changed = []
    for p in paths:
        try:
            got = filehash.sha256_of(p)
        except OSError:
            if given is not None:
                raise ConfigError(f"--{role} {str(p)!r}: no such file") from None
            continue
        if got == sha:
            return p
        changed.append((p, got))
    if changed:
        p, got = changed[0]
        raise ConfigError(f"the {role} file {str(p)!r} no longer matches the row: sha256 {got[:16]}..., "
                          f"the row records {sha[:16]}... ({name})")
    raise ConfigError(f"the row's {role} file {name} (sha256 {sha[:16]}...) is not on this machine: "
                      f"give it with --{role} PATH")


def _legacy_files(row: dict, draft: Path | None, target: Path | None) -> tuple[Path | None, Path | None, str]:
    """Files for a row that records none: those given, else its catalog pair as it is now."""
    if draft is not None or target is not None:
        return draft, target, "the files given"
    from ..store.catalog import is_present, load_catalog, local_path

    cat = load_catalog()
    if row["pair"] not in cat.pairs:
        raise ConfigError(f"the row records no model files and its pair {row['pair']!r} is not a catalog pair: "
                          "give them with --draft PATH --target PATH")
    entry = cat.pairs[row["pair"]]
    for e in (entry.draft, entry.target):
        if not is_present(e):
            raise ConfigError(f"the catalog pair {row['pair']!r} is not pulled ({e.file} missing): "
                              f"run `easd-local pull {row['pair']}`")
    return local_path(entry.draft), local_path(entry.target), f"catalog pair {row['pair']!r} as it is now"


def plan_rerun(rows: Sequence[dict], qid: str, method: str, pair: str | None = None, *,
               draft: Path | None = None, target: Path | None = None, no_repack: bool = False) -> RerunPlan:
    """Pick the row and find its files; nothing is loaded. ``no_repack``: llama.cpp's extra
    buffer types off whatever the row recorded (--no-repack, on a CPU where they crash)."""
    index, row = find_row(rows, qid, method, pair)
    cfg = row_config(row)
    need_draft, need_target = cfg.needs_draft_model, cfg.mode_info.needs_target
    notes: list[str] = []
    env = row_env(row)
    if row_model_sha(row, "target") or row_model_sha(row, "draft"):
        d = locate("draft", row, draft) if need_draft else None
        t = locate("target", row, target) if need_target else None
    else:
        d, t, where = _legacy_files(row, draft, target)
        d, t = (d if need_draft else None), (t if need_target else None)
        notes.append(f"the row records no model hashes: using {where}, unverified")
    if env is not None:
        try:
            e = provenance.Environment(**{k: tuple(v) if isinstance(v, list) else v for k, v in env.items()})
        except TypeError:  # written by another version: take what it says
            e = None
        topts = e.load_options() if e else _opts_from(env, draft=False)
        dopts = e.load_options(draft=True) if e else _opts_from(env, draft=True)
    else:
        topts = dopts = BENCH_DEFAULT_OPTIONS
        notes.append("the row records no environment: using bench's defaults (ctx 4096, all cores, no flash attention)")
    if no_repack:
        topts, dopts = replace(topts, extra_bufts=False), replace(dopts, extra_bufts=False)
    return RerunPlan(row, index + 1, cfg, d, t, topts, dopts, notes)


def _opts_from(env: dict, *, draft: bool) -> LoadOptions:
    ngl = env.get("n_gpu_layers_draft" if draft else "n_gpu_layers", -1)
    return LoadOptions(n_ctx=int(env.get("n_ctx", 4096)), n_threads=env.get("threads"), n_gpu_layers=int(ngl),
                       flash_attn=bool(env.get("flash_attn", False)), main_gpu=int(env.get("main_gpu") or 0),
                       n_batch=int(env.get("n_batch", 512)))


def environment_note(plan: RerunPlan) -> str | None:
    """One line when this machine's environment differs from the row's (None when equal or
    the row records none)."""
    env = row_env(plan.row)
    if env is None:
        return None
    now = provenance.environment(plan.target_opts, plan.draft_opts, parallel=int(env.get("parallel", 1)))
    diffs = provenance.env_difference(env, now.to_dict())
    return f"another environment than the row's: {', '.join(diffs)}" if diffs else None


# ---------------------------------------------------------------------- the run


def logits_after(model: Model, tokens: Sequence[int], n_vocab: int) -> np.ndarray:
    model.reset()
    return model.decode(list(tokens), logits_at=(-1,))[0, :n_vocab]


def rerun(plan: RerunPlan) -> RerunResult:
    """Decode the row again and compare with what it recorded."""
    row, cfg = plan.row, plan.cfg
    models = open_models(plan.draft, plan.target, plan.target_opts, plan.draft_opts)
    with models:
        main = models.target if models.target is not None else models.draft
        cfg.validate(models.n_vocab)
        prompt = main.vocab.chat_tokens(build_messages(row["question"]))
        recorded = row.get("completion_tokens")
        retokenized = recorded is None
        eog = main.vocab.eog_ids()
        if retokenized:
            recorded = main.vocab.tokenize(row["completion"], add_special=False, parse_special=False)
        new: list[int] = []
        k, at_k = None, None
        # the row's own generator seed (rows of the batched runner record it; older ones
        # used the configuration's seed)
        events = decoding.generate(models.target, models.draft, prompt, cfg, n_vocab=models.n_vocab,
                                   thresholds_source=row["stats"].get("thresholds_source", "default"),
                                   rng_seed=row.get("rng_seed"))
        for ev in events:
            if isinstance(ev, decoding.Finished):
                break
            i = len(new)
            if retokenized and i == len(recorded) and ev.token in eog:
                continue  # the recorded text ends where the new run ends generation
            new.append(ev.token)
            if i >= len(recorded) or ev.token != recorded[i]:
                k, at_k = i, ev  # stop at the first difference: the rest cannot be compared
                events.close()
                break
        if k is None and len(new) < len(recorded):
            k = len(new)  # the new completion ended first
        if k is None:
            return RerunResult(len(new), len(recorded), retokenized, None)
        rec_tok = recorded[k] if k < len(recorded) else None
        new_tok = new[k] if k < len(new) else None
        common = list(prompt) + new[:k]

        def piece(tok: int | None) -> str:
            return "" if tok is None else main.vocab.token_to_piece(tok).decode("utf-8", errors="replace")

        char = len(main.vocab.detokenize(new[:k]))
        if rec_tok is None or new_tok is None:
            diff = Difference(k, char, rec_tok, new_tok, piece(rec_tok), piece(new_tok), "length", None, None, None)
            return RerunResult(len(new), len(recorded), retokenized, diff)
        # the model whose choice the token is: the target, except in draft-only mode
        decider = getattr(models, cfg.mode_info.decider)
        z = logits_after(decider, common, models.n_vocab)
        logits = (float(z[new_tok]), float(z[rec_tok]))
        gate, gate_source, fired = None, "", (None, None)
        gate_ = Gate.of(cfg)
        if gate_.can_fire:
            z_d = logits_after(models.draft, common, models.n_vocab)
            gaps = (topn_boundary_gap(z, cfg.top_n), topn_boundary_gap(z_d, cfg.top_n))
            figures = (at_k.h_draft, at_k.h_target, at_k.overlap) if at_k is not None else (None,) * 3
            if all(f is not None and not math.isnan(f) for f in figures):
                # what the new run's gate decided on, as the generation computed it
                reading = Reading(*figures)
                gate_source = "the new run's own figures"
            else:  # the lazy gate stopped early there (or never looked): read all three
                reading = gate_.read(z_d, z)
                gate_source = "evaluated again after the prompt and the common tokens"
            gate = GateState.of(gate_, reading, gaps)
            if cfg.greedy and at_k is not None:
                # greedy: a fire emits the target's runner-up, anything else its best token
                best = int(np.argmax(z))
                second = int(rules.runner_up(z, best))
                rec_fired = True if rec_tok == second else False if rec_tok == best else None
                fired = (at_k.origin == decoding.EASD, rec_fired)
        gate_differs = None if fired[0] is None or fired[1] is None else fired[0] != fired[1]
        gap = logits[0] - logits[1]
        diff = Difference(k, char, rec_tok, new_tok, piece(rec_tok), piece(new_tok),
                          classify(gap, gate, gate_differs), gap, logits, gate, gate_source, fired)
        return RerunResult(len(new), len(recorded), retokenized, diff)
