"""Grade a results file's rows again with this version's grader.

A row's ``correct`` is the grader's verdict when the row was written. When the grader is
mended (an equivalence it missed), the rows already written keep the old verdict and a table
would mix two graders; :func:`regrade` re-extracts and re-grades every row from its stored
completion and gold, so that one file is graded one way. Only the rows whose answer or verdict
changes are rewritten: each gets ``grader`` and ``regraded`` (the code version that regraded
it and what the row held before), so that it still says what produced it; every other line
stays byte for byte. The file is replaced atomically, under the lock a bench run holds while it
appends, so a running bench and a regrade never meet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..fsutil import describe_write_error, try_lock, write_text_atomic
from ..store.provenance import git_state
from .datasets import PRESETS
from .grading import GRADERS, is_correct
from .schema import validate_row


@dataclass(frozen=True)
class Change:
    line: int
    qid: str
    method: str
    pair: str
    extracted_was: str | None
    extracted: str | None
    correct_was: bool
    correct: bool


@dataclass(frozen=True)
class Regraded:
    rows: int
    changes: list[Change]
    written: bool


def row_grader(row: dict, grader: str | None = None) -> str:
    """The grader of a row: the one it records, else ``grader``, else its dataset preset's."""
    name = row.get("grader") or grader or (PRESETS[row["dataset"]].grader if row["dataset"] in PRESETS else None)
    if name is None:
        raise ConfigError(f"rows of dataset {row['dataset']!r} do not say which grader marked them: "
                          f"give --grader ({' or '.join(GRADERS)})")
    if name not in GRADERS:
        raise ConfigError(f"grader must be one of {', '.join(GRADERS)}, got {name!r}")
    return name


def regrade(path: str | Path, grader: str | None = None, *, write: bool = True) -> Regraded:
    p = Path(path).expanduser()
    if grader is not None and grader not in GRADERS:  # even when every row records its own
        raise ConfigError(f"--grader must be one of {', '.join(GRADERS)}, got {grader!r}")
    if not p.is_file():
        raise ConfigError(f"results file {str(p)!r} {'is a directory' if p.is_dir() else 'not found'}")
    try:
        lock = open(p, "a", encoding="utf-8")  # noqa: SIM115 - held until the file is replaced
    except OSError as exc:
        raise ConfigError(f"cannot open {str(p)!r}: {exc.strerror or exc}") from None
    with lock:
        if not try_lock(lock):
            raise ConfigError(f"{str(p)!r} is being written by a bench run; regrade it when the run has stopped")
        data = p.read_bytes()
        if data and not data.endswith(b"\n"):
            raise ConfigError(f"the last line of {str(p)!r} is cut off (a killed run): continue the run with "
                              "--resume first, which computes that row again")
        lines = data.split(b"\n")[:-1]
        commit, dirty = git_state()
        changes: list[Change] = []
        rows = 0
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            where = f"{p.name} line {i + 1}"
            try:
                row = validate_row(json.loads(raw.decode("utf-8")), where)
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise ConfigError(f"{where} is not valid JSON; the file is corrupt") from None
            rows += 1
            name = row_grader(row, grader)
            correct, extracted = is_correct(row["completion"], row["gold"], name)
            if (correct, extracted) == (row["correct"], row["extracted"]):
                continue
            changes.append(Change(i + 1, row["qid"], row["method"], row["pair"], row["extracted"], extracted,
                                  row["correct"], correct))
            # an earlier regrade's record nests under "before": the row's whole history stays
            was = {"git_commit": commit, "dirty": dirty, "extracted": row["extracted"], "correct": row["correct"],
                   **({"before": row["regraded"]} if "regraded" in row else {})}
            new = {**row, "extracted": extracted, "correct": correct, "grader": name, "regraded": was}
            lines[i] = json.dumps(new, ensure_ascii=False, allow_nan=False).encode("utf-8")
        if changes and write:
            try:
                write_text_atomic(p, b"".join(line + b"\n" for line in lines).decode("utf-8"))
            except OSError as exc:
                raise ConfigError(f"cannot rewrite {str(p)!r}: {describe_write_error(p, exc)}") from None
    return Regraded(rows, changes, bool(changes) and write)

