"""Statistics and report aggregates on a hand-made results file.

Reference values were computed by hand from the formulas written next to them and
cross-checked once with scipy (scipy.stats.binomtest(...).proportion_ci(method="wilson")
and binomtest(min(b, c), b + c, 0.5).pvalue); scipy is not needed to run these tests.
"""

from __future__ import annotations

import io
import json
import sys

import pytest

from easd_local.bench.report import (
    NOTES,
    load_results,
    plot,
    render_markdown,
    render_rich,
    summarize,
)
from easd_local.bench.schema import STAT_FIELDS, empty_stats, make_row, validate_row
from easd_local.bench.stats import mcnemar_exact, wilson_interval
from easd_local.errors import ConfigError

# ------------------------------------------------------------------- stats.py


@pytest.mark.parametrize(
    "k,n,lo,hi",
    [
        # Wilson: centre = (p + z²/2n)/(1 + z²/n), half = z·sqrt(p(1-p)/n + z²/4n²)/(1 + z²/n),
        # z = 1.959964, z² = 3.841459.
        # 8/10: p=.8, 1+z²/n = 1.3841459, centre = (.8 + .1920729)/1.3841459 = .716740,
        #       half = 1.959964·sqrt(.016 + .0096036)/1.3841459 = .226578 -> (.490162, .943318)
        (8, 10, 0.490162, 0.943318),
        # 0/10: centre = .1920729/1.3841459 = .138767 = half -> (0, .277533)
        (0, 10, 0.0, 0.277533),
        # 10/10: mirror image of 0/10
        (10, 10, 0.722467, 1.0),
        # 50/100: centre .5, half = 1.959964·sqrt(.0025 + .00009604)/1.0384146 = .096168
        (50, 100, 0.403832, 0.596168),
        # 3/4: 1+z²/n = 1.9603648, centre = (.75 + .4801824)/1.9603648 = .627527,
        #      half = 1.959964·sqrt(.046875 + .0600228)/1.9603648 = .326886
        (3, 4, 0.300642, 0.954413),
    ],
)
def test_wilson_interval_known_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got[0] == pytest.approx(lo, abs=1e-4)
    assert got[1] == pytest.approx(hi, abs=1e-4)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 7)[0] == 0.0
    assert wilson_interval(7, 7)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


@pytest.mark.parametrize(
    "b,c,p",
    [
        # p = min(1, 2·Σ_{i<=min(b,c)} C(b+c, i) / 2^(b+c))
        (2, 8, 0.109375),  # n=10: 2·(1+10+45)/1024 = 112/1024
        (8, 2, 0.109375),  # symmetric
        (0, 5, 0.0625),  # n=5: 2·1/32
        (3, 3, 1.0),  # n=6: 2·(1+6+15+20)/64 = 84/64 -> capped at 1
        (10, 2, 0.03857421875),  # n=12: 2·(1+12+66)/4096 = 158/4096
        (7, 1, 0.0703125),  # n=8: 2·(1+8)/256 = 18/256
        (8, 1, 0.0390625),  # n=9: 2·(1+9)/512 = 20/512
        (1, 0, 1.0),  # n=1: 2·1/2
        (0, 0, 1.0),  # no discordant pairs
    ],
)
def test_mcnemar_exact_known_values(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p, abs=1e-12)


def test_mcnemar_exact_large_n_uses_exact_arithmetic():
    # 2^1300 overflows a float; the exact sum must still give a finite, sane p.
    # Reference: scipy.stats.binomtest(600, 1300, 0.5).pvalue = 0.006015793861044...
    assert mcnemar_exact(600, 700) == pytest.approx(0.0060157938610449, rel=1e-9)
    assert mcnemar_exact(5000, 5000) == 1.0
    assert mcnemar_exact(0, 3000) == 0.0  # 2/2^3000 underflows to 0.0 without an OverflowError


# ------------------------------------------------------------- results file

CONFIG = {"mode": "x", "max_tokens": 512, "temperature": 0.0}


