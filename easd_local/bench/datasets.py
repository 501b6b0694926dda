"""Reasoning benchmark problems: built-in presets (bundled JSONL) or any user JSONL file.

A preset names a bundled file under ``easd_local/data`` together with its question and
answer field names and the grader that fits it. Any other JSONL file works the same way
once the caller names its question and answer fields.

Every problem gets a stable ``qid`` (``<dataset>-<id>``) built from the row's own ``id`` or
``unique_id`` when it has one, else from its zero-padded row index; results files and
paired comparisons key on it, so it must not change between runs.
"""

from __future__ import annotations

import ast
import json
import random
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import ConfigError
from ..jsonsafe import jsonl_lines
from ..text import check_text

GRADERS = ("numeric", "math")


@dataclass(frozen=True)
class Problem:
    qid: str  # stable id, e.g. "gsm8k-test-00007"
    index: int  # 0-based row index in the file (blank lines not counted)
    question: str
    gold: str  # the raw gold answer as text (GSM8K: the part after "####")
    dataset: str  # preset name or the name derived from the file
    grader: str  # "numeric" | "math"


@dataclass(frozen=True)
class DatasetPreset:
    name: str
    resource: str  # path inside easd_local/data
    question_key: str
    answer_key: str
    grader: str
    qid_prefix: str
    description: str
    calibration_only: bool = False


PRESETS: dict[str, DatasetPreset] = {
    p.name: p
    for p in (
        DatasetPreset("gsm8k", "gsm8k/test.jsonl", "question", "answer", "numeric", "gsm8k-test",
                      "GSM8K test split (1319 grade-school word problems)"),
        DatasetPreset("gsm8k-train", "gsm8k/train.jsonl", "question", "answer", "numeric",
                      "gsm8k-train", "GSM8K train split: calibration only, never for reported scores",
                      calibration_only=True),
        DatasetPreset("math500", "math500/test.jsonl", "problem", "answer", "math", "math500",
                      "MATH-500 (500 competition problems, LaTeX answers)"),
        DatasetPreset("aime24", "aime24/test.jsonl", "problem", "answer", "numeric", "aime24",
                      "AIME 2024 (30 problems, integer answers)"),
        DatasetPreset("amc23", "amc23/test.jsonl", "problem", "answer", "numeric", "amc23",
                      "AMC 2023 (40 problems, numeric answers)"),
        DatasetPreset("olympiadbench", "olympiadbench/test.jsonl", "question", "final_answer", "math",
                      "olympiadbench", "OlympiadBench English text-only maths (675 problems)"),
    )
}

_ID_KEYS = ("id", "unique_id")
_SPLIT_STEMS = {"test", "train", "dev", "val", "valid", "validation", "eval"}


def preset_names() -> list[str]:
    return list(PRESETS)


def preset_text(name: str) -> str:
    """The bundled JSONL text of a preset (read through importlib.resources)."""
    preset = PRESETS[name]
    ref = resources.files("easd_local").joinpath("data", *preset.resource.split("/"))
    try:
        return ref.read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as exc:  # a broken install: data not packaged
        raise ConfigError(
            f"bundled dataset {name!r} is missing from the installation (easd_local/data/"
            f"{preset.resource}): {exc.__class__.__name__}"
        ) from None


def gold_to_text(value: Any, *, gsm8k_hash: bool = True) -> str:
    """Render a raw gold value as text.

    - lists (or strings holding a list of strings such as ``"['2']"``) are unwrapped;
      several items are joined with ``", "``;
    - GSM8K's worked answers keep only the part after the last ``####``;
    - numbers become their ``str`` (AMC's ``27.0`` stays ``"27.0"``; graders compare numerically).
    """
    if isinstance(value, (list, tuple)):
        return ", ".join(gold_to_text(v, gsm8k_hash=gsm8k_hash) for v in value)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value).strip()
    if gsm8k_hash and "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            parsed = None
        # only lists of strings: "[3,4]" or "[-2, 7]" is an interval, not a list
        if isinstance(parsed, (list, tuple)) and parsed and all(isinstance(v, str) for v in parsed):
            return gold_to_text(list(parsed), gsm8k_hash=gsm8k_hash)
    return text


