"""Read a results file and summarise it per (dataset, pair) and method.

No printing here: :func:`render_rich` returns tables for the caller to print,
:func:`render_markdown` returns text and :func:`plot` writes an image file.

Definitions (all aggregates are ratios of sums over a method's rows, not means of
per-row ratios):

- accuracy = correct / n, with a Wilson 95% interval;
- tokens/s = Σ generated tokens / Σ ``seconds_total`` (wall time of the whole generation);
- acceptance rate = Σ ``draft_accepted`` / Σ ``drafted``;
- mean accepted length (tokens per verify) = Σ(``draft_accepted`` + ``sd_rejections`` +
  ``easd_fires`` + ``bonus``) / Σ ``target_calls``;
- EASD fires per 100 tokens = 100 · Σ ``easd_fires`` / Σ ``tokens``;
- gate near-ties = Σ ``gate_near`` / Σ ``gate_decisions``: the share of gate decisions
  (fired or not) that moving an entropy by 0.05 nats could flip (``near_ties``), over the
  rows that record them;
- time shares = Σ ``seconds_draft`` | ``seconds_target`` | ``seconds_controller`` / Σ ``seconds_total``;
- gate mechanism (gated methods, against ``target`` on the qids both have): problems on which
  the gate fired at least once, answers that changed (extracted answer differs), and texts
  that differ although the gate never fired. Greedy ``easd-tf`` decodes the target one token
  at a time exactly as ``target`` does until its first fire, so for it that last count must
  be 0; anything else is a defect or a different environment (``sd`` and ``easd`` verify in
  batches, whose argmax near-ties part texts without a fire: ``sd``'s count is that noise).

The speculative figures are reported only for methods that drafted (Σ ``drafted`` > 0);
the fire rate also for the other EASD methods (``easd-tf`` gates without drafting).
Each method is compared with ``sd`` and with ``target`` on the qids both have: wins
(method right, baseline wrong), losses (the reverse) and the exact McNemar p-value.

Rows name their models by sha256 (``provenance``): a pair whose files changed between rows
is summarised as two groups. Rows from several environments (llama.cpp build, threads,
batch sizes, machine...: ``provenance.Environment``) are flagged by :func:`environments`;
``same_env`` restricts the paired comparisons to qids whose two rows share one recorded
environment, since greedy text moves at every near-tie between environments.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .. import figures
from ..errors import ConfigError
from ..jsonsafe import jsonl_lines
from ..engine.decoding import Stats
from ..engine.modes import MODE_TABLE, MODES
from ..store.provenance import UNKNOWN_ENV
from .loops import is_looping, is_truncated
from .schema import row_env, row_env_id, row_model_sha, validate_row
from .stats import mcnemar_exact, wilson_interval

BASELINES = ("sd", "target")
_MODE_ORDER = MODES

TOKENS_PER_S_NOTE = "tok/s = total generated tokens / total wall seconds (seconds_total) per method"


class Results(list):
    """The rows of a results file (a plain list) plus what loading skipped.

    ``torn_lines`` is 1 when the last line was cut off mid-write (a crash) and skipped.
    """

    def __init__(self, rows: Iterable[dict] = (), *, path: str = "", torn_lines: int = 0) -> None:
        super().__init__(rows)
        self.path = path
        self.torn_lines = torn_lines


def load_results(path: str | Path) -> Results:
    """Load and validate a JSON-lines results file.

    An unterminated last line that is not valid JSON (the runner died mid-write) is skipped
    and counted in ``.torn_lines``; any other bad line raises ConfigError naming its line
    number (the same rule ``runner.ResultsFile`` applies when resuming).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "not found"
        raise ConfigError(f"results file {str(p)!r} {what}")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot read results file {str(p)!r}: {exc.strerror or exc}") from None
    numbered = [(i, line) for i, line in enumerate(jsonl_lines(text), 1) if line.strip()]
    rows: list[dict] = []
    torn = 0
    for pos, (lineno, line) in enumerate(numbered):
        where = f"{p.name} line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if pos == len(numbered) - 1 and not text.endswith("\n"):
                # cut off mid-write (the writer ends every row with a newline): the run can
                # be resumed, which cuts this away and computes the row again. A bad line
                # that does end in a newline was written whole: the file is corrupt
                torn += 1
                continue
            raise ConfigError(f"{where} is not valid JSON ({exc.msg}); the file is corrupt") from None
        rows.append(validate_row(row, where))
    return Results(rows, path=str(p), torn_lines=torn)


