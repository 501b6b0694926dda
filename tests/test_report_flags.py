"""The bench report says why an accuracy may mean little (rows cut at max tokens, rows with
no extractable answer) and titles its tables and plots with pair, dataset and settings."""

from __future__ import annotations

import dataclasses

import pytest

from easd_local.bench.report import (flags_text, load_lines, plot, render_markdown, settings_label, speed_note,
                                     summarize)
from easd_local.bench.schema import empty_stats, make_row, validate_row
from easd_local.errors import ConfigError
from easd_local.engine.config import DecodeConfig


def _row(method, i, *, correct, extracted, stop, config=None, seconds=1.0, tokens=10):
    cfg = dataclasses.asdict(DecodeConfig(mode=method if method != "hot" else "easd", max_tokens=64))
    cfg.update(config or {})
    stats = dict(empty_stats(), stop_reason=stop, tokens=tokens, seconds_total=seconds)
    return make_row(dataset="gsm8k", qid=f"gsm8k-test-{i:05d}", index=i, method=method, pair="mine", config=cfg,
                    question="Q?", gold="1", completion="…", extracted=extracted, correct=correct, stats=stats)


def test_truncated_and_unanswered_rows_are_flagged():
    rows = [_row("target", i, correct=i == 0, extracted="1" if i == 0 else "2", stop="eos") for i in range(4)]
    rows += [_row("easd", i, correct=False, extracted=None, stop="length") for i in range(4)]
    rows += [_row("sd", i, correct=False, extracted=None if i < 2 else "3", stop="length" if i == 0 else "eos")
             for i in range(4)]
    (g,) = summarize(rows)
    by = {m.method: m for m in g.methods}
    assert flags_text(by["target"]) == ""
    assert flags_text(by["easd"]) == "4/4 truncated, 4/4 no answer extracted"
    assert flags_text(by["sd"]) == "1/4 truncated, 2/4 no answer extracted"
    md = render_markdown([g])
    assert "| easd | 4 | 0.0% (0) · 4/4 truncated, 4/4 no answer extracted |" in md
    assert "| target | 4 | 25.0% (1) |" in md


def test_titles_carry_pair_dataset_and_settings():
    rows = [_row(m, i, correct=True, extracted="1", stop="eos") for m in ("target", "sd") for i in range(2)]
    assert settings_label(rows) == "greedy · max 64 tokens · gamma 4"
    (g,) = summarize(rows)
    assert "### gsm8k · pair mine · 2 questions · greedy · max 64 tokens · gamma 4" in render_markdown([g])
    sampled = [_row("target", i, correct=True, extracted="1", stop="eos",
                    config={"temperature": 0.7, "top_k": 40, "top_p": 0.95, "max_tokens": 64 + i}) for i in range(2)]
    assert settings_label(sampled) == "temperature 0.7 · top-k 40 · top-p 0.95 · max tokens varies"


