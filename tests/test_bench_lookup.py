"""scripts/bench_lookup.py and its code-editing requests: the request set's shape, the
summary's arithmetic, llama-server's command line, and a smoke run of our half on the tiny
pair (``--quick --no-llama``: CI never builds llama-server). Where llama-server has been built
on the machine, one more test runs llama.cpp's half on the tiny pair too; otherwise it is
skipped. No timing is asserted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_lookup.py"
REQUESTS = REPO / "easd_local" / "data" / "code_edits" / "requests.jsonl"


sys.path.insert(0, str(REPO / "scripts"))
import bench_lookup as bench  # noqa: E402  (a script, not a package)


def test_code_edit_requests():
    rows = [json.loads(line) for line in REQUESTS.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 24
    assert len({r["id"] for r in rows}) == len(rows)
    assert {"Python", "JavaScript", "TypeScript", "Go", "Rust", "C", "Java", "SQL", "Bash"} <= {
        r["language"] for r in rows}
    for r in rows:
        assert set(r) == {"id", "language", "request"}
        code = re.search(r"```\w+\n(.*)\n```", r["request"], re.S)
        assert code, r["id"]
        assert 10 <= code.group(1).count("\n") + 1 <= 40, r["id"]
    assert [q["id"] for q in bench.load_requests("code", 3)] == [r["id"] for r in rows[:3]]
    g = bench.load_requests("gsm8k", 2)
    assert g[0]["id"] == "gsm8k-test-00000" and g[0]["text"].startswith("Janet") and len(g) == 2


def test_methods():
    assert bench.parse_methods("ngram-mod,ngram-simple") == ["target", "ngram-mod", "ngram-simple"]
    assert bench.spec_type("ngram-simple+draft") == "ngram-simple,draft" and bench.spec_type("target") is None
    with pytest.raises(Exception, match="unknown drafter"):
        bench.parse_methods("target,ngram-bogus")


def _row(q, system, method, tok_s, ids, drafted=None, accepted=None):
    return {"request": q, "system": system, "method": method, "tok_s": tok_s, "token_ids": ids,
            "drafted": drafted, "accepted": accepted, "prompt_tokens": 10}


def test_drafters_that_keep_text_across_requests_are_named():
    assert bench.learns("ours", "ngram-mod") and bench.learns("llama", "ngram-mod")
    assert bench.learns("ours", "ngram-simple+ngram-mod")
    assert not any(bench.learns(s, m) for s in ("ours", "llama") for m in ("target", "ngram-simple"))
    assert not bench.learns("ours", "draft") and not bench.learns("ours", "ngram-simple+draft")


def test_summary_ratios_differences_and_vs_llama():
    assert bench.first_diff([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_diff([1, 2, 3], [1, 5, 3]) == 1 and bench.first_diff([1, 2], [1, 2, 3]) == 2
    rows = [_row("a", "ours", "target", 10.0, [1, 2, 3]), _row("a", "ours", "ngram-simple", 15.0, [1, 2, 3], 8, 6),
            _row("b", "ours", "target", 10.0, [4, 5]), _row("b", "ours", "ngram-simple", 9.0, [4, 6], 4, 1),
            _row("a", "llama", "target", 20.0, [1, 2, 3]), _row("a", "llama", "ngram-simple", 24.0, [1, 2, 3], 9, 5),
            _row("b", "llama", "target", 20.0, [4, 5]), _row("b", "llama", "ngram-simple", 30.0, [4, 5], 3, 3)]
    order = ["ours:target", "llama:target", "ours:ngram-simple", "llama:ngram-simple"]
    s = {x["method"]: x for x in bench.summarize(rows, order)}
    assert list(s) == order
    o = s["ours:ngram-simple"]
    assert (o["min"], o["max"], o["median"]) == pytest.approx((0.9, 1.5, 1.2))
    assert (o["accepted"], o["drafted"]) == (7, 12) and o["differs"] == [("b", 1)]
    assert o["vs_llama_median"] == pytest.approx((15 / 24 + 9 / 30) / 2)
    ll = s["llama:ngram-simple"]
    assert ll["median"] == pytest.approx((1.2 + 1.5) / 2) and ll["differs"] == [] and ll["vs_llama_median"] is None


def test_repeats_pair_each_run_with_the_target_beside_it():
    """With --repeats a request's ratio is the median of its rounds' paired ratios: a slow
    round slows the target and the lookup alike and moves no ratio; a request below 0.95x is
    counted; a greedy difference in any round is named."""
    def rr(q, m, n, tok_s, ids=(1, 2)):
        return dict(_row(q, "ours", m, tok_s, list(ids), 2, 1), round=n)
    rows = [rr("a", "target", 0, 10.0), rr("a", "ngram-simple", 0, 13.0),
            rr("a", "target", 1, 5.0), rr("a", "ngram-simple", 1, 6.5),    # a slow round: the same 1.3
            rr("a", "target", 2, 10.0), rr("a", "ngram-simple", 2, 20.0),  # one lucky round
            rr("b", "target", 0, 10.0), rr("b", "ngram-simple", 0, 9.0),
            rr("b", "target", 1, 10.0), rr("b", "ngram-simple", 1, 9.2, (1, 3))]
    s = bench.summarize(rows, ["ours:target", "ours:ngram-simple"])[1]
    assert s["rounds"] == 3 and s["n"] == 2
    assert (s["max"], s["min"]) == pytest.approx((1.3, 0.91))  # medians of (1.3, 1.3, 2.0) and (0.9, 0.92)
    assert s["below"] == 1 and s["differs"] == [("b", 1)]
    assert (s["accepted"], s["drafted"]) == (5, 10)
    # rows written before --repeats (no round) read as round 0
    old = [{k: v for k, v in r.items() if k != "round"} for r in rows if r["round"] == 0]
    assert bench.summarize(old, ["ours:target", "ours:ngram-simple"])[1]["min"] == pytest.approx(0.9)


def test_llama_server_command(tmp_path, monkeypatch):
    seen = {}

    class FakeServer:
        def __init__(self, cmd, log_path, base=None):
            seen.update(cmd=cmd, base=base)

    monkeypatch.setattr(bench.bench_serve, "Server", FakeServer)
    a = Namespace(ctx=4096, threads=2)
    bench.start_llama(Path("llama-server"), Path("t.gguf"), "ngram-simple", a, True, tmp_path / "log")
    cmd = seen["cmd"]
    assert cmd[cmd.index("-t") + 1] == "2" and cmd[cmd.index("-c") + 1] == "4096"
    assert cmd[cmd.index("--cache-ram") + 1] == "0" and "-nr" in cmd
    assert cmd[cmd.index("--spec-type") + 1] == "ngram-simple" and cmd[cmd.index("--spec-draft-n-max") + 1] == "16"
    bench.start_llama(Path("llama-server"), Path("t.gguf"), "target", a, False, tmp_path / "log")
    assert "--spec-type" not in seen["cmd"] and "-nr" not in seen["cmd"]


@pytest.mark.parametrize("verdict", ["crash", "ok"])
def test_bench_serve_tells_llama_server_what_our_loader_decided(tmp_path, monkeypatch, verdict):
    """bench_serve.py's llama-server skips our loader's repacking self-test: where the verdict
    turned repacking off (an AMX CPU whose kernels crash) it gets -nr, else not (the verdict
    forced here, as the suite does where it needs one)."""
    from easd_local.llamacpp import repack

    seen = {}

    class FakeServer:
        def __init__(self, cmd, log_path, base=None):
            seen.update(cmd=cmd)

    monkeypatch.setattr(bench.bench_serve, "Server", FakeServer)
    monkeypatch.setenv(repack.FORCE_ENV, verdict)
    off = bench.bench_serve.repack_off(Path("d.gguf"), Path("t.gguf"), 2)
    assert off is (verdict == "crash")
    a = Namespace(ctx=4096, threads=2, gamma=4, no_repack=off)
    bench.bench_serve.llama_server(Path("llama-server"), Path("d.gguf"), Path("t.gguf"), 1, True, a, tmp_path / "log")
    assert ("-nr" in seen["cmd"]) is off and seen["cmd"][seen["cmd"].index("-md") + 1] == "d.gguf"


def _run(tmp_path, *args, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, EASD_LOCAL_HOME=str(tmp_path / "home"))
    env.pop("EASD_LOCAL_CATALOG", None)
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)


def test_quick_smoke_ours_only_and_resume(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "rows.jsonl"
    base = ["--quick", "--threads", 1, "--draft", tiny_draft, "--target", tiny_target, "--json", out]
    r = _run(tmp_path, *base, "--no-llama", "--methods", "ngram-simple,ngram-mod,draft")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * 4  # 2 requests x (target, ngram-simple, ngram-mod, draft)
    assert {(x["system"], x["method"]) for x in rows} == {
        ("ours", "target"), ("ours", "ngram-simple"), ("ours", "ngram-mod"), ("ours", "draft")}
    assert all(1 <= x["tokens"] <= 16 and x["tok_s"] > 0 for x in rows)
    for text in ("decode tok/s per request", "ours:ngram-simple", "median", "accepted/drafted",
                 "greedy differs from its target", "load average"):
        assert text in r.stdout
    # greedy lookup is lossless on the tiny pair
    assert re.search(r"ours:ngram-simple .* none$", r.stdout, re.M), r.stdout
    assert "load average at start" in r.stderr
    assert "llama-server" not in r.stderr  # nothing built, nothing started
    r = _run(tmp_path, *base, "--no-llama", "--methods", "ngram-simple,ngram-mod,draft", "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resume: 8 rows" in r.stderr and "request 1/2" not in r.stderr
    assert len(out.read_text().splitlines()) == 8 and "ours:ngram-mod" in r.stdout
    # a second round of the same rows: only round 2 runs, the tables pair each round
    r = _run(tmp_path, *base, "--no-llama", "--methods", "ngram-simple,ngram-mod,draft", "--resume", "--repeats", 2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "round 1/2" not in r.stderr and "round 2/2" in r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # ngram-mod keeps text across requests: first round only (a second run would replay the first)
    assert "ours:ngram-mod keep text across requests: first round only" in r.stderr
    assert len(rows) == 8 + 2 * 3 and sorted({x.get("round", 0) for x in rows}) == [0, 1]
    assert {x.get("round", 0) for x in rows if x["method"] == "ngram-mod"} == {0}
    assert "the median of 2 rounds" in r.stdout and "<0.95" in r.stdout
    assert re.search(r"ours:target: its own runs of a request, fastest over slowest: median \d\.\d{3}", r.stdout)


def test_quick_writes_its_own_tiny_pair(tmp_path):
    r = _run(tmp_path, "--quick", "--no-llama", "--threads", 1, "--methods", "ngram-simple", "--limit", 1)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tiny-target" in r.stderr and "ours:ngram-simple" in r.stdout


def test_llama_half_on_tiny_pair_when_built(tmp_path, tiny_draft, tiny_target):
    build = bench.bench_speed.default_build_root() / f"llama-cpp-python-{bench.bench_speed.llama_cpp_python_version()}"
    if not bench.bench_speed.have_tools(build, ("llama-server",)):
        pytest.skip("llama-server not built here (scripts/bench_serve.py or bench_lookup.py without --no-build builds it)")
    out = tmp_path / "rows.jsonl"
    r = _run(tmp_path, "--quick", "--threads", 1, "--draft", tiny_draft, "--target", tiny_target, "--limit", 1,
             "--no-build", "--build-dir", build, "--json", out)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    llama = {x["method"]: x for x in rows if x["system"] == "llama"}
    assert set(llama) == {"target", "ngram-simple", "ngram-mod"}
    assert all(x["tokens"] >= 1 and x["tok_s"] > 0 and x["prompt_n"] == x["prompt_tokens"] for x in llama.values())
    assert "llama:ngram-mod" in r.stdout


def test_replay_prices_what_its_policy_proposed_with_another_curve():
    """``lookup_replay.py --price``: the same proposals, their verifies priced at a measured curve
    rather than the costs the policy decided with."""
    import lookup_replay
    from easd_local.engine.drafters.policy import AcceptanceBook, linear_costs
    from easd_local.pairscore.lookup import simulate

    text = [5, 6, 7, 8] * 12
    sim = simulate([1, 2] + text[:8], text, AcceptanceBook(linear_costs(64, 0.29)))
    assert lookup_replay.priced(sim, linear_costs(64, 0.29)) == pytest.approx(sim.speedup)
    dearer = lookup_replay.priced(sim, linear_costs(64, 0.6))
    assert 0 < dearer < sim.speedup
    want = sim.tokens / sum(n * (1 + 0.6 * k) for k, n in sim.proposals.items())
    assert dearer == pytest.approx(want)


def test_replay_reads_a_curve_or_says_it_is_none(tmp_path):
    import lookup_replay

    good = tmp_path / "c.json"
    good.write_text(json.dumps({"cost_by_tokens": {"1": 1.0, "2": 1.6, "3": 2.1}}))
    assert lookup_replay.read_curve(good) == [1.0, 1.6, 2.1]
    for bad in ("{}", "not json", json.dumps({"cost_by_tokens": {"2": 1.6}}), json.dumps({"cost_by_tokens": {}})):
        (tmp_path / "b.json").write_text(bad)
        assert lookup_replay.read_curve(tmp_path / "b.json") is None