# ----------------------------------------------------------------------- summaries


@dataclass
class PairedComparison:
    baseline: str
    n: int  # qids both the method and the baseline answered
    wins: int  # method right, baseline wrong
    losses: int  # method wrong, baseline right
    both_right: int
    both_wrong: int
    p_value: float  # exact McNemar on (wins, losses)
    accuracy: float  # the method's accuracy on these n qids
    baseline_accuracy: float


@dataclass
class MethodSummary:
    method: str
    n: int
    correct: int
    accuracy: float
    ci_low: float  # Wilson 95%
    ci_high: float
    tokens: int  # Σ generated tokens
    seconds: float  # Σ seconds_total
    tokens_per_s: float | None  # Σ tokens / Σ seconds_total
    mean_tokens: float
    speculative: bool  # Σ drafted > 0
    acceptance_rate: float | None  # Σ draft_accepted / Σ drafted
    mean_accepted_len: float | None  # tokens per target verify call
    easd_fires_per_100: float | None  # per 100 generated tokens
    gate_near_share: float | None  # Σ gate_near / Σ gate_decisions (None: no decisions recorded)
    share_draft: float | None  # fractions of Σ seconds_total
    share_target: float | None
    share_controller: float | None
    stop_reasons: dict[str, int] = field(default_factory=dict)
    load_median: float | None = None  # median 1-minute load average as its rows finished
    load_rows: int = 0  # rows that record one (rows written before 2026-12-04 do not)
    truncated: int = 0  # rows that stopped on length or context, not at an end of generation
    looping: int = 0  # of those, rows whose tail repeats one span over and over (loops.py)
    no_answer: int = 0  # rows from which the grader extracted no answer
    vs_sd: PairedComparison | None = None
    vs_target: PairedComparison | None = None
    mechanism: "GateMechanism | None" = None


@dataclass
class GateMechanism:
    """What the EASD gate did to a gated method's answers, against ``target``."""

    n: int  # qids both the method and target answered
    fired: int  # of those, problems with at least one gate fire
    texts_changed: int  # completions that differ from target's
    answers_changed: int  # extracted answers that differ from target's
    changed_without_fire: int  # completions that differ although the gate never fired
    greedy: bool  # every compared row of both was greedy (then the no-fire texts must agree)

    @property
    def fired_share(self) -> float | None:
        return _ratio(self.fired, self.n)


@dataclass
class GroupSummary:
    dataset: str
    pair: str
    questions: int  # distinct qids in this group
    methods: list[MethodSummary]
    duplicates: int = 0  # rows superseded by a later row for the same (method, qid)
    files: str = ""  # "draft 1a2b3c4d · target 5e6f7a8b" when the pair's files differ between rows
    same_env: bool = False  # paired comparisons only on qids whose rows share one environment
    settings: str = ""  # the decoding settings every row of the group shares, e.g. "greedy · max 512 tokens"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _method_key(method: str, first_seen: int) -> tuple[int, int]:
    base = method.split("[", 1)[0].strip()
    rank = _MODE_ORDER.index(base) if base in _MODE_ORDER else len(_MODE_ORDER)
    return rank, first_seen


def _paired(mine: dict[str, bool], theirs: dict[str, bool], baseline: str,
            envs: tuple[dict[str, str | None], dict[str, str | None]] | None = None) -> PairedComparison:
    common = [q for q in mine if q in theirs]
    if envs is not None:  # same environment only (an unrecorded one matches nothing)
        common = [q for q in common if envs[0][q] is not None and envs[0][q] == envs[1][q]]
    wins = sum(1 for q in common if mine[q] and not theirs[q])
    losses = sum(1 for q in common if theirs[q] and not mine[q])
    both_right = sum(1 for q in common if mine[q] and theirs[q])
    n = len(common)
    return PairedComparison(
        baseline=baseline,
        n=n,
        wins=wins,
        losses=losses,
        both_right=both_right,
        both_wrong=n - wins - losses - both_right,
        p_value=mcnemar_exact(wins, losses),
        accuracy=(wins + both_right) / n if n else 0.0,
        baseline_accuracy=(losses + both_right) / n if n else 0.0,
    )


