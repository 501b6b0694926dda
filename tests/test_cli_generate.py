"""`easd-local generate` through the CLI on the tiny pair."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from easd_local.cli import app

runner = CliRunner()

JSON_KEYS = {
    "text", "mode", "tokens", "tokens_per_s", "drafted", "accepted", "sd_rejections", "easd_fires", "bonus",
    "target_calls", "draft_calls", "seconds_draft", "seconds_target", "seconds_controller", "ttft_s",
    "tau_draft", "tau_target", "top_n", "overlap", "penalty", "thresholds_source", "stop_reason",
}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))


def gen(args, tiny_draft, tiny_target):
    return runner.invoke(app, ["generate", *args, "--draft", str(tiny_draft), "--target", str(tiny_target),
                               "--ctx", "512", "--threads", "1"])


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--gamma", "0", "gamma must be >= 1"),
        ("--top-n", "0", "top-n must be >= 1"),
        ("--top-n", "100000", "top-n must be at most the vocabulary size 306"),
        ("--overlap", "1.5", "overlap must be in [0, 1]"),
        ("--penalty", "-0.1", "penalty (lambda) must be in [0, 1]"),
        ("--penalty", "2", "penalty (lambda) must be in [0, 1]"),
        ("--temperature", "-1", "temperature must be a finite number >= 0"),
        ("--mode", "fast", "mode must be one of"),
        ("--top-p", "0", "top-p must be in (0, 1]"),
        ("--max-tokens", "0", "max-tokens must be >= 1"),
        ("--tau-draft", "-1", "tau-draft must be >= 0"),
    ],
)
def test_invalid_parameters_rejected_before_loading(flag, value, message, tmp_path):
    # the model paths do not exist: the parameter error must come first
    missing = tmp_path / "nope.gguf"
    r = runner.invoke(app, ["generate", "hi", flag, value, "--draft", str(missing), "--target", str(missing)])
    if "vocabulary size" in message:
        assert r.exit_code == 2 and "file not found" in r.output  # N vs vocab needs the model
        return
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output and "file not found" not in r.output


def test_top_n_larger_than_vocabulary(tiny_draft, tiny_target):
    r = gen(["hi", "--top-n", "100000"], tiny_draft, tiny_target)
    assert r.exit_code == 2
    assert "top-n must be at most the vocabulary size 306" in r.output


def test_json_output_has_stable_keys(tiny_draft, tiny_target):
    r = gen(["Tell me a story", "--json", "--max-tokens", "12", "--mode", "easd"], tiny_draft, tiny_target)
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    assert JSON_KEYS <= set(obj)
    assert obj["mode"] == "easd" and obj["tokens"] == 12
    assert obj["draft_accepted"] + obj["sd_rejections"] + obj["easd_fires"] + obj["bonus"] == obj["tokens"]
    assert obj["thresholds_source"] == "default"


def test_streams_text_and_status(tiny_draft, tiny_target):
    r = gen(["Tell me a story", "--max-tokens", "10", "--mode", "sd", "--raw"], tiny_draft, tiny_target)
    assert r.exit_code == 0, r.output
    assert "sd · 10 tokens" in r.output
    # llama.cpp's names and the bench report's tok/verify
    assert re.search(r"n_drafted \d+ · n_accept \d+ \(\d+%\) · \d+\.\d\d tok/verify", r.output), r.output


def test_trace_file(tiny_draft, tiny_target, tmp_path):
    trace = tmp_path / "t.jsonl"
    r = gen(["Tell me a story", "--max-tokens", "20", "--trace", str(trace), "--tau-draft", "0.5",
             "--tau-target", "0.5", "--overlap", "0.2", "--json"], tiny_draft, tiny_target)
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(rows) == 20
    assert {row["origin"] for row in rows} <= {"draft-accepted", "target", "target-resampled", "easd-resampled", "bonus", "draft"}
    assert all(set(row) >= {"token", "text", "origin", "h_draft", "h_target", "overlap"} for row in rows)
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    assert obj["thresholds_source"] == "flags"
    assert sum(row["origin"] == "easd-resampled" for row in rows) == obj["easd_fires"]


def test_target_mode_needs_only_target(tiny_target):
    r = runner.invoke(app, ["generate", "hi", "--mode", "target", "--target", str(tiny_target), "--max-tokens", "5",
                            "--json", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["tokens"] == 5


def test_missing_draft_is_one_line(tiny_target):
    r = runner.invoke(app, ["generate", "hi", "--mode", "sd", "--target", str(tiny_target)])
    assert r.exit_code == 2
    assert "--draft is missing" in r.output


def test_incompatible_pair(tiny_odd, tiny_target):
    r = runner.invoke(app, ["generate", "hi", "--draft", str(tiny_odd), "--target", str(tiny_target)])
    assert r.exit_code == 2
    assert "vocabularies differ at token id 267" in r.output
