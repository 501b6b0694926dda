"""The texts a pair is scored along, as token ids: what the target wrote (a bench file's
rows: faithful, nothing generated; or its greedy answers generated here first, see
``written``), a preset's reference solutions (an approximation) or any text file.

Each item is a ``prompt`` (the context, at least one token) and a ``text`` whose every
token is scored: position j is where both models predict ``text[j]`` after
``prompt + text[:j]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..bench.datasets import PRESETS, load_dataset, reference_solutions
from ..bench.prompt import build_messages
from ..bench.report import load_results
from ..bench.schema import read_number, row_model_sha
from ..engine.modes import MODE_TABLE
from ..text import decode_input
from ..errors import ConfigError

FAITHFUL = "results"  # the corpus kinds
WRITTEN = "written"  # the target's greedy answers, generated here: faithful too, without a results file
REFERENCE = "dataset"
TEXT = "text"


@dataclass(frozen=True)
class Item:
    label: str  # the problem's qid, or "FILE part k"
    prompt: list[int]
    text: list[int]
    budget: int | None = None  # the run's max tokens (bench rows): SD's last block drafts no further


@dataclass
class Corpus:
    kind: str  # FAITHFUL, WRITTEN, REFERENCE or TEXT
    source: str  # what it was read from, for the reader
    items: list[Item]
    notes: list[str] = field(default_factory=list)  # what the reader must know about it
    rows: list[dict] = field(default_factory=list)  # FAITHFUL: every row of the file (the measured runs)

    @property
    def positions(self) -> int:
        return sum(len(it.text) for it in self.items)

    @property
    def faithful(self) -> bool:
        """Whether the texts are what the target wrote (a results file's rows, or answers
        written here): greedy SD's blocks are then simulated along the text greedy sd writes."""
        return self.kind in (FAITHFUL, WRITTEN)


def _row_order(row: dict) -> tuple:
    return (row["dataset"], row["index"], row["qid"])


@dataclass
class Source:
    """A corpus read and checked, before any model is loaded (what tokenizing it needs is the
    target's vocabulary)."""

    kind: str
    name: str  # the file or preset
    rows: list[dict] = field(default_factory=list)  # FAITHFUL: every row of the file
    mine: list[dict] = field(default_factory=list)  # FAITHFUL: the rows of --method
    method: str = "target"
    solutions: list = field(default_factory=list)  # REFERENCE: [(problem, solution)]
    text: str = ""  # TEXT
    problems: list = field(default_factory=list)  # WRITTEN: the questions the target answers
    max_tokens: int = 0  # WRITTEN: its budget per answer


def read_results(path: str | Path, method: str = "target") -> Source:
    """A bench results file's rows, checked: ConfigError when it holds no row of ``method``."""
    rows = list(load_results(path))
    mine = [r for r in rows if r["method"] == method]
    if not mine:
        methods = sorted({r["method"] for r in rows})
        raise ConfigError(f"{path}: no rows of method {method!r} (it holds {', '.join(methods) or 'no rows'}); "
                          "--method names another")
    return Source(FAITHFUL, Path(path).name, rows=rows, mine=mine, method=method)


def read_dataset(name: str, limit: int | None = None) -> Source:
    return Source(REFERENCE, name, solutions=reference_solutions(name, limit=limit))


def read_questions(name: str, limit: int | None, max_tokens: int) -> Source:
    """A dataset's questions, for the target to answer first (any preset or JSONL file that
    ``bench --dataset`` reads: no reference solutions needed)."""
    if max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {max_tokens}")
    problems = load_dataset(name, limit=limit)
    if not problems:
        raise ConfigError(f"--dataset {name}: no questions")
    return Source(WRITTEN, Path(name).name if name not in PRESETS else name, problems=problems, max_tokens=max_tokens)


def read_text(path: str | Path) -> Source:
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"--text {p}: {e.strerror or e}") from None
    return Source(TEXT, p.name, text=decode_input(data, f"--text {p}"))


def tokenize(src: Source, vocab, *, limit: int | None = None, window: int = 4096,
             target_sha: str | None = None) -> Corpus:
    """The corpus of ``src`` in the target's tokens (``window``: the longest text part)."""
    if src.kind == FAITHFUL:
        return from_results(src, vocab, limit=limit, target_sha=target_sha)
    if src.kind == REFERENCE:
        return from_dataset(src, vocab)
    return from_text(src, vocab, window=window, limit=limit)