def _summarize_method(method: str, rows: list[dict]) -> MethodSummary:
    n = len(rows)
    correct = sum(1 for r in rows if r["correct"])
    lo, hi = wilson_interval(correct, n)

    # the rows' statistics pooled; a row's mode (from its config) says which of its target
    # calls verified drafts
    s = sum((Stats.from_dict({**r["stats"], "mode": r["config"].get("mode", "")}) for r in rows), Stats())
    tokens = s.tokens
    seconds = s.seconds_total
    speculative = s.drafted > 0
    # easd-tf drafts nothing but gates every position: its fire rate belongs in the table
    loads = [float(r["load_avg"]) for r in rows if r.get("load_avg") is not None]
    gated = speculative or any(getattr(MODE_TABLE.get(str(r["config"].get("mode", ""))), "gated", False) for r in rows)
    return MethodSummary(
        method=method,
        n=n,
        correct=correct,
        accuracy=correct / n if n else 0.0,
        ci_low=lo,
        ci_high=hi,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=_ratio(tokens, seconds),
        mean_tokens=tokens / n if n else 0.0,
        speculative=speculative,
        acceptance_rate=s.acceptance_rate if speculative else None,
        mean_accepted_len=s.mean_accepted_len if speculative else None,
        easd_fires_per_100=s.easd_fires_per_100 if gated else None,
        gate_near_share=_ratio(sum(r["stats"].get("gate_near", 0) for r in rows),
                               sum(r["stats"].get("gate_decisions", 0) for r in rows)),
        share_draft=_ratio(s.seconds_draft, seconds),
        share_target=_ratio(s.seconds_target, seconds),
        share_controller=_ratio(s.seconds_controller, seconds),
        stop_reasons=dict(Counter(r["stats"]["stop_reason"] or "?" for r in rows)),
        load_median=statistics.median(loads) if loads else None,
        load_rows=len(loads),
        truncated=sum(1 for r in rows if is_truncated(r)),
        looping=sum(1 for r in rows if is_looping(r)),
        no_answer=sum(1 for r in rows if r.get("extracted") in (None, "")),
    )


def gate_mechanism(mine: dict[str, dict], target: dict[str, dict]) -> GateMechanism:
    """Compare a gated method's rows with target's, qid by qid (see the module docstring)."""
    common = [q for q in mine if q in target]
    fired = texts = answers = unexplained = 0
    greedy = bool(common)
    for q in common:
        a, b = mine[q], target[q]
        fires = a["stats"].get("easd_fires", 0) > 0
        fired += fires
        differ = a["completion"] != b["completion"]
        texts += differ
        answers += a["extracted"] != b["extracted"]
        unexplained += differ and not fires
        greedy = greedy and a["config"].get("temperature") == 0 and b["config"].get("temperature") == 0
    return GateMechanism(len(common), fired, texts, answers, unexplained, greedy)


def latest_rows(rows: Iterable[dict]) -> tuple[list[dict], Counter]:
    """The rows a report compares: the last row of each (dataset, pair, files, method, qid),
    in order of first appearance; and how many rows were superseded per (dataset, pair)."""
    latest: dict[tuple, dict] = {}
    duplicates: Counter = Counter()
    for row in rows:
        key = (row["dataset"], row["pair"], _files_key(row), row["method"], row["qid"])
        if key in latest:
            duplicates[key[:2]] += 1
        latest[key] = row
    return list(latest.values()), duplicates


