"""The results-file row: one JSON line per finished (problem, method).

The runner builds rows with :func:`make_row`; the report reads them back through
:func:`validate_row`. Example::

    {"dataset": "gsm8k", "qid": "gsm8k-test-00007", "index": 7, "method": "easd",
     "pair": "default", "config": {...}, "question": "...", "gold": "18",
     "completion": "...", "extracted": "18", "correct": true,
     "stats": {"tokens": 212, "drafted": 240, ..., "stop_reason": "eos"}}

``method`` is free text: a mode (``target``, ``draft``, ``sd``, ``easd``, ``easd-tf``) or a
named configuration such as ``easd[tau_target=1.5]``. Modes that do not draft write 0 in
every speculative field. Extra keys (top level or in ``stats``) are allowed and kept.

Rows written since provenance was added also carry ``provenance`` (``provenance.Provenance
.to_dict()``: ``env_id``, ``env``, and the ``draft`` / ``target`` files with their sha256)
and ``completion_tokens`` (the generated token ids); rows of the batched runner also carry
``rng_seed``, the seed of the sequence's own random generator (from ``--seed`` and the
problem: ``runner.problem_seed``; without it the generator was seeded with
``config["seed"]``); rows written since 2026-12-04 carry ``load_avg``, the machine's 1-minute
load average when the row finished (absent where the OS has none), since tokens/s compare only
between rows made under like loads. Older rows lack these: readers treat
their environment as unknown (:func:`row_env_id` gives None) and their models as unnamed.

Non-finite numbers: strict JSON has no Infinity or NaN (jq and most non-Python readers
reject them), so a float that is not finite is stored as the string ``"inf"`` or ``"-inf"``,
or as null for NaN, in ``stats`` (``decoding.Stats.to_dict`` writes it so) and in ``config``
(:func:`stored_config`). Only the EASD gate settings (``tau_draft``, ``tau_target``: inf =
gate off) are ever infinite. Readers take both that form and the bare floats of files
written before it (Python's json reads ``Infinity``): :func:`read_number`.
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

from ..engine.decoding import json_number
from ..errors import ConfigError

# stats fields -> kind. "count": int >= 0; "seconds"/"rate": finite float >= 0;
# "param": float, +-inf allowed (EASD gate settings; inf = gate off; stored as "inf");
# "text": str.
STAT_FIELDS: dict[str, str] = {
    "tokens": "count",
    "drafted": "count",
    "accepted": "count",
    "draft_accepted": "count",
    "sd_rejections": "count",
    "easd_fires": "count",
    "bonus": "count",
    "target_calls": "count",
    "draft_calls": "count",
    "catchup_calls": "count",
    "catchup_tokens": "count",
    "seconds_draft": "seconds",
    "seconds_target": "seconds",
    "seconds_controller": "seconds",
    "seconds_total": "seconds",
    "tokens_per_s": "rate",
    "ttft_s": "seconds",
    "acceptance_rate": "rate",
    "mean_accepted_len": "rate",
    "tau_draft": "param",
    "tau_target": "param",
    "top_n": "count",
    "overlap": "param",
    "penalty": "param",
    "thresholds_source": "text",
    "stop_reason": "text",
}

TOP_FIELDS: dict[str, tuple[type, ...]] = {
    "dataset": (str,),
    "qid": (str,),
    "index": (int,),
    "method": (str,),
    "pair": (str,),
    "config": (dict,),
    "question": (str,),
    "gold": (str,),
    "completion": (str,),
    "extracted": (str, type(None)),
    "correct": (bool,),
    "stats": (dict,),
}


# stats that rows written before they existed lack (name -> kind, as in STAT_FIELDS):
# the gate decisions (near_ties.gate_margin) and those within a near-tie of flipping
OPTIONAL_STAT_FIELDS: dict[str, str] = {
    "gate_decisions": "count",
    "gate_near": "count",
}

# keys that rows written before they existed lack (name -> allowed types)
OPTIONAL_TOP_FIELDS: dict[str, tuple[type, ...]] = {
    "provenance": (dict,),
    "completion_tokens": (list,),
    "load_avg": (float, int),
    "grader": (str,),  # the grader that marked the row (rows written since 2026-12-05, and regraded ones)
    "regraded": (dict,),  # bench regrade: the code version and what the row held before
}


class RowStats(TypedDict):
    tokens: int
    drafted: int
    accepted: int
    draft_accepted: int
    sd_rejections: int
    easd_fires: int
    bonus: int
    target_calls: int
    draft_calls: int
    catchup_calls: int
    catchup_tokens: int
    seconds_draft: float
    seconds_target: float
    seconds_controller: float
    seconds_total: float
    tokens_per_s: float
    ttft_s: float
    acceptance_rate: float
    mean_accepted_len: float
    tau_draft: float | str  # "inf" when the gate is off (see the module docstring)
    tau_target: float | str
    top_n: int
    overlap: float | str
    penalty: float | str
    thresholds_source: str
    stop_reason: str


class ResultRow(TypedDict):
    dataset: str
    qid: str
    index: int
    method: str
    pair: str
    config: dict[str, Any]
    question: str
    gold: str
    completion: str
    extracted: str | None
    correct: bool
    stats: RowStats
    # since provenance (absent in older rows):
    # provenance: {"env_id": str, "env": {...}, "draft": {...} | None, "target": {...} | None}
    # completion_tokens: list[int]


def stored_config(config: dict[str, Any]) -> dict[str, Any]:
    """A decoding configuration (flat: field -> value) as the results file stores it. Also
    the form to compare configurations in: an old file's float inf and "inf" become equal."""
    return {k: json_number(v) for k, v in config.items()}