def _row(dataset, pair, method, qid, correct, **stats):
    full = dict(empty_stats(), stop_reason="eos")
    full.update(stats)
    return make_row(
        dataset=dataset, qid=qid, index=int(qid.rsplit("-", 1)[1]), method=method, pair=pair,
        config=dict(CONFIG, mode=method.split("[")[0]), question="Q?", gold="1",
        completion="\\boxed{1}" if correct else "\\boxed{2}",
        extracted="1" if correct else "2", correct=correct, stats=full,
    )


def _gsm(i):
    return f"gsm8k-test-{i:05d}"


# Group A: gsm8k / default, 5 questions, three methods.
#             q0 q1 q2 q3 q4
# target       T  T  F  T  F   -> 3/5
# sd           T  F  F  T  F   -> 2/5
# easd         T  T  T  F  (torn last line: lost) -> 3/4
TARGET = [True, True, False, True, False]
SD = [True, False, False, True, False]
EASD = [True, True, True, False]
# per-question stats: tokens = draft_accepted + sd_rejections + easd_fires + bonus (the SD identity)
EASD_STATS = [
    dict(tokens=80, drafted=80, draft_accepted=60, sd_rejections=10, easd_fires=2, bonus=8,
         target_calls=20, seconds_draft=1.0, seconds_target=2.0, seconds_controller=0.5,
         seconds_total=4.0, tokens_per_s=20.0),
    dict(tokens=40, drafted=40, draft_accepted=30, sd_rejections=5, easd_fires=0, bonus=5,
         target_calls=10, seconds_draft=0.25, seconds_target=0.5, seconds_controller=0.125,
         seconds_total=1.0, tokens_per_s=40.0),
    dict(tokens=120, drafted=120, draft_accepted=100, sd_rejections=8, easd_fires=3, bonus=9,
         target_calls=20, seconds_draft=1.5, seconds_target=3.0, seconds_controller=0.5,
         seconds_total=6.0, tokens_per_s=20.0),
    dict(tokens=60, drafted=60, draft_accepted=50, sd_rejections=4, easd_fires=1, bonus=5,
         target_calls=10, seconds_draft=1.0, seconds_target=2.0, seconds_controller=0.25,
         seconds_total=4.0, tokens_per_s=15.0),
]
SD_STATS = dict(tokens=50, drafted=40, draft_accepted=30, sd_rejections=8, bonus=12, target_calls=10,
                seconds_draft=0.5, seconds_target=1.5, seconds_controller=0.1, seconds_total=2.5)
TARGET_STATS = dict(tokens=50, target_calls=50, seconds_target=4.8, seconds_total=5.0,
                    stop_reason="max_tokens")


def _aime(i):
    return f"aime24-{60 + i}"