def select_rows(rows: Iterable[dict], *, methods: Sequence[str] | None = None,
                common: bool = False) -> list[dict]:
    """The rows a report shows: only ``methods`` (all when None) and, with ``common``, only
    the problems every shown method of the same (dataset, pair) answered, so that each
    accuracy is taken on the same problems (a sensitivity table whose settings ran on the
    first 300 problems beside methods that ran on all of them). ConfigError when a named
    method has no rows."""
    rows = list(rows)
    if methods is not None:
        present = {r["method"] for r in rows}
        missing = [m for m in methods if m not in present]
        if missing:
            raise ConfigError(f"no rows of method {', '.join(missing)} (the file has: "
                              f"{', '.join(sorted(present)) or 'none'})")
        keep = set(methods)
        rows = [r for r in rows if r["method"] in keep]
    if common:
        answered: dict[tuple[str, str], dict[str, set]] = {}
        for r in latest_rows(rows)[0]:
            answered.setdefault((r["dataset"], r["pair"]), {}).setdefault(r["method"], set()).add(r["qid"])
        shared = {key: set.intersection(*by_method.values()) for key, by_method in answered.items()}
        rows = [r for r in rows if r["qid"] in shared[(r["dataset"], r["pair"])]]
    return rows


def _files_key(row: dict) -> tuple[str | None, str | None]:
    return row_model_sha(row, "draft"), row_model_sha(row, "target")


def _file_groups(rows: list[dict]) -> dict[int, tuple]:
    """Row index -> files key of its group. Rows that name no files (written before
    provenance) join their pair's group when the pair has one set of recorded files."""
    known: dict[tuple[str, str], set] = {}
    for r in rows:
        f = _files_key(r)
        if f != (None, None):
            known.setdefault((r["dataset"], r["pair"]), set()).add(f)
    out = {}
    for i, r in enumerate(rows):
        f = _files_key(r)
        options = known.get((r["dataset"], r["pair"]), set())
        if f == (None, None) and len(options) == 1:
            f = next(iter(options))
        out[i] = f
    return out


def _files_label(files: tuple[str | None, str | None]) -> str:
    d, t = files
    if d is None and t is None:
        return "files not recorded"
    return " · ".join(f"{role} {sha[:8]}" for role, sha in (("draft", d), ("target", t)) if sha)


def summarize(rows: Iterable[dict], *, same_env: bool = False) -> list[GroupSummary]:
    """One GroupSummary per (dataset, pair, model files), in order of first appearance;
    methods in mode order (target, draft, sd, easd, easd-tf, then others as first seen).
    When a (dataset, pair, files, method, qid) appears more than once the last row wins.
    ``same_env``: paired comparisons only on qids whose two rows share a recorded
    environment."""
    rows, duplicates = latest_rows(rows)
    method_seen: dict[str, int] = {}
    for row in rows:
        method_seen.setdefault(row["method"], len(method_seen))
    files_of = _file_groups(rows)

    # keyed by qid: a row written before provenance joins its pair's recorded files, so it can
    # meet a newer row of the same (method, qid) here; the later one wins, as in latest_rows
    by_group: dict[tuple, dict[str, dict[str, dict]]] = {}
    for i, row in enumerate(rows):
        key = (row["dataset"], row["pair"], files_of[i])
        same = by_group.setdefault(key, {}).setdefault(row["method"], {})
        if row["qid"] in same:
            duplicates[key[:2]] += 1
        same[row["qid"]] = row
    groups = {key: {m: list(rs.values()) for m, rs in by_method.items()} for key, by_method in by_group.items()}
    n_files = Counter(key[:2] for key in groups)

    out: list[GroupSummary] = []
    for (dataset, pair, files), by_method in groups.items():
        outcome = {m: {r["qid"]: bool(r["correct"]) for r in rs} for m, rs in by_method.items()}
        by_qid = {m: {r["qid"]: r for r in rs} for m, rs in by_method.items()}
        env = {m: {r["qid"]: row_env_id(r) for r in rs} for m, rs in by_method.items()}
        methods = []
        for method in sorted(by_method, key=lambda m: _method_key(m, method_seen[m])):
            summary = _summarize_method(method, by_method[method])
            for baseline in BASELINES:
                if baseline in outcome and baseline != method:
                    envs = (env[method], env[baseline]) if same_env else None
                    setattr(summary, f"vs_{baseline}",
                            _paired(outcome[method], outcome[baseline], baseline, envs))
            if "target" in by_qid and method != "target" and summary.easd_fires_per_100 is not None:
                summary.mechanism = gate_mechanism(by_qid[method], by_qid["target"])
            methods.append(summary)
        questions = len({r["qid"] for rs in by_method.values() for r in rs})
        label = _files_label(files) if n_files[(dataset, pair)] > 1 else ""
        out.append(GroupSummary(dataset, pair, questions, methods, duplicates[(dataset, pair)], label, same_env,
                                settings_label([r for rs in by_method.values() for r in rs])))
    return out


