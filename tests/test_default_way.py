"""The default way (no --mode) follows what `easd-local pair costs` recorded on this machine:
the fastest lossless way, the draft model loaded only when that way uses it; with nothing
recorded, the target alone and a line saying how to measure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from easd_local.engine.near_ties import ARGMAX_NEAR_TIE
from easd_local.engine.ways import MARGIN, WAY_TABLE, WAYS, choose
from easd_local.pairscore.probe import PROBE_GAMMA
from easd_local.store import costs as store

EASD = [sys.executable, "-m", "easd_local"]


def _run(args, home, **env):
    return subprocess.run(EASD + [str(a) for a in args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "EASD_LOCAL_HOME": str(home), **env})


def test_choose_takes_the_fastest_lossless_way_by_a_margin():
    r = {"target": 1.0, "sd:ngram-simple": 1.4, "sd": 0.6, "sd:ngram-simple+draft": 0.7}
    assert choose(r, True)[0].name == "sd:ngram-simple"
    assert choose({**r, "sd": 1.9}, True)[0].name == "sd"
    assert choose({**r, "sd": 1.9}, False)[0].name == "sd:ngram-simple"  # no draft model: its ways are out
    assert choose({**r, "sd:ngram-simple": 1.0 + MARGIN / 2}, True)[0].name == "target"  # within noise
    way, why = choose({"target": 1.0, "sd:ngram-simple": 0.9}, True)
    assert way.name == "target" and "0.90×" in why
    assert "pair costs" in choose(None, True)[1]
    assert {w.name for w in WAYS} == set(WAY_TABLE) and all(w.mode in ("target", "sd") for w in WAYS)


def _key(draft, target):
    return store.costs_key(draft, target, 1, -1, None)


def _record(draft, target, ratios, home, monkeypatch):
    monkeypatch.setenv("EASD_LOCAL_HOME", str(home))
    store.record(_key(draft, target), {"ratios": ratios, "verify_costs": [1.0, 1.3, 1.6, 1.9, 2.2]})


def test_the_default_follows_the_recorded_costs(tiny_draft, tiny_target, tmp_path, monkeypatch):
    pair = ["-md", tiny_draft, "-m", tiny_target, "--threads", "1", "-n", "6", "--json"]
    r = _run(["generate", "one two one two one two", *pair], tmp_path)
    obj = json.loads(r.stdout)
    assert r.returncode == 0 and obj["mode"] == "target" and "easd-local pair costs" in obj["auto_mode_reason"]
    assert "draft" not in obj["placement"] or obj["placement"]["draft"] is None  # not loaded: nothing uses it

    _record(tiny_draft, tiny_target, {"target": 1.0, "sd:ngram-simple": 1.5, "sd": 0.6,
                                      "sd:ngram-simple+draft": 0.7}, tmp_path, monkeypatch)
    r = _run(["generate", "one two one two one two", *pair], tmp_path)
    obj = json.loads(r.stdout)
    assert (obj["mode"], obj["spec_type"]) == ("sd", "ngram-simple"), r.stderr
    assert "1.50× the target alone" in obj["auto_mode_reason"] and obj["lossless"] is True
    assert "draft" not in obj["placement"] or obj["placement"]["draft"] is None
    assert obj["draft_calls"] == 0

    _record(tiny_draft, tiny_target, {"target": 1.0, "sd:ngram-simple": 1.1, "sd": 1.6,
                                      "sd:ngram-simple+draft": 1.2}, tmp_path, monkeypatch)
    r = _run(["generate", "one two one two one two", *pair], tmp_path)
    obj = json.loads(r.stdout)
    assert (obj["mode"], obj["spec_type"]) == ("sd", "draft") and obj["placement"]["draft"], r.stderr
    # flags win over the recorded default
    r = _run(["generate", "hi", *pair, "--mode", "target"], tmp_path)
    assert json.loads(r.stdout)["mode"] == "target" and json.loads(r.stdout)["auto_mode_reason"] is None


def test_pair_costs_measures_every_way_and_records_it(tiny_draft, tiny_target, tmp_path):
    r = _run(["pair", "costs", "-md", tiny_draft, "-m", tiny_target, "--threads", "1", "-n", "8", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)
    assert set(entry["ratios"]) == set(WAY_TABLE) and entry["ratios"]["target"] == 1.0
    assert all(v > 0 for v in entry["tokens_per_s"].values())
    # each way on each of the four prompts, over the target alone on the same prompt
    assert set(entry["prompt_ratios"]) == set(WAY_TABLE) and entry["prompt_ratios"]["target"] == [1.0] * 4
    assert all(len(v) == 4 and all(x > 0 for x in v) for v in entry["prompt_ratios"].values())
    # timed up to a lookup's longest proposal, not extrapolated (``probe.PROBE_GAMMA``)
    assert entry["texts_differing"]["target"] == 0 and len(entry["verify_costs"]) == PROBE_GAMMA + 1
    # where a lossless way's text parted from the target's: at a near-tie of the target's logits
    assert set(entry["parting_gaps"]) == set(WAY_TABLE) and entry["parting_gaps"]["target"] == []
    for way, gaps in entry["parting_gaps"].items():
        assert len(gaps) <= entry["texts_differing"][way] and all(0 <= g < ARGMAX_NEAR_TIE for g in gaps), way
    recorded = json.loads((tmp_path / store.COSTS_NAME).read_text())
    assert entry["key"] in recorded
    # the next command reads it
    r = _run(["generate", "hi", "-md", tiny_draft, "-m", tiny_target, "--threads", "1", "-n", "4", "--json"], tmp_path)
    way, why = choose(entry["ratios"], True)
    obj = json.loads(r.stdout)
    assert (obj["mode"], obj["spec_type"] if way.mode == "sd" else "draft") == (way.mode, way.spec_type)
    # the reason says when the speeds were measured: an old measurement is one to renew
    assert entry["date"] and obj["auto_mode_reason"] == f"{why}, measured {entry['date']}"


def test_a_parting_is_measured_on_the_targets_own_logits(tiny_target):
    """``ways_measure.parting_gap``: the target alone's logit gap between the two tokens where
    a reply first parts from its own, from a decode of the prompt and the common tokens."""
    from easd_local.llamacpp.runtime import LoadOptions, Model
    from easd_local.pairscore.ways_measure import parting_gap

    with Model(tiny_target, LoadOptions(n_ctx=256, n_threads=1)) as m:
        prompt = m.vocab.tokenize("one two three", add_special=True, parse_special=False)
        ref = [int(m.decode(list(prompt), logits_at=(-1,))[0].argmax())]
        for _ in range(5):
            m.reset()
            ref.append(int(m.decode(list(prompt) + ref, logits_at=(-1,))[0].argmax()))
        m.reset()
        z = m.decode(list(prompt) + ref[:3], logits_at=(-1,))[0]
        assert int(z.argmax()) == ref[3]
        other = int(np.where(np.arange(z.size) == ref[3], -np.inf, z).argmax())  # the runner-up at position 3
        gap = parting_gap(m, list(prompt), ref, ref[:3] + [other, 1, 2], m.n_vocab)
        assert gap == pytest.approx(float(z[ref[3]] - z[other]), abs=1e-4) and gap >= 0
        assert parting_gap(m, list(prompt), ref, list(ref), m.n_vocab) is None  # the same text
        assert parting_gap(m, list(prompt), ref, ref[:4], m.n_vocab) is None  # one ends, the other goes on


def test_pair_costs_says_what_texts_that_differ_mean():
    from easd_local.cli.pair_costs import partings_text

    base = {"texts_differing": {"target": 0, "sd": 2, "sd:ngram-simple": 1}}
    assert partings_text({**base, "texts_differing": {"target": 0, "sd": 0}, "parting_gaps": {}}) is None
    assert partings_text(base) is None  # a record from before the gaps were measured: nothing claimed
    near = partings_text({**base, "parting_gaps": {"target": [], "sd": [0.031, 0.12], "sd:ngram-simple": []}})
    assert "2 of 3 at a near-tie" in near.plain and "within 0.12" in near.plain and "1 where one reply ends" in near.plain
    far = partings_text({**base, "parting_gaps": {"target": [], "sd": [0.031, 1.7], "sd:ngram-simple": [0.2]}})
    assert far.style == "yellow" and far.plain.startswith("sd parted") and "1.70 logits" in far.plain


def test_chat_loads_the_draft_model_when_a_mode_first_needs_it(tiny_draft, tiny_target, tmp_path):
    r = _run(["chat", "-md", tiny_draft, "-m", tiny_target, "--threads", "1", "-n", "4"], tmp_path)
    assert r.returncode == 0
    p = subprocess.run(EASD + ["chat", "-md", str(tiny_draft), "-m", str(tiny_target), "--threads", "1", "-n", "4"],
                       input="hi\n/mode easd\nhello\n", capture_output=True, text=True, timeout=300,
                       env={**os.environ, "EASD_LOCAL_HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for f in (tmp_path / "transcripts").glob("*.jsonl") for x in f.read_text().splitlines()]
    events = [r["event"] for r in rows]
    assert "draft_loaded" in events
    modes = [r["stats"]["mode"] for r in rows if r["event"] == "assistant"]
    assert modes[-1] == "easd"


def test_verify_curve_times_every_length_on_a_real_model(tiny_target, tmp_path):
    """``scripts/verify_curve.py`` (real llama.cpp, the tiny target): one cost per verify length,
    in one-token decodes (the first is 1 by definition); a missing file is one line, exit 2."""
    script = [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "verify_curve.py")]
    r = subprocess.run(script + ["--target", str(tiny_target), "--rows", "5", "--reps", "2", "--threads", "1",
                                 "--json", str(tmp_path / "c.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len([ln for ln in r.stdout.splitlines() if ln.split()[:1] in (["1"], ["5"])]) == 2  # the table's rows
    out = json.loads((tmp_path / "c.json").read_text())
    assert list(out["cost_by_tokens"]) == ["1", "2", "3", "4", "5"] and out["cost_by_tokens"]["1"] == 1.0
    assert all(v > 0 for v in out["ms_by_tokens"].values()) and out["reps"] == 2
    r = subprocess.run(script + ["--target", str(tmp_path / "none.gguf")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    (tmp_path / "afile").write_text("x")  # --json OUT that cannot be written: one line, nothing half-written
    r = subprocess.run(script + ["--target", str(tiny_target), "--rows", "2", "--reps", "1", "--threads", "1",
                                 "--json", str(tmp_path / "afile" / "c.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "afile").read_text() == "x"


def test_doctor_says_the_default_way_and_when_it_was_measured(tiny_draft, tiny_target, tmp_path, monkeypatch):
    """`easd-local doctor`'s "default mode": what a plain `chat` would run on the pair (default
    threads and offload) and why, from the same record, with its date; or how to measure."""
    from easd_local.doctor import default_way
    from easd_local.llamacpp.devices import gpu_offload_supported

    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path))
    if not gpu_offload_supported():
        assert default_way(tiny_draft, tiny_target).startswith("target: no speeds measured")
    assert "easd-local pair costs" in default_way(tiny_draft, tiny_target)
    store.record(store.costs_key(tiny_draft, tiny_target, None, -1, None),
                 {"ratios": {"target": 1.0, "sd:ngram-simple": 1.5, "sd": 0.6}, "date": "2026-12-07 01:00"})
    assert default_way(tiny_draft, tiny_target) == (
        "sd:ngram-simple: sd with prompt lookup: 1.50× the target alone on this machine (sd 0.60×), "
        "measured 2026-12-07 01:00")
    # another thread count is another machine state: not this record
    store.record(store.costs_key(tiny_draft, tiny_target, 1, -1, None) if (os.cpu_count() or 1) > 1 else "other",
                 {"ratios": {"target": 1.0, "sd": 1.9}, "date": "2026-12-07 02:00"})
    assert "sd with prompt lookup" in default_way(tiny_draft, tiny_target)
