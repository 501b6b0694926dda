"""Calibration: the percentile maths on known traces, profiles (write, find, apply and the
precedence flag > user profile > catalog profile > default through resolve_config), and
`easd-local calibrate` end to end on the tiny pair, followed by `generate` using the profile."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from easd_local import calibrate as cal
from easd_local.store import filehash, profiles
from easd_local.store.catalog import ModelEntry, PairEntry
from easd_local.engine.config import DEFAULT_TAU_DRAFT, DEFAULT_TAU_TARGET, DecodeConfig
from easd_local.errors import ConfigError
from easd_local.store.resolve import PairFiles, resolve_config

NO_FLAGS = {"tau_draft": None, "tau_target": None}


@pytest.fixture
def home(easd_home) -> Path:
    return easd_home


@pytest.fixture
def cli(home):
    from typer.testing import CliRunner

    from easd_local.cli import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def _trace(h_d, h_t, ov=None, agree=None, top_n=5) -> cal.Trace:
    tr = cal.Trace(top_n=top_n)
    n = len(h_t)
    tr.extend(0, h_d, h_t, ov if ov is not None else [0.0] * n, agree if agree is not None else [True] * n)
    tr.n_questions = 1
    return tr


# ------------------------------------------------------------------------------ the maths


def test_percentiles_of_a_known_trace():
    vals = list(range(101))  # 0..100: percentile p is exactly p
    assert cal.percentiles(vals, [50, 75, 90, 95, 99]) == {50: 50.0, 75: 75.0, 90: 90.0, 95: 95.0, 99: 99.0}
    # linear interpolation between order statistics (index p/100 * (n-1))
    got = cal.percentiles([4.0, 1.0, 3.0, 2.0], [0, 50, 75, 100])
    assert got == pytest.approx({0: 1.0, 50: 2.5, 75: 3.25, 100: 4.0})
    assert cal.percentiles([1.0, float("nan"), 3.0], [50]) == {50: 2.0}  # NaN ignored
    with pytest.raises(ValueError):
        cal.percentiles([], [50])
    with pytest.raises(ValueError):
        cal.percentiles([1.0], [101])


def test_thresholds_at_takes_each_models_own_percentile():
    h_d = [i / 100 for i in range(101)]  # 0.00 .. 1.00
    h_t = [2 * x for x in h_d]  # 0.00 .. 2.00
    tr = _trace(h_d, h_t)
    assert cal.thresholds_at(tr, 90) == pytest.approx((0.9, 1.8))
    assert cal.thresholds_at(tr, 50) == pytest.approx((0.5, 1.0))
    shuffled = _trace(list(reversed(h_d)), h_t[::-1])
    assert cal.thresholds_at(shuffled, 90) == pytest.approx((0.9, 1.8))


def test_overlap_distribution_and_gate_share():
    tr = _trace([1.0, 1.0, 0.1, 1.0], [1.0, 1.0, 1.0, 0.1], ov=[0.6, 0.4, 1.0, 1.0], agree=[True, False, True, True])
    dist = cal.overlap_distribution(tr)
    assert [o for o, _, _ in dist] == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert [c for _, c, _ in dist] == [0, 0, 1, 1, 0, 2]
    assert sum(s for _, _, s in dist) == pytest.approx(1.0)
    # only position 0 passes all three (H_d >= .5, H_t >= .5, O >= .6); it is an agreeing one
    all_share, acc_share = cal.gate_open_share(tr, 0.5, 0.5, 0.6)
    assert all_share == pytest.approx(1 / 4)
    assert acc_share == pytest.approx(1 / 3)
    s = cal.summary(tr, 0.6, ps=[50])
    assert s["positions"] == 4 and s["max"]["h_draft"] == 1.0 and len(s["overlap"]) == 6


def test_histogram_shares_bins():
    edges, a, b = cal.histogram([0.0, 1.0, 2.0], [0.5, 4.0], bins=4)
    assert edges[0] == 0.0 and edges[-1] == 4.0
    assert a.sum() == 3 and b.sum() == 2


# ------------------------------------------------------------------------------ questions


def test_test_split_presets_are_refused_unless_allowed():
    with pytest.raises(ConfigError, match="test split") as e:
        cal.load_questions("gsm8k", limit=3)
    assert "gsm8k-train" in str(e.value) and "--allow-test-split" in str(e.value)
    name, qs = cal.load_questions("gsm8k", limit=3, allow_test_split=True)
    assert name == "gsm8k" and len(qs) == 3
    name, qs = cal.load_questions("gsm8k-train", limit=2)
    assert name == "gsm8k-train" and qs[0].startswith("Natalia")


def test_jsonl_dataset_with_question_key(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "a?"}\n\n{"prompt": "b?"}\n{"prompt": "c?"}\n')
    assert cal.load_questions(str(f), "prompt", limit=2) == ("mine", ["a?", "b?"])
    with pytest.raises(ConfigError, match="question-key"):
        cal.load_questions(str(f), None)
    with pytest.raises(ConfigError, match="neither a preset"):
        cal.load_questions(str(tmp_path / "nope.jsonl"))


def test_cli_refuses_test_split_before_loading_models(cli, tmp_path):
    r = cli("calibrate", "--draft", tmp_path / "missing-d.gguf", "--target", tmp_path / "missing-t.gguf",
            "--dataset", "gsm8k")
    assert r.exit_code == 2
    assert "test split" in r.output and "missing" not in r.output


# ------------------------------------------------------------------------------ profiles


def _entry(name, path: Path) -> ModelEntry:
    sha = filehash.sha256_of(path)
    return ModelEntry(name=name, file=path.name, size=path.stat().st_size, sha256=sha)


def test_profile_round_trip(home, tiny_draft, tiny_target):
    d, t = profiles.file_id(tiny_draft), profiles.file_id(tiny_target)
    path = profiles.write_profile(d, t, 1.25, 0.75, percentile=90, positions=123, command="easd-local calibrate")
    assert path.parent == home / "profiles" and path.is_file()
    data = json.loads(path.read_text())
    assert data["draft"]["sha256"] == d.sha256 and data["positions"] == 123
    prof = profiles.find_profile(tiny_draft, tiny_target)
    assert prof is not None and prof.kind == "user" and prof.path == path
    assert (prof.tau_draft, prof.tau_target, prof.percentile) == (1.25, 0.75, 90)
    assert profiles.read_profile(path) == prof
    cfg, source = profiles.apply_thresholds(DecodeConfig(), prof, NO_FLAGS)
    assert (cfg.tau_draft, cfg.tau_target) == (1.25, 0.75)
    assert source.startswith("profile (") and str(path) in source
    # the pair the other way round (or another pair) has no profile
    assert profiles.find_profile(tiny_target, tiny_draft) is None


def test_precedence_flag_user_catalog_default(home, tiny_draft, tiny_target):
    spec = PairFiles(draft=tiny_draft, target=tiny_target, label="tiny")
    cfg, source = resolve_config(DecodeConfig(), spec, NO_FLAGS)
    assert (cfg.tau_draft, cfg.tau_target, source) == (DEFAULT_TAU_DRAFT, DEFAULT_TAU_TARGET, "default")

    entry = PairEntry(name="tinypair", draft=_entry("d", tiny_draft), target=_entry("t", tiny_target),
                      profile={"tau_draft": 1.1, "tau_target": 1.2, "percentile": 90})
    cspec = PairFiles(draft=tiny_draft, target=tiny_target, label="tinypair", entry=entry)
    cfg, source = resolve_config(DecodeConfig(), cspec, NO_FLAGS)
    assert (cfg.tau_draft, cfg.tau_target) == (1.1, 1.2)
    assert "catalog pair 'tinypair'" in source

    path = profiles.write_profile(profiles.file_id(tiny_draft), profiles.file_id(tiny_target), 1.5, 1.6,
                                  percentile=95)
    cfg, source = resolve_config(DecodeConfig(), cspec, NO_FLAGS)
    assert (cfg.tau_draft, cfg.tau_target) == (1.5, 1.6)
    assert str(path) in source

    cfg, source = resolve_config(DecodeConfig(), cspec, {"tau_draft": 0.3, "tau_target": None})
    assert (cfg.tau_draft, cfg.tau_target) == (0.3, 1.6)
    assert source.startswith("flags over profile") and str(path) in source
    cfg, source = resolve_config(DecodeConfig(), cspec, {"tau_draft": 0.3, "tau_target": 0.4})
    assert (cfg.tau_draft, cfg.tau_target) == (0.3, 0.4)

    path.unlink()  # back to the catalog's
    cfg, source = resolve_config(DecodeConfig(), cspec, NO_FLAGS)
    assert (cfg.tau_draft, cfg.tau_target) == (1.1, 1.2)


def test_catalog_profile_found_for_plain_paths(home, tmp_path, monkeypatch, tiny_draft, tiny_target):
    """--draft/--target files that are a catalog pair's (same sha256) get its profile."""
    d, t = _entry("tiny-d", tiny_draft), _entry("tiny-t", tiny_target)
    cat = tmp_path / "catalog.toml"
    cat.write_text(
        'schema = 1\ndefault_pair = "tp"\n'
        + "".join(f'[models.{m.name}]\nfile = "{m.file}"\nsize = {m.size}\nsha256 = "{m.sha256}"\n\n' for m in (d, t))
        + '[pairs.tp]\ndraft = "tiny-d"\ntarget = "tiny-t"\n[pairs.tp.profile]\ntau_draft = 0.9\ntau_target = 0.8\n'
    )
    monkeypatch.setenv("EASD_LOCAL_CATALOG", str(cat))
    prof = profiles.find_profile(tiny_draft, tiny_target)
    assert prof is not None and (prof.tau_draft, prof.tau_target) == (0.9, 0.8) and "'tp'" in prof.source
    assert profiles.find_profile(tiny_target, tiny_draft) is None