def settings_label(rows: Sequence[dict]) -> str:
    """The sampling settings the rows share, for titles: 'greedy · max 512 tokens · gamma 4'
    (a setting that differs between rows reads 'varies')."""
    def shared(key: str):
        values = {json.dumps(r.get("config", {}).get(key)) for r in rows}
        return json.loads(values.pop()) if len(values) == 1 else "varies"

    temp = shared("temperature")
    if temp == 0 or temp == 0.0:
        parts = ["greedy"]
    else:
        parts = [f"temperature {temp:g}" if isinstance(temp, (int, float)) else f"temperature {temp}"]
        for key, name in (("top_k", "top-k"), ("top_p", "top-p")):
            v = shared(key)
            parts.append(f"{name} {v:g}" if isinstance(v, (int, float)) else f"{name} {v}")
    mt = shared("max_tokens")
    parts.append(f"max {mt} tokens" if mt != "varies" else "max tokens varies")
    if any(getattr(MODE_TABLE.get(str(r.get("config", {}).get("mode"))), "speculative", False) for r in rows):
        parts.append(f"gamma {shared('gamma')}")
    return " · ".join(parts)


def flags_text(m: MethodSummary) -> str:
    """Why an accuracy may mean little: '4/4 truncated, 4/4 no answer extracted' ('' if none)."""
    parts = []
    if m.truncated:
        loops = f" ({m.looping} looping)" if m.looping else ""
        parts.append(f"{m.truncated}/{m.n} truncated{loops}")
    if m.no_answer:
        parts.append(f"{m.no_answer}/{m.n} no answer extracted")
    return ", ".join(parts)


@dataclass
class EnvMix:
    """The environments of the compared rows."""

    rows: list[tuple[str, int]]  # (env_id or UNKNOWN_ENV, rows), most rows first
    differing: dict[str, list[Any]] = field(default_factory=dict)  # field -> its values, among recorded envs

    @property
    def mixed(self) -> bool:
        return len(self.rows) > 1


def environments(rows: Iterable[dict]) -> EnvMix:
    """How many of ``rows`` come from each environment, and which fields differ between the
    recorded ones (rows written before provenance count as one unknown environment)."""
    counts: Counter = Counter()
    envs: dict[str, dict] = {}
    for r in rows:
        eid = row_env_id(r)
        counts[eid or UNKNOWN_ENV] += 1
        if eid is not None:
            envs.setdefault(eid, row_env(r) or {})
    differing: dict[str, list[Any]] = {}
    for key in dict.fromkeys(k for e in envs.values() for k in e):
        values = list(dict.fromkeys(json.dumps(e.get(key), sort_keys=True) for e in envs.values()))
        if len(values) > 1:
            differing[key] = [json.loads(v) for v in values]
    return EnvMix(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])), differing)


