"""Broken model files end in one clear line, in every command that meets them (issue 13,
items 2 and 5): a GGUF whose tensor data is random bytes (it loads; its logits are NaN or
infinite) and a GGUF whose chat template has one byte changed. Real llama.cpp."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import gguf_mutate
from easd_local.bench.report import load_results
from easd_local.cli import app
from easd_local.errors import NonFiniteLogitsError
from easd_local.llamacpp.runtime import LoadOptions, Model, ModelFile

runner = CliRunner()

pytestmark = pytest.mark.usefixtures("easd_home")


@pytest.fixture(scope="module")
def broken(tmp_path_factory, tiny_draft, tiny_target) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("broken")
    return {
        "nan_target": gguf_mutate.with_random_tensor_data(tiny_target, d / "nan-target.gguf", seed=1),
        "nan_draft": gguf_mutate.with_random_tensor_data(tiny_draft, d / "nan-draft.gguf", seed=2),
        # one byte changed inside tokenizer.chat_template: "endfor" -> "endfxr"
        "bad_template": gguf_mutate.with_bytes_replaced(tiny_target, d / "bad-template.gguf", b"endfor", b"endfxr"),
    }


def _error_lines(output: str) -> list[str]:
    assert "Traceback" not in output, output
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


# ------------------------------------------------------------------ 2. NaN logits


def test_runtime_refuses_non_finite_logits(broken):
    with Model(broken["nan_target"], LoadOptions(n_ctx=64, n_threads=1)) as m:
        with pytest.raises(NonFiniteLogitsError, match="nan-target.gguf: the model produced NaN or infinite logits"):
            m.decode(m.vocab.tokenize("hello"), logits_at=(-1,))
        # nothing of the failed call is recorded: the cache is usable (and still broken)
        assert m.n_past == 0
        z = m.decode(m.vocab.tokenize("hi"), logits_at=())
        assert z.shape == (0, m.n_vocab) and m.n_past == 2


@pytest.mark.parametrize("which,args", [
    ("nan_target", ["--mode", "target"]),  # greedy: argmax of NaNs printed NUL bytes with exit 0
    ("nan_target", ["--mode", "target", "--temperature", "0.8"]),  # sampling raised ValueError
    ("nan_target", ["--mode", "easd", "--temperature", "0.8"]),
    ("nan_draft", ["--mode", "sd"]),
    ("nan_draft", ["--mode", "easd-tf", "--tau-target", "0", "--tau-draft", "0"]),
])
def test_generate_names_the_model_with_nan_logits(broken, tiny_draft, tiny_target, which, args):
    draft = broken["nan_draft"] if which == "nan_draft" else tiny_draft
    target = broken["nan_target"] if which == "nan_target" else tiny_target
    r = runner.invoke(app, ["generate", "hello", *args, "--draft", str(draft), "--target", str(target),
                            "--max-tokens", "8", "--threads", "1", "--ctx", "256", "--json"])
    assert r.exit_code == 2, r.output
    errors = _error_lines(r.output)
    assert errors == [f"error: {broken[which]}: the model produced NaN or infinite logits; its weights look "
                      "corrupt (re-download or re-convert the file)"]
    assert r.stdout == ""  # no JSON object for a generation that failed


def test_chat_reports_nan_logits_and_returns_to_the_prompt(broken, tiny_draft):
    r = runner.invoke(app, ["chat", "--draft", str(tiny_draft), "--target", str(broken["nan_target"]),
                            "--threads", "1", "--ctx", "256", "--max-tokens", "8"],
                      input="hello\n/stats\nagain\n")
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert r.stderr.count("the model produced NaN or infinite logits") == 2  # each message, one line
    assert "turns 0" in r.stderr  # /stats ran between them: the session went on


def test_bench_skips_what_nan_logits_spoil(broken, tiny_draft, tiny_target, tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"q": f"What is {i} + 1?", "a": str(i + 1)}) + "\n" for i in range(2)))
    out = tmp_path / "r.jsonl"
    # a broken draft spoils the methods that use it; target-only rows are still written
    r = runner.invoke(app, ["bench", "--dataset", str(data), "--question-key", "q", "--answer-key", "a",
                            "--modes", "target,sd", "--draft", str(broken["nan_draft"]), "--target", str(tiny_target),
                            "--max-tokens", "6", "--threads", "1", "--ctx", "256", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert [(row["qid"], row["method"]) for row in load_results(out)] == [("q-00000", "target"), ("q-00001", "target")]
    assert r.stderr.count("skipped q-0000") == 2
    assert "nan-draft.gguf: the model produced NaN or infinite logits" in r.stderr
    assert "2 problems skipped: a model produced NaN or infinite logits (re-download or re-convert" in r.stderr
    # the progress counts written rows only (it said 4/4 with 2 written)
    assert re.findall(r"(\d+)/(\d+) rows", r.stderr)[-1] == ("2", "2")
    assert "(2 skipped)" in r.stderr


# ------------------------------------------------------------------ 5. a broken chat template


def test_broken_chat_template_is_one_line_everywhere(broken, tiny_draft, tmp_path):
    bad = broken["bad_template"]
    common = ["--draft", str(tiny_draft), "--target", str(bad), "--threads", "1", "--ctx", "256", "--max-tokens", "4"]
    r = runner.invoke(app, ["generate", "hello", *common])
    assert r.exit_code == 2
    [line] = _error_lines(r.output)
    assert "bad-template.gguf: the chat template in its GGUF metadata is broken (TemplateSyntaxError" in line
    assert line.endswith("use --raw to prompt without it")
    r = runner.invoke(app, ["generate", "hello", "--raw", *common])
    assert r.exit_code == 0, r.output

    r = runner.invoke(app, ["chat", *common], input="hello\n")
    assert r.exit_code == 2
    [line] = _error_lines(r.output)
    assert "chat template in its GGUF metadata is broken" in line and "generate --raw" in line

    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"q": "1 + 1?", "a": "2"}) + "\n")
    r = runner.invoke(app, ["bench", "--dataset", str(data), "--question-key", "q", "--answer-key", "a",
                            "--modes", "target", *common, "--out", str(tmp_path / "r.jsonl")])
    assert r.exit_code == 2
    [line] = _error_lines(r.output)
    assert "chat template in its GGUF metadata is broken" in line and "bench renders every question" in line


def test_models_inspect_says_a_template_is_broken(broken, tiny_target):
    # from the header alone (no model load), compiled by the formatter the runtime uses
    r = runner.invoke(app, ["models", "inspect", str(broken["bad_template"])], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.replace("│", " ").split())  # the table wraps at any terminal width
    assert "chat template broken (TemplateSyntaxError: Encountered unknown tag" in flat, r.output
    assert "'endfxr'" in flat and "generate --raw prompts without it" in flat, r.output
    r = runner.invoke(app, ["models", "inspect", str(tiny_target)], env={"COLUMNS": "200"})
    assert "chat template yes" in " ".join(r.output.replace("│", " ").split()), r.output


def test_good_template_still_renders(tiny_target):
    with ModelFile(tiny_target) as m:
        assert m.vocab.chat_template_error() is None
        text = m.vocab.apply_chat_template([{"role": "user", "content": "hi"}])
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert np.asarray(m.vocab.chat_tokens([{"role": "user", "content": "hi"}])).size > 0
