"""Calibration of the EASD entropy thresholds for a draft/target pair (no printing here).

``collect`` decodes each calibration question greedily with the target alone and records,
at every generated position, both models' entropy (``rules.entropy`` on raw logits over
the shared vocabulary, as the gate sees them) and the top-N overlap of their logits.

How the draft sees the same token sequence: the target is decoded first, step by step
(it has to be: each token depends on the previous one), keeping per position only its
entropy and its top-N token ids. The draft is then run over ``prompt + completion`` in
batched decodes with logits requested at the generated positions, ``chunk`` positions per
decode, so memory stays at ``chunk`` rows × vocabulary floats (64 × 152k × 4 B = 39 MB)
whatever ``max_tokens`` is. A batched decode of the draft costs much less than the same
number of single-token steps, and the logits are those of the same prefix (up to the tiny
float differences between batched and single-token evaluation). Both caches keep the
longest common prefix between questions, so the shared chat-template preamble is
evaluated once.

``percentiles`` and ``thresholds_at`` are the pure maths tested on known traces.
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from . import figures
from .store import profiles
from .engine import rules
from .engine.decoding import fits_context
from .llamacpp.runtime import Part
from .errors import ConfigError
from .jsonsafe import jsonl_lines
from .fsutil import describe_write_error, write_jsonl_atomic
from .text import check_text

PERCENTILES = (50, 75, 90, 95, 99)
DEFAULT_DATASET = "gsm8k-train"
DEFAULT_LIMIT = 100
DEFAULT_MAX_TOKENS = 256
DEFAULT_CHUNK = 64
# a threshold with fewer positions of a model above it than this is set by a handful of
# tokens: another run of the same questions, or other questions, moves it
MIN_TAIL = 10


# ------------------------------------------------------------------------------ the trace


@dataclass
class Trace:
    """Per generated position: entropies, overlap, whether the draft's greedy token is
    the target's (the positions where greedy SD accepts, i.e. where the gate is asked)."""

    top_n: int
    h_draft: list[float] = field(default_factory=list)
    h_target: list[float] = field(default_factory=list)
    overlap: list[float] = field(default_factory=list)
    agree: list[bool] = field(default_factory=list)
    question: list[int] = field(default_factory=list)
    n_questions: int = 0
    skipped: list[tuple[int, int]] = field(default_factory=list)  # (question, prompt tokens): longer than the context
    prompt_tokens: int = 0
    seconds: float = 0.0
    seconds_target: float = 0.0
    seconds_draft: float = 0.0

    @property
    def positions(self) -> int:
        return len(self.h_target)

    def extend(self, q: int, h_d, h_t, ov, agree) -> None:
        self.h_draft.extend(float(x) for x in h_d)
        self.h_target.extend(float(x) for x in h_t)
        self.overlap.extend(float(x) for x in ov)
        self.agree.extend(bool(x) for x in agree)
        self.question.extend([q] * len(h_t))

    def rows(self) -> Iterable[dict]:
        last_q, i = None, 0
        for q, hd, ht, ov, ag in zip(self.question, self.h_draft, self.h_target, self.overlap, self.agree):
            i = i + 1 if q == last_q else 0
            last_q = q
            yield {"q": q, "i": i, "h_draft": round(hd, 6), "h_target": round(ht, 6), "overlap": ov, "agree": ag}


# ------------------------------------------------------------------------------ the maths


def percentiles(values: Sequence[float], ps: Sequence[float] = PERCENTILES) -> dict[float, float]:
    """``{p: value}``: numpy's linear-interpolation percentile (the default method: for n
    sorted values, percentile p sits at index ``p/100 * (n-1)``). NaNs are ignored.
    ValueError for no values or p outside [0, 100]."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    v = v[~np.isnan(v)]
    if v.size == 0:
        raise ValueError("no values to take percentiles of")
    for p in ps:
        if not (0.0 <= float(p) <= 100.0):
            raise ValueError(f"percentile must be in [0, 100], got {p}")
    qs = np.percentile(v, [float(p) for p in ps])
    return {p: float(q) for p, q in zip(ps, qs)}


def thresholds_at(trace: Trace, p: float) -> tuple[float, float]:
    """``(tau_draft, tau_target)``: the p-th percentile of the draft's and the target's
    entropies over all positions of the trace."""
    return percentiles(trace.h_draft, [p])[p], percentiles(trace.h_target, [p])[p]


def thin_tail(trace: Trace, p: float) -> str | None:
    """A warning when the thresholds at percentile ``p`` have fewer than ``MIN_TAIL`` of a
    model's positions above them (too few positions, or too high a percentile), else None."""
    tau_d, tau_t = thresholds_at(trace, p)
    above = min(int((np.asarray(trace.h_draft) > tau_d).sum()), int((np.asarray(trace.h_target) > tau_t).sum()))
    if above >= MIN_TAIL:
        return None
    return (f"p{p:g} of {trace.positions:,} positions leaves {above} position{'s' if above != 1 else ''} above a "
            f"threshold, too few for it to be stable (at least {MIN_TAIL} are wanted): more questions (--limit) "
            "or tokens (--max-tokens), or a lower --percentile, give steadier thresholds")


