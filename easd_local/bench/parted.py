"""Where two lossless greedy methods of one results file part, and why.

Greedy ``sd`` equals ``target`` but for near-ties: its tokens come from the target's batched
verify, ``target``'s from one-token decodes, and llama.cpp's numbers move a little with the
batch shape. So the study's ``sd`` rows are the control that shows how much of a difference
between methods is numerical noise, and that control holds only if every text where ``sd``
and ``target`` part does so at an argmax near-tie. :func:`explain` checks it from the rows
alone (no generation): for each problem it finds the first token where the two recorded
completions differ, evaluates the target again on the prompt and the common tokens (one
batch, logits at the last position only) and takes the logit gap between the two tokens;
under ``near_ties.ARGMAX_NEAR_TIE`` it is an argmax near-tie, above it a real difference
(a defect in a lossless method).

EASD modes are refused: their texts part where the gate fires, which ``bench report``'s
gate-mechanism table counts. Nothing here prints.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from ..engine.near_ties import ARGMAX, ARGMAX_NEAR_TIE, REAL, first_difference
from ..engine.pair import open_models
from ..llamacpp.runtime import LoadOptions
from ..errors import ConfigError
from .prompt import build_messages
from .report import latest_rows
from .rerun import logits_after, plan_rerun, row_config
from .schema import row_env, row_model_sha

IDENTICAL = "identical"
LENGTH = "length"  # one completion is a prefix of the other (it stopped on max tokens or context)
KINDS = (IDENTICAL, ARGMAX, REAL, LENGTH)


@dataclass(frozen=True)
class Parting:
    qid: str
    index: int | None  # first token index where the completions differ; None: identical
    token: int | None  # the method's token there (None: its completion ended)
    baseline_token: int | None
    text: str  # their pieces
    baseline_text: str
    kind: str  # one of KINDS
    logit_gap: float | None  # target logit(method's token) - logit(baseline's) at that position
    answer_changed: bool  # the extracted answers differ
    correct: tuple[bool, bool]  # (method, baseline)


@dataclass(frozen=True)
class PartedPlan:
    method: str
    baseline: str
    pairs: list[tuple[dict, dict]]  # (method row, baseline row) per problem, in file order
    target: Path
    target_opts: LoadOptions
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PartedSummary:
    compared: int
    counts: dict[str, int]  # kind -> problems
    gaps: list[float]  # |logit gap| of the argmax near-ties and real differences
    answers_changed: int
    wins: int  # method right, baseline wrong (among all compared)
    losses: int

    @property
    def parted(self) -> int:
        return self.compared - self.counts.get(IDENTICAL, 0)

    @property
    def max_gap(self) -> float | None:
        return max(self.gaps) if self.gaps else None

    @property
    def median_gap(self) -> float | None:
        return statistics.median(self.gaps) if self.gaps else None


def _check_lossless(row: dict, name: str) -> None:
    cfg = row_config(row)
    if not (cfg.mode_info.lossless and not cfg.gate_enabled and cfg.mode_info.decider == "target"):
        raise ConfigError(f"{name} {row['method']!r} is mode {cfg.mode}: `bench parted` explains the lossless "
                          "methods (target, sd), whose texts may part only at near-ties; an EASD method's texts "
                          "part where its gate fires (bench report's gate-mechanism table counts those)")
    if not cfg.greedy:
        raise ConfigError(f"{name} {row['method']!r} was sampled (temperature {cfg.temperature}): sampled texts "
                          "part by chance; `bench parted` compares greedy rows")


def plan_parted(rows: Sequence[dict], method: str, baseline: str = "target", pair: str | None = None, *,
                target: Path | None = None, limit: int | None = None, no_repack: bool = False) -> PartedPlan:
    """Pair the two methods' rows by problem and find the target file; nothing is loaded."""
    if method == baseline:
        raise ConfigError(f"--method and --against are both {method!r}: give two methods")
    pairs_seen = {r["pair"] for r in rows if r["method"] in (method, baseline)}
    if pair is None and len(pairs_seen) > 1:
        raise ConfigError(f"the rows of {method!r} and {baseline!r} are on pairs {', '.join(sorted(pairs_seen))}: "
                          "choose one with --pair")
    wanted = [r for r in rows if r["method"] in (method, baseline) and (pair is None or r["pair"] == pair)]
    # the rows bench report compares: a re-run row replaces the one before it
    last = {(r["qid"], r["method"]): r for r in latest_rows(wanted)[0]}
    pairs = [(last[(q, method)], last[(q, baseline)]) for q in dict.fromkeys(r["qid"] for r in wanted)
             if (q, method) in last and (q, baseline) in last]
    for name, m in (("--method", method), ("--against", baseline)):
        if not any(r["method"] == m for r in rows):
            found = sorted({r["method"] for r in rows})
            raise ConfigError(f"{name} {m!r}: no rows with that method; "
                              + (f"the file's methods: {', '.join(found)}" if found else "the file has no rows"))
    if not pairs:
        raise ConfigError(f"no problem has rows of both {method!r} and {baseline!r}")
    if limit is not None:
        pairs = pairs[:limit]
    shas = {row_model_sha(r, "target") for pr in pairs for r in pr}
    if len(shas) > 1:
        raise ConfigError("the rows record different target files: their texts would part for that reason alone")
    for row, base in pairs:  # before anything loads: a refusal mid-way would leave half a report
        _check_lossless(row, "--method")
        _check_lossless(base, "--against")
    missing = sum(1 for pr in pairs for r in pr if not r.get("completion_tokens"))
    if missing:
        raise ConfigError(f"{missing} of the rows record no token ids (written before completion_tokens existed): "
                          "`bench parted` compares recorded tokens")
    # the baseline row's file and llama.cpp settings (what it was decoded with)
    plan = plan_rerun(rows, pairs[0][1]["qid"], baseline, pair, target=target, no_repack=no_repack)
    notes = list(plan.notes)
    if no_repack and not (row_env(pairs[0][1]) or {}).get("no_repack"):
        notes.append("--no-repack: llama.cpp's weight repacking is off here; the rows may have run with it on "
                     "(a near-tie may then part differently)")
    return PartedPlan(method, baseline, pairs, plan.target, plan.target_opts, notes)


