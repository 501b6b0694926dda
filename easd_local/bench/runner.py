"""Run a benchmark: problems × methods × pairs, one result row per finished (problem, method).

Nothing here prints. The command line (``easd_local.cli.bench``) builds a :class:`Plan`
with :func:`build_methods` / :func:`prepare`, opens the results file with
:class:`ResultsFile` and drives :func:`run_plan`, a generator of progress events.

Order of work: pairs outermost (each pair's models are loaded once), then problems, then
methods, so that one problem's methods run back to back and any drift in machine load
hits every method of a problem alike (the paired comparisons in the report rely on that).

Parallel (``--parallel N``, the models' ``LoadOptions.n_seq``): N problems of one method
decode together in the batched engine (``easd_local.engine.scheduler``). Problems are taken in
windows of ``WINDOW × N``; each method runs over a window with N sequences in flight, a
slot refilled as soon as its sequence finishes, so the methods of a problem still run
close together in time. At N = 1 the window is one problem: the order above. A row is
written when its own sequence finishes. Each sequence's random generator is seeded from
``--seed`` and the problem (:func:`problem_seed`), never from its slot, so a row does not
depend on N beyond llama.cpp's batched numerics (greedy: near-ties).

Durability: every row is appended as one JSON line, flushed and fsynced before the next
generation starts. A run killed at any moment loses at most the row being written; a
torn last line is cut away when the run is resumed, and rows already present (keyed by
dataset, qid, method, pair) are skipped, so a resumed run neither loses nor duplicates.

A problem whose prompt does not fit in the context is skipped for every method of the pair
(they share the prompt and the context), with a :class:`Skipped` event and no row: the
accuracy tables stay over problems every method answered, and a resumed run with a larger
``--ctx`` computes it.

The file is strict JSON (``allow_nan=False``): see the schema for how infinities are stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..engine import decoding
from ..store import provenance
from ..engine.config import DecodeConfig, field_name, parse_value
from ..engine.modes import MODES, models_needed, parse_way_label
from ..errors import ConfigError, NonFiniteLogitsError, RuntimeFailure
from ..engine.near_ties import gate_margin
from ..engine.pair import open_models
from ..store.provenance import Environment
from ..store.resolve import PairFiles, resolve_config, resolve_pair
from ..llamacpp.gguf_file import check_gguf_file
from ..llamacpp.runtime import LoadOptions
from ..engine.scheduler import Failed, Request, Scheduler
from .datasets import Problem
from .grading import is_correct
from .prompt import build_messages
from .results import Key, ResultsFile
from .schema import make_row, row_env, stored_config

DEFAULT_MODES = ("target", "sd", "easd")
DEFAULT_MAX_TOKENS = 1024
WINDOW = 4  # problems per window, in units of --parallel


def default_parallel(gpu: bool) -> int:
    """--parallel when not given. CPU: 4 -- a step's weights are read once for the whole
    batch, so on a memory-bound CPU four one-token sequences cost about two one-token
    steps (target decode of 4 tokens 147 ms vs 72 ms for 1 on the 2-core development
    machine, scripts/bench_runtime.py), while the KV cache (4 × --ctx) stays small.
    GPU: 8 -- the GPU has compute to spare at small batches; not measured here (no GPU)."""
    return 8 if gpu else 4


def problem_seed(seed: int, dataset: str, qid: str) -> int:
    """A sequence's generator seed: from --seed and the problem, never the batch slot."""
    digest = hashlib.sha256(f"{seed}\0{dataset}\0{qid}".encode()).digest()
    return int.from_bytes(digest[:8], "little")

# ------------------------------------------------------------------------- methods