def _short(key: str, value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if key == "git_commit":
        return str(value)[:7]
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def env_lines(mix: EnvMix, same_env: bool = False) -> list[str]:
    """What a report says above its tables about environments: nothing for one environment;
    for several, how many rows each, which fields differ, and what --same-env does."""
    if not mix.mixed:
        return []
    per = " · ".join(f"{eid}: {n} row{'s' if n != 1 else ''}" for eid, n in mix.rows)
    lines = [f"these rows come from {len(mix.rows)} environments ({per})"]
    if mix.differing:
        lines.append("fields that differ: " + "; ".join(
            f"{k} {' / '.join(_short(k, v) for v in vals)}" for k, vals in mix.differing.items()))
    if any(eid == UNKNOWN_ENV for eid, _ in mix.rows):
        lines.append(f"{UNKNOWN_ENV}: rows written before provenance was recorded")
    lines.append("paired comparisons use only qids whose two rows share one environment (--same-env)" if same_env
                 else "paired comparisons may mix environments; --same-env restricts them to one")
    return lines


# ------------------------------------------------------------------------ rendering


# 1-minute load averages whose medians lie this close count as like loads (on the 2-core
# development machine one more busy thread moves the load by ~1 and tok/s by a third or more)
LOAD_ALIKE = 0.5


def speed_note(g: GroupSummary) -> str | None:
    """None when the group's tok/s were measured under like loads (every row records one and
    the methods' medians lie within LOAD_ALIKE); otherwise why its tok/s are no speed
    comparison. One method alone compares with nothing: None."""
    ms = [m for m in g.methods if m.tokens_per_s is not None]
    if len(ms) < 2:
        return None
    if any(m.load_rows < m.n for m in ms):
        return "load not recorded for every row: compare tok/s only between methods run side by side"
    lo, hi = min(m.load_median for m in ms), max(m.load_median for m in ms)
    if hi - lo > LOAD_ALIKE:
        return f"rows made under different loads (medians {lo:.2f}–{hi:.2f}): tok/s here are no speed comparison"
    return None


def load_lines(summaries: Sequence[GroupSummary]) -> list[str]:
    """One line per group whose rows record the machine's load: each method's median 1-minute
    load average, so that a reader sees whether its tok/s were measured under like loads
    (a speed comparison is a ratio measured side by side in one run), and where they were
    not, :func:`speed_note`. Where no row records a load, only the speed note (nothing for
    one method)."""
    out = []
    for g in summaries:
        if not any(m.load_rows for m in g.methods):
            note = speed_note(g)
            if note:
                out.append(f"tok/s, {g.dataset} · pair {g.pair}: {note}")
            continue
        parts = []
        for m in g.methods:
            if not m.load_rows:
                parts.append(f"{m.method} not recorded")
                continue
            part = f"{m.method} {m.load_median:.2f}"
            parts.append(part + (f" ({m.load_rows} of {m.n} rows)" if m.load_rows < m.n else ""))
        note = speed_note(g)
        out.append(f"load (median 1-minute load average as the rows finished; tok/s compare only under like "
                   f"loads), {g.dataset} · pair {g.pair}: " + " · ".join(parts) + (f"; {note}" if note else ""))
    return out


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}%"