def _id_suffix(raw: Any) -> str:
    text = str(raw).strip()
    if text.endswith(".json"):
        text = text[: -len(".json")]
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")
    return text or "x"


def _name_for_path(path: Path) -> str:
    stem = path.name
    for suffix in (".jsonl", ".json", ".ndjson"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    if stem.lower() in _SPLIT_STEMS and path.parent.name:
        stem = f"{path.parent.name}-{stem}"
    return stem


def _parse_rows(lines: Iterable[str], source: str) -> list[tuple[int, dict]]:
    """(1-based line number, row) for every non-blank line; ConfigError on non-JSON lines."""
    rows: list[tuple[int, dict]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source} line {lineno} is not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"{source} line {lineno} is a JSON {type(row).__name__}, expected an object"
            )
        rows.append((lineno, row))
    if not rows:
        raise ConfigError(f"{source} holds no problems (empty file)")
    return rows


def _field(row: dict, key: str, lineno: int, source: str, what: str) -> Any:
    if key not in row:
        present = ", ".join(sorted(map(str, row))) or "none"
        raise ConfigError(
            f"{source} line {lineno} has no {what} key {key!r} (keys present: {present})"
        )
    value = row[key]
    if value is None:
        raise ConfigError(f"{source} line {lineno}: {what} key {key!r} is null")
    return value