def test_plot_title_and_axes_from_zero(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    saved = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **kw: (saved.append(self), real(self, *a, **kw))[1])
    # two methods at nearly the same speed must not land at opposite edges of the plot
    rows = [_row("target", i, correct=True, extracted="1", stop="eos", seconds=1.0) for i in range(3)]
    rows += [_row("sd", i, correct=i > 0, extracted="1", stop="eos", seconds=1.01) for i in range(3)]
    out = plot(summarize(rows), tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ax = saved[0].axes[0]
    assert ax.get_title() == "gsm8k · pair mine\ngreedy · max 64 tokens · gamma 4"
    lo, hi = ax.get_xlim()
    assert lo <= 0 < 9.9 < hi  # tok/s of both (10 and 9.9) sit near the right, on one scale from zero
    assert ax.get_ylim() == (0.0, 100.0)


def test_methods_and_common_select_what_the_report_compares(tmp_path):
    """A sensitivity table: settings that ran on the first problems only, beside methods that
    ran on all of them; --common takes every accuracy on the same problems, --methods picks."""
    import json

    from typer.testing import CliRunner

    from easd_local.bench.report import select_rows
    from easd_local.cli import app
    from easd_local.errors import ConfigError

    rows = [_row("target", i, correct=i % 2 == 0, extracted="1", stop="eos") for i in range(6)]
    rows += [_row("easd", i, correct=True, extracted="1", stop="eos") for i in range(6)]
    rows += [_row("hot", i, correct=False, extracted="2", stop="eos") for i in range(2)]  # first 2 only
    (g,) = summarize(select_rows(rows, common=True))
    assert {m.method: (m.n, m.correct) for m in g.methods} == {"target": (2, 1), "easd": (2, 2), "hot": (2, 0)}
    (g,) = summarize(select_rows(rows, methods=["target", "easd"], common=True))
    assert {m.method: (m.n, m.correct) for m in g.methods} == {"target": (6, 3), "easd": (6, 6)}
    (g,) = summarize(select_rows(rows, methods=["target", "hot"]))
    assert {m.method: m.n for m in g.methods} == {"target": 6, "hot": 2}
    with pytest.raises(ConfigError, match="no rows of method nope"):
        select_rows(rows, methods=["nope"])

    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    md = tmp_path / "r.md"
    r = CliRunner().invoke(app, ["bench", "report", str(path), "--common", "--markdown", str(md)])
    assert r.exit_code == 0, r.output
    text = md.read_text(encoding="utf-8")
    assert "2 questions" in text and "| target | 2 | 50.0% (1) |" in text
    assert "only the problems every shown method answered (--common)" in text
    r = CliRunner().invoke(app, ["bench", "report", str(path), "--methods", "target,nope"])
    assert r.exit_code == 2 and "Traceback" not in r.output and "no rows of method nope" in r.output


def test_load_lines_say_under_what_load_each_method_ran():
    rows = [_row("target", i, correct=True, extracted="1", stop="eos") for i in range(3)]  # before load_avg
    assert load_lines(summarize(rows)) == []  # one method: no speed to compare
    unrecorded = rows + [make_row(**{**_kw(r), "method": "sd"}) for r in rows]
    assert load_lines(summarize(unrecorded)) == [
        "tok/s, gsm8k · pair mine: load not recorded for every row: compare tok/s only between methods run side by side"]
    rows += [make_row(**{**_kw(r), "method": "easd-tf", "load_avg": load}) for r, load in zip(rows, (1.0, 3.0, 2.5))]
    rows.append(make_row(**{**_kw(rows[0]), "method": "sd", "qid": "gsm8k-test-00009", "index": 9, "load_avg": 0.5}))
    (line,) = load_lines(summarize(rows))
    assert "target not recorded" in line and "easd-tf 2.50" in line and "sd 0.50" in line
    assert "(1 of" not in line  # every easd-tf and sd row records one
    assert line.endswith("; load not recorded for every row: compare tok/s only between methods run side by side")
    rows.append(_row("sd", 10, correct=True, extracted="1", stop="eos"))
    assert "sd 0.50 (1 of 2 rows)" in load_lines(summarize(rows))[0]


@pytest.mark.parametrize("loads,note", [((2.0, 2.4), None), ((2.0, 2.6), "medians 2.00–2.60"),
                                        ((None, 2.0), "not recorded for every row")])
def test_speed_note_says_when_tok_s_are_no_speed_comparison(loads, note, tmp_path, monkeypatch):
    """Methods whose rows ran under loads more than LOAD_ALIKE apart, or without a recorded
    load, get a note in the report's load line and on the plot's speed panel."""
    rows = []
    for method, load in zip(("target", "easd-tf"), loads):
        for i in range(2):
            row = _row(method, i, correct=True, extracted="1", stop="eos")
            rows.append(row if load is None else make_row(**{**_kw(row), "load_avg": load}))
    (g,) = summarize(rows)
    got = speed_note(g)
    assert (got is None) if note is None else (note in got)
    assert speed_note(summarize([r for r in rows if r["method"] == "target"])[0]) is None  # one method: nothing to compare
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    saved = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **kw: (saved.append(self), real(self, *a, **kw))[1])
    plot(summarize(rows), tmp_path / "p.png")
    texts = [t.get_text() for t in saved[0].axes[0].texts]
    assert texts == ([] if note is None else [got])


def _kw(row):
    keys = ("dataset", "qid", "index", "method", "pair", "config", "question", "gold", "completion", "extracted",
            "correct", "stats")
    return {k: row[k] for k in keys}