def read_number(value: Any) -> float | None:
    """A stored number back as a float ("inf" / "-inf" -> +-inf, null -> NaN); None when
    ``value`` is not a number (a bool, another text, a list...)."""
    if value is None:
        return math.nan
    if value in ("inf", "-inf"):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def empty_stats() -> dict[str, Any]:
    """A stats dict with every field zero (texts empty): the base for non-drafting modes."""
    out: dict[str, Any] = {}
    for name, kind in STAT_FIELDS.items():
        out[name] = 0 if kind == "count" else "" if kind == "text" else 0.0
    return out


def make_row(
    *,
    dataset: str,
    qid: str,
    index: int,
    method: str,
    pair: str,
    config: dict[str, Any],
    question: str,
    gold: str,
    completion: str,
    extracted: str | None,
    correct: bool,
    stats: dict[str, Any],
    provenance: dict[str, Any] | None = None,
    completion_tokens: list[int] | None = None,
    rng_seed: int | None = None,
    load_avg: float | None = None,
    grader: str | None = None,
) -> dict[str, Any]:
    """Build and validate a row; stats fields not given default to 0 ("" for texts).

    ``stats`` as ``decoding.Stats.to_dict`` gives it (non-finite floats already stored as
    text); ``config`` is stored here with :func:`stored_config`."""
    full = empty_stats()
    full.update(stats)
    row = {
        "dataset": dataset,
        "qid": qid,
        "index": index,
        "method": method,
        "pair": pair,
        "config": stored_config(config),
        "question": question,
        "gold": gold,
        "completion": completion,
        "extracted": extracted,
        "correct": bool(correct),
        "stats": full,
    }
    if provenance is not None:
        row["provenance"] = provenance
    if completion_tokens is not None:
        row["completion_tokens"] = [int(t) for t in completion_tokens]
    if rng_seed is not None:
        row["rng_seed"] = int(rng_seed)
    if load_avg is not None:
        row["load_avg"] = float(load_avg)
    if grader is not None:
        row["grader"] = grader
    return validate_row(row)


def _bad(where: str, msg: str) -> ConfigError:
    return ConfigError(f"{where}{': ' if where else ''}{msg}")


