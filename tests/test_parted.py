"""`easd-local bench parted` on the tiny pair (real llama.cpp): where greedy sd's recorded text
parts from target's, the logit gap it reports is the target's own (checked against a separate
load), a small gap is an argmax near-tie and a large one a real difference (exit 1); EASD and
sampled rows are refused in one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from easd_local.bench.parted import IDENTICAL, LENGTH, Parting, summarize
from easd_local.bench.prompt import build_messages
from easd_local.cli import app
from easd_local.engine.near_ties import ARGMAX, REAL
from easd_local.llamacpp.runtime import LoadOptions, Model

cli_runner = CliRunner()
pytestmark = pytest.mark.usefixtures("easd_home")
K = 4  # the token the tests alter


def invoke(*args):
    return cli_runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def made(tmp_path, tiny_draft, tiny_target):
    """A results file of two problems × (target, sd) and one of easd-tf, greedy, from copies
    of the tiny files."""
    d, t = tmp_path / "d.gguf", tmp_path / "t.gguf"
    shutil.copy(tiny_draft, d)
    shutil.copy(tiny_target, t)
    out = tmp_path / "r.jsonl"
    r = invoke("bench", "--dataset", "gsm8k", "--limit", 2, "--modes", "target,sd,easd-tf", "--draft", d,
               "--target", t, "--max-tokens", 12, "--ctx", 512, "--threads", 1, "--out", out)
    assert r.exit_code == 0, r.output
    return out, t


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def target_logits(t: Path, question: str, tokens: list[int]) -> np.ndarray:
    with Model(t, LoadOptions(n_ctx=512, n_threads=1)) as m:
        prompt = m.vocab.chat_tokens(build_messages(question))
        return m.decode(list(prompt) + tokens, logits_at=(-1,))[0, :m.n_vocab].copy()


SUMMARY = re.compile(r"(\d+) problems: (\d+) identical, (\d+) parted \((\d+) at an argmax near-tie, (\d+) at a real "
                     r"difference, (\d+) where one stopped first\)")


def test_parted_fresh_rows_part_only_at_near_ties(made):
    out, _ = made
    r = invoke("bench", "parted", out, "--method", "sd")
    assert r.exit_code == 0, r.output
    m = SUMMARY.search(r.stdout)
    assert m, r.stdout
    n, same, parted, near, real, length = map(int, m.groups())
    assert n == 2 and same + parted == 2 and near + real + length == parted and real == 0
    assert len([ln for ln in r.stdout.splitlines() if " parts at token " in ln]) == parted


@pytest.mark.parametrize("pick", ["runner-up", "last"])
def test_parted_reports_the_targets_logit_gap(made, tmp_path, pick):
    """Replace sd's token K on the first problem by the target's runner-up there (a small gap)
    or its least likely token (a large one); the gap reported is the one a separate load of
    the target gives, and its size decides the kind and the exit status."""
    out, t = made
    rows = rows_of(out)
    tr = next(r for r in rows if r["method"] == "target" and r["index"] == 0)
    sd = next(r for r in rows if r["method"] == "sd" and r["index"] == 0)
    toks = list(tr["completion_tokens"])
    assert len(toks) > K
    z = target_logits(t, tr["question"], toks[:K])
    order = np.argsort(z)
    x = int(order[-2] if pick == "runner-up" else order[0])
    if x == toks[K]:
        x = int(order[-1])
    sd["completion_tokens"] = toks[:K] + [x] + toks[K + 1:]
    path = write([r for r in rows if r["index"] == 0 and r["method"] in ("target", "sd")], tmp_path / "alt.jsonl")
    r = invoke("bench", "parted", path, "--method", "sd")
    line = next(ln for ln in r.stdout.splitlines() if " parts at token " in ln)
    assert line.startswith(f"{tr['qid']} parts at token {K}: sd ") and f"(id {x}), target " in line
    assert f"(id {toks[K]})" in line
    gap = float(re.search(r"logit gap ([-+][0-9.]+)", line).group(1))
    expected = float(z[x] - z[toks[K]])
    assert gap == pytest.approx(expected, abs=2e-3)
    if pick == "last":
        assert abs(expected) >= 0.5  # the tiny target's logits are not flat: the test exercises REAL
    kind = ARGMAX if abs(expected) < 0.5 else REAL
    assert kind in line
    assert r.exit_code == (1 if kind == REAL else 0), r.output


def test_parted_refuses_easd_and_sampled_rows(made, tmp_path):
    out, _ = made
    r = invoke("bench", "parted", out, "--method", "easd-tf")
    assert r.exit_code != 0
    assert "lossless" in r.output and "Traceback" not in r.output
    rows = rows_of(out)
    for row in rows:
        row["config"]["temperature"] = 0.7
    r = invoke("bench", "parted", write(rows, tmp_path / "t07.jsonl"), "--method", "sd")
    assert r.exit_code != 0
    assert "sampled" in r.output and "Traceback" not in r.output
    r = invoke("bench", "parted", out, "--method", "sd", "--against", "nope")
    assert r.exit_code != 0 and "'nope'" in r.output and "Traceback" not in r.output


def test_summarize_counts_kinds_gaps_and_answers():
    def p(kind, gap=None, changed=False, correct=(True, True)):
        return Parting("q", None if kind == IDENTICAL else 3, 1, 2, "a", "b", kind, gap, changed, correct)

    s = summarize([p(IDENTICAL), p(ARGMAX, -0.1, True, (False, True)), p(ARGMAX, 0.3, True, (True, False)),
                   p(REAL, 1.5), p(LENGTH, None, True, (True, False))])
    assert s.compared == 5 and s.parted == 4
    assert s.counts == {IDENTICAL: 1, ARGMAX: 2, REAL: 1, LENGTH: 1}
    assert s.gaps == [0.1, 0.3, 1.5] and s.max_gap == 1.5 and s.median_gap == pytest.approx(0.3)
    assert s.answers_changed == 3 and (s.wins, s.losses) == (2, 1)


def test_parted_no_repack_is_taken_and_said(made):
    out, _ = made
    r = invoke("bench", "parted", out, "--method", "sd", "--no-repack")
    assert r.exit_code == 0, r.output
    assert "--no-repack: llama.cpp's weight repacking is off here" in r.stderr
    assert SUMMARY.search(r.stdout)


def test_methods_missing_from_the_file_are_named_and_an_empty_file_says_so():
    from easd_local.bench.parted import plan_parted
    from easd_local.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--method 'sd': no rows with that method; the file has no rows$"):
        plan_parted([], "sd")
    rows = [{"dataset": "gsm8k", "qid": "q1", "method": "target", "pair": "p"}]
    with pytest.raises(ConfigError, match=r"^--method 'sd': no rows with that method; the file's methods: target$"):
        plan_parted(rows, "sd")