def _num(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _vs(c: PairedComparison | None, with_n: bool = False) -> str:
    if c is None:
        return "—"
    return f"+{c.wins}/-{c.losses} p={_p(c.p_value)}" + (f" n={c.n}" if with_n else "")


def _shares(m: MethodSummary) -> str:
    if m.share_draft is None:
        return "—"
    return f"{100 * m.share_draft:.0f}/{100 * (m.share_target or 0):.0f}/{100 * (m.share_controller or 0):.0f}"


_COLUMNS = (
    "method", "n", "accuracy", "95% CI", "tok/s", "mean tok", "accept",
    "tok/verify", "fires/100 tok", "gate near-tie", "time % d/t/c", "vs sd (W/L, p)", "vs target (W/L, p)",
)

NOTES = (
    TOKENS_PER_S_NOTE + ". accept = Σ accepted draft tokens / Σ drafted. "
    "accuracy flags rows that stopped at max tokens or context (truncated; looping: its last 200 or more "
    "tokens repeat one span of at most 256 tokens three or more times, a loop that more tokens would most "
    "likely only lengthen) or gave the grader nothing to extract (no answer extracted). tok/verify = tokens committed per target verify call. fires/100 tok = EASD gate fires "
    "per 100 generated tokens. gate near-tie = share of gate decisions (fired or not) that a 0.05-nat change "
    "of an entropy could flip. time % = share of wall time in draft / target (verify) / "
    "controller. W/L = questions this method got right and the baseline wrong / the reverse, "
    "on the questions both ran; p = two-sided exact McNemar."
)


def _cells(m: MethodSummary, with_n: bool = False) -> list[str]:
    return [
        m.method,
        str(m.n),
        f"{100 * m.accuracy:.1f}% ({m.correct})" + (f" · {flags_text(m)}" if flags_text(m) else ""),
        f"{100 * m.ci_low:.1f}–{100 * m.ci_high:.1f}",
        _num(m.tokens_per_s),
        _num(m.mean_tokens, 0),
        _pct(m.acceptance_rate),
        _num(m.mean_accepted_len, 2),
        _num(m.easd_fires_per_100, 2),
        _pct(m.gate_near_share),
        _shares(m),
        _vs(m.vs_sd, with_n),
        _vs(m.vs_target, with_n),
    ]


_MECH_COLUMNS = ("method", "n vs target", "problems fired", "texts changed", "answers changed",
                 "changed without a fire")

MECH_NOTE = (
    "EASD (easd, easd-tf) is not lossless: where its gate fires, the target's re-pick replaces the token SD "
    "would keep, so its texts and answers may differ from target's, for better or worse (W/L and p say which). "
    "Gate mechanism, against target on the questions both ran: problems fired = problems with at least one "
    "gate fire; texts/answers changed = completions / extracted answers that differ from target's; "
    "changed without a fire = completions that differ although the gate never fired (greedy easd-tf must "
    "have 0: up to its first fire it is the target, decoded the same way; greedy sd, the lossless control, "
    "and easd only where a verify batch moves one of the target's near-ties, which bench parted names; "
    "sampled, a gate that opens but does not fire still draws other random numbers than the target, so its "
    "text may part without a fire)."
)


def _mech_cells(m: MethodSummary) -> list[str] | None:
    g = m.mechanism
    if g is None:
        return None
    return [
        m.method, str(g.n), f"{g.fired} ({_pct(g.fired_share)})", str(g.texts_changed), str(g.answers_changed),
        str(g.changed_without_fire) + ("" if g.greedy else " (sampled)"),
    ]


def _title(g: GroupSummary) -> str:
    extra = f", {g.duplicates} superseded row{'s' if g.duplicates != 1 else ''}" if g.duplicates else ""
    files = f" ({g.files})" if g.files else ""
    same = " · paired: same environment only" if g.same_env else ""
    settings = f" · {g.settings}" if g.settings else ""
    return f"{g.dataset} · pair {g.pair}{files} · {g.questions} questions{settings}{extra}{same}"


def render_rich(summaries: list[GroupSummary]) -> list:
    """One ``rich.table.Table`` per (dataset, pair); the caller prints them."""
    from rich.table import Table
    from rich.text import Text

    tables = []
    mech_tables = []
    for i, g in enumerate(summaries):
        last = i == len(summaries) - 1  # the notes go under the last table only
        table = Table(title=Text(_title(g)), caption=Text(NOTES) if last else None,
                      caption_justify="left")
        for i, col in enumerate(_COLUMNS):
            table.add_column(col, justify="left" if i == 0 else "right", no_wrap=i == 0)
        for m in g.methods:
            table.add_row(*(Text(c) for c in _cells(m, g.same_env)))  # Text: "easd[...]" is not markup
        tables.append(table)
        mech = [c for c in (_mech_cells(m) for m in g.methods) if c is not None]
        if mech:
            mt = Table(title=Text(f"{g.dataset} · pair {g.pair} · gate mechanism"), caption_justify="left")
            for j, col in enumerate(_MECH_COLUMNS):
                mt.add_column(col, justify="left" if j == 0 else "right", no_wrap=j == 0)
            for cells in mech:
                mt.add_row(*(Text(c) for c in cells))
            tables.append(mt)
            mech_tables.append(mt)
    if mech_tables:  # under the last gate table, which need not be the last group's
        mech_tables[-1].caption = Text(MECH_NOTE)
    return tables


def render_markdown(summaries: list[GroupSummary], env_note: Sequence[str] = (),
                    after: Sequence[str] = ()) -> str:
    """The summaries as Markdown: the environment note (:func:`env_lines`) as a quote, a
    heading and a table per (dataset, pair), then notes, then ``after`` (e.g.
    :func:`load_lines`), one paragraph each."""
    parts: list[str] = [f"> {line}  " for line in env_note]
    if parts:
        parts.append("")
    for g in summaries:
        parts.append(f"### {_title(g)}\n")
        parts.append("| " + " | ".join(_COLUMNS) + " |")
        parts.append("|" + "|".join(["---"] + ["---:"] * (len(_COLUMNS) - 1)) + "|")
        for m in g.methods:
            parts.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(m, g.same_env)) + " |")
        parts.append("")
        mech = [c for c in (_mech_cells(m) for m in g.methods) if c is not None]
        if mech:
            parts.append(f"Gate mechanism ({g.dataset} · pair {g.pair}):\n")
            parts.append("| " + " | ".join(_MECH_COLUMNS) + " |")
            parts.append("|" + "|".join(["---"] + ["---:"] * (len(_MECH_COLUMNS) - 1)) + "|")
            for cells in mech:
                parts.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
            parts.append("")
    if summaries:
        parts.append(f"_{NOTES}_")
        parts.append("")
        if any(m.mechanism for g in summaries for m in g.methods):
            parts.append(f"_{MECH_NOTE}_")
            parts.append("")
    for line in after:
        parts.append(f"Note: {line}")
        parts.append("")
    return "\n".join(parts)


