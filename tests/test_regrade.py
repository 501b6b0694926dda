"""`easd-local bench regrade`: after the grader is mended, a results file's rows are graded
again from their stored completions, so that one table is graded one way. Only the rows that
change are rewritten, each saying what it held before; a running bench's file is refused."""

from __future__ import annotations

import dataclasses
import json

from typer.testing import CliRunner

from easd_local.bench.schema import empty_stats, make_row, validate_row
from easd_local.cli import app
from easd_local.engine.config import DecodeConfig
from easd_local.fsutil import try_lock

runner = CliRunner()


def _row(i, completion, gold, extracted, correct, dataset="math500"):
    return make_row(dataset=dataset, qid=f"{dataset}-{i}", index=i, method="easd-tf", pair="default",
                    config=dataclasses.asdict(DecodeConfig(mode="easd-tf")), question="Q?", gold=gold,
                    completion=completion, extracted=extracted, correct=correct,
                    stats=dict(empty_stats(), stop_reason="eos"))


def _write(path, rows):
    # the writer's own form, one row per line, so that untouched lines can be compared byte for byte
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def test_regrade_rewrites_only_rows_whose_verdict_changes(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [_row(0, "so $\\boxed{(b + 2)(a + 5)}$", "(a+5)(b+2)", "(b + 2)(a + 5)", False),  # the old grader's miss
            _row(1, "é $\\boxed{7}$", "7", "7", True),
            _row(2, "$\\boxed{x^2-1}$", "(x+1)(x-1)", "x^2-1", False)]  # equal in value, not the answer
    _write(path, rows)
    before = path.read_bytes().split(b"\n")

    r = runner.invoke(app, ["bench", "regrade", str(path), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "line 1: math500-0 · easd-tf · pair default: answer '(b + 2)(a + 5)' · wrong -> right" in r.output
    assert "1 of 3 rows changed (1 wrong -> right, 0 right -> wrong); file unchanged (--dry-run)" in r.output
    assert path.read_bytes().split(b"\n") == before

    path.chmod(0o644)
    r = runner.invoke(app, ["bench", "regrade", str(path)])
    assert r.exit_code == 0 and "file rewritten" in r.output, r.output
    assert path.stat().st_mode & 0o777 == 0o644  # readable by whoever could read it before
    after = path.read_bytes().split(b"\n")
    assert after[1:] == before[1:]  # the other rows, byte for byte
    row = validate_row(json.loads(after[0]))
    assert row["correct"] is True and row["grader"] == "math"
    assert row["regraded"]["correct"] is False and row["regraded"]["extracted"] == "(b + 2)(a + 5)"
    assert "git_commit" in row["regraded"] and "dirty" in row["regraded"]
    r = runner.invoke(app, ["bench", "regrade", str(path)])
    assert "0 of 3 rows changed" in r.output and "file unchanged" in r.output
    # the report reads the new verdict
    r = runner.invoke(app, ["bench", "report", str(path)])
    assert r.exit_code == 0 and "66.7%" in r.output, r.output


def test_regrade_refuses_what_it_cannot_do_safely(tmp_path):
    path = tmp_path / "r.jsonl"
    _write(path, [_row(0, "$\\boxed{1}$", "1", "1", True)])
    with open(path, "a", encoding="utf-8") as running_bench:
        assert try_lock(running_bench)
        r = runner.invoke(app, ["bench", "regrade", str(path)])
    assert r.exit_code == 2 and "is being written by a bench run" in r.output and "Traceback" not in r.output

    with open(path, "a", encoding="utf-8") as f:
        f.write('{"dataset": "math5')  # a killed run's torn row
    r = runner.invoke(app, ["bench", "regrade", str(path)])
    assert r.exit_code == 2 and "cut off" in r.output and "--resume" in r.output

    custom = tmp_path / "c.jsonl"
    _write(custom, [_row(0, "$\\boxed{1}$", "1", "1", True, dataset="mine")])
    r = runner.invoke(app, ["bench", "regrade", str(custom)])
    assert r.exit_code == 2 and "give --grader (numeric or math)" in r.output
    assert runner.invoke(app, ["bench", "regrade", str(custom), "--grader", "numeric"]).exit_code == 0
    # a bad --grader is refused even where every row names its own grader
    named = tmp_path / "n.jsonl"
    _write(named, [dict(_row(0, "$\\boxed{1}$", "1", "1", True), grader="math")])
    r = runner.invoke(app, ["bench", "regrade", str(named), "--grader", "maths"])
    assert r.exit_code == 2 and "--grader must be one of numeric, math, got 'maths'" in r.output
    r = runner.invoke(app, ["bench", "regrade", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "not found" in r.output