@pytest.mark.parametrize("bad", [-1.0, True, float("nan"), "2.0"])
def test_a_bad_load_avg_is_refused(bad):
    row = _row("target", 0, correct=True, extracted="1", stop="eos")
    with pytest.raises(ConfigError, match="load_avg"):
        validate_row({**row, "load_avg": bad}, "r.jsonl line 1")


def test_loop_period_finds_a_repeating_tail_and_nothing_else():
    import random

    from easd_local.bench.loops import loop_period

    rng = random.Random(3)
    prose = [rng.randrange(1000) for _ in range(600)]
    cycle = [rng.randrange(1000) for _ in range(44)]
    assert loop_period(prose) is None
    assert loop_period(prose + cycle * 10) == 44
    assert loop_period(prose + cycle * 10 + cycle[:7]) == 44  # cut off mid-cycle, as max tokens does
    assert loop_period(prose + cycle * 4) is None  # 176 tokens of repetition: too short to call a loop
    assert loop_period(prose + [5] * 250) == 1
    long_cycle = [rng.randrange(1000) for _ in range(120)]
    assert loop_period(prose + long_cycle * 3) == 120
    assert loop_period(prose + long_cycle * 2) is None  # twice is not yet a loop
    # one stray token inside the tail breaks it
    tail = cycle * 10
    tail[-100] = -1
    assert loop_period(prose + tail) is None
    assert loop_period([]) is None


def test_truncated_rows_in_a_loop_are_told_apart():
    import random

    rng = random.Random(4)
    prose = [rng.randrange(1000) for _ in range(300)]
    cycle = [rng.randrange(1000) for _ in range(30)]
    rows = [_row("target", i, correct=False, extracted=None, stop="length") for i in range(3)]
    rows[0]["completion_tokens"] = prose + cycle * 8  # a loop
    rows[1]["completion_tokens"] = prose  # still going somewhere when cut off
    rows += [_row("target", 3, correct=True, extracted="1", stop="eos")]
    rows[-1]["completion_tokens"] = prose + cycle * 8  # repeats, but it finished: not counted
    for r in rows:
        validate_row(r)
    (g,) = summarize(rows)
    (m,) = g.methods
    assert (m.truncated, m.looping) == (3, 1)  # rows[2] records no token ids: not called a loop
    assert flags_text(m) == "3/4 truncated (1 looping), 3/4 no answer extracted"
    assert "25.0% (1) · 3/4 truncated (1 looping)" in render_markdown([g])


def test_study_reruns_only_the_problems_cut_off_while_still_working(tmp_path, capsys):
    """scripts/truncated_qids.py picks the problems a larger max tokens could change: some row
    stopped on length without a loop; a looping or finished row does not pick its problem."""
    import importlib.util
    import json
    import random
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "truncated_qids", Path(__file__).resolve().parents[1] / "scripts" / "truncated_qids.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    rng = random.Random(5)
    prose = [rng.randrange(1000) for _ in range(300)]
    loop = prose + [rng.randrange(1000) for _ in range(30)] * 8
    rows = []
    for i, (target_stop, target_tokens, other_stop, other_tokens) in enumerate([
            ("eos", prose, "eos", prose),  # 0: both finished
            ("length", loop, "eos", prose),  # 1: target loops: picked only by --looping
            ("eos", prose, "length", prose),  # 2: easd-tf cut off while working
            ("length", prose, "length", loop),  # 3: target cut off while working
            ("length", prose, "eos", prose)]):  # 4: cut off, but only in a superseded row
        for method, stop, tokens in (("target", target_stop, target_tokens), ("easd-tf", other_stop, other_tokens)):
            row = _row(method, i, correct=False, extracted=None, stop=stop)
            row["completion_tokens"] = tokens
            rows.append(row)
    rows.append(_row("target", 4, correct=True, extracted="1", stop="eos"))  # a later rerun of 4's target row
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(validate_row(r)) + "\n" for r in reversed(rows[:2])) +
                    "".join(json.dumps(r) + "\n" for r in rows[2:]), encoding="utf-8")

    def qids(*args):
        assert script.main([str(path), *args]) == 0
        return capsys.readouterr().out.strip()

    assert qids() == "gsm8k-test-00002,gsm8k-test-00003"
    assert qids("--looping", "1") == "gsm8k-test-00001,gsm8k-test-00002,gsm8k-test-00003"
    assert qids("--methods", "target") == "gsm8k-test-00003"
    assert qids("--methods", "target", "--looping", "5") == "gsm8k-test-00001,gsm8k-test-00003"
    assert qids("--methods", "easd-tf", "--looping", "1") == "gsm8k-test-00002,gsm8k-test-00003"  # its 3 loops
    assert script.main([str(path), "--methods", "sd"]) == 2
    assert "no rows of method sd" in capsys.readouterr().err
    assert script.main([str(tmp_path / "missing.jsonl")]) == 2


