"""Issue 39, item 4: defaults that follow the evidence. A pair's profile carries verdicts
(EASD against a lossless mode: paired wins/losses, p). The default is a lossless way whatever
they say (EASD is never the default); one that shows an EASD mode significantly worse is said
beside "not lossless" wherever that mode is picked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from easd_local.bench import report as rep
from easd_local.bench.verdicts import verdicts
from easd_local.cli import app
from easd_local.engine.modes import mode_info
from easd_local.engine.ways import WAYS, auto_mode
from easd_local.engine.verdict import Verdict, losing
from easd_local.store.catalog import load_catalog
from easd_local.store.profiles import FileId, file_id, find_verdicts, record_verdict

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
EASD = [sys.executable, "-m", "easd_local"]


def _verdict(**kw) -> Verdict:
    base = dict(dataset="gsm8k", problems=1319, method="easd-tf", against="target", accuracy=0.588,
                against_accuracy=0.637, wins=124, losses=189, p=0.0003, temperature=0.0)
    return Verdict(**{**base, **kw})


def test_the_rule():
    worse = _verdict()
    even = _verdict(accuracy=0.58, against_accuracy=0.59, wins=40, losses=43, p=0.83, problems=300)
    assert worse.significant_loss and not even.significant_loss
    assert losing([even, worse]) is worse and losing([even]) is None
    assert not _verdict(method="sd", against="target").significant_loss  # only EASD modes lose this way
    assert not _verdict(wins=189, losses=124, accuracy=0.637, against_accuracy=0.588).significant_loss
    assert worse.summary() == ("EASD (easd-tf) lost 4.9 points against target on GSM8K for this pair (1,319 "
                               "problems, greedy, p < 0.001)")


@pytest.mark.parametrize("results", ["gsm8k-greedy.jsonl", "gsm8k300-t07.jsonl", "math500-greedy.jsonl"])
def test_the_shipped_verdicts_are_what_the_committed_results_give(results):
    """The catalog's verdicts for the default pair are bench report --record-verdict's
    reading of the study's committed results files, to the last digit."""
    rows = rep.load_results(REPO / "results" / "study" / results)
    summaries = rep.summarize(rows)
    got = {(v.verdict.dataset, v.verdict.against, v.verdict.temperature): v.verdict
           for v in verdicts(summaries, rep.latest_rows(rows)[0])}
    shipped = {(v.dataset, v.against, v.temperature): v for v in find_verdicts(None, None, load_catalog().pair("default"))}
    assert got
    for key, v in got.items():
        assert {**shipped[key].to_dict(), "date": ""} == {**v.to_dict(), "date": ""}, key


def test_default_pair_verdict_picks_a_lossless_mode():
    shipped = find_verdicts(None, None, load_catalog().pair("default"))
    worst = losing(shipped)
    assert worst is not None and worst.dataset == "gsm8k" and worst.against == "target"
    # the default is one of the lossless ways, whatever is measured: never EASD
    assert all(mode_info(w.mode).lossless for w in WAYS)
    assert auto_mode(False, True).mode == "target"


def _run(args, home: Path, **env):
    return subprocess.run(EASD + [str(a) for a in args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "EASD_LOCAL_HOME": str(home), **env})


def test_a_recorded_verdict_leaves_the_default_lossless(easd_home, tiny_draft, tiny_target):
    """EASD is not lossless: with or without a verdict the default is a lossless way (here,
    with nothing measured, the target alone); asked for by name it runs."""
    pair = ["-md", tiny_draft, "-m", tiny_target, "--threads", "1", "-n", "4"]
    for verdict in (None, _verdict(), _verdict(wins=40, losses=43, p=0.83, problems=300)):
        if verdict is not None:
            record_verdict(file_id(tiny_draft), file_id(tiny_target), verdict)
        r = _run(["generate", "Hi", *pair, "--json"], easd_home)
        assert r.returncode == 0 and json.loads(r.stdout)["mode"] == "target", r.stderr
    flagged = _run(["generate", "Hi", *pair, "--json", "--mode", "easd-tf"], easd_home)
    obj = json.loads(flagged.stdout)
    assert obj["mode"] == "easd-tf" and obj["auto_mode_reason"] is None and obj["lossless"] is False  # flags win