def validate_row(row: Any, where: str = "") -> dict[str, Any]:
    """Return ``row`` unchanged if it follows the schema, else raise ConfigError (one line,
    prefixed with ``where``, e.g. ``"results.jsonl line 7"``)."""
    if not isinstance(row, dict):
        raise _bad(where, f"a result row must be a JSON object, got {type(row).__name__}")
    missing = [k for k in TOP_FIELDS if k not in row]
    if missing:
        raise _bad(where, f"result row lacks {', '.join(missing)}")
    for key, types in TOP_FIELDS.items():
        value = row[key]
        if isinstance(value, bool) and bool not in types:
            ok = False
        else:
            ok = isinstance(value, types)
        if not ok:
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise _bad(where, f"{key} must be {want}, got {type(value).__name__}")
    if not row["method"]:
        raise _bad(where, "method is empty")
    for key, types in OPTIONAL_TOP_FIELDS.items():
        if key in row and not isinstance(row[key], types):
            raise _bad(where, f"{key} must be {' or '.join(t.__name__ for t in types)}, got {type(row[key]).__name__}")
    load = row.get("load_avg")
    if load is not None and (isinstance(load, bool) or not math.isfinite(load) or load < 0):
        raise _bad(where, f"load_avg must be a number >= 0, got {load!r}")
    if "provenance" in row:
        _check_provenance(row["provenance"], where)
    toks = row.get("completion_tokens")
    if toks is not None and not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in toks):
        raise _bad(where, "completion_tokens must be a list of token ids (whole numbers >= 0)")
    stats = row["stats"]
    missing = [k for k in STAT_FIELDS if k not in stats]
    if missing:
        raise _bad(where, f"stats lacks {', '.join(missing)}")
    for name, kind in [*STAT_FIELDS.items(), *((k, v) for k, v in OPTIONAL_STAT_FIELDS.items() if k in stats)]:
        value = stats[name]
        if kind == "text":
            if not isinstance(value, str):
                raise _bad(where, f"stats.{name} must be text, got {type(value).__name__}")
            continue
        number = read_number(value)
        if number is None:
            raise _bad(where, f"stats.{name} must be a number, got {type(value).__name__}")
        if kind == "count":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _bad(where, f"stats.{name} must be a whole number >= 0, got {value!r}")
            continue
        if kind == "param":  # gate settings may be +-inf (gate off), never NaN
            if math.isnan(number):
                raise _bad(where, f"stats.{name} must be a number, got NaN")
            continue
        if not math.isfinite(number):
            raise _bad(where, f"stats.{name} must be finite, got {value!r}")
        if kind in ("seconds", "rate") and value < 0:
            raise _bad(where, f"stats.{name} must be >= 0, got {value!r}")
    return row


def _check_provenance(prov: dict, where: str) -> None:
    if not isinstance(prov.get("env_id"), str) or not isinstance(prov.get("env"), dict):
        raise _bad(where, "provenance needs env_id (text) and env (an object)")
    for role in ("draft", "target"):
        m = prov.get(role)
        if m is None:
            continue
        if not isinstance(m, dict) or not isinstance(m.get("sha256"), str):
            raise _bad(where, f"provenance.{role} must be null or an object with a sha256")


# ------------------------------------------------------------------ reading provenance


def row_env_id(row: dict) -> str | None:
    """The row's environment id; None for rows written before provenance."""
    prov = row.get("provenance")
    return prov.get("env_id") if isinstance(prov, dict) else None


def row_env(row: dict) -> dict[str, Any] | None:
    """The row's environment fields; None for rows written before provenance."""
    prov = row.get("provenance")
    return prov.get("env") if isinstance(prov, dict) else None


def row_model_sha(row: dict, role: str) -> str | None:
    """sha256 of the row's ``role`` ("draft" / "target") file; None when not recorded."""
    prov = row.get("provenance")
    m = prov.get(role) if isinstance(prov, dict) else None
    return m.get("sha256") if isinstance(m, dict) else None