def test_several_results_files_report_as_one_later_rows_replacing(tmp_path):
    """MATH-500's unfinished problems re-run with more tokens: reported with the first run's
    file, their rows replace the cut-off ones (the title says so and that max tokens varies)."""
    import json

    from typer.testing import CliRunner

    from easd_local.cli import app

    first = [_row(m, i, correct=i == 0, extracted=None if i == 2 else "1", stop="length" if i == 2 else "eos")
             for m in ("target", "easd") for i in range(3)]
    again = [_row(m, 2, correct=m == "target", extracted="1", stop="eos", config={"max_tokens": 128})
             for m in ("target", "easd")]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, rows in ((a, first), (b, again)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    def report(*files):
        md = tmp_path / "r.md"
        r = CliRunner().invoke(app, ["bench", "report", *map(str, files), "--markdown", str(md)])
        assert r.exit_code == 0, r.output
        return md.read_text(encoding="utf-8")

    both = report(a, b)
    assert "3 questions · greedy · max tokens varies · gamma 4, 2 superseded rows" in both
    assert "| target | 3 | 66.7% (2) |" in both and "| easd | 3 | 33.3% (1) |" in both
    assert f"files: {a}, {b} (a later file's row replaces" in both
    # the order decides: the first run's rows given last win again
    assert "| target | 3 | 33.3% (1) · 1/3 truncated, 1/3 no answer extracted |" in report(b, a)
    alone = report(a)
    assert "files:" not in alone and "superseded" not in alone and "max 64 tokens" in alone
    r = CliRunner().invoke(app, ["bench", "report", str(a), str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "missing.jsonl" in r.output and "Traceback" not in r.output


def test_rows_holding_unicode_line_separators_load_whole(tmp_path):
    """json.dumps(ensure_ascii=False), the writer's form, leaves U+2028, U+2029 and U+0085 raw in
    a string; str.splitlines would cut such a row in two and call the file corrupt."""
    import json

    from easd_local.bench.report import load_results

    rows = [_row("target", i, correct=True, extracted="1", stop="eos") for i in range(2)]
    rows[0]["completion"] = "a\u2028b\u2029c\x85d\x1ce"
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    loaded = load_results(path)
    assert len(loaded) == 2 and loaded[0]["completion"] == "a\u2028b\u2029c\x85d\x1ce"


def test_markdown_on_a_full_disk_leaves_the_previous_report_whole(tmp_path):
    """--markdown over an earlier report, on a disk that fills up: one error line, exit 2, and
    the earlier report as it was (not a truncated one); a new report gets the usual permissions."""
    import json
    import os
    import resource
    import signal
    import subprocess
    import sys

    rows = [_row(m, i, correct=True, extracted="1", stop="eos") for m in ("target", "easd") for i in range(2)]
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    md = tmp_path / "r.md"
    md.write_text("the earlier report\n", encoding="utf-8")

    def full_disk():  # writes past 200 bytes fail (EFBIG), as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))

    cmd = [sys.executable, "-c", "from easd_local.cli import main; main()", "bench", "report", str(results),
           "--markdown", str(md)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), timeout=120,
                          preexec_fn=full_disk)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot write {str(md)!r}" in proc.stderr and "Traceback" not in proc.stderr
    assert md.read_text(encoding="utf-8") == "the earlier report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "r.md"]  # no temporary file left

    from typer.testing import CliRunner

    from easd_local.cli import app

    fresh = tmp_path / "new.md"
    umask = os.umask(0o022)
    try:
        r = CliRunner().invoke(app, ["bench", "report", str(results), "--markdown", str(fresh)])
    finally:
        os.umask(umask)
    assert r.exit_code == 0, r.output
    assert fresh.read_text(encoding="utf-8").startswith("### gsm8k · pair mine")
    assert fresh.stat().st_mode & 0o777 == 0o644
