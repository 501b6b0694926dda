"""`easd-local bench` end to end on the tiny pair (real llama.cpp): rows, pairs, methods
(--modes / --sweep / --easd-config), custom datasets, resume after a kill (between rows and
mid-row), the report command and its Markdown / PNG outputs.

The tiny models never emit end-of-generation, so every run uses a small --max-tokens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from easd_local.bench import runner as bench_runner
from easd_local.bench.report import load_results
from easd_local.bench.schema import validate_row
from easd_local.cli import app
from easd_local.engine.config import DecodeConfig
from easd_local.errors import ConfigError

runner = CliRunner()
FAST = ["--max-tokens", "12", "--ctx", "1024", "--threads", "1"]


pytestmark = pytest.mark.usefixtures("easd_home")


def bench(*args):
    return runner.invoke(app, ["bench", *[str(a) for a in args]])


def files(draft, target):
    return ["--draft", draft, "--target", target]


def rows_of(path: Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [validate_row(json.loads(line), f"line {i}") for i, line in enumerate(lines, 1)]


def keys_of(rows):
    return [(r["dataset"], r["qid"], r["method"], r["pair"]) for r in rows]


# ------------------------------------------------------------------------ runs


def test_three_problems_three_modes(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", "gsm8k", "--limit", 3, "--modes", "target,sd,easd",
              *files(tiny_draft, tiny_target), *FAST, "--parallel", 1, "--out", out)
    assert r.exit_code == 0, r.output
    rows = rows_of(out)
    assert len(rows) == 9
    pair = f"{tiny_draft.stem}+{tiny_target.stem}"
    # problems outer, methods inner: one problem's methods run back to back
    assert [(r["qid"], r["method"]) for r in rows] == [
        (f"gsm8k-test-{i:05d}", m) for i in range(3) for m in ("target", "sd", "easd")]
    for row in rows:
        assert row["dataset"] == "gsm8k" and row["pair"] == pair and row["grader"] == "numeric"
        s = row["stats"]
        assert s["tokens"] == 12 and s["mode"] == row["method"] == row["config"]["mode"]
        assert row["config"]["max_tokens"] == 12 and row["config"]["temperature"] == 0.0
        # every method paid for its own prompt (caches reset before each generation)
        assert s["prompt_tokens"] > 0 and s["seconds_prompt"] > 0
        assert isinstance(row["completion"], str) and row["correct"] is False
    assert all(r["stats"]["drafted"] == 0 for r in rows if r["method"] == "target")
    assert all(r["stats"]["drafted"] > 0 for r in rows if r["method"] != "target")
    # the report follows the run
    assert f"gsm8k · pair {pair} · 3 questions" in r.stdout
    assert "vs sd" in r.stdout and "easd" in r.stdout
    assert "9 rows" in r.stderr


def test_two_pairs_in_one_run(tmp_path, tiny_draft, tiny_target, tiny_target_q4):
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", "gsm8k", "--limit", 2, "--modes", "target,sd",
              *files(tiny_draft, tiny_target), *files(tiny_draft, tiny_target_q4), *FAST, "--out", out)
    assert r.exit_code == 0, r.output
    rows = rows_of(out)
    labels = [f"{tiny_draft.stem}+{t.stem}" for t in (tiny_target, tiny_target_q4)]
    assert Counter(r["pair"] for r in rows) == {labels[0]: 4, labels[1]: 4}
    assert [r["pair"] for r in rows] == [labels[0]] * 4 + [labels[1]] * 4  # pairs outermost
    assert all(f"pair {lab}" in r.stdout for lab in labels)


def test_sweep_and_easd_configs_make_named_methods(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", "gsm8k", "--limit", 1, "--modes", "sd", "--sweep", "tau-target=0.5,inf",
              "--easd-config", "hot:tau-target=0,tau-draft=0,overlap=0,penalty=0",
              "--easd-config", "tf:mode=easd-tf,tau_target=0.3",
              *files(tiny_draft, tiny_target), *FAST, "--out", out)
    assert r.exit_code == 0, r.output
    rows = {row["method"]: row for row in rows_of(out)}
    assert list(rows) == ["sd", "hot", "tf", "easd[tau_target=0.5]", "easd[tau_target=inf]"]
    assert rows["easd[tau_target=0.5]"]["config"]["tau_target"] == 0.5
    off = rows["easd[tau_target=inf]"]
    assert off["config"]["tau_target"] == "inf" and off["stats"]["easd_fires"] == 0  # strict JSON
    assert off["completion"] == rows["sd"]["completion"]  # gate off = SD
    assert rows["hot"]["config"]["mode"] == "easd" and rows["hot"]["stats"]["easd_fires"] > 0
    assert rows["tf"]["config"]["mode"] == "easd-tf" and rows["tf"]["config"]["tau_target"] == 0.3
    assert rows["hot"]["stats"]["thresholds_source"] == "flags"
    assert rows["sd"]["stats"]["thresholds_source"] == "default"


def _strict_json(line: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def _old_format(row):
    """``row`` as files written before strict JSON held it: the gate settings as bare floats
    (``json.dumps`` writes them as Infinity)."""
    old = json.loads(json.dumps(row))
    for part in (old["config"], old["stats"]):
        for k, v in part.items():
            if v in ("inf", "-inf"):
                part[k] = float(v)
    return old


def test_results_file_is_strict_json_with_gate_off(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "r.jsonl"
    args = ["--dataset", "gsm8k", "--limit", 2, "--modes", "target,sd,easd", "--tau-target", "inf",
            "--easd-config", "on:tau-target=0", *files(tiny_draft, tiny_target), *FAST, "--out", out]
    r = bench(*args)
    assert r.exit_code == 0, r.output
    rows = [_strict_json(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 8
    for row in rows:  # the gate is off, except for "on"
        want = 0.0 if row["method"] == "on" else "inf"
        assert row["config"]["tau_target"] == want and row["stats"]["tau_target"] == want
    assert [validate_row(row) for row in rows] == rows
    r = bench("report", out)
    assert r.exit_code == 0, r.output
    assert "gsm8k · pair" in r.stdout and "vs sd" in r.stdout
    # a file written before strict JSON (bare Infinity) still resumes and reports
    old = [json.dumps(_old_format(row)) for row in rows[:-1]]
    assert "Infinity" in old[0]
    out.write_text("".join(line + "\n" for line in old), encoding="utf-8")
    r = bench(*args, "--resume")
    assert r.exit_code == 0, r.output
    assert "7 already there, 1 to go" in r.stderr and "other settings" not in r.stderr
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 8 and _strict_json(lines[-1])["method"] == rows[-1]["method"]
    assert sorted(keys_of(load_results(out))) == sorted(keys_of(rows))
    assert "gsm8k · pair" in r.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--sweep", "tau-target=abc"], "tau-target needs a number"),
        (["--sweep", "tau-target=0.5,-1"], "tau-target must be >= 0"),
        (["--sweep", "bogus=1,2"], "unknown setting 'bogus'"),
        (["--easd-config", "x:bogus=1"], "unknown setting 'bogus'"),
        (["--easd-config", "x:overlap=2"], "overlap must be in [0, 1]"),
        (["--easd-config", "nocolon"], "expected NAME:key=value"),
        (["--modes", "target,fast"], "unknown mode 'fast'"),
        (["--modes", "easd", "--easd-config", "easd:penalty=0.5"], "two methods are named 'easd'"),
        (["--gamma", "0"], "gamma must be >= 1"),
    ],
)
def test_bad_method_settings_exit_2_before_loading(tmp_path, args, message):
    missing = tmp_path / "nope.gguf"  # never reached: settings are checked first
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", "gsm8k", "--limit", 1, *args, *files(missing, missing), "--out", out)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "not found" not in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_method_parsing():
    ms = bench_runner.build_methods(None, (), ("tau-target=1.5,2", "penalty=0,0.5"))
    assert [m.name for m in ms] == ["easd[tau_target=1.5,penalty=0]", "easd[tau_target=1.5,penalty=0.5]",
                                    "easd[tau_target=2,penalty=0]", "easd[tau_target=2,penalty=0.5]"]
    assert [m.name for m in bench_runner.build_methods(None)] == ["target", "sd", "easd"]
    m = bench_runner.parse_easd_config("cool: mode=easd-tf, top-n=3, lambda=0.5")
    assert m.changes == {"mode": "easd-tf", "top_n": 3, "penalty": 0.5}
    with pytest.raises(ConfigError, match="swept twice"):
        bench_runner.build_methods(None, (), ("tau-target=1", "tau_target=2"))
    # method settings win over flags
    bench_runner.check_methods([m], DecodeConfig(), {"top_n": 10})


def test_custom_jsonl_dataset(tmp_path, tiny_draft, tiny_target):
    data = tmp_path / "mine.jsonl"
    data.write_text("\n".join(json.dumps({"q": f"What is {i} + {i}?", "a": str(2 * i)}) for i in range(3)) + "\n")
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", data, "--question-key", "q", "--answer-key", "a", "--grader", "numeric",
              "--offset", 1, "--modes", "target", "--target", tiny_target, *FAST, "--out", out)
    assert r.exit_code == 0, r.output
    rows = rows_of(out)
    assert [(r["dataset"], r["qid"], r["gold"]) for r in rows] == [("mine", "mine-00001", "2"), ("mine", "mine-00002", "4")]
    assert rows[0]["question"] == "What is 1 + 1?" and rows[0]["pair"] == tiny_target.stem
    r = bench("--dataset", data, "--modes", "target", "--target", tiny_target, "--out", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and "needs question_key and answer_key" in r.output


def test_qid_runs_only_the_named_problems(tmp_path, tiny_target):
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", "gsm8k", "--qid", "gsm8k-test-00005,gsm8k-test-00001", "--qid", "gsm8k-test-00009",
              "--modes", "target", "--target", tiny_target, *FAST, "--out", out)
    assert r.exit_code == 0, r.output
    assert [row["qid"] for row in rows_of(out)] == ["gsm8k-test-00001", "gsm8k-test-00005", "gsm8k-test-00009"]
    r = bench("--dataset", "gsm8k", "--qid", "gsm8k-test-1", "--modes", "target", "--target", tiny_target, *FAST,
              "--out", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and "--qid gsm8k-test-1: not a problem of gsm8k" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "x.jsonl").exists()


def test_missing_dataset_or_out():
    assert "--dataset is missing" in bench("--out", "x.jsonl").output
    r = bench("--dataset", "gsm8k")
    assert r.exit_code == 2 and "--out is missing" in r.output


def test_parallel_rows_equal_one_at_a_time(tmp_path, tiny_draft, tiny_target):
    """--parallel 3: the same rows as --parallel 1 (greedy; up to a near-tie, and on the
    tiny pair none parts them), each written once, with parallel in the provenance."""
    rows = {}
    for n in (1, 3):
        out = tmp_path / f"r{n}.jsonl"
        r = bench("--dataset", "gsm8k", "--limit", 5, "--modes", "target,sd,easd-tf",
                  *files(tiny_draft, tiny_target), *FAST, "--parallel", n, "--out", out)
        assert r.exit_code == 0, r.output
        assert f"{n} sequence{'s' if n > 1 else ''} at a time (--parallel)" in r.stderr and "KV cache" in r.stderr
        rows[n] = {tuple(k): row for k, row in zip(keys_of(rows_of(out)), rows_of(out))}
        assert len(rows[n]) == 15 == len(rows_of(out))
        assert all(row["provenance"]["env"]["parallel"] == n for row in rows[n].values())
    assert rows[1].keys() == rows[3].keys()
    same = sum(rows[1][k]["completion_tokens"] == rows[3][k]["completion_tokens"] for k in rows[1])
    assert same >= 14, f"{15 - same} rows differ between --parallel 1 and 3"
    for k in rows[1]:  # statistics identities hold per row
        s = rows[3][k]["stats"]
        if s["mode"] == "sd":
            assert s["draft_accepted"] + s["sd_rejections"] + s["easd_fires"] + s["bonus"] == s["tokens"]


def test_parallel_that_does_not_fit_is_refused_in_one_line(tmp_path, tiny_draft, tiny_target, monkeypatch):
    from easd_local.llamacpp import runtime

    monkeypatch.setattr(runtime, "available_memory", lambda: 10_000)
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", "gsm8k", "--limit", 2, "--modes", "target", *files(tiny_draft, tiny_target), *FAST,
              "--parallel", 8, "--out", out)
    assert r.exit_code == 2
    assert "KV cache for 8 sequences × 1024 tokens needs" in r.stderr and "lower --parallel or --ctx" in r.stderr
    assert "Traceback" not in r.output and not out.exists()  # no empty results file left behind
    r = bench("--dataset", "gsm8k", "--limit", 2, *files(tiny_draft, tiny_target), *FAST, "--parallel", 0,
              "--out", out)
    assert r.exit_code == 2 and "--parallel must be between 1 and 256" in r.stderr


# ---------------------------------------------------------------------- resume


def _kill_after_rows(args: list[str], out, *, rows: int, wait_s: float) -> None:
    """Run ``easd-local ARGS`` in a subprocess and SIGKILL it once ``out`` holds ``rows`` lines."""
    cmd = [sys.executable, "-c", "from easd_local.cli import main; main()"]
    proc = subprocess.Popen(cmd + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if out.exists() and out.read_bytes().count(b"\n") >= rows:
                break
            time.sleep(0.002)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)


def test_resume_after_sigkill_of_a_parallel_run(tmp_path, tiny_draft, tiny_target):
    """bench --parallel 3 killed with SIGKILL mid-run, then resumed: every row exactly once."""
    out = tmp_path / "r.jsonl"
    args = ["bench", "--dataset", "gsm8k", "--limit", "9", "--modes", "target,sd", "--parallel", "3",
            *map(str, files(tiny_draft, tiny_target)), *FAST, "--out", str(out)]
    _kill_after_rows(args, out, rows=4, wait_s=60)
    data = out.read_bytes()
    before = [json.loads(line) for line in data[: data.rfind(b"\n")].split(b"\n")]  # the complete rows
    assert 4 <= len(before) < 18
    r = runner.invoke(app, args + ["--resume"])
    assert r.exit_code == 0, r.output
    rows = load_results(out)
    assert rows.torn_lines == 0
    expected = [("gsm8k", f"gsm8k-test-{i:05d}", m, f"{tiny_draft.stem}+{tiny_target.stem}")
                for i in range(9) for m in ("target", "sd")]
    got = keys_of(rows)
    assert sorted(got) == sorted(expected) and len(set(got)) == len(got)  # nothing lost, nothing twice
    assert got[: len(before)] == keys_of(before)  # the finished rows kept as they were
    assert "already there" in r.stderr




def test_resume_after_kill_between_rows(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "r.jsonl"
    args = ["bench", "--dataset", "gsm8k", "--limit", "8", "--modes", "target,sd,easd",
            *map(str, files(tiny_draft, tiny_target)), *FAST, "--out", str(out)]
    _kill_after_rows(args, out, rows=2, wait_s=30)
    before = out.read_bytes().count(b"\n")
    assert 2 <= before < 24
    r = runner.invoke(app, args + ["--resume"])
    assert r.exit_code == 0, r.output
    rows = load_results(out)
    assert rows.torn_lines == 0
    expected = [("gsm8k", f"gsm8k-test-{i:05d}", m, f"{tiny_draft.stem}+{tiny_target.stem}")
                for i in range(8) for m in ("target", "sd", "easd")]
    assert sorted(keys_of(rows)) == sorted(expected)  # nothing lost, nothing twice
    assert "already there" in r.stderr


def test_resume_after_torn_line_and_exists_error(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "r.jsonl"
    args = ["--dataset", "gsm8k", "--limit", 2, "--modes", "target,sd", *files(tiny_draft, tiny_target), *FAST,
            "--out", out]
    assert bench(*args).exit_code == 0
    full = out.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(full) == 4
    # without --resume an existing results file is never touched
    r = bench(*args)
    assert r.exit_code == 2 and "exists; use --resume or another --out" in r.output
    assert out.read_text(encoding="utf-8").splitlines(keepends=True) == full
    # killed while writing the third row: half a line, no newline
    out.write_text(full[0] + full[1] + full[2][: len(full[2]) // 2], encoding="utf-8")
    r = bench("report", out)
    assert r.exit_code == 0 and "cut off mid-write" in r.stderr
    r = bench(*args, "--resume")
    assert r.exit_code == 0, r.output
    assert "removed a torn last line" in r.stderr
    rows = load_results(out)
    assert rows.torn_lines == 0 and len(rows) == 4
    assert sorted(keys_of(rows)) == sorted(keys_of(json.loads(line) for line in full))
    assert all(line.endswith("\n") for line in out.read_text(encoding="utf-8").splitlines(keepends=True))
    # resuming a complete file computes nothing; other settings are pointed out
    r = bench(*args, "--resume", "--max-tokens", "8")  # the last --max-tokens wins
    assert r.exit_code == 0, r.output
    assert "warning: 4 rows kept" in r.stderr and "max_tokens 12 -> 8" in r.stderr
    assert len(out.read_text().splitlines()) == 4


def test_results_file_corrupt_middle_line(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"not": "a row"\n{}\n')
    with pytest.raises(ConfigError, match="line 1 is not valid JSON"):
        bench_runner.ResultsFile(out, resume=True)


def test_results_file_must_be_a_regular_file(tmp_path):
    # /dev/full reads without end (the run was killed for memory: a pipe stands in for it, which
    # cannot fill the memory if this check goes), /dev/null keeps no row
    os.mkfifo(tmp_path / "pipe")
    for device in (tmp_path / "pipe", "/dev/null"):
        with pytest.raises(ConfigError, match="is not a regular file"):
            bench_runner.ResultsFile(device, resume=False)


def test_results_file_one_writer(tmp_path):
    out = tmp_path / "sub" / "r.jsonl"  # parent folders are created
    with bench_runner.ResultsFile(out, resume=True):
        with pytest.raises(ConfigError, match="being written by another run"):
            bench_runner.ResultsFile(out, resume=True).open()
    bench_runner.ResultsFile(out, resume=True).open().close()  # released


def _file_size_limit(limit: int):
    """A child's preexec: writes past ``limit`` bytes fail as on a full disk (the kernel
    writes what fits, then refuses with EFBIG; SIGXFSZ ignored so that the process lives)."""
    import resource

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_results_file_full_mid_row(tmp_path, tiny_target):
    """The disk fills up while a row is written: one error line and exit 2, no traceback; the
    file keeps only whole rows, and --resume completes it."""
    out = tmp_path / "r.jsonl"
    args = ["bench", "--dataset", "gsm8k", "--limit", "2", "--modes", "target", "--target", str(tiny_target),
            *FAST, "--parallel", "1", "--out", str(out)]
    cmd = [sys.executable, "-c", "from easd_local.cli import main; main()", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), timeout=300,
                          preexec_fn=_file_size_limit(4000))  # a row is about 2.7 kB: the second one is cut
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cannot write a row to" in proc.stderr and "1 row saved before it" in proc.stderr
    assert "rerun with --resume" in proc.stderr.splitlines()[-1]
    assert out.read_bytes().endswith(b"\n") and len(rows_of(out)) == 1  # nothing half-written
    r = bench(*args[1:], "--resume")
    assert r.exit_code == 0, r.output
    assert [row["qid"] for row in rows_of(out)] == ["gsm8k-test-00000", "gsm8k-test-00001"]


def test_missing_model_file_is_one_line_before_the_results_file(tmp_path, tiny_draft):
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", "gsm8k", "--limit", 1, "--modes", "target,sd", *files(tiny_draft, tmp_path / "gone.gguf"),
              *FAST, "--out", out)
    assert r.exit_code == 2, r.output
    assert "gone.gguf: file not found" in r.stderr and "Traceback" not in r.output
    assert not out.exists()  # checked before the results file is opened


def test_a_model_that_will_not_load_leaves_no_results_file(tmp_path, tiny_draft):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    out = tmp_path / "r.jsonl"
    r = bench("--dataset", "gsm8k", "--limit", 1, "--modes", "target", *files(tiny_draft, bad), *FAST, "--out", out)
    assert r.exit_code == 2, r.output
    assert "error:" in r.stderr and "Traceback" not in r.output
    assert not out.exists()  # the file this run opened, with no row in it, is removed
    kept = tmp_path / "kept.jsonl"
    kept.write_text("")  # a file that was there before the run is the user's: left as it was
    r = bench("--dataset", "gsm8k", "--limit", 1, "--modes", "target", *files(tiny_draft, bad), *FAST, "--out", kept)
    assert r.exit_code == 2 and kept.exists()


# ---------------------------------------------------------------------- report


def test_report_command_markdown_and_plot(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "r.jsonl"
    assert bench("--dataset", "gsm8k", "--limit", 2, "--modes", "target,sd,easd", *files(tiny_draft, tiny_target),
                 *FAST, "--out", out).exit_code == 0
    md = tmp_path / "r.md"
    r = bench("report", out, "--markdown", md)
    assert r.exit_code == 0, r.output
    assert "gsm8k · pair" in r.stdout and "vs target" in r.stdout
    text = md.read_text(encoding="utf-8")
    assert text.startswith("### gsm8k · pair") and "| easd |" in text
    png = tmp_path / "r.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib is not installed")
    r = bench("report", out, "--plot", png)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "r.jsonl"
    out.write_text("")
    r = bench("report", out, "--plot", tmp_path / "p.png")
    assert r.exit_code == 2
    assert "pip install 'easd-local[plot]'" in r.output and len(r.output.strip().splitlines()) == 1


def test_cli_shape(tmp_path, tiny_target):
    r = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "160"})
    assert r.exit_code == 0
    for word in ("--dataset", "--modes", "--sweep", "--easd-config", "--resume", "report", "easd[tau_target=1.5]",
                 "easd and easd-tf are not lossless"):
        assert word in r.stdout
    r = runner.invoke(app, ["bench", "report", "--help"], env={"COLUMNS": "160"})
    assert r.exit_code == 0 and "--markdown" in r.stdout and "--plot" in r.stdout and "--dataset" not in r.stdout
    # run options belong to a run, not to the report
    r = bench("--limit", 3, "report", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and "--limit belongs to a benchmark run" in r.output
    # `bench run` is the explicit spelling of `bench`
    out = tmp_path / "r.jsonl"
    r = bench("run", "--dataset", "gsm8k", "--limit", 1, "--modes", "target", "--target", tiny_target, *FAST,
              "--out", out)
    assert r.exit_code == 0, r.output
    assert len(rows_of(out)) == 1


def test_modes_take_every_way_label_the_tool_prints():
    """`pair costs`, doctor and the banner name the ways ``sd:ngram-simple+draft``: --modes runs
    each under that name (the report's method), its drafters as --spec-type."""
    got = {m.name: m.changes for m in bench_runner.parse_modes("target, SD:ngram-simple,sd:ngram-simple+draft")}
    assert got == {"target": {"mode": "target"}, "sd:ngram-simple": {"mode": "sd", "spec_type": "ngram-simple"},
                   "sd:ngram-simple+draft": {"mode": "sd", "spec_type": "ngram-simple,draft"}}
    with pytest.raises(ConfigError, match="unknown drafter 'nope'"):
        bench_runner.parse_modes("sd:nope")