def test_bench_report_records_the_verdict(easd_home, tiny_draft, tiny_target, tmp_path):
    out = tmp_path / "r.jsonl"
    r = runner.invoke(app, ["bench", "--dataset", "gsm8k", "--limit", "3", "--modes", "target,sd,easd-tf",
                            "--draft", str(tiny_draft), "--target", str(tiny_target), "--max-tokens", "8",
                            "--ctx", "1024", "--threads", "1", "--parallel", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["bench", "report", str(out), "--record-verdict"])
    assert r.exit_code == 0, r.output
    assert r.stdout.count("verdict for ") == 2  # easd-tf against target and against sd
    got = find_verdicts(tiny_draft, tiny_target)
    assert sorted(v.against for v in got) == ["sd", "target"]
    assert all(v.problems == 3 and v.method == "easd-tf" and v.temperature == 0.0 for v in got)
    # a calibration afterwards keeps them
    from easd_local.store.profiles import write_profile

    write_profile(file_id(tiny_draft), file_id(tiny_target), 0.5, 0.5)
    assert len(find_verdicts(tiny_draft, tiny_target)) == 2
    # nothing to compare: one line, exit 2
    only = tmp_path / "t.jsonl"
    only.write_text("".join(ln + "\n" for ln in out.read_text().splitlines() if '"method": "target"' in ln))
    r = runner.invoke(app, ["bench", "report", str(only), "--record-verdict"])
    assert r.exit_code == 2 and "nothing to record" in r.stderr


def test_record_verdict_replaces_the_same_comparison(easd_home):
    d, t = FileId("a" * 64, 10, "d.gguf"), FileId("b" * 64, 20, "t.gguf")
    record_verdict(d, t, _verdict(p=0.5, wins=1, losses=2))
    path = record_verdict(d, t, _verdict())
    data = json.loads(path.read_text())
    assert len(data["verdicts"]) == 1 and data["verdicts"][0]["p"] == 0.0003


def test_picking_an_easd_mode_says_what_this_pairs_comparison_found(easd_home, tiny_draft, tiny_target):
    """Wherever an EASD mode is picked by name, "not lossless" comes with the pair's own
    recorded loss for that mode, if a comparison found it significantly worse (generate's
    note, chat's banner and /mode); not for another mode, not for a loss within noise."""
    pair = ["-md", tiny_draft, "-m", tiny_target, "--threads", "1", "-n", "4"]
    lost = _verdict().summary()
    record_verdict(file_id(tiny_draft), file_id(tiny_target), _verdict())
    r = _run(["generate", "Hi", *pair, "--mode", "easd-tf"], easd_home, COLUMNS="400")
    assert r.returncode == 0 and "not lossless" in r.stderr and lost in r.stderr, r.stderr
    r = _run(["generate", "Hi", *pair, "--mode", "easd"], easd_home, COLUMNS="400")
    assert r.returncode == 0 and "not lossless" in r.stderr and "points" not in r.stderr, r.stderr
    chat = subprocess.run(EASD + ["chat", *map(str, pair), "--mode", "easd-tf"], input="/mode sd\n/mode easd-tf\n",
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "EASD_LOCAL_HOME": str(easd_home), "COLUMNS": "400"})
    said = chat.stdout + chat.stderr
    assert chat.returncode == 0 and said.count(lost) == 2, said  # the banner, then /mode easd-tf
    record_verdict(file_id(tiny_draft), file_id(tiny_target), _verdict(wins=40, losses=43, p=0.83, problems=300))
    r = _run(["generate", "Hi", *pair, "--mode", "easd-tf"], easd_home, COLUMNS="400")
    assert r.returncode == 0 and "not lossless" in r.stderr and "points" not in r.stderr, r.stderr