@dataclass(frozen=True)
class Method:
    """A named decoding configuration: ``changes`` (DecodeConfig field -> value, always
    including ``mode``) override the command-line flags, which override the pair profile."""

    name: str
    changes: dict[str, Any]
    origin: str  # the option it came from, for error messages ("--modes sd", "--sweep ...")

    @property
    def mode(self) -> str:
        return self.changes["mode"]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _settings(items: Sequence[tuple[str, str]], origin: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, text in items:
        name = field_name(key)
        if name in out:
            raise ConfigError(f"{origin}: {name.replace('_', '-')} is given twice")
        out[name] = parse_value(name, text)
    return out


def parse_modes(text: str) -> list[Method]:
    """``"target,sd,easd"`` -> one method per mode, named by the mode; ``sd:ngram-simple`` is
    a mode with its drafters (``--spec-type``; ``sd:ngram-simple+draft``: two), named so, as
    ``modes.way_label`` names a way."""
    out = []
    for name in (m.strip().lower() for m in text.split(",")):
        if not name:
            continue
        mode, spec = parse_way_label(name)
        if mode not in MODES:
            raise ConfigError(f"--modes: unknown mode {mode!r}; modes: {', '.join(MODES)}")
        changes: dict[str, Any] = {"mode": mode}
        if spec:
            changes["spec_type"] = spec
        out.append(Method(name, changes, f"--modes {name}"))
    if not out:
        raise ConfigError("--modes is empty; give a comma-separated list of: " + ", ".join(MODES))
    return out


def parse_easd_config(text: str) -> Method:
    """``"NAME:key=val,key=val"`` -> a method NAME (mode from ``mode=``, else easd)."""
    origin = f"--easd-config {text}"
    name, sep, body = text.partition(":")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"{origin}: expected NAME:key=value,... (e.g. hot:tau-target=1.5,penalty=0.5)")
    items = []
    for part in (p.strip() for p in body.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{origin}: {part!r} is not key=value")
        items.append((key, value))
    changes = _settings(items, origin)
    changes.setdefault("mode", "easd")
    return Method(name, changes, origin)


def parse_sweeps(sweeps: Sequence[str]) -> list[Method]:
    """``["tau-target=1.5,2", "penalty=0,0.5"]`` -> the cartesian product, one method per
    combination, named like ``easd[tau_target=1.5,penalty=0]`` (mode from ``mode=`` if swept)."""
    if not sweeps:
        return []
    axes: list[tuple[str, list[Any]]] = []
    for text in sweeps:
        origin = f"--sweep {text}"
        key, eq, values = text.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{origin}: expected key=v1,v2,... (e.g. tau-target=1.5,2,2.5)")
        name = field_name(key)
        if any(name == a for a, _ in axes):
            raise ConfigError(f"{origin}: {name.replace('_', '-')} is swept twice")
        vals = [parse_value(name, v) for v in values.split(",") if v.strip()]
        if not vals:
            raise ConfigError(f"{origin}: no values")
        if len(set(map(_fmt, vals))) != len(vals):
            raise ConfigError(f"{origin}: a value repeats")
        axes.append((name, vals))
    out = []
    for combo in itertools.product(*(vals for _, vals in axes)):
        changes = dict(zip((a for a, _ in axes), combo))
        mode = changes.setdefault("mode", "easd")
        label = ",".join(f"{k}={_fmt(v)}" for k, v in changes.items() if k != "mode")
        name = f"{mode}[{label}]" if label else mode
        origin = "--sweep " + " ".join(f"{k.replace('_', '-')}={_fmt(changes[k])}" for k, _ in axes)
        out.append(Method(name, changes, origin))
    return out


def build_methods(modes: str | None, easd_configs: Sequence[str] = (), sweeps: Sequence[str] = ()) -> list[Method]:
    """The methods of a run: ``--modes`` (default target,sd,easd when no --easd-config or
    --sweep is given), then each ``--easd-config``, then the ``--sweep`` combinations."""
    methods: list[Method] = []
    if modes is not None:
        methods += parse_modes(modes)
    elif not easd_configs and not sweeps:
        methods += parse_modes(",".join(DEFAULT_MODES))
    methods += [parse_easd_config(t) for t in easd_configs]
    methods += parse_sweeps(sweeps)
    seen: dict[str, Method] = {}
    for m in methods:
        if m.name in seen:
            raise ConfigError(f"two methods are named {m.name!r} ({seen[m.name].origin} and {m.origin}); "
                              "give each --easd-config a different NAME")
        seen[m.name] = m
    return methods


def check_methods(methods: Sequence[Method], base: DecodeConfig, flags: dict[str, Any]) -> None:
    """Validate every method's configuration (flags, then the method's own settings);
    ConfigError names the option at fault. Run before any model loads."""
    given = {k: v for k, v in flags.items() if v is not None}
    with_flags = base.replace(**given)
    for m in methods:
        try:
            with_flags.replace(**m.changes)
        except ConfigError as e:
            raise ConfigError(f"{m.origin}: {e}") from None


# ------------------------------------------------------------------------ the plan


def pair_specs(
    pairs: Sequence[str],
    drafts: Sequence[str | Path],
    targets: Sequence[str | Path],
    methods: Sequence[Method],
    *,
    confirm: Callable[[list], bool] = lambda missing: True,
    progress=None,
) -> list[PairFiles]:
    """Catalog pairs (``--pair``, in order) then file pairs (the i-th ``--draft`` with the
    i-th ``--target``); the default catalog pair when none is given. A side may be left
    out only when no method needs it (``--modes target`` needs no draft)."""
    need_draft, need_target = models_needed((m.mode, m.changes.get("spec_type", "draft")) for m in methods)
    mode = "easd" if (need_draft and need_target) else ("target" if need_target else "draft")
    drafts, targets = list(drafts), list(targets)
    if drafts and targets and len(drafts) != len(targets):
        raise ConfigError(
            f"--draft is given {len(drafts)} times but --target {len(targets)} times: "
            "give them in groups (the i-th --draft goes with the i-th --target)"
        )
    if drafts and not targets:
        if need_target:
            raise ConfigError("--target is missing: give a --target for each --draft (or --pair NAME)")
        groups = [(d, None) for d in drafts]
    elif targets and not drafts:
        if need_draft:
            raise ConfigError("--draft is missing: give a --draft for each --target (or --pair NAME)")
        groups = [(None, t) for t in targets]
    else:
        groups = list(zip(drafts, targets))
    specs: list[PairFiles] = []
    for name in pairs:
        specs.append(resolve_pair(name, None, None, mode=mode, confirm=confirm, progress=progress))
    for d, t in groups:
        specs.append(resolve_pair(None, d, t, mode=mode, confirm=confirm, progress=progress))
    if not specs:
        specs.append(resolve_pair(None, None, None, mode=mode, confirm=confirm, progress=progress))
    labels: dict[str, PairFiles] = {}
    for s in specs:
        for f in (s.draft, s.target):  # one line before --out is opened (provenance hashes them first)
            if f is not None:
                check_gguf_file(f)
        if s.label in labels:
            raise ConfigError(f"two pairs have the same label {s.label!r}; results are keyed by it, "
                              "so give each pair once (file pairs are labelled by their file names)")
        labels[s.label] = s
    return specs


@dataclass(frozen=True)
class MethodRun:
    method: Method
    cfg: DecodeConfig
    source: str  # thresholds source (default / profile / flags)

    @property
    def config(self) -> dict[str, Any]:
        return dataclasses.asdict(self.cfg)


@dataclass(frozen=True)
class PairMethods:
    """One pair's files and the methods to run on it."""

    spec: PairFiles
    runs: list[MethodRun]

    @property
    def label(self) -> str:
        return self.spec.label


@dataclass(frozen=True)
class Plan:
    problems: list[Problem]
    pairs: list[PairMethods]
    target_opts: LoadOptions = LoadOptions()
    draft_opts: LoadOptions | None = None
    env: Environment | None = None  # recorded in every row (prepare() fills it in)

    @property
    def parallel(self) -> int:
        """Sequences decoded together (``--parallel``): the contexts' sequence count."""
        return max(1, self.target_opts.n_seq)

    @property
    def methods(self) -> list[str]:
        return [r.method.name for r in self.pairs[0].runs] if self.pairs else []

    def keys(self) -> Iterator[tuple[Key, PairMethods, Problem, MethodRun]]:
        for pr in self.pairs:
            for prob in self.problems:
                for run in pr.runs:
                    yield (prob.dataset, prob.qid, run.method.name, pr.label), pr, prob, run


def prepare(
    problems: Sequence[Problem],
    specs: Sequence[PairFiles],
    methods: Sequence[Method],
    base: DecodeConfig,
    flags: dict[str, Any],
    target_opts: LoadOptions = LoadOptions(),
    draft_opts: LoadOptions | None = None,
    env: Environment | None = None,
) -> Plan:
    """Resolve each method's configuration per pair: method settings > flags > the pair's
    profile > ``base`` (no model is loaded). ``env``: the run's environment (default:
    computed from the load options)."""
    given = {k: v for k, v in flags.items() if v is not None}
    pairs = []
    for spec in specs:
        runs = []
        for m in methods:
            try:
                cfg, source = resolve_config(base, spec, {**given, **m.changes})
            except ConfigError as e:
                raise ConfigError(f"{m.origin} (pair {spec.label}): {e}") from None
            runs.append(MethodRun(m, cfg, source))
        pairs.append(PairMethods(spec, runs))
    env = env or provenance.environment(target_opts, draft_opts)
    return Plan(list(problems), pairs, target_opts, draft_opts, env)


# ------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Started:
    """Before any model loads: what the run will do."""

    total: int  # problem × method × pair rows in the plan
    todo: int  # rows still to compute
    resumed: list[dict]  # rows of the plan already in the file (for running accuracy)
    changed: list[str] = field(default_factory=list)  # resumed rows made with other settings


@dataclass(frozen=True)
class PairLoading:
    pair: str
    index: int
    todo: int


@dataclass(frozen=True)
class PairLoaded:
    pair: str
    seconds: float
    kv_bytes: int = 0  # both models' KV caches (they grow with --parallel × --ctx)
    parallel: int = 1
    n_ctx: int = 0  # per sequence


@dataclass(frozen=True)
class Working:
    pair: str
    problem: Problem
    method: str


@dataclass(frozen=True)
class RowDone:
    row: dict


@dataclass(frozen=True)
class Skipped:
    """Rows of a problem that could not be computed (every method of ``pair`` when its
    prompt does not fit; one method when a model gave non-finite logits); they are not
    written, so a resumed run tries them again."""

    pair: str
    problem: Problem
    reason: str  # the same text for every problem skipped for one cause: summaries group by it
    detail: str  # this problem's own figures ("its prompt is 812 tokens")
    rows: int  # rows of the plan left uncomputed
    hint: str = ""  # what to do about it, the same for every skip of one reason


NON_FINITE_REASON = "a model produced NaN or infinite logits"
NON_FINITE_HINT = "re-download or re-convert the model file named above, then rerun with --resume"


Event = Started | PairLoading | PairLoaded | Working | RowDone | Skipped


def context_reason(n_ctx: int) -> str:
    return f"prompt longer than the context ({n_ctx} tokens)"


CONTEXT_HINT = "rerun with --resume and a larger --ctx to compute them"


def skip_summary(skips: Sequence[Skipped]) -> list[str]:
    """One line per reason, e.g. "2 problems skipped: prompt longer than the context (4096
    tokens)"; a problem skipped on several pairs counts once."""
    by_reason: dict[str, set[tuple[str, str]]] = {}
    for s in skips:
        by_reason.setdefault(s.reason, set()).add((s.problem.dataset, s.problem.qid))
    hints = {s.reason: s.hint for s in skips}
    return [f"{len(p)} problem{'s' if len(p) != 1 else ''} skipped: {reason}"
            + (f" ({hints[reason]})" if hints[reason] else "") for reason, p in by_reason.items()]


def _describe_change(old: dict, new: dict) -> str:
    diffs = [f"{k} {_fmt(old.get(k))} -> {_fmt(new.get(k))}" for k in new if old.get(k) != new.get(k)]
    diffs += [f"{k} (no longer set)" for k in old if k not in new]
    return ", ".join(diffs[:3]) + (", ..." if len(diffs) > 3 else "")


def env_mismatch(rows: Sequence[dict], env: Environment, where: str = "the file") -> str | None:
    """One line saying how ``env`` differs from the environments of ``rows`` (the fields
    that differ from the last such row's, and how many rows record none); None when every
    row was made in ``env`` (or there are none)."""
    now = env.to_dict()
    unknown = sum(1 for r in rows if row_env(r) is None)
    differing = [(r, d) for r in rows if row_env(r) is not None
                 for d in [provenance.env_difference(row_env(r), now)] if d]
    if not unknown and not differing:
        return None
    parts = []
    if differing:
        diffs = differing[-1][1]
        parts.append(f"{len(differing)} of {where}'s {len(rows)} rows come from another environment "
                     f"({', '.join(diffs[:4])}{', ...' if len(diffs) > 4 else ''})")
    if unknown:
        parts.append(f"{unknown} of {where}'s {len(rows)} rows record no environment (written before provenance)")
    return "this run's environment is not that of its results file: " + "; ".join(parts)


def start_info(plan: Plan, out: ResultsFile) -> Started:
    total = 0
    resumed: list[dict] = []
    changed: list[str] = []
    for key, _pr, _prob, run in plan.keys():
        total += 1
        old = out.rows.get(key)
        if old is None:
            continue
        resumed.append(old)
        # both as the file stores them now: an old file's bare Infinity equals "inf"
        was = stored_config(old.get("config", {}))
        now = json.loads(json.dumps(stored_config(run.config)))
        if was != now:
            changed.append(f"{key[2]} on {key[1]} (pair {key[3]}): {_describe_change(was, now)}")
    return Started(total=total, todo=total - len(resumed), resumed=resumed, changed=changed)


def run_plan(plan: Plan, out: ResultsFile) -> Iterator[Event]:
    """Compute every row of ``plan`` not yet in ``out``, appending each as it finishes.

    Yields :class:`Started` first, then for each pair with work left :class:`PairLoading`
    and :class:`PairLoaded`, then :class:`Working` / :class:`RowDone` per row, or one
    :class:`Skipped` for a problem whose prompt does not fit in the context."""
    import time

    info = start_info(plan, out)
    yield info
    for index, pr in enumerate(plan.pairs):
        todo = [
            (prob, [run for run in pr.runs if (prob.dataset, prob.qid, run.method.name, pr.label) not in out.rows])
            for prob in plan.problems
        ]
        todo = [(prob, runs) for prob, runs in todo if runs]
        if not todo:
            continue
        yield PairLoading(pr.label, index, sum(len(runs) for _, runs in todo))
        need_draft, need_target = models_needed({(run.cfg.mode, run.cfg.spec_type) for run in pr.runs})
        t0 = time.perf_counter()
        # hashed before loading: a model file changed under a loaded model would be misnamed
        # (each file is hashed once; later runs read the hash cache)
        prov = provenance.collect(pr.spec.draft, pr.spec.target, plan.target_opts, plan.draft_opts,
                                  env=plan.env).to_dict()
        models = open_models(
            pr.spec.draft if need_draft else None,
            pr.spec.target if need_target else None,
            plan.target_opts,
            plan.draft_opts,
        )
        with models:
            for run in pr.runs:  # top-n against the vocabulary: needs the loaded models
                try:
                    run.cfg.validate(models.n_vocab)
                except ConfigError as e:
                    raise ConfigError(f"{run.method.origin} (pair {pr.label}): {e}") from None
            present = [m for m in (models.target, models.draft) if m is not None]
            n_ctx = min(m.n_ctx for m in present)
            yield PairLoaded(pr.label, time.perf_counter() - t0, sum(m.kv_bytes for m in present),
                             plan.parallel, n_ctx)
            # the prompt goes through the target's chat template (the draft's when no target)
            main = models.target if models.target is not None else models.draft
            broken = main.vocab.chat_template_error()
            if broken is not None:
                raise ConfigError(f"pair {pr.label}: {broken}; bench renders every question with it")
            ready: list[tuple[Problem, list[int], list[MethodRun]]] = []
            for prob, runs in todo:
                prompt = main.vocab.chat_tokens(build_messages(prob.question))
                # decoding.generate's own test, made once per problem against the smallest
                # context loaded, so that every method skips it
                if not decoding.fits_context(len(prompt), n_ctx):
                    detail = f"its prompt is {len(prompt)} tokens"
                    yield Skipped(pr.label, prob, context_reason(n_ctx), detail, len(runs), CONTEXT_HINT)
                    continue
                ready.append((prob, prompt, runs))
            sched = Scheduler(models, plan.parallel)
            size = 1 if plan.parallel == 1 else WINDOW * plan.parallel
            for w0 in range(0, len(ready), size):
                window = ready[w0 : w0 + size]
                for run in pr.runs:
                    items = [(prob, prompt) for prob, prompt, runs in window if run in runs]
                    yield from _run_method(sched, pr, run, items, prov, out)


def _run_method(sched: Scheduler, pr: PairMethods, run: MethodRun, items, prov: dict, out: ResultsFile) -> Iterator[Event]:
    """Decode ``items`` (problem, prompt) with one method, ``sched.n_parallel`` at a time;
    append each row as its sequence finishes."""
    pending = list(reversed(items))
    inflight: dict[int, tuple[Problem, int]] = {}
    events: dict[int, list[decoding.TokenEvent]] = {}
    while pending or inflight:
        while pending and sched.free_slots():
            prob, prompt = pending.pop()
            yield Working(pr.label, prob, run.method.name)
            # Fresh caches for every generation (reuse_cache=False). Decoding would otherwise
            # reuse the prompt the previous method left in the slot, so every method after
            # the first of a problem would skip its prompt evaluation and look faster
            # (seconds_total and ttft include the prompt).
            seed = problem_seed(run.cfg.seed, prob.dataset, prob.qid)
            rid = sched.submit(Request(prompt, run.cfg, thresholds_source=run.source, reuse_cache=False, rng_seed=seed))
            inflight[rid] = (prob, seed)
        for rid, ev in sched.step():
            if isinstance(ev, Failed):
                if isinstance(ev.error, NonFiniteLogitsError):
                    # a model's weights are broken: no row, and the run goes on
                    prob, _seed = inflight.pop(rid)
                    events.pop(rid, None)
                    yield Skipped(pr.label, prob, NON_FINITE_REASON, f"{run.method.name}: {ev.error}", 1,
                                  NON_FINITE_HINT)
                    continue
                raise ev.error if ev.error is not None else RuntimeFailure(ev.message)
            if not isinstance(ev, decoding.Finished):
                events.setdefault(rid, []).append(ev)
                continue
            prob, seed = inflight.pop(rid)
            margin = gate_margin(events.pop(rid, []), run.cfg.tau_draft, run.cfg.tau_target, run.cfg.overlap)
            correct, extracted = is_correct(ev.text, prob.gold, prob.grader)
            row = make_row(
                dataset=prob.dataset, qid=prob.qid, index=prob.index, method=run.method.name,
                pair=pr.label, config=run.config, question=prob.question, gold=prob.gold,
                completion=ev.text, extracted=extracted, correct=correct,
                # to_dict: strict JSON, a gate that is off (tau inf) stored as "inf"
                stats={**ev.stats.to_dict(), **margin.to_stats()}, provenance=prov, completion_tokens=ev.tokens,
                rng_seed=seed, load_avg=provenance.load_average(), grader=prob.grader,
            )
            out.append(row)
            yield RowDone(row)