def test_no_hashing_without_a_candidate_profile(home, monkeypatch, tiny_draft, tiny_target):
    def boom(*a, **k):
        raise AssertionError("hashed although no profile has these sizes")

    monkeypatch.setattr(profiles.filehash, "sha256_of", boom)
    assert profiles.find_profile(tiny_draft, tiny_target) is None


# ------------------------------------------------------------------------------ end to end
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def test_calibrate_end_to_end_then_generate_uses_profile(cli, home, tmp_path, tiny_draft, tiny_target):
    ds = tmp_path / "calib.jsonl"
    ds.write_text(json.dumps({"text": "What is two plus two?"}) + "\n"
                  + json.dumps({"text": "Name three colours."}) + "\n"
                  + json.dumps({"text": "never used (limit 2)"}) + "\n")
    trace = tmp_path / "trace.jsonl"
    r = cli("calibrate", "--draft", tiny_draft, "--target", tiny_target, "--dataset", ds, "--question-key", "text",
            "--limit", 2, "--max-tokens", 16, "--percentile", 90, "--threads", 1, "--ctx", 512, "--json",
            "--trace", trace)
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["questions"] == 2 and 2 <= s["positions"] <= 32
    assert [row["percentile"] for row in s["percentiles"]] == [50, 75, 90, 95, 99]
    for row in s["percentiles"]:
        assert 0 <= row["h_draft"] <= math.log(512) and 0 <= row["h_target"] <= math.log(512)
    assert sum(o["count"] for o in s["overlap"]) == s["positions"]
    prof = s["profile"]
    p90 = next(row for row in s["percentiles"] if row["percentile"] == 90)
    assert prof["tau_draft"] == pytest.approx(p90["h_draft"], abs=1e-4)
    assert prof["tau_target"] == pytest.approx(p90["h_target"], abs=1e-4)
    path = Path(prof["path"])
    assert path.parent == home / "profiles" and path.is_file()
    stored = json.loads(path.read_text())
    assert stored["positions"] == s["positions"] and stored["percentile"] == 90
    assert "easd-local calibrate" in stored["command"] and "--percentile 90" in stored["command"]
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(rows) == s["positions"] and {"h_draft", "h_target", "overlap", "agree"} <= set(rows[0])

    g = cli("generate", "Hello", "--draft", tiny_draft, "--target", tiny_target, "--max-tokens", 8,
            "--threads", 1, "--ctx", 512, "--json")
    assert g.exit_code == 0, g.output
    out = json.loads(g.stdout.strip().splitlines()[-1])
    assert "profile" in out["thresholds_source"] and str(path) in out["thresholds_source"]
    assert out["tau_draft"] == prof["tau_draft"] and out["tau_target"] == prof["tau_target"]

    g = cli("generate", "Hello", "--draft", tiny_draft, "--target", tiny_target, "--max-tokens", 4,
            "--threads", 1, "--ctx", 512, "--json", "--tau-target", 0.123)
    out = json.loads(g.stdout.strip().splitlines()[-1])
    assert out["tau_target"] == 0.123 and out["tau_draft"] == prof["tau_draft"]
    assert out["thresholds_source"].startswith("flags over profile")


