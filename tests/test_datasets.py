"""Dataset presets, user JSONL files, slicing/sampling and clear errors."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest

from easd_local.bench.datasets import PRESETS, Problem, gold_to_text, load_dataset
from easd_local.errors import ConfigError

EXPECTED_ROWS = {
    "gsm8k": 1319,
    "gsm8k-train": 7473,
    "math500": 500,
    "aime24": 30,
    "amc23": 40,
    "olympiadbench": 675,
}
SHARED = Path("/work/shared/data")


@pytest.mark.parametrize("name", list(EXPECTED_ROWS))
def test_presets_load_with_stable_unique_ids(name):
    problems = load_dataset(name)
    assert len(problems) == EXPECTED_ROWS[name]
    assert len({p.qid for p in problems}) == len(problems)
    assert [p.index for p in problems] == list(range(len(problems)))
    assert all(p.question.strip() and p.gold.strip() for p in problems)
    assert {p.dataset for p in problems} == {name}
    assert {p.grader for p in problems} == {PRESETS[name].grader}


def test_preset_fields_and_gold_forms():
    g = load_dataset("gsm8k", limit=8)
    assert g[7] == Problem(
        qid="gsm8k-test-00007", index=7, question=g[7].question, gold=g[7].gold,
        dataset="gsm8k", grader="numeric",
    )
    assert g[0].gold == "18" and g[0].question.startswith("Janet")
    assert load_dataset("gsm8k", offset=146, limit=1)[0].gold == "2,125"  # raw text after ####
    assert load_dataset("gsm8k-train", limit=1)[0].qid == "gsm8k-train-00000"
    m = load_dataset("math500", limit=1)[0]
    assert m.qid == "math500-test-precalculus-807"  # from unique_id "test/precalculus/807.json"
    assert m.gold == "\\left( 3, \\frac{\\pi}{2} \\right)" and m.grader == "math"
    assert load_dataset("aime24", limit=1)[0].qid == "aime24-60"
    assert load_dataset("amc23", limit=1)[0].gold == "27.0"
    o = load_dataset("olympiadbench", limit=1)[0]
    assert (o.qid, o.gold, o.grader) == ("olympiadbench-1606", "2", "math")


def test_gold_to_text_unwraps_lists():
    assert gold_to_text(["2"]) == "2"
    assert gold_to_text("['2']") == "2"
    assert gold_to_text(["$1$", "$2$"]) == "$1$, $2$"
    assert gold_to_text("['a', 'b']") == "a, b"
    assert gold_to_text(27.0) == "27.0"
    assert gold_to_text("work\n#### 1,000") == "1,000"
    assert gold_to_text('["x", "y"]') == "x, y"  # a JSON list of strings in a string
    assert gold_to_text("[3,4]") == "[3,4]"  # a closed interval, not a list
    assert gold_to_text("[-2,7)") == "[-2,7)"


def test_offset_limit_and_sample_are_reproducible():
    sliced = load_dataset("gsm8k", offset=10, limit=3)
    assert [p.index for p in sliced] == [10, 11, 12]
    assert [p.qid for p in sliced] == ["gsm8k-test-00010", "gsm8k-test-00011", "gsm8k-test-00012"]
    a = load_dataset("gsm8k", sample=20, seed=3)
    b = load_dataset("gsm8k", sample=20, seed=3)
    c = load_dataset("gsm8k", sample=20, seed=4)
    assert [p.qid for p in a] == [p.qid for p in b]
    assert [p.qid for p in a] != [p.qid for p in c]
    assert [p.index for p in a] == sorted(p.index for p in a) and len(a) == 20
    # sampling draws from the offset/limit slice; asking for more than it holds gives all
    s = load_dataset("aime24", offset=5, limit=10, sample=4, seed=0)
    assert len(s) == 4 and all(5 <= p.index < 15 for p in s)
    assert len(load_dataset("aime24", sample=100)) == 30
    assert load_dataset("aime24", offset=30) == []


def test_qids_select_named_problems_in_file_order():
    got = load_dataset("gsm8k", qids=["gsm8k-test-00012", " gsm8k-test-00003", ""])
    assert [p.qid for p in got] == ["gsm8k-test-00003", "gsm8k-test-00012"]
    # the selection is taken from the --offset/--limit slice, then --sample draws from it
    assert [p.qid for p in load_dataset("gsm8k", offset=3, limit=1, qids=["gsm8k-test-00003"])] == ["gsm8k-test-00003"]
    assert len(load_dataset("gsm8k", qids=[f"gsm8k-test-{i:05d}" for i in range(9)], sample=2, seed=1)) == 2
    # a name outside the slice or a typo is an error, never a silently smaller run
    with pytest.raises(ConfigError, match=r"--qid gsm8k-test-00012: not a problem of gsm8k .*slice .*gsm8k-test-00000"):
        load_dataset("gsm8k", limit=5, qids=["gsm8k-test-00012"])
    with pytest.raises(ConfigError, match="and 1 more"):
        load_dataset("gsm8k", qids=["a", "b", "c", "d"])
    with pytest.raises(ConfigError, match="names no problem"):
        load_dataset("gsm8k", qids=[" "])


def _write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_user_jsonl(tmp_path):
    path = _write(tmp_path, "mine.jsonl", [
        json.dumps({"q": "1+1?", "a": 2}),
        "",
        json.dumps({"q": "2+2?", "a": "4"}),
    ])
    probs = load_dataset(path, question_key="q", answer_key="a")
    assert [(p.qid, p.index, p.gold, p.grader, p.dataset) for p in probs] == [
        ("mine-00000", 0, "2", "numeric", "mine"),
        ("mine-00001", 1, "4", "numeric", "mine"),
    ]
    probs = load_dataset(str(path), question_key="q", answer_key="a", grader="math")
    assert probs[0].grader == "math"
    # a file called test.jsonl takes its folder's name; a row's own id is used
    (tmp_path / "bench").mkdir()
    path = _write(tmp_path / "bench", "test.jsonl", [json.dumps({"id": "p/1", "q": "x", "a": "1"})])
    (p,) = load_dataset(path, question_key="q", answer_key="a")
    assert (p.dataset, p.qid) == ("bench-test", "bench-test-p-1")


def test_user_jsonl_with_unicode_line_separators(tmp_path):
    # raw U+2028 / U+0085 are legal inside JSON strings: they must not split a row
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"q": "one\u2028two\x85three", "a": "5"}, ensure_ascii=False) + "\n", encoding="utf-8")
    (p,) = load_dataset(path, question_key="q", answer_key="a")
    assert p.question == "one\u2028two\x85three" and p.gold == "5"


def test_errors_are_one_clear_line(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown dataset 'gsm9k'.*gsm8k, gsm8k-train, math500"):
        load_dataset("gsm9k")
    with pytest.raises(ConfigError, match=r"not found"):
        load_dataset(tmp_path / "missing.jsonl", question_key="q", answer_key="a")
    good = _write(tmp_path, "d.jsonl", [json.dumps({"q": "x", "a": "1"})])
    with pytest.raises(ConfigError, match=r"needs question_key and answer_key"):
        load_dataset(good)
    with pytest.raises(ConfigError, match=r"needs answer_key"):
        load_dataset(good, question_key="q")
    bad = _write(tmp_path, "bad.jsonl", [json.dumps({"q": "x", "a": "1"}), "{not json"])
    with pytest.raises(ConfigError, match=r"bad\.jsonl line 2 is not valid JSON"):
        load_dataset(bad, question_key="q", answer_key="a")
    with pytest.raises(ConfigError, match=r"line 1 has no answer key 'answer' \(keys present: a, q\)"):
        load_dataset(good, question_key="q", answer_key="answer")
    with pytest.raises(ConfigError, match=r"line 1 has no question key 'question'"):
        load_dataset(good, question_key="question", answer_key="a")
    empty = _write(tmp_path, "empty.jsonl", [""])
    with pytest.raises(ConfigError, match="empty"):
        load_dataset(empty, question_key="q", answer_key="a")
    dup = _write(tmp_path, "dup.jsonl", [json.dumps({"id": 1, "q": "x", "a": "1"})] * 2)
    with pytest.raises(ConfigError, match=r"line 2: id 1 repeats line 1"):
        load_dataset(dup, question_key="q", answer_key="a")
    with pytest.raises(ConfigError, match="grader must be one of numeric, math"):
        load_dataset("gsm8k", grader="exact")
    with pytest.raises(ConfigError, match="limit must be an integer >= 0"):
        load_dataset("gsm8k", limit=-1)
    with pytest.raises(ConfigError, match="sample must be an integer >= 1"):
        load_dataset("gsm8k", sample=0)


def test_bundled_files_are_verbatim_copies():
    if not SHARED.is_dir():
        pytest.skip("shared data folder not present")
    for preset in PRESETS.values():
        bundled = resources.files("easd_local").joinpath("data", *preset.resource.split("/"))
        original = SHARED / preset.resource
        assert hashlib.sha256(bundled.read_bytes()).hexdigest() == hashlib.sha256(
            original.read_bytes()
        ).hexdigest(), preset.resource
