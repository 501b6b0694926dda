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

from ..decoding import json_number
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
    stats = row["stats"]
    missing = [k for k in STAT_FIELDS if k not in stats]
    if missing:
        raise _bad(where, f"stats lacks {', '.join(missing)}")
    for name, kind in STAT_FIELDS.items():
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