def _write_results(path):
    lines = []
    for i in range(5):
        lines.append(_row("gsm8k", "default", "target", _gsm(i), TARGET[i], **TARGET_STATS))
        lines.append(_row("gsm8k", "default", "sd", _gsm(i), SD[i], **SD_STATS))
        if i < 4:
            lines.append(_row("gsm8k", "default", "easd", _gsm(i), EASD[i], **EASD_STATS[i]))
    # Group B: aime24 / big, 12 questions, sd vs easd[tau_target=1.5]:
    # b0-b2 both right, b3-b10 easd right & sd wrong (8 wins), b11 sd right & easd wrong (1 loss).
    # easd's b5 is written twice: first wrong, then (a resumed run) right; the later row wins.
    for i in range(12):
        sd_ok = i <= 2 or i == 11
        easd_ok = i <= 10
        st = dict(tokens=10, drafted=8, draft_accepted=4, sd_rejections=2, bonus=4, target_calls=2,
                  seconds_total=1.0)
        lines.append(_row("aime24", "big", "sd", _aime(i), sd_ok, **st))
        if i == 5:
            lines.append(_row("aime24", "big", "easd[tau_target=1.5]", _aime(i), False, **st))
        lines.append(_row("aime24", "big", "easd[tau_target=1.5]", _aime(i), easd_ok,
                          **dict(st, easd_fires=1, sd_rejections=1)))
    text = "".join(json.dumps(r) + "\n" for r in lines)
    # the run crashed while writing easd's q4 row: half a line, no newline
    torn = json.dumps(_row("gsm8k", "default", "easd", _gsm(4), True, **EASD_STATS[0]))
    text += torn[: len(torn) // 2]
    path.write_text(text, encoding="utf-8")
    return len(lines)


@pytest.fixture()
def results(tmp_path):
    path = tmp_path / "results.jsonl"
    n = _write_results(path)
    rows = load_results(path)
    assert len(rows) == n
    return rows


def test_torn_last_line_is_skipped_and_counted(results):
    assert results.torn_lines == 1
    assert isinstance(results, list)


def test_corrupt_middle_line_names_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    _write_results(path)
    lines = path.read_text().split("\n")
    lines.insert(3, '{"dataset": "gsm8k", "qid": ')
    path.write_text("\n".join(lines))
    with pytest.raises(ConfigError, match=r"r\.jsonl line 4 is not valid JSON"):
        load_results(path)


def test_invalid_row_names_line_and_field(tmp_path):
    path = tmp_path / "r.jsonl"
    row = _row("gsm8k", "default", "sd", _gsm(0), True, **SD_STATS)
    del row["stats"]["easd_fires"]
    path.write_text(json.dumps(_row("gsm8k", "default", "sd", _gsm(1), True)) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=r"line 2: stats lacks easd_fires"):
        load_results(path)


def test_missing_results_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_results(tmp_path / "nope.jsonl")


def _group(summaries, dataset):
    (g,) = [g for g in summaries if g.dataset == dataset]
    return g


def _method(group, name):
    (m,) = [m for m in group.methods if m.method == name]
    return m


def test_summary_accuracy_and_wilson(results):
    summaries = summarize(results)
    assert [(g.dataset, g.pair) for g in summaries] == [("gsm8k", "default"), ("aime24", "big")]
    g = _group(summaries, "gsm8k")
    assert g.questions == 5 and g.duplicates == 0
    assert [m.method for m in g.methods] == ["target", "sd", "easd"]
    easd = _method(g, "easd")
    assert (easd.n, easd.correct, easd.accuracy) == (4, 3, 0.75)
    # Wilson 3/4 (derivation in test_wilson_interval_known_values)
    assert easd.ci_low == pytest.approx(0.300642, abs=1e-4)
    assert easd.ci_high == pytest.approx(0.954413, abs=1e-4)
    target = _method(g, "target")
    assert (target.n, target.correct, target.accuracy) == (5, 3, 0.6)
    # Wilson 3/5: 1+z²/n = 1.7682918, centre = (.6 + .3841459)/1.7682918 = .556548,
    # half = 1.959964·sqrt(.048 + .0384146)/1.7682918 = .325824 -> (.230724, .882379)
    assert (target.ci_low, target.ci_high) == pytest.approx((0.230724, 0.882379), abs=1e-4)
    assert _method(g, "sd").accuracy == 0.4


def test_summary_rates_and_time_shares(results):
    g = _group(summarize(results), "gsm8k")
    easd = _method(g, "easd")
    # Σtokens = 80+40+120+60 = 300, Σseconds_total = 4+1+6+4 = 15
    assert easd.tokens == 300 and easd.seconds == 15.0
    assert easd.tokens_per_s == pytest.approx(20.0)  # 300/15 (the mean of per-row rates is 23.75)
    assert easd.mean_tokens == pytest.approx(75.0)
    assert easd.speculative
    assert easd.acceptance_rate == pytest.approx(240 / 300)  # Σdraft_accepted / Σdrafted = 0.8
    # Σ(draft_accepted + sd_rejections + easd_fires + bonus) / Σtarget_calls = 300/60
    assert easd.mean_accepted_len == pytest.approx(5.0)
    assert easd.easd_fires_per_100 == pytest.approx(2.0)  # 100·6/300
    assert easd.share_draft == pytest.approx(3.75 / 15)  # 0.25
    assert easd.share_target == pytest.approx(7.5 / 15)  # 0.5
    assert easd.share_controller == pytest.approx(1.375 / 15)
    assert easd.stop_reasons == {"eos": 4}

    sd = _method(g, "sd")
    assert sd.tokens_per_s == pytest.approx(250 / 12.5)  # 20
    assert sd.acceptance_rate == pytest.approx(150 / 200)
    assert sd.mean_accepted_len == pytest.approx((150 + 40 + 0 + 60) / 50)  # 5.0: tokens per verify call
    assert sd.easd_fires_per_100 == 0.0

    target = _method(g, "target")
    assert target.tokens_per_s == pytest.approx(250 / 25)
    assert not target.speculative
    assert target.acceptance_rate is None and target.mean_accepted_len is None
    assert target.easd_fires_per_100 is None
    assert target.share_draft == 0.0 and target.share_target == pytest.approx(24 / 25)
    assert target.stop_reasons == {"max_tokens": 5}


def test_paired_comparisons(results):
    g = _group(summarize(results), "gsm8k")
    easd = _method(g, "easd")
    # vs sd on q0..q3: easd T T T F, sd T F F T -> wins q1 q2, loss q3, both right q0
    c = easd.vs_sd
    assert (c.n, c.wins, c.losses, c.both_right, c.both_wrong) == (4, 2, 1, 1, 0)
    assert c.p_value == 1.0  # n=3: 2·(1+3)/8 = 1 -> capped
    assert (c.accuracy, c.baseline_accuracy) == (0.75, 0.5)
    # vs target on q0..q3: target T T F T -> win q2, loss q3, both right q0 q1
    c = easd.vs_target
    assert (c.n, c.wins, c.losses, c.both_right, c.both_wrong) == (4, 1, 1, 2, 0)
    assert c.p_value == 1.0
    sd = _method(g, "sd")
    assert sd.vs_sd is None
    assert (sd.vs_target.wins, sd.vs_target.losses, sd.vs_target.n) == (0, 1, 5)
    target = _method(g, "target")
    assert target.vs_target is None
    assert (target.vs_sd.wins, target.vs_sd.losses) == (1, 0)

    big = _group(summarize(results), "aime24")
    assert big.questions == 12 and big.duplicates == 1
    assert [m.method for m in big.methods] == ["sd", "easd[tau_target=1.5]"]
    named = _method(big, "easd[tau_target=1.5]")
    assert (named.n, named.correct) == (12, 11)  # the later, correct b5 row won
    assert (named.vs_sd.wins, named.vs_sd.losses, named.vs_sd.both_right) == (8, 1, 3)
    assert named.vs_sd.p_value == pytest.approx(20 / 512)  # 0.0390625
    assert named.vs_target is None
    # Σ(4 + 1 + 1 + 4)·12 / Σ2·12 = 5 tokens per verify; fires 12 per 120 tokens
    assert named.mean_accepted_len == pytest.approx(5.0)
    assert named.easd_fires_per_100 == pytest.approx(10.0)


def test_renderers(results, tmp_path):
    summaries = summarize(results)
    md = render_markdown(summaries)
    assert "### gsm8k · pair default · 5 questions" in md
    assert "| easd | 4 | 75.0% (3) | 30.1–95.4 | 20.0 | 75 | 80.0% | 5.00 | 2.00 | — | 25/50/9 |" in md
    assert "easd[tau_target=1.5]" in md and "+8/-1 p=0.039" in md
    assert "total generated tokens / total wall seconds" in md
    assert render_markdown([]) == ""

    from rich.console import Console

    tables = render_rich(summaries)
    # group A: results table + gate mechanism (sd, easd against target); group B has no target
    assert len(tables) == 3
    buf = io.StringIO()
    console = Console(file=buf, width=250, color_system=None)
    for t in tables:
        console.print(t)
    out = buf.getvalue()
    assert "easd[tau_target=1.5]" in out and "75.0% (3)" in out
    assert NOTES[:20] in out
    assert "gsm8k · pair default · gate mechanism" in out
    # where a user meets EASD's figures, it says that EASD is not lossless (table and Markdown)
    assert "EASD (easd, easd-tf) is not lossless" in " ".join(out.split()) and "EASD (easd, easd-tf) is not lossless" in md


def test_plot_without_matplotlib_says_how_to_install(results, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ConfigError, match=r"pip install 'easd-local\[plot\]'"):
        plot(summarize(results), tmp_path / "p.png")


def test_plot_writes_png(results, tmp_path):
    pytest.importorskip("matplotlib")
    out = plot(summarize(results), tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_schema_roundtrip_and_errors():
    row = _row("gsm8k", "default", "target", _gsm(7), True, tokens=3, seconds_total=0.1)
    assert validate_row(json.loads(json.dumps(row))) == row
    assert set(row["stats"]) == set(STAT_FIELDS)
    assert row["stats"]["drafted"] == 0 and row["stats"]["tau_target"] == 0.0
    bad = json.loads(json.dumps(row))
    bad["correct"] = "yes"
    with pytest.raises(ConfigError, match="correct must be bool"):
        validate_row(bad, "x line 1")
    bad = json.loads(json.dumps(row))
    bad["stats"]["tokens"] = -1
    with pytest.raises(ConfigError, match=r"stats\.tokens must be a whole number >= 0"):
        validate_row(bad)
    bad = json.loads(json.dumps(row))
    bad["stats"]["drafted"] = True
    with pytest.raises(ConfigError, match=r"stats\.drafted must be a number"):
        validate_row(bad)
    del bad["qid"]
    with pytest.raises(ConfigError, match="lacks qid"):
        validate_row(bad)
    # gate off: tau may be infinite (json writes Infinity), never NaN
    ok = json.loads(json.dumps(row))
    ok["stats"]["tau_target"] = float("inf")
    validate_row(json.loads(json.dumps(ok)))
    ok["stats"]["tau_target"] = float("nan")
    with pytest.raises(ConfigError, match="NaN"):
        validate_row(ok)


# ------------------------------------------------------------- gate mechanism


def _mech_row(method, i, completion, extracted, fires, temperature=0.0):
    full = dict(empty_stats(), stop_reason="eos", tokens=10, easd_fires=fires, seconds_total=1.0)
    return make_row(
        dataset="gsm8k", qid=_gsm(i), index=i, method=method, pair="default",
        config=dict(CONFIG, mode=method, temperature=temperature), question="Q?", gold="1",
        completion=completion, extracted=extracted, correct=extracted == "1", stats=full,
    )


def test_gate_mechanism_counts_fires_changes_and_unexplained_differences():
    # q0: no fire, same text; q1: fired, answer changed; q2: fired, same answer other text;
    # q3: no fire yet the text differs (must be reported); q4: easd-tf only (not paired)
    rows = [
        _mech_row("target", 0, "a 1", "1", 0), _mech_row("easd-tf", 0, "a 1", "1", 0),
        _mech_row("target", 1, "b 1", "1", 0), _mech_row("easd-tf", 1, "b 2", "2", 3),
        _mech_row("target", 2, "c 1", "1", 0), _mech_row("easd-tf", 2, "c' 1", "1", 1),
        _mech_row("target", 3, "d 1", "1", 0), _mech_row("easd-tf", 3, "d 1 more", "1", 0),
        _mech_row("easd-tf", 4, "e", "1", 2),
    ]
    [g] = summarize(rows)
    by = {m.method: m for m in g.methods}
    assert by["target"].mechanism is None
    mech = by["easd-tf"].mechanism
    assert (mech.n, mech.fired, mech.texts_changed, mech.answers_changed, mech.changed_without_fire) == (4, 2, 3, 1, 1)
    assert mech.greedy and mech.fired_share == 0.5
    md = render_markdown([g])
    assert "| easd-tf | 4 | 2 (50.0%) | 3 | 1 | 1 |" in md


def test_gate_mechanism_marks_sampled_runs():
    rows = [_mech_row("target", 0, "a", "1", 0, 0.7), _mech_row("easd-tf", 0, "b", "1", 0, 0.7)]
    [g] = summarize(rows)
    mech = [m for m in g.methods if m.method == "easd-tf"][0].mechanism
    assert not mech.greedy and mech.changed_without_fire == 1
    assert "1 (sampled)" in render_markdown([g])


def test_row_without_provenance_and_a_newer_row_of_the_same_problem_count_once():
    old = _mech_row("target", 0, "a 1", "1", 0)
    new = dict(_mech_row("target", 0, "a 2", "2", 0),
               provenance={"env_id": "e1", "env": {"threads": 2},
                           "draft": {"file": "d.gguf", "size": 1, "sha256": "d" * 64},
                           "target": {"file": "t.gguf", "size": 1, "sha256": "t" * 64}})
    [g] = summarize([old, new])
    [m] = g.methods
    assert (m.n, m.correct, g.duplicates) == (1, 0, 1)
