"""`easd-local generate` through the CLI on the tiny pair."""

from __future__ import annotations

import errno
import json
import os
import re
import stat

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


def test_no_mmap_generates_the_same_tokens_and_records_itself(tiny_draft, tiny_target):
    runs = [gen(["Tell me a story", "--json", "--max-tokens", "12", "--mode", "sd", *extra], tiny_draft, tiny_target)
            for extra in ((), ("--no-mmap",))]
    assert [r.exit_code for r in runs] == [0, 0], runs[-1].output
    mapped, read = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert read["completion_tokens"] == mapped["completion_tokens"] and read["text"] == mapped["text"]
    assert read["provenance"]["env"]["no_mmap"] is True and "no_mmap" not in mapped["provenance"]["env"]


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


@pytest.mark.parametrize("where", ["folder", "fifo", "under-a-file"])
def test_trace_path_that_cannot_be_a_file_is_refused_before_loading(where, tmp_path):
    # an atomic write renames over its path: a FIFO (or, as root, /dev/full) would have been
    # replaced by a plain file, a folder or a file on the way failed with a traceback, and
    # all of it only after the whole completion
    paths = {"folder": tmp_path, "fifo": tmp_path / "pipe", "under-a-file": tmp_path / "file" / "t.jsonl"}
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "file").write_text("x")
    missing = tmp_path / "nope.gguf"
    r = runner.invoke(app, ["generate", "hi", "--trace", str(paths[where]), "--draft", str(missing),
                            "--target", str(missing)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "file not found" not in r.output
    error = {"folder": f"{tmp_path}: is a folder, not a file", "fifo": "pipe: is not a regular file",
             "under-a-file": f"{tmp_path / 'file'} is a file, not a folder"}[where]
    assert r.output.count("error:") == 1 and error in r.output, r.output
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe").st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


def test_trace_on_a_full_disk_is_one_line(tiny_draft, tiny_target, tmp_path, monkeypatch):
    def full(path, rows):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("easd_local.cli.generate.write_jsonl_atomic", full)
    r = gen(["hi", "--max-tokens", "4", "--trace", str(tmp_path / "t.jsonl")], tiny_draft, tiny_target)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert f"error: could not write the trace: no space left on the device holding {tmp_path / 't.jsonl'}" in r.output


def test_system_with_raw_is_refused_before_loading(tmp_path):
    # it was dropped without a word: the completion ran as if no system message was given
    missing = tmp_path / "nope.gguf"
    r = runner.invoke(app, ["generate", "hi", "--raw", "--system", "Be terse.", "--draft", str(missing),
                            "--target", str(missing)])
    assert r.exit_code == 2, r.output
    assert "error: --system needs --chat: a --raw prompt has no system message" in r.output
    assert "file not found" not in r.output


def test_mode_takes_the_way_label_the_tool_prints(tiny_draft, tiny_target):
    """`--mode sd:ngram-simple` is what the banner, doctor and `pair costs` call the way: it
    runs that way (prompt lookup needs no draft model), in any case."""
    r = runner.invoke(app, ["generate", "hi", "--mode", "SD:ngram-simple", "--target", str(tiny_target),
                            "--max-tokens", "4", "--json", "--threads", "1"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["mode"], got["spec_type"]) == ("sd", "ngram-simple")
    r = gen(["hi", "--mode", "sd:ngram-simple+draft", "--max-tokens", "4", "--json"], tiny_draft, tiny_target)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["spec_type"] == "ngram-simple,draft"
    r = gen(["hi", "--mode", "sd:ngram-simple", "--spec-type", "draft"], tiny_draft, tiny_target)
    assert r.exit_code == 2 and "give one" in r.output and "Traceback" not in r.output
    r = gen(["hi", "--mode", "sd:bogus"], tiny_draft, tiny_target)
    assert r.exit_code == 2 and "unknown drafter 'bogus'" in r.output


def test_lossless_is_one_rule_with_the_server(tiny_draft, tiny_target):
    """EASD with its gate off is SD (lossless, no "not lossless" note), as the server says; draft
    mode never is (DecodeConfig.lossless, which generate --json and the server's timings read)."""
    r = gen(["hi", "--mode", "easd", "--tau-draft", "inf", "--max-tokens", "3", "--json"], tiny_draft, tiny_target)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["lossless"] is True and "not lossless" not in r.output
    r = gen(["hi", "--mode", "easd", "--max-tokens", "3", "--json"], tiny_draft, tiny_target)
    assert json.loads(r.stdout.strip().splitlines()[-1])["lossless"] is False
    r = gen(["hi", "--mode", "draft", "--max-tokens", "3", "--json"], tiny_draft, tiny_target)
    assert json.loads(r.stdout.strip().splitlines()[-1])["lossless"] is False