def plot(summaries: list[GroupSummary], path: str | Path) -> Path:
    """Accuracy (with Wilson 95% bars) against tokens/s, one panel per dataset, one point
    per (method, pair); under it, where any method gates, accuracy against EASD fires per
    100 tokens (a method that cannot fire sits at 0). Needs matplotlib (the ``plot``
    extra). Returns the written path."""
    figures.require("--plot")
    if not summaries:
        raise ConfigError("nothing to plot: the results hold no rows")
    out = Path(path).expanduser()
    datasets = list(dict.fromkeys(g.dataset for g in summaries))
    pairs = list(dict.fromkeys(g.pair for g in summaries))
    methods = list(dict.fromkeys(m.method for g in summaries for m in g.methods))
    gated = any(m.easd_fires_per_100 is not None for g in summaries for m in g.methods)
    panels = [("tokens/s (total tokens / total seconds)", lambda m: m.tokens_per_s)]
    if gated:
        panels.append(("EASD gate fires per 100 generated tokens",
                       lambda m: m.easd_fires_per_100 if m.easd_fires_per_100 is not None else 0.0))
    markers = "osD^vP*Xh<>"
    fig = figures.new_figure("--plot", figsize=(6.0 * len(datasets), 4.5 * len(panels)), constrained_layout=True)
    grid = fig.subplots(len(panels), len(datasets), squeeze=False)
    colours = [f"C{i % 10}" for i in range(len(methods))]
    for row, (xlabel, xof) in enumerate(panels):
        for ax, dataset in zip(grid[row], datasets):
            for g in (g for g in summaries if g.dataset == dataset):
                marker = markers[pairs.index(g.pair) % len(markers)]
                for m in g.methods:
                    x = xof(m)
                    if x is None:
                        continue
                    colour = colours[methods.index(m.method)]
                    label = m.method if len(pairs) == 1 else f"{m.method} · {g.pair}"
                    ax.errorbar(
                        x, 100 * m.accuracy,
                        yerr=[[100 * (m.accuracy - m.ci_low)], [100 * (m.ci_high - m.accuracy)]],
                        fmt=marker, color=colour, capsize=3, label=label,
                    )
            here = [g for g in summaries if g.dataset == dataset]
            ax.set_title(f"{dataset} · pair {', '.join(dict.fromkeys(g.pair for g in here))}\n"
                         f"{' | '.join(dict.fromkeys(g.settings for g in here if g.settings))}", fontsize="medium")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("accuracy % (Wilson 95%)")
            notes = [n for n in (speed_note(g) for g in here) if n] if row == 0 else []
            if notes:  # the speed panel of rows that no speed comparison can be read from
                ax.text(0.01, 0.01, "\n".join(dict.fromkeys(notes)), transform=ax.transAxes, fontsize="x-small",
                        va="bottom", ha="left", wrap=True, color="0.3")
            # from zero, so that two near-equal speeds do not sit at opposite edges; a little
            # room on both sides so that points at 0 (methods that never fire) stay visible
            hi = max(ax.get_xlim()[1], 1e-9)
            ax.set_xlim(-0.03 * hi, 1.08 * hi)
            ax.set_ylim(0, 100)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small")
    return figures.save(fig, out)