def explain(plan: PartedPlan) -> Iterator[Parting]:
    """One Parting per problem, as each is evaluated (the target is loaded once)."""
    models = open_models(None, plan.target, plan.target_opts)
    with models:
        t = models.target

        def piece(x: int | None) -> str:
            return "" if x is None else t.vocab.token_to_piece(x).decode("utf-8", errors="replace")

        for row, base in plan.pairs:
            a, b = row["completion_tokens"], base["completion_tokens"]
            k = first_difference(a, b)
            changed = (row.get("extracted") or "") != (base.get("extracted") or "")
            correct = (bool(row.get("correct")), bool(base.get("correct")))
            if k is None:
                yield Parting(row["qid"], None, None, None, "", "", IDENTICAL, None, changed, correct)
                continue
            tok = a[k] if k < len(a) else None
            btok = b[k] if k < len(b) else None
            if tok is None or btok is None:
                yield Parting(row["qid"], k, tok, btok, piece(tok), piece(btok), LENGTH, None, changed, correct)
                continue
            prompt = t.vocab.chat_tokens(build_messages(row["question"]))
            z = logits_after(t, list(prompt) + list(a[:k]), models.n_vocab)
            gap = float(z[tok] - z[btok])
            kind = ARGMAX if abs(gap) < ARGMAX_NEAR_TIE else REAL
            yield Parting(row["qid"], k, tok, btok, piece(tok), piece(btok), kind, gap, changed, correct)


def summarize(partings: Sequence[Parting]) -> PartedSummary:
    counts = {k: 0 for k in KINDS}
    for p in partings:
        counts[p.kind] += 1
    gaps = [abs(p.logit_gap) for p in partings if p.logit_gap is not None]
    return PartedSummary(
        compared=len(partings), counts=counts, gaps=gaps,
        answers_changed=sum(p.answer_changed for p in partings),
        wins=sum(1 for p in partings if p.correct[0] and not p.correct[1]),
        losses=sum(1 for p in partings if p.correct[1] and not p.correct[0]),
    )