def test_calibrate_tables(cli, tmp_path, tiny_draft, tiny_target):
    ds = tmp_path / "q.jsonl"
    ds.write_text('{"question": "Count to five."}\n')
    png = tmp_path / "figs" / "h.png"
    r = cli("calibrate", "--draft", tiny_draft, "--target", tiny_target, "--dataset", ds, "--limit", 1,
            "--max-tokens", 8, "--threads", 1, "--ctx", 512, *(["--png", png] if HAVE_MPL else []))
    assert r.exit_code == 0, r.output
    for text in ("p50", "p99", "H_draft", "H_target", "overlap", "5/5", "histogram", "no profile written"):
        assert text in r.stdout
    if HAVE_MPL:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and [p.name for p in png.parent.iterdir()] == ["h.png"]


def test_collect_in_parallel_equals_one_at_a_time(tiny_draft, tiny_target):
    """--parallel 3: every question's positions and figures as when decoded alone, up to
    llama.cpp's batched numerics: a few hundredths of a nat, until a near-tie parts the
    greedy texts (measured on the tiny pair: at the 15th position of one question), so
    the figures are compared over each question's first 10 positions. A row handed to
    the wrong sequence differs by nats at once."""
    from easd_local.engine.pair import load_pair
    from easd_local.llamacpp.runtime import LoadOptions

    texts = ["The quick brown fox", "Once upon a time there was", "In the beginning", "hello world, hello"]
    with load_pair(tiny_draft, tiny_target, LoadOptions(n_ctx=256, n_threads=1, n_seq=3)) as p:
        prompts = [p.target.vocab.tokenize(t) for t in texts]
        one = cal.collect(p.draft, p.target, prompts, max_tokens=20, chunk=7, n_vocab=p.n_vocab)
        p.target.reset()
        p.draft.reset()
        three = cal.collect(p.draft, p.target, prompts, max_tokens=20, chunk=7, n_vocab=p.n_vocab, parallel=3)
        with pytest.raises(ConfigError, match="--parallel must be between 1 and the models' 3"):
            cal.collect(p.draft, p.target, prompts, parallel=4)
    assert one.question == three.question and one.n_questions == three.n_questions == 4
    assert one.prompt_tokens == three.prompt_tokens
    first = [i for i, q in enumerate(one.question) if i - one.question.index(q) < 10]
    for a, b in ((one.h_target, three.h_target), (one.h_draft, three.h_draft), (one.overlap, three.overlap)):
        diff = max(abs(a[i] - b[i]) for i in first)
        assert diff < 0.1, diff
    assert sum(one.agree[i] != three.agree[i] for i in first) <= 1


