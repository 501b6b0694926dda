"""`easd-local bench` with a problem whose prompt does not fit in --ctx (tiny pair, real
llama.cpp): that problem is skipped for every method and no row is written for it, the
run carries on, the CLI says so, and --resume with a larger --ctx computes it later."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from easd_local.bench import runner as bench_runner
from easd_local.bench.datasets import Problem
from easd_local.cli import app

runner = CliRunner()
MODES = ("target", "sd", "easd")


pytestmark = pytest.mark.usefixtures("easd_home")


def bench(*args):
    return runner.invoke(app, ["bench", *[str(a) for a in args]])


def qids_of(path: Path) -> list[tuple[str, str]]:
    return [(r["qid"], r["method"]) for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())]


def test_prompt_longer_than_ctx_is_skipped_for_every_method(tmp_path, tiny_draft, tiny_target):
    data = tmp_path / "mine.jsonl"
    # the tiny tokenizer is close to a token per byte: 1,000 characters never fit in 256 tokens
    questions = ["What is 1 + 1?", "What is " + "one plus " * 110 + "one?", "What is 2 + 2?"]
    data.write_text("".join(json.dumps({"q": q, "a": "2"}) + "\n" for q in questions), encoding="utf-8")
    out = tmp_path / "r.jsonl"
    args = ["--dataset", data, "--question-key", "q", "--answer-key", "a", "--grader", "numeric",
            "--modes", ",".join(MODES), "--draft", tiny_draft, "--target", tiny_target,
            "--max-tokens", 8, "--threads", 1, "--out", out]
    r = bench(*args, "--ctx", 256)
    assert r.exit_code == 0, r.output
    # (sorted: with --parallel > 1 a window's rows come method by method)
    assert sorted(qids_of(out)) == sorted((q, m) for q in ("mine-00000", "mine-00002") for m in MODES)
    assert "skipped mine-00001" in r.stderr and "longer than the context (256 tokens)" in r.stderr
    assert "1 problem skipped: prompt longer than the context (256 tokens)" in r.stderr
    assert "mine · pair" in r.stdout and "2 questions" in r.stdout  # the report covers the others
    # no row was written for it: a larger context computes it on --resume, and only it
    r = bench(*args, "--ctx", 1024, "--resume")
    assert r.exit_code == 0, r.output
    assert sorted(qids_of(out)) == sorted((f"mine-{i:05d}", m) for i in range(3) for m in MODES)
    assert qids_of(out)[-3:] == [("mine-00001", m) for m in MODES]
    assert "skipped" not in r.stderr


def test_a_run_that_skips_every_problem_reports_no_results(tmp_path, tiny_draft, tiny_target):
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"q": "What is " + "one plus " * 110 + "one?", "a": "2"}) + "\n", encoding="utf-8")
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", data, "--question-key", "q", "--answer-key", "a", "--grader", "numeric", "--modes",
              "target", "--draft", tiny_draft, "--target", tiny_target, "--max-tokens", 8, "--threads", 1,
              "--ctx", 256, "--out", out)
    assert r.exit_code == 0, r.output
    assert "no results yet" in " ".join(r.stdout.split()) and "1 problem skipped" in r.stderr and "Traceback" not in r.output
    assert out.exists() and out.read_text() == ""  # the run finished: its (empty) file stays for --resume


def _skip(qid: str, n_ctx: int, pair: str = "p") -> bench_runner.Skipped:
    prob = Problem(dataset="d", qid=qid, index=0, question="q", gold="1", grader="numeric")
    return bench_runner.Skipped(pair, prob, bench_runner.context_reason(n_ctx), "its prompt is 999 tokens", 3)


def test_skip_summary_counts_problems_per_reason():
    assert bench_runner.skip_summary([]) == []
    # the same problem skipped on two pairs is one problem
    skips = [_skip("a", 256), _skip("b", 256), _skip("a", 256, pair="q"), _skip("c", 512)]
    assert bench_runner.skip_summary(skips) == [
        "2 problems skipped: prompt longer than the context (256 tokens)",
        "1 problem skipped: prompt longer than the context (512 tokens)",
    ]
