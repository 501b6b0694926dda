"""`easd-local bench rerun` on the tiny pair (real llama.cpp): a fresh row reproduces, an
altered one is located and explained, changed or missing files are refused."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from easd_local.cli import app
from easd_local.engine.near_ties import ARGMAX, GATE, REAL

cli_runner = CliRunner()
pytestmark = pytest.mark.usefixtures("easd_home")


def invoke(*args):
    return cli_runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def made(tmp_path, tiny_draft, tiny_target):
    """A results file of one problem × (target, easd-tf), made from copies of the tiny files."""
    d, t = tmp_path / "d.gguf", tmp_path / "t.gguf"
    shutil.copy(tiny_draft, d)
    shutil.copy(tiny_target, t)
    out = tmp_path / "r.jsonl"
    r = invoke("bench", "--dataset", "gsm8k", "--limit", 1, "--modes", "target,easd-tf", "--draft", d, "--target", t,
               "--max-tokens", 10, "--ctx", 512, "--threads", 1, "--out", out)
    assert r.exit_code == 0, r.output
    return out, d, t


def rewrite(path: Path, out: Path, change) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        change(row)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_rerun_fresh_row_is_identical(made):
    out, _, _ = made
    for method in ("target", "easd-tf"):
        r = invoke("bench", "rerun", out, "--qid", "gsm8k-test-00000", "--method", method)
        assert r.exit_code == 0, r.output
        assert r.stdout.strip() == "identical (10 tokens)"
        assert "another environment" not in r.stderr


def test_rerun_altered_row_names_the_first_difference(made, tmp_path):
    out, _, _ = made
    copy = tmp_path / "altered.jsonl"

    def alter(row):
        row["completion_tokens"][4] = (row["completion_tokens"][4] + 1) % 50

    rows = rewrite(out, copy, alter)
    r = invoke("bench", "rerun", copy, "--qid", "gsm8k-test-00000", "--method", "easd-tf")
    assert r.exit_code == 1, r.output
    lines = r.stdout.splitlines()
    tf = rows[1]
    assert lines[0].startswith(f"first difference at token 4 (character ")
    assert f"recorded " in lines[0] and f"(id {tf['completion_tokens'][4]})" in lines[0]
    why = lines[1].removeprefix("why: ")
    assert why in (ARGMAX, GATE, REAL)
    gap = float(re.search(r"logit gap new - recorded: ([-+][0-9.]+)", r.stdout).group(1))
    assert why != ARGMAX or abs(gap) < 0.5
    if "gate: the new run" not in r.stdout:  # the gates did not decide differently: the gap decides
        assert (abs(gap) < 0.5) == (why == ARGMAX) or why == GATE
    assert "gate open there" in r.stdout or "gate closed there" in r.stdout  # easd-tf: the gate's distances


def test_rerun_old_row_retokenizes_its_text(made, tmp_path):
    out, d, t = made
    copy = tmp_path / "old.jsonl"

    def make_old(row):
        del row["provenance"], row["completion_tokens"]

    rewrite(out, copy, make_old)
    r = invoke("bench", "rerun", copy, "--qid", "gsm8k-test-00000", "--method", "target", "--draft", d, "--target", t)
    # re-tokenizing the text of random-weight models need not give back the generated ids:
    # either way the output says that the ids come from re-tokenizing
    assert r.exit_code in (0, 1), r.output
    assert "re-tokenizing" in r.stdout and "records no environment" in r.stderr
    # without files, a file pair's old row cannot be located
    r = invoke("bench", "rerun", copy, "--qid", "gsm8k-test-00000", "--method", "target")
    assert r.exit_code == 2 and "give them with --draft PATH --target PATH" in r.stderr


def test_rerun_refuses_changed_or_missing_files(made):
    out, d, t = made
    with open(t, "ab") as f:
        f.write(b"\0" * 16)
    r = invoke("bench", "rerun", out, "--qid", "gsm8k-test-00000", "--method", "target")
    assert r.exit_code == 2 and "no longer matches the row" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    t.unlink()
    r = invoke("bench", "rerun", out, "--qid", "gsm8k-test-00000", "--method", "target")
    assert r.exit_code == 2 and "t.gguf" in r.stderr and "is not on this machine" in r.stderr
    r = invoke("bench", "rerun", out, "--qid", "gsm8k-test-00000", "--method", "sd")
    assert r.exit_code == 2 and "its methods: easd-tf, target" in r.stderr


def test_rerun_no_repack_reaches_the_load_and_says_the_environment_differs(made):
    """--no-repack (a CPU whose repacked kernels crash): the rerun loads without llama.cpp's
    extra buffer types and says that this differs from the row's environment."""
    out, _, _ = made
    r = invoke("bench", "rerun", out, "--qid", "gsm8k-test-00000", "--method", "target", "--no-repack")
    assert r.exit_code in (0, 1), r.output
    assert "another environment than the row's" in r.stderr and "no_repack" in r.stderr, r.stderr
    assert "Traceback" not in r.output


def test_a_no_repack_row_records_it_and_reruns_with_it(tmp_path, tiny_draft, tiny_target):
    """bench --no-repack writes rows whose environment says no_repack, and their rerun takes
    it from the row: no flag needed, no environment note."""
    out = tmp_path / "nr.jsonl"
    r = invoke("bench", "--dataset", "gsm8k", "--limit", 1, "--modes", "target", "--draft", tiny_draft, "--target",
               tiny_target, "--max-tokens", 6, "--ctx", 512, "--threads", 1, "--no-repack", "--out", out)
    assert r.exit_code == 0, r.output
    row = json.loads(out.read_text().splitlines()[0])
    assert row["provenance"]["env"]["no_repack"] is True
    r = invoke("bench", "rerun", out, "--qid", "gsm8k-test-00000", "--method", "target")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "identical (6 tokens)" and "another environment" not in r.stderr