def gate_open_share(trace: Trace, tau_draft: float, tau_target: float, tau_overlap: float) -> tuple[float, float]:
    """Share of positions where the EASD gate would open (``rules.gate``), over all
    positions and over the positions where greedy SD accepts the draft's token."""
    if trace.positions == 0:
        return 0.0, 0.0
    fires = rules.gate(np.asarray(trace.h_draft), np.asarray(trace.h_target), np.asarray(trace.overlap),
                       tau_draft, tau_target, tau_overlap)
    agree = np.asarray(trace.agree, dtype=bool)
    return float(fires.mean()), float(fires[agree].mean()) if agree.any() else 0.0


def overlap_distribution(trace: Trace) -> list[tuple[float, int, float]]:
    """``[(overlap, count, share)]`` for every possible value k/N, k = 0..N."""
    n = trace.top_n
    total = max(1, trace.positions)
    ks = np.rint(np.asarray(trace.overlap, dtype=np.float64) * n).astype(int) if trace.positions else np.zeros(0, int)
    counts = np.bincount(ks, minlength=n + 1) if ks.size else np.zeros(n + 1, int)
    return [(k / n, int(counts[k]), int(counts[k]) / total) for k in range(n + 1)]


def histogram(a: Sequence[float], b: Sequence[float], bins: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Common-bin histograms of two samples on [0, max]: ``(edges, counts_a, counts_b)``."""
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    top = max(float(xa.max()) if xa.size else 0.0, float(xb.max()) if xb.size else 0.0, 1e-9)
    edges = np.linspace(0.0, top, bins + 1)
    return edges, np.histogram(xa, edges)[0], np.histogram(xb, edges)[0]


def summary(trace: Trace, tau_overlap: float, ps: Sequence[float] = PERCENTILES) -> dict:
    """Everything the command shows, as plain data (also its --json output)."""
    pd, pt = percentiles(trace.h_draft, ps), percentiles(trace.h_target, ps)
    rows = []
    for p in ps:
        all_share, acc_share = gate_open_share(trace, pd[p], pt[p], tau_overlap)
        rows.append({"percentile": p, "h_draft": pd[p], "h_target": pt[p], "gate_open": all_share,
                     "gate_open_accepted": acc_share})
    return {
        "positions": trace.positions,
        "questions": trace.n_questions,
        "top_n": trace.top_n,
        "overlap_threshold": tau_overlap,
        "agree": float(np.mean(trace.agree)) if trace.positions else 0.0,
        "percentiles": rows,
        "max": {"h_draft": max(trace.h_draft), "h_target": max(trace.h_target)},
        "mean": {"h_draft": float(np.mean(trace.h_draft)), "h_target": float(np.mean(trace.h_target))},
        "overlap": [{"overlap": o, "count": c, "share": s} for o, c, s in overlap_distribution(trace)],
        "seconds": trace.seconds,
    }


# ------------------------------------------------------------------------------ questions


def _json_type(value) -> str:
    return {list: "array", dict: "object", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)



def load_questions(dataset: str, question_key: str | None = None, limit: int | None = DEFAULT_LIMIT,
                   allow_test_split: bool = False) -> tuple[str, list[str]]:
    """``(dataset name, questions)`` from a bundled preset or a JSONL file.

    Test-split presets are refused unless ``allow_test_split``: thresholds tuned on the
    questions that ``bench`` reports scores on would bias those scores."""
    from .bench.datasets import PRESETS, load_dataset

    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    if dataset in PRESETS:
        preset = PRESETS[dataset]
        if not preset.calibration_only and not allow_test_split:
            train = [n for n, p in PRESETS.items() if p.calibration_only]
            raise ConfigError(
                f"--dataset {dataset} is a test split ({preset.description}): thresholds calibrated on it "
                f"are tuned on the very questions `bench` scores, which biases those scores. Use "
                f"{' or '.join(train) or 'a training split'} (the default) or your own JSONL, or pass "
                f"--allow-test-split if you will not report scores on {dataset}"
            )
        problems = load_dataset(dataset, question_key=question_key, limit=limit)
        return dataset, [p.question for p in problems]
    path = Path(dataset).expanduser()
    if not path.is_file():
        from .bench.datasets import preset_names

        raise ConfigError(
            f"--dataset {dataset!r} is neither a preset ({', '.join(preset_names())}) nor a JSONL file"
        )
    key = question_key or "question"
    out: list[str] = []
    try:
        lines = jsonl_lines(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read dataset {path}: {e}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{path} line {lineno} is not valid JSON ({e})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path} line {lineno} is a JSON {type(row).__name__}, expected an object")
        if key not in row:
            keys = ", ".join(sorted(map(str, row))) or "none"
            raise ConfigError(f"{path} line {lineno} has no field {key!r} (give --question-key; found: {keys})")
        if not isinstance(row[key], str):
            raise ConfigError(f"{path} line {lineno}: field {key!r} holds a JSON {_json_type(row[key])}, "
                              "expected text")
        out.append(check_text(row[key], f"{path} line {lineno}: the question"))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ConfigError(f"{path} holds no questions")
    return path.stem, out


# ------------------------------------------------------------------------------ collecting


def prefill(model, tokens: Sequence[int], seq: int = 0) -> None:
    """Sequence ``seq``'s cache := ``tokens`` (nothing evaluated for the prefix already there)."""
    keep = model.common_prefix(tokens, seq=seq)
    model.rollback(keep, seq)
    rest = list(tokens[keep:])
    if rest:
        model.decode_batch([Part(seq, rest, ())])


def _top_sets(z: np.ndarray, n: int) -> np.ndarray:
    # the very sets rules.top_n_overlap compares (argpartition's choice on ties)
    return rules._top_n_sets(z, n)


def collect(
    draft,
    target,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    top_n: int = 5,
    n_vocab: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    parallel: int = 1,
    progress: Callable[[int, int, int], None] | None = None,
) -> Trace:
    """Greedy target-only decoding of each prompt (token ids), recording both models'
    entropies and the top-N overlap at every generated position. ``parallel`` questions
    decode together (one target batch per step, sequences 0..parallel-1; the models must
    hold that many). A prompt longer than the context is skipped and listed in
    ``Trace.skipped``. ``progress(done, total, positions)`` is called after each question."""
    if max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {max_tokens}")
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    if parallel < 1 or parallel > min(target.n_seq, draft.n_seq):
        raise ConfigError(f"--parallel must be between 1 and the models' {min(target.n_seq, draft.n_seq)} sequences")
    V = n_vocab or min(draft.n_vocab, target.n_vocab)
    n = min(int(top_n), V)
    if n < 1:
        raise ConfigError(f"--top-n must be >= 1, got {top_n}")
    trace = Trace(top_n=n)
    eog = target.vocab.eog_ids()
    ctx = min(target.n_ctx, draft.n_ctx)
    t0 = time.perf_counter()
    prompts = [list(p) for p in prompts]
    qids = []  # the questions that fit; one longer than the context is skipped, as bench skips it
    for qi, prompt in enumerate(prompts):
        if not prompt:
            raise ConfigError(f"question {qi} rendered to an empty prompt")
        if fits_context(len(prompt), ctx):
            qids.append(qi)
        else:
            trace.skipped.append((qi, len(prompt)))
    prompts = [prompts[qi] for qi in qids]
    for g0 in range(0, len(prompts), parallel):
        group = prompts[g0 : g0 + parallel]
        for prompt in group:
            trace.prompt_tokens += len(prompt)
        # ---- target: greedy, one step of every question of the group per batch
        ts = time.perf_counter()
        for k, prompt in enumerate(group):
            prefill(target, prompt[:-1], k)
        last = [p[-1] for p in group]
        toks: list[list[int]] = [[] for _ in group]
        h_t: list[list[float]] = [[] for _ in group]
        top_t: list[list[np.ndarray]] = [[] for _ in group]
        live = list(range(len(group)))
        while live:
            live = [k for k in live if len(toks[k]) < max_tokens and target.seq_len(k) + 1 <= ctx]
            if not live:
                break
            zs = target.decode_batch([Part(k, [last[k]]) for k in live])
            for k, z in zip(live, zs):
                z = z[:, :V]
                h_t[k].append(float(rules.entropy(z)[0]))
                top_t[k].append(_top_sets(z, n)[0])
                tok = int(np.argmax(z[0]))
                toks[k].append(tok)
                last[k] = tok
            live = [k for k in live if toks[k][-1] not in eog]
        trace.seconds_target += time.perf_counter() - ts
        # ---- draft: prompt + completion, logits at the generated positions, in chunks
        # (one draft batch per chunk across the group)
        ts = time.perf_counter()
        seqs = [p + t for p, t in zip(group, toks)]
        starts = [len(p) - 1 for p in group]  # seqs[k][start + i] is evaluated to predict toks[k][i]
        for k in range(len(group)):
            prefill(draft, seqs[k][: starts[k]], k)
        h_d: list[list[float]] = [[] for _ in group]
        ov: list[list[float]] = [[] for _ in group]
        agree: list[list[bool]] = [[] for _ in group]
        for c0 in range(0, max((len(t) for t in toks), default=0), chunk):
            ks = [k for k in range(len(group)) if c0 < len(toks[k])]
            segs = {k: seqs[k][starts[k] + c0 : starts[k] + min(c0 + chunk, len(toks[k]))] for k in ks}
            zds = draft.decode_batch([Part(k, segs[k], range(len(segs[k]))) for k in ks])
            for k, zd in zip(ks, zds):
                zd = zd[:, :V]
                seg = segs[k]
                h_d[k].extend(rules.entropy(zd).tolist())
                sd = _top_sets(zd, n)
                st = np.stack(top_t[k][c0 : c0 + len(seg)])
                common = (sd[:, :, None] == st[:, None, :]).any(axis=-1).sum(axis=-1)
                ov[k].extend((common / float(n)).tolist())
                agree[k].extend((np.argmax(zd, axis=-1) == np.asarray(toks[k][c0 : c0 + len(seg)])).tolist())
        trace.seconds_draft += time.perf_counter() - ts
        for k in range(len(group)):
            trace.extend(qids[g0 + k], h_d[k], h_t[k], ov[k], agree[k])
            trace.n_questions += 1
            if progress is not None:
                progress(g0 + k + 1, len(prompts), trace.positions)
    trace.seconds = time.perf_counter() - t0
    return trace


# ------------------------------------------------------------------------------ output


def write_pair_profile(trace: Trace, summary_: dict, files, percentile: float, *, dataset: str, max_tokens: int,
                       top_n: int, command: str) -> dict:
    """Write the thresholds at ``percentile`` of ``trace`` into the user profile of the pair
    ``files`` (a ``resolve.PairFiles``) with what produced them; return what was written:
    ``{"path", "tau_draft", "tau_target", "percentile", "warning"}`` (``thin_tail``'s warning, also
    kept in the profile, or None). ``summary_`` is ``summary(trace, ...)``."""
    tau_d, tau_t = (round(v, 4) for v in thresholds_at(trace, percentile))
    warning = thin_tail(trace, percentile)
    entry = files.entry
    did = profiles.file_id(files.draft, entry.draft if entry is not None else None)
    tid = profiles.file_id(files.target, entry.target if entry is not None else None)
    path = profiles.write_profile(
        did, tid, tau_d, tau_t, percentile=percentile,
        positions=trace.positions, questions=trace.n_questions, dataset=dataset, max_tokens=max_tokens,
        top_n=top_n, pair=files.label, command=command,
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        seconds=round(trace.seconds, 1),
        percentiles={f"p{r['percentile']:g}": {"h_draft": round(r["h_draft"], 4), "h_target": round(r["h_target"], 4)}
                     for r in summary_["percentiles"]},
        **({"warning": warning} if warning else {}),
    )
    return {"path": str(path), "tau_draft": tau_d, "tau_target": tau_t, "percentile": percentile, "warning": warning}


def write_trace(path: str | Path, trace: Trace) -> None:
    """ConfigError of one line when ``path`` cannot be written."""
    path = Path(path).expanduser()
    try:
        write_jsonl_atomic(path, trace.rows())
    except OSError as e:
        raise ConfigError(f"cannot write the trace {path}: {describe_write_error(path, e)}") from None


def plot_png(trace: Trace, path: str | Path, taus: tuple[float, float] | None = None, title: str = "") -> Path:
    """Histograms of both entropies (and the chosen thresholds) to a PNG; ConfigError when
    matplotlib is not installed or the file cannot be written."""
    edges, _, _ = histogram(trace.h_draft, trace.h_target, bins=40)
    fig = figures.new_figure("--png", figsize=(8, 4.5), dpi=120)
    ax = fig.subplots()
    ax.hist(trace.h_draft, bins=edges, alpha=0.55, label="draft H_d", color="tab:blue")
    ax.hist(trace.h_target, bins=edges, alpha=0.55, label="target H_t", color="tab:orange")
    if taus is not None:
        ax.axvline(taus[0], color="tab:blue", ls="--", lw=1, label=f"tau_draft {taus[0]:.3g}")
        ax.axvline(taus[1], color="tab:orange", ls="--", lw=1, label=f"tau_target {taus[1]:.3g}")
    ax.set_yscale("log")
    ax.set_xlabel("entropy (nats)")
    ax.set_ylabel("positions (log scale)")
    ax.set_title(title or f"entropy over {trace.positions} positions, {trace.n_questions} questions")
    ax.legend()
    fig.tight_layout()
    return figures.save(fig, path)
