"""Provenance: the file-hash cache, the environment, and what bench rows and `generate
--json` record (tiny pair, real llama.cpp); resuming in another environment."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from easd_local.store import filehash, provenance
from easd_local.bench import runner as bench_runner
from easd_local.bench.schema import row_env_id, row_model_sha, validate_row
from easd_local.cli import app
from easd_local.llamacpp.runtime import LoadOptions

cli_runner = CliRunner()
FAST = ["--max-tokens", "8", "--ctx", "512"]

pytestmark = pytest.mark.usefixtures("easd_home")


def invoke(*args):
    return cli_runner.invoke(app, [str(a) for a in args])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rows_of(path: Path) -> list[dict]:
    return [validate_row(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------ filehash


def test_hash_cache_is_used_and_invalidated(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"x" * 1000)
    sha = filehash.sha256_of(f)
    assert sha == sha256(f) and filehash.lookup(f) == sha
    cache = json.loads(filehash.cache_path().read_text())
    assert cache[str(f.resolve())]["sha256"] == sha
    # a cached entry is trusted while size, mtime and inode are unchanged (never re-read) ...
    cache[str(f.resolve())]["sha256"] = "0" * 64
    filehash.cache_path().write_text(json.dumps(cache))
    assert filehash.sha256_of(f) == "0" * 64
    # ... and recomputed when the file changes
    f.write_bytes(b"GGUF" + b"y" * 1001)
    assert filehash.lookup(f) is None
    assert filehash.sha256_of(f) == sha256(f)


def test_replaced_file_with_same_size_and_mtime_is_rehashed(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"a" * 100)
    filehash.sha256_of(f)
    st = f.stat()
    new = tmp_path / "new.gguf"
    new.write_bytes(b"GGUF" + b"b" * 100)
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, f)  # same size and mtime; another inode
    assert filehash.lookup(f) is None
    assert filehash.sha256_of(f) == sha256(f)


def test_record_and_lookup(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"z" * 10)
    assert filehash.lookup(f) is None
    filehash.record(f, "AB" * 32)
    assert filehash.lookup(f) == "ab" * 32 and filehash.sha256_of(f) == "ab" * 32
    with pytest.raises(ValueError):
        filehash.record(f, "not a hash")


# --------------------------------------------------------------------- environment


def test_environment_fields_and_id():
    env = provenance.environment(LoadOptions(n_ctx=512, n_threads=2, n_batch=256, flash_attn=True))
    d = env.to_dict()
    assert (d["threads"], d["n_ctx"], d["n_batch"], d["n_ubatch"], d["flash_attn"], d["parallel"]) == (
        2, 512, 256, 256, True, 1)
    assert "CPU" in d["backend"] and d["llama_system_info"] and d["llama_cpp_python"]
    assert len(d["machine_id"]) == 12 and d["machine_id"] not in json.dumps(os.uname())
    other = provenance.environment(LoadOptions(n_ctx=512, n_threads=1, n_batch=256, flash_attn=True))
    assert env.env_id != other.env_id and len(env.env_id) == 12
    assert env.env_id == provenance.environment(LoadOptions(n_ctx=512, n_threads=2, n_batch=256, flash_attn=True)).env_id
    assert provenance.env_difference(d, other.to_dict()) == ["threads 2 -> 1"]
    assert provenance.env_difference(d, d) == []
    assert provenance.env_difference(None, d) == ["environment unknown (written before provenance)"]
    # --no-mmap decodes at another speed: recorded, and only when given (earlier rows keep their env_id)
    read = provenance.environment(LoadOptions(n_ctx=512, n_threads=2, n_batch=256, flash_attn=True, mmap=False))
    assert "no_mmap" not in d and read.to_dict()["no_mmap"] is True and read.env_id != env.env_id
    assert read.load_options().mmap is False and env.load_options().mmap is True


# ------------------------------------------------------------------ what results carry


def check_provenance(prov: dict, tiny_draft: Path, tiny_target: Path, threads: int, parallel: int = 1) -> None:
    env = prov["env"]
    for key in ("easd_local", "git_commit", "git_dirty", "llama_cpp_python", "llama_system_info", "backend", "cpu",
                "machine_id", "n_ctx", "threads", "n_batch", "n_ubatch", "flash_attn", "n_gpu_layers",
                "n_gpu_layers_draft", "main_gpu", "parallel"):
        assert key in env, key
    assert env["threads"] == threads and env["n_ctx"] == 512 and env["n_batch"] == 512 and env["n_ubatch"] == 512
    assert env["flash_attn"] is False and env["parallel"] == parallel
    assert prov["env_id"] == provenance.env_id(env)
    assert prov["draft"] == {"file": tiny_draft.name, "size": tiny_draft.stat().st_size, "sha256": sha256(tiny_draft)}
    assert prov["target"] == {"file": tiny_target.name, "size": tiny_target.stat().st_size,
                              "sha256": sha256(tiny_target)}


def test_bench_row_carries_provenance(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "r.jsonl"
    r = invoke("bench", "--dataset", "gsm8k", "--limit", 1, "--modes", "target,easd-tf", "--draft", tiny_draft,
               "--target", tiny_target, *FAST, "--threads", 1, "--parallel", 2, "--out", out)
    assert r.exit_code == 0, r.output
    rows = rows_of(out)
    assert len(rows) == 2
    for row in rows:
        check_provenance(row["provenance"], tiny_draft, tiny_target, threads=1, parallel=2)
        assert row_model_sha(row, "target") == sha256(tiny_target)
        assert len(row["completion_tokens"]) == row["stats"]["tokens"] == 8
        assert row["load_avg"] == pytest.approx(os.getloadavg()[0], abs=5.0) and row["load_avg"] >= 0
    assert row_env_id(rows[0]) == row_env_id(rows[1])
    # gate margin: the target alone decides nothing; easd-tf evaluates the gate at every position
    target, tf = rows
    assert (target["stats"]["gate_decisions"], target["stats"]["gate_near_share"]) == (0, None)
    assert tf["stats"]["gate_decisions"] == 8 and 0 <= tf["stats"]["gate_near"] <= 8
    assert tf["stats"]["gate_margin"] == 0.05
    # the report says under what load each method's tok/s were measured, on screen and in markdown
    md = tmp_path / "r.md"
    r = invoke("bench", "report", out, "--markdown", md)
    assert r.exit_code == 0, r.output
    note = f"target {target['load_avg']:.2f} · easd-tf {tf['load_avg']:.2f}"
    assert "note: load (median 1-minute load average" in r.stdout and note in r.stdout.replace("\n", " ")
    assert note in md.read_text()


def test_each_row_records_its_own_load(tmp_path, tiny_draft, tiny_target, monkeypatch):
    """The load is read as each row finishes, not once per run (a cached first reading made
    every row of an hour-long run carry the load of its first minute)."""
    readings = iter(float(i) for i in range(1, 100))
    monkeypatch.setattr(os, "getloadavg", lambda: (next(readings), 0.0, 0.0))
    out = tmp_path / "r.jsonl"
    r = invoke("bench", "--dataset", "gsm8k", "--limit", 3, "--modes", "target", "--target", tiny_target, *FAST,
               "--threads", 1, "--out", out)
    assert r.exit_code == 0, r.output
    loads = [row["load_avg"] for row in rows_of(out)]
    assert len(loads) == 3 and len(set(loads)) == 3 and loads == sorted(loads)


def test_generate_json_carries_provenance(tiny_draft, tiny_target):
    r = invoke("generate", "Hello", "--draft", tiny_draft, "--target", tiny_target, *FAST, "--threads", 2, "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    check_provenance(obj["provenance"], tiny_draft, tiny_target, threads=2)
    assert len(obj["completion_tokens"]) == obj["tokens"]


def test_resume_in_another_environment_notes_or_refuses(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "r.jsonl"
    common = ["bench", "--dataset", "gsm8k", "--modes", "target", "--draft", tiny_draft, "--target", tiny_target,
              *FAST, "--out", out]
    assert invoke(*common, "--limit", 1, "--threads", 1).exit_code == 0
    # same environment: no note
    r = invoke(*common, "--limit", 1, "--threads", 1, "--resume")
    assert r.exit_code == 0 and "environment" not in r.stderr
    # --strict-env refuses, in one line, before anything runs
    r = invoke(*common, "--limit", 2, "--threads", 2, "--resume", "--strict-env")
    assert r.exit_code == 2
    assert "threads 1 -> 2" in r.stderr and "--strict-env refuses" in r.stderr and "Traceback" not in r.output
    assert len(rows_of(out)) == 1
    # without it: one note naming the difference, and the run continues
    r = invoke(*common, "--limit", 2, "--threads", 2, "--resume")
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.stderr.splitlines() if "environment" in ln]
    assert len(notes) == 1 and "threads 1 -> 2" in notes[0] and "1 of the file's 1 rows" in notes[0]
    rows = rows_of(out)
    assert [row["provenance"]["env"]["threads"] for row in rows] == [1, 2]


def test_env_mismatch_names_rows_without_provenance():
    env = provenance.environment(LoadOptions(n_ctx=512, n_threads=1))
    old = {"stats": {}}
    line = bench_runner.env_mismatch([old, {"provenance": {"env_id": env.env_id, "env": env.to_dict()}}], env)
    assert line is not None and "1 of the file's 2 rows record no environment" in line
    assert bench_runner.env_mismatch([{"provenance": {"env_id": env.env_id, "env": env.to_dict()}}], env) is None
    assert bench_runner.env_mismatch([], env) is None


# ------------------------------------------------------------------------ the report


def test_report_names_a_mix_of_environments(tmp_path, tiny_draft, tiny_target):
    out = tmp_path / "r.jsonl"
    common = ["bench", "--dataset", "gsm8k", "--draft", tiny_draft, "--target", tiny_target, *FAST, "--out", out]
    assert invoke(*common, "--modes", "target", "--limit", 2, "--threads", 1).exit_code == 0
    r = invoke("bench", "report", out)
    assert r.exit_code == 0 and "environment" not in r.output  # one environment: no warning
    # target rows of problems 0-1 with one thread; everything else with two
    r = invoke(*common, "--modes", "target,easd-tf", "--limit", 3, "--threads", 2, "--resume")
    assert r.exit_code == 0, r.output
    r = invoke("bench", "report", out)
    assert r.exit_code == 0, r.output
    head = r.stdout.split("gsm8k · pair")[0]  # above the table
    assert "these rows come from 2 environments" in head and ": 4 rows" in head and ": 2 rows" in head
    assert "threads 2 / 1" in head or "threads 1 / 2" in head
    assert "--same-env" in head
    assert "n=" not in r.stdout  # all three problems paired
    # --same-env: only problem 2 has its target and easd-tf rows in one environment
    r = invoke("bench", "report", out, "--same-env")
    assert r.exit_code == 0, r.output
    assert "n=1" in r.stdout and "same environment only" in r.stdout
    md = tmp_path / "r.md"
    assert invoke("bench", "report", out, "--markdown", md).exit_code == 0
    assert md.read_text().startswith("> these rows come from 2 environments")


def _row(qid, method, correct, env=None, target_sha=None, stats=None):
    from easd_local.bench.schema import make_row

    prov = None
    if env is not None:
        prov = {"env_id": provenance.env_id(env), "env": env, "draft": None,
                "target": {"file": "t.gguf", "size": 1, "sha256": target_sha or "a" * 64}}
    return make_row(dataset="d", qid=qid, index=0, method=method, pair="p", config={"mode": method}, question="q",
                    gold="1", completion="c", extracted=None, correct=correct, stats=stats or {}, provenance=prov)


def test_report_groups_by_model_files_and_counts_unknown_environments():
    from easd_local.bench import report as rep

    e1 = {"threads": 1, "git_commit": "1234567890"}
    rows = [_row("q1", "target", True), _row("q2", "target", False),  # before provenance
            _row("q1", "easd", True, e1, stats={"gate_decisions": 4, "gate_near": 1}),
            _row("q2", "easd", True, e1, stats={"gate_decisions": 6, "gate_near": 1})]
    mix = rep.environments(rows)
    assert mix.mixed and dict(mix.rows) == {provenance.env_id(e1): 2, "unknown": 2} and mix.differing == {}
    lines = rep.env_lines(mix)
    assert any("written before provenance" in ln for ln in lines)
    # rows without files join the pair's one set of recorded files: one group, paired on both qids
    (g,) = rep.summarize(rows)
    easd = next(m for m in g.methods if m.method == "easd")
    assert easd.vs_target.n == 2 and (easd.vs_target.wins, easd.vs_target.losses) == (1, 0)
    assert easd.gate_near_share == pytest.approx(0.2)  # Σ near / Σ decisions
    assert next(m for m in g.methods if m.method == "target").gate_near_share is None  # old rows: not recorded
    (g,) = rep.summarize(rows, same_env=True)  # an unknown environment matches nothing
    assert next(m for m in g.methods if m.method == "easd").vs_target.n == 0
    # the target file changed: a group per set of files; rows that name none can no longer join one
    rows.append(_row("q1", "easd", False, e1, target_sha="b" * 64))
    groups = rep.summarize(rows)
    assert [g.files for g in groups] == ["files not recorded", "target aaaaaaaa", "target bbbbbbbb"]
    assert [g.questions for g in groups] == [2, 2, 1]


def test_paths_with(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"q" * 10)
    sha = filehash.sha256_of(f)
    assert filehash.paths_with(sha) == [f.resolve()]
    f.write_bytes(b"GGUF" + b"r" * 11)
    assert filehash.paths_with(sha) == [] and filehash.paths_with(sha, unchanged_only=False) == [f.resolve()]
    f.unlink()
    assert filehash.paths_with(sha, unchanged_only=False) == []