def test_thin_tail_warns_when_few_positions_lie_above_a_threshold():
    many = _trace(list(np.linspace(0, 3, 1000)), list(np.linspace(0, 2, 1000)))
    assert cal.thin_tail(many, 90) is None  # 100 positions above each threshold
    assert "leaves 9 positions above" in cal.thin_tail(many, 99.1)
    few = _trace([0.1 * k for k in range(24)], [0.2 * k for k in range(24)])
    warning = cal.thin_tail(few, 90)
    assert "p90 of 24 positions leaves 3 positions above a threshold" in warning


def _calibrate_args(tmp_path, tiny_draft, tiny_target, *extra):
    ds = tmp_path / "q.jsonl"
    ds.write_text('{"question": "Count to five."}\n')
    return ("calibrate", "--draft", tiny_draft, "--target", tiny_target, "--dataset", ds, "--limit", 1,
            "--max-tokens", 8, "--threads", 1, "--ctx", 512, *extra)


def test_thresholds_from_a_small_sample_are_written_with_a_warning(cli, home, tmp_path, tiny_draft, tiny_target):
    r = cli(*_calibrate_args(tmp_path, tiny_draft, tiny_target, "--percentile", 90, "--json"))
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["positions"] <= 8 and "too few for it to be stable" in s["profile"]["warning"]
    stored = json.loads(Path(s["profile"]["path"]).read_text())
    assert stored["warning"] == s["profile"]["warning"]
    assert profiles.read_profile(s["profile"]["path"]).tau_draft == s["profile"]["tau_draft"]
    r = cli(*_calibrate_args(tmp_path, tiny_draft, tiny_target, "--percentile", 90))
    assert r.exit_code == 0 and "warning: p90 of" in r.stderr


@pytest.mark.parametrize("flag", ["--trace", "--png"])
def test_an_output_that_cannot_be_written_is_refused_before_the_run(cli, home, tmp_path, tiny_draft, tiny_target,
                                                                   flag):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    r = cli(*_calibrate_args(tmp_path, tiny_draft, tiny_target, "--percentile", 90, flag, folder))
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert f"{flag}: {folder}: is a folder, not a file" in r.output
    assert not (home / "profiles").exists()  # refused before the run: nothing written


def test_a_profile_that_cannot_be_written_is_one_line_after_the_figures(cli, home, tmp_path, tiny_draft, tiny_target):
    home.mkdir(parents=True)
    (home / "profiles").write_text("not a folder")
    r = cli(*_calibrate_args(tmp_path, tiny_draft, tiny_target, "--percentile", 90))
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "p90" in r.stdout and "H_draft" in r.stdout  # the figures measured are shown
    assert "error: the thresholds were not written" in r.stderr and "wrote profile" not in r.stdout
