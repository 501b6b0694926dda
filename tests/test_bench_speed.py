"""scripts/bench_speed.py: output parsing of llama.cpp's tools, and an end-to-end smoke run
on the tiny pair that checks the output format only (no timing assertions).

CI never builds llama.cpp's tools (a from-source build of ggml + llama + common takes tens
of minutes on 2 cores, most of CI's budget, to test a benchmark whose numbers CI cannot
judge anyway): the smoke tests run our half (``--ours-only``, and ``--no-build`` with an
empty build dir, which must skip the native half with a note). Where the tools have been
built on the machine (the script's cache), one more test runs the native half on the tiny
pair too; otherwise it is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_speed.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_speed", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_speed"] = mod
    spec.loader.exec_module(mod)
    return mod


bench = _load()

SPEC_OUT = """
main: n_draft = 4
encoded   87 tokens in    0.812 seconds, speed:  107.143 t/s
decoded  130 tokens in    5.123 seconds, speed:   25.376 t/s

n_draft   = 4
n_predict = 130
n_drafted = 120
n_accept  = 98
accept    = 81.667%
"""

COMPLETION_OUT = """
common_perf_print:    sampling time =      12.50 ms
common_perf_print:    samplers time =       5.00 ms /   128 tokens
common_perf_print:        load time =     500.00 ms
common_perf_print: prompt eval time =     800.00 ms /    87 tokens (    9.20 ms per token,   108.75 tokens per second)
common_perf_print:        eval time =    5000.00 ms /   127 runs   (   39.37 ms per token,    25.40 tokens per second)
common_perf_print:       total time =    5900.00 ms /   214 tokens
"""


def test_parse_speculative_simple():
    d = bench.parse_speculative(SPEC_OUT)
    assert d["prompt_tokens"] == 87
    assert (d["tokens"], d["seconds"], d["tokens_per_s"]) == (130, 5.123, 25.376)
    assert (d["n_drafted"], d["n_accept"], d["accept_pct"]) == (120, 98, 81.667)
    assert d["acceptance_rate"] == pytest.approx(98 / 120)
    with pytest.raises(ValueError, match="decoded"):
        bench.parse_speculative("nothing here")


def test_parse_completion():
    d = bench.parse_completion(COMPLETION_OUT)
    assert d["prompt_tokens"] == 87 and d["tokens"] == 127
    assert d["seconds"] == pytest.approx(5.0125)
    assert d["tokens_per_s"] == pytest.approx(127 / 5.0125)
    assert d["eval_tokens_per_s"] == pytest.approx(25.4)
    with pytest.raises(ValueError, match="eval time"):
        bench.parse_completion("common_perf_print: prompt eval time = 1.0 ms / 3 tokens")


def test_native_commands_use_same_settings(tmp_path):
    args = bench.parse_args(["--draft", "d.gguf", "--target", "t.gguf", "--threads", "3", "--gamma", "5",
                             "--max-tokens", "64"])
    tools = {t: tmp_path / t for t in bench.TOOLS}
    sd = bench.native_sd_cmd(tools, args, tmp_path / "p.txt")
    tg = bench.native_target_cmd(tools, args, tmp_path / "p.txt")
    for cmd in (sd, tg):
        assert cmd[cmd.index("-t") + 1] == "3" and cmd[cmd.index("-n") + 1] == "64"
        assert cmd[cmd.index("--temp") + 1] == "0" and cmd[cmd.index("-f") + 1].endswith("p.txt")
        assert cmd[cmd.index("-fa") + 1] == "off"
    assert sd[sd.index("--spec-draft-n-max") + 1] == "5" and sd[sd.index("--draft-p-min") + 1] == "0"
    assert sd[sd.index("--spec-type") + 1] == "draft-simple" and sd[sd.index("-td") + 1] == "3"
    assert "-no-cnv" in tg


def test_summary_ratios():
    R = bench.Run
    runs = [R("ours", "target", 0, 0, 10, 1.0, 10.0), R("llama.cpp", "target", 0, 0, 10, 1.0, 20.0),
            R("ours", "sd", 0, 0, 10, 1.0, 30.0, drafted=8, accepted=6),
            R("llama.cpp", "sd", 0, 0, 10, 1.0, 30.0, drafted=8, accepted=4),
            R("ours", "easd", 0, 0, 10, 1.0, 29.0, drafted=8, accepted=5, extra={"easd_fires": 2}),
            R("ours", "target", 1, 0, 30, 2.0, 15.0)]
    s = bench.summarize(runs)
    c = s["comparisons"]
    assert c["target"]["ratio"]["median"] == pytest.approx(0.5) and c["target"]["met"] is False
    assert c["sd"]["ratio"]["median"] == pytest.approx(1.0) and c["sd"]["met"] is True
    assert c["easd"]["ratio"]["median"] == pytest.approx(29 / 30) and c["easd"]["met"] is True
    assert s["systems"]["ours:sd"]["acceptance_rate"] == pytest.approx(0.75)
    # totals pool tokens and seconds (40 tokens in 3 s), not the runs' rates (mean 12.5)
    assert s["systems"]["ours:target"]["tokens_per_s"] == pytest.approx(40 / 3)
    assert s["systems"]["ours:target"]["acceptance_rate"] is None
    assert s["systems"]["ours:easd"]["easd_fires_per_100"] == pytest.approx(20.0)
    assert s["systems"]["ours:target"]["easd_fires_per_100"] is None
    assert list(s["systems"]) == ["ours:target", "llama.cpp:target", "ours:sd", "llama.cpp:sd", "ours:easd"]


def _run(tmp_path, *args, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, EASD_LOCAL_HOME=str(tmp_path / "home"))
    env.pop("EASD_LOCAL_CATALOG", None)
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)


def _pair_args(tiny_draft, tiny_target):
    return ["--draft", tiny_draft, "--target", tiny_target, "--n-prompts", 2, "--max-tokens", 8, "--reps", 1,
            "--threads", 1, "--ctx", 512]


def test_smoke_ours_only_json(tmp_path, tiny_draft, tiny_target):
    r = _run(tmp_path, *_pair_args(tiny_draft, tiny_target), "--ours-only", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"meta", "summary", "runs"}
    assert len(out["runs"]) == 2 * 3  # 2 prompts × (target, sd, easd)
    assert {(x["system"], x["mode"]) for x in out["runs"]} == {("ours", "target"), ("ours", "sd"), ("ours", "easd")}
    for x in out["runs"]:
        assert x["tokens"] >= 1 and x["tokens_per_s"] > 0
    sy = out["summary"]["systems"]
    assert set(sy) == {"ours:target", "ours:sd", "ours:easd"}
    assert 0 <= sy["ours:sd"]["acceptance_rate"] <= 1 and 0 <= sy["ours:sd"]["controller_share"] <= 1
    comp = out["summary"]["comparisons"]
    assert comp["sd"]["ratio"] is None and comp["target"]["ratio"] is None
    assert comp["easd"]["ratio"]["n"] == 2
    assert any("skipped" in n for n in out["meta"]["notes"])
    assert "llama.cpp" not in r.stderr.replace("llama.cpp half", "")  # nothing built, nothing run


def test_smoke_no_build_skips_native_with_a_note(tmp_path, tiny_draft, tiny_target):
    r = _run(tmp_path, *_pair_args(tiny_draft, tiny_target), "--no-build", "--build-dir", tmp_path / "empty",
             "--save", tmp_path / "out.json")
    assert r.returncode == 0, r.stderr
    assert "not built" in r.stderr and "--no-build" in r.stderr
    for text in ("decoding speed", "ours", "target", "sd", "easd", "tok/s", "ratios per (prompt, rep)",
                 "ours easd / ours sd", "not measured", "median"):
        assert text in r.stdout
    assert not (tmp_path / "empty" / "build").exists()
    saved = json.loads((tmp_path / "out.json").read_text())
    assert set(saved) == {"meta", "summary", "runs"} and len(saved["runs"]) == 6


def test_modes_subset(tmp_path, tiny_draft, tiny_target):
    r = _run(tmp_path, *_pair_args(tiny_draft, tiny_target), "--modes", "sd,easd", "--ours-only", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {x["mode"] for x in out["runs"]} <= {"sd", "easd"} and len(out["runs"]) >= 4
    r = _run(tmp_path, *_pair_args(tiny_draft, tiny_target), "--modes", "bogus")
    assert r.returncode == 2 and "--modes" in r.stderr


def _built_tools_dir() -> Path | None:
    explicit = os.environ.get("EASD_BENCH_LLAMA_BUILD")
    cands = [Path(explicit)] if explicit else []
    cands.append(bench.default_build_root() / f"llama-cpp-python-{bench.llama_cpp_python_version()}")
    return next((c for c in cands if bench.have_tools(c)), None)


def test_native_half_on_tiny_pair_when_built(tmp_path, tiny_draft, tiny_target):
    build = _built_tools_dir()
    if build is None:
        pytest.skip("llama.cpp tools not built here (scripts/bench_speed.py --build-only builds them)")
    r = _run(tmp_path, *_pair_args(tiny_draft, tiny_target), "--n-prompts", 1, "--no-build", "--build-dir", build,
             "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    sy = out["summary"]["systems"]
    assert {"llama.cpp:target", "llama.cpp:sd"} <= set(sy)
    nat = [x for x in out["runs"] if x["system"] == "llama.cpp"]
    assert all(x["tokens"] >= 1 and x["seconds"] > 0 for x in nat)
    sd = next(x for x in nat if x["mode"] == "sd")
    assert sd["drafted"] >= 1 and 0 <= sd["acceptance_rate"] <= 1
    assert out["summary"]["comparisons"]["sd"]["ratio"]["n"] == 1
    assert not any("tokenized" in n for n in out["meta"]["notes"]), out["meta"]["notes"]