def _check_int(name: str, value: Any, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def load_dataset(
    name_or_path: str | Path,
    question_key: str | None = None,
    answer_key: str | None = None,
    grader: str | None = None,
    limit: int | None = None,
    offset: int = 0,
    sample: int | None = None,
    seed: int = 0,
    qids: Sequence[str] | None = None,
) -> list[Problem]:
    """Load problems from a preset name or a JSONL path.

    ``offset``/``limit`` slice the file's rows first; ``qids`` then keeps only the named
    problems of the slice (in file order; a name not in the slice is a ConfigError, so a typo
    never runs an empty or partial set); ``sample`` then draws that many problems with
    ``random.Random(seed)`` (all of them when fewer) and returns them sorted by index, so
    the same seed always gives the same set.
    Question/answer keys and grader given with a preset override the preset's.
    """
    _check_int("offset", offset, 0)
    _check_int("limit", limit, 0)
    _check_int("sample", sample, 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    if grader is not None and grader not in GRADERS:
        raise ConfigError(f"grader must be one of {', '.join(GRADERS)}, got {grader!r}")

    key = str(name_or_path)
    if key in PRESETS:
        preset = PRESETS[key]
        text = preset_text(key)
        source = f"{preset.name} ({preset.resource})"
        dataset = preset.name
        prefix = preset.qid_prefix
        q_key = question_key or preset.question_key
        a_key = answer_key or preset.answer_key
        grader = grader or preset.grader
    else:
        path = Path(key).expanduser()
        looks_like_path = path.suffix != "" or "/" in key or "\\" in key or path.exists()
        if not looks_like_path:
            raise ConfigError(
                f"unknown dataset {key!r}: use a preset ({', '.join(PRESETS)}) or a JSONL file path"
            )
        if not path.is_file():
            what = "is a directory, not a JSONL file" if path.is_dir() else "not found"
            raise ConfigError(f"dataset file {str(path)!r} {what}")
        if not question_key or not answer_key:
            missing = " and ".join(
                n for n, v in (("question_key", question_key), ("answer_key", answer_key)) if not v
            )
            raise ConfigError(
                f"dataset file {str(path)!r} needs {missing} (the JSON field names of the "
                f"question and the gold answer); presets: {', '.join(PRESETS)}"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"dataset file {str(path)!r} is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(f"cannot read dataset file {str(path)!r}: {exc.strerror or exc}") from None
        source = str(path)
        dataset = _name_for_path(path)
        prefix = dataset
        q_key, a_key = question_key, answer_key
        grader = grader or "numeric"

    rows = _parse_rows(jsonl_lines(text), source)
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for index, (lineno, row) in enumerate(rows):
        question = _field(row, q_key, lineno, source, "question")
        if not isinstance(question, str):
            raise ConfigError(
                f"{source} line {lineno}: question key {q_key!r} holds a {type(question).__name__}, "
                "expected text"
            )
        check_text(question, f"{source} line {lineno}: the question")
        gold = gold_to_text(_field(row, a_key, lineno, source, "answer"), gsm8k_hash=True)
        raw_id = next((row[k] for k in _ID_KEYS if row.get(k) not in (None, "")), None)
        suffix = _id_suffix(raw_id) if raw_id is not None else f"{index:05d}"
        qid = f"{prefix}-{suffix}"
        if qid in seen:
            raise ConfigError(
                f"{source} line {lineno}: id {raw_id!r} repeats line {seen[qid]}; ids must be unique"
            )
        seen[qid] = lineno
        problems.append(Problem(qid, index, question, gold, dataset, grader))

    stop = None if limit is None else offset + limit
    problems = problems[offset:stop]
    if qids is not None:
        problems = _select_qids(problems, qids, source)
    if sample is not None and sample < len(problems):
        problems = sorted(random.Random(seed).sample(problems, sample), key=lambda p: p.index)
    return problems


def _select_qids(problems: list[Problem], qids: Sequence[str], source: str) -> list[Problem]:
    wanted = {q.strip() for q in qids if q.strip()}
    if not wanted:
        raise ConfigError("--qid names no problem (give ids such as the qid field of a results row)")
    present = {p.qid for p in problems}
    unknown = sorted(wanted - present)
    if unknown:
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        example = f" (its ids look like {problems[0].qid})" if problems else ""
        raise ConfigError(f"--qid {shown}: not a problem of {source} in the --offset/--limit slice{example}")
    return [p for p in problems if p.qid in wanted]


# Where each preset keeps a worked reference solution (AMC 2023 has none): text written by
# people, in their style, not a model's (``pair score --dataset`` scores models along it)
SOLUTION_KEYS: dict[str, str] = {
    "gsm8k": "answer", "gsm8k-train": "answer", "math500": "solution", "aime24": "solution",
    "olympiadbench": "solution",
}


def reference_solutions(name: str, limit: int | None = None, offset: int = 0) -> list[tuple[Problem, str]]:
    """``[(problem, its reference solution)]`` of a preset, in file order (``offset``/``limit``
    slice as in :func:`load_dataset`). A solution given as a list (OlympiadBench) is its items
    joined by a blank line. ConfigError for a preset without solutions or a non-preset."""
    if name not in PRESETS:
        raise ConfigError(f"--dataset {name!r}: reference solutions come with the presets "
                          f"{', '.join(SOLUTION_KEYS)}; for your own text use --text FILE")
    key = SOLUTION_KEYS.get(name)
    if key is None:
        raise ConfigError(f"--dataset {name}: the preset has no reference solutions; "
                          f"presets that do: {', '.join(SOLUTION_KEYS)}")
    problems = load_dataset(name)
    rows = _parse_rows(jsonl_lines(preset_text(name)), PRESETS[name].resource)
    stop = None if limit is None else offset + limit
    out = []
    for prob, (lineno, row) in list(zip(problems, rows))[offset:stop]:
        sol = _field(row, key, lineno, name, "solution")
        text = "\n\n".join(str(s) for s in sol) if isinstance(sol, list) else str(sol)
        out.append((prob, check_text(text, f"{name} line {lineno}: the solution")))
    return out