def from_results(src: Source, vocab, *, limit: int | None = None, target_sha: str | None = None) -> Corpus:
    """The texts of ``src.method``'s rows of a bench results file (default ``target``: the
    target's own answers), first ``limit`` problems in file order (dataset, index). Where
    rows of several target files are there, those of ``target_sha`` are taken."""
    mine, method, rows = src.mine, src.method, src.rows
    notes: list[str] = []
    if target_sha is not None:
        same = [r for r in mine if row_model_sha(r, "target") == target_sha]
        if same:
            mine = same
        else:
            shas = {row_model_sha(r, "target") for r in mine} - {None}
            notes.append("the rows were written by another target file"
                         + (f" (sha256 {', '.join(s[:12] for s in sorted(shas))}…)" if shas else " (not recorded)")
                         + ": their text is not this target's own, so the prediction is an approximation")
    seen: set[tuple[str, str]] = set()
    chosen = []
    for r in sorted(mine, key=_row_order):
        key = (r["dataset"], r["qid"])
        if key not in seen:
            seen.add(key)
            chosen.append(r)
    if limit is not None:
        chosen = chosen[:limit]
    items, retokenized, prompt_differs, sampled = [], 0, 0, 0
    for r in chosen:
        prompt = vocab.chat_tokens(build_messages(r["question"]))
        recorded = r["stats"].get("prompt_tokens")
        if isinstance(recorded, int) and recorded != len(prompt):
            prompt_differs += 1
        toks = r.get("completion_tokens")
        if toks is None:
            toks = vocab.tokenize(r["completion"], add_special=False, parse_special=False)
            retokenized += 1
        temp = read_number(r["config"].get("temperature", 0.0))
        if temp is not None and temp > 0:
            sampled += 1
        budget = r["config"].get("max_tokens")
        items.append(Item(r["qid"], prompt, [int(t) for t in toks],
                          int(budget) if isinstance(budget, int) and not isinstance(budget, bool) else None))
    if retokenized:
        notes.append(f"{retokenized} row{'s' if retokenized != 1 else ''} predate completion_tokens: their text was "
                     "tokenized again, which may differ from what was generated")
    if prompt_differs:
        notes.append(f"{prompt_differs} prompt{'s' if prompt_differs != 1 else ''} tokenized to another length than "
                     "the row recorded: this target's chat template differs from the one the rows were made with")
    if sampled:
        notes.append(f"{sampled} row{'s' if sampled != 1 else ''} were sampled (temperature > 0): the greedy SD "
                     "simulation follows a text greedy decoding would not have written")
    return Corpus(FAITHFUL, f"{len(items)} {method} rows of {src.name}", items, notes, rows)


def from_dataset(src: Source, vocab) -> Corpus:
    """A preset's questions (rendered as bench renders them) and reference solutions."""
    items = []
    for prob, sol in src.solutions:
        text = vocab.tokenize(sol, add_special=False, parse_special=False)
        items.append(Item(prob.qid, vocab.chat_tokens(build_messages(prob.question)), text))
    note = ("an approximation: reference solutions are written by people, in another style than the target's own "
            "answers (GSM8K's carry <<48/2=24>> calculator notes), so the draft agrees with the target less often "
            "along them than along the target's text, and the predicted tokens per verify come out low; "
            "--from RESULTS.jsonl (the target's rows of a bench file) is the faithful corpus")
    return Corpus(REFERENCE, f"{len(items)} {src.name} reference solutions", items, [note])


def from_text(src: Source, vocab, *, window: int, limit: int | None = None) -> Corpus:
    """A text file, tokenized as plain text (no special tokens), cut into windows of at most
    ``window`` tokens; each window's first token is its context."""
    p = Path(src.name)
    toks = vocab.tokenize(src.text, add_special=False, parse_special=False)
    if len(toks) < 2:
        raise ConfigError(f"--text {p}: {len(toks)} token{'s' if len(toks) != 1 else ''}; at least 2 are needed")
    window = max(2, int(window))
    items = []
    for k, s in enumerate(range(0, len(toks) - 1, window)):
        part = toks[s : s + window]
        if len(part) < 2:
            break
        items.append(Item(f"{p.name} part {k + 1}", part[:1], part[1:]))
        if limit is not None and len(items) >= limit:
            break
    note = ("an approximation: a text file is not the target's own answers, and the draft agrees with the target "
            "less often along text the target would not have written, so the predicted tokens per verify may come "
            "out low; --from RESULTS.jsonl or --dataset D --target-writes is the faithful corpus")
    return Corpus(TEXT, f"{src.name}: {len(toks):,} tokens in {len(items)} part{'s' if len(items) != 1 else ''}",
                  items, [note])


# ------------------------------------------------------------------- measured runs


@dataclass
class Measured:
    """What one method of a bench file measured on some of the scored problems (greedy rows
    of this very draft and target)."""

    method: str
    mode: str
    config: dict[str, Any]
    qids: list[str]
    tokens: int
    target_calls: int
    fires: int

    @property
    def tokens_per_verify(self) -> float:
        return self.tokens / self.target_calls if self.target_calls else math.nan

    @property
    def fires_per_100(self) -> float:
        return 100.0 * self.fires / self.tokens if self.tokens else math.nan


def measured_runs(rows: Iterable[dict], qids: set[str], draft_sha: str, target_sha: str) -> list[Measured]:
    """The speculative methods (``sd``, ``easd``, ``easd-tf``) a results file ran greedy on the
    scored problems with these two files, each pooled over the problems it answered."""
    by_method: dict[str, list[dict]] = {}
    for r in rows:
        info = MODE_TABLE.get(str(r["config"].get("mode")))
        # the draft model's methods: a drafter with its distributions (not lookup's)
        if info is None or not info.needs_drafter or r["qid"] not in qids:
            continue
        if r["config"].get("spec_type", "draft") != "draft" and not info.needs_dists:
            continue
        if read_number(r["config"].get("temperature", 0.0)) != 0.0:
            continue
        if row_model_sha(r, "draft") != draft_sha or row_model_sha(r, "target") != target_sha:
            continue
        by_method.setdefault(r["method"], []).append(r)
    out = []
    for method, rs in by_method.items():
        seen: dict[str, dict] = {}
        for r in rs:
            seen.setdefault(r["qid"], r)
        rs = list(seen.values())
        cfg = dict(rs[0]["config"])
        if any(dict(r["config"]) != cfg for r in rs):
            continue  # one method, several settings: no single prediction to set against it
        out.append(Measured(method, cfg["mode"], cfg, [r["qid"] for r in rs],
                            tokens=sum(r["stats"]["tokens"] for r in rs),
                            target_calls=sum(r["stats"]["target_calls"] for r in rs),
                            fires=sum(r["stats"]["easd_fires"] for r in rs)))
    return sorted(out, key=lambda m: (m.mode, m.method))
