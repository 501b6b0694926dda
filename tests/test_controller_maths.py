"""The controller's maths at the real vocabulary (issue 46): entropy, top-N sets, the plain
sampling distribution, the residual and sampling computed the fast way equal the plain
full-vocabulary way they replaced, to 1e-5, on rows 151,936 wide with extremes (-inf logits,
one-hot rows, ties); and ``scripts/bench_controller.py --json`` reports every mode.

The reference implementations below are the earlier code, kept here verbatim as the law.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from easd_local.engine import gate, rules
from easd_local.engine.dist import Sparse

V = 151_936
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the earlier code
def old_entropy(z):
    z = np.atleast_2d(z)
    d = z - z.max(axis=-1, keepdims=True)
    e = np.exp(d)
    s = e.sum(axis=-1, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        np.multiply(e, d, out=d)
    t = d.sum(axis=-1, dtype=np.float64)
    for i in np.flatnonzero(np.isnan(t)):
        zi = z[i] - z[i].max()
        ei = np.exp(zi)
        t[i] = np.multiply(ei, zi, out=np.zeros_like(ei), where=ei > 0).sum(dtype=np.float64)
    return np.log(s) - t / s


def old_softmax(z, T):
    zt = z / z.dtype.type(T) if T != 1.0 else z
    e = zt - zt.max(axis=-1, keepdims=True)
    np.exp(e, out=e)
    e *= (1.0 / e.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(e.dtype)
    return e


def old_residual(p, q):
    r = np.maximum(p - q, 0)
    s = r.sum(dtype=np.float64)
    return r / r.dtype.type(s) if s > 0 else p.copy()


def old_cdf(p):
    cs = np.cumsum(p, dtype=np.float64)
    return cs / cs[-1]


def stable_top(z, n):
    """The top-N set with ties broken toward the lower id (what ``_top_n_sets`` promises)."""
    return np.sort(np.argsort(-z, axis=-1, kind="stable")[..., :n], axis=-1)


# ------------------------------------------------------------------ rows
def rows(seed: int = 0) -> np.ndarray:
    """Real-vocabulary rows: LM-like (a bulk 20+ nats below a few leaders), Gaussian, with -inf
    logits, one-hot (one finite logit), a flat row, and rows with ties at the top."""
    rng = np.random.default_rng(seed)
    out = []
    lm = rng.normal(-3.0, 2.0, V).astype(np.float32)
    lm[rng.integers(0, V, 40)] += rng.uniform(15, 24, 40).astype(np.float32)
    out.append(lm)
    out.append((rng.standard_normal(V) * 3).astype(np.float32))
    masked = (rng.standard_normal(V) * 2).astype(np.float32)
    masked[rng.random(V) < 0.3] = -np.inf
    out.append(masked)
    onehot = np.full(V, -np.inf, dtype=np.float32)
    onehot[12345] = 3.0
    out.append(onehot)
    out.append(np.zeros(V, dtype=np.float32))  # every token tied
    ties = np.round(rng.standard_normal(V) * 2).astype(np.float32)  # ties at every value
    ties[[5, 70_000, 151_935]] = 9.0  # three tied leaders across blocks
    out.append(ties)
    peaked = rng.normal(-40.0, 3.0, V).astype(np.float32)
    peaked[777] = 10.0
    out.append(peaked)
    return np.stack(out)


Z = rows()


def test_entropy_matches_the_old_way():
    h = gate.entropy(Z)
    np.testing.assert_allclose(h, old_entropy(Z), rtol=0, atol=1e-5)
    assert h[3] == 0.0 and abs(h[4] - math.log(V)) < 1e-5
    for i, z in enumerate(Z):  # one row at a time: the same figure
        assert abs(float(gate.entropy(z)) - h[i]) < 1e-9


def confident_rows(seed: int = 1) -> list[np.ndarray]:
    """Rows like a real model's at its usual positions: a handful of leaders, a few hundred
    tokens within 20 nats of the best, the bulk 25-40 nats below (measured on the default
    target: a median of 11 tokens within 12 nats, 1,139 within 20)."""
    rng = np.random.default_rng(seed)
    out = []
    for gap in (0.0, 0.3, 1.0, 2.0, 4.0, 8.0, 15.0):
        z = rng.normal(-10.0, 4.0, V).astype(np.float32)
        z[rng.integers(0, V, 300)] += 12.0
        z[100], z[2000] = 25.0, 25.0 - gap
        out.append(z)
    masked = out[3].copy()
    masked[rng.random(V) < 0.3] = -np.inf
    masked[100] = 25.0
    out.append(masked)
    return out


def test_entropy_bounds_hold_the_exact_figure():
    for z in confident_rows():
        lo, est, hi = gate.entropy_bounds(z)
        h = float(gate.entropy(z))
        assert lo - 1e-9 <= h <= hi + 1e-9 and lo <= est <= hi
        assert hi - lo < 0.01
    assert gate.entropy_bounds(Z[1]) is None  # a Gaussian row: its head is most of it


@pytest.mark.parametrize("tau", [0.0, 0.05, 0.3, 0.6, 0.75, 1.0, 2.0, math.inf])
def test_entropy_against_a_threshold_decides_as_the_exact_figure(tau):
    """The same side of tau as the exact entropy on every row; the exact bits where the bounds
    do not settle it (and on narrow rows, so the tiny pair's pinned figures stand)."""
    for z in [*confident_rows(), *Z]:
        h = float(gate.entropy(z))
        got = gate.entropy_against(z, tau)
        assert (got >= tau) == (h >= tau), (tau, h, got)
        assert abs(got - h) < 0.01 or (math.isnan(h) and math.isnan(got))
    for z in confident_rows():
        h = float(gate.entropy(z))
        assert gate.entropy_against(z, h) == h  # at the threshold itself: exact
        assert gate.entropy_against(z[:2000], tau) == float(gate.entropy(z[:2000]))  # narrow: exact


def test_the_screen_given_the_rows_maximum_is_the_screen_that_finds_it():
    """Greedy steps hand the screen the logit of the argmax they took (one pass fewer over
    the row): the very same bounds and figure, on every row the steps can meet."""
    for z in [*confident_rows(), *Z]:
        top = z[int(z.argmax())]
        assert gate.entropy_bounds(z, top) == gate.entropy_bounds(z)
        for tau in (0.3, 0.6, 0.75):
            a, b = gate.entropy_against(z, tau, top), gate.entropy_against(z, tau)
            assert a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("n", [1, 5, 20])
def test_top_n_sets_match_a_full_sort(n):
    got = np.sort(gate.top_n_sets(Z, n), axis=-1)
    np.testing.assert_array_equal(got, stable_top(Z, n))
    # rows without ties at the n-th value: the set argpartition gave before
    for i in (0, 1, 2, 6):
        old = np.sort(np.argpartition(Z[i], V - n)[V - n:])
        np.testing.assert_array_equal(got[i], old)


def test_overlap_matches_the_old_way_without_ties():
    zd = Z[[0, 1, 2, 6]]
    rng = np.random.default_rng(1)
    zt = zd + rng.normal(0, 0.5, zd.shape).astype(np.float32)
    n = 5
    old = [len(set(np.argpartition(a, V - n)[V - n:]) & set(np.argpartition(b, V - n)[V - n:])) / n
           for a, b in zip(zd, zt)]
    np.testing.assert_allclose(gate.top_n_overlap(zd, zt, n), old)


@pytest.mark.parametrize("T", [0.7, 1.0, 1.3])
def test_plain_sampling_distribution_matches_the_old_way(T):
    for z in Z:
        got = rules.sampling_probs(z, T)
        ref = old_softmax(z[None, :], T)[0]
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
        assert abs(got.sum(dtype=np.float64) - 1) < 1e-5 and got.dtype == np.float32
    # a row with every token within reach is computed by the very same operations
    z = (np.random.default_rng(2).standard_normal(V)).astype(np.float32)
    np.testing.assert_array_equal(rules.sampling_probs(z, 0.8), old_softmax(z[None, :], 0.8)[0])


def test_residual_matches_the_old_way():
    p = rules.sampling_probs(Z, 0.7)
    q = rules.sampling_probs(np.roll(Z, 1, axis=0), 0.7)
    for a, b in zip(p, q):
        np.testing.assert_allclose(rules.residual(a, b), old_residual(a, b), rtol=0, atol=1e-5)
    same = rules.residual(p[0], p[0])  # no positive part: p itself
    np.testing.assert_array_equal(same, p[0])


def test_blockwise_sampling_picks_the_token_of_the_full_cumulative_sum():
    p = rules.sampling_probs(Z, 0.7)
    for row in p:
        cdf = old_cdf(row)
        for seed in range(20):
            u = np.random.default_rng(seed).random()
            want = int(np.searchsorted(cdf, u, side="right"))
            got = rules.sample(row, np.random.default_rng(seed))
            assert row[got] > 0
            # the same token, or a neighbour across a boundary within rounding of the sums
            assert got == want or abs(cdf[min(got, want)] - u) < 1e-12, (got, want)
    onehot = np.zeros(V, dtype=np.float32)
    onehot[V - 1] = 1.0
    assert rules.sample(onehot, np.random.default_rng(0)) == V - 1
    onehot[:] = 0
    onehot[3] = 1.0
    assert rules.sample(onehot, np.random.default_rng(0)) == 3


def _dense(p):
    return p.dense() if isinstance(p, Sparse) else np.asarray(p)


def test_sparse_distribution_is_the_dense_one():
    """Plain sampling of a wide row kept as its support (``rules.distribution``): p(d), the
    residual against another such q, a point mass's residual, the penalised p and a sample
    are those of the dense rows (to float rounding), -inf logits, one-hot and flat rows
    included."""
    sparse_rows = 0
    for T in (0.7, 1.0):
        ps = [rules.distribution(z, T) for z in Z]
        qs = [rules.distribution(z, T) for z in np.roll(Z, 1, axis=0)]
        for z, p, q in zip(Z, ps, qs):
            # held sparse exactly where fewer than half the tokens lie within 30 tempered nats
            near = np.count_nonzero(z >= z.max() - np.float32(gate.TAIL_NATS * T))
            assert isinstance(p, Sparse) == (2 * near < V), (T, near)
            sparse_rows += isinstance(p, Sparse)
            ref = rules.sampling_probs(z, T)
            np.testing.assert_allclose(_dense(p), ref, rtol=0, atol=1e-7)
            qd = _dense(q)
            for tok in (int(z.argmax()), 0, V - 1, 12345):
                assert abs(rules.prob(p, tok) - float(ref[tok])) < 1e-7
            np.testing.assert_allclose(_dense(rules.residual(p, q)), rules.residual(ref, qd), rtol=0, atol=1e-6)
            np.testing.assert_allclose(_dense(rules.residual(p, qd)), rules.residual(ref, qd), rtol=0, atol=1e-6)
            top = int(z.argmax())
            np.testing.assert_allclose(_dense(rules.residual_point(p, top)), rules.residual_point(ref, top),
                                       rtol=0, atol=1e-6)
            np.testing.assert_allclose(_dense(rules.penalize(p, top, 0.3)), rules.penalize(ref, top, 0.3),
                                       rtol=0, atol=1e-6)
            cdf = old_cdf(ref)
            for seed in range(10):
                got = rules.sample(p, np.random.default_rng(seed))
                want = rules.sample(ref, np.random.default_rng(seed))
                u = np.random.default_rng(seed).random()
                assert ref[got] > 0 and (got == want or abs(cdf[min(got, want)] - u) < 1e-9), (got, want)
    assert sparse_rows >= 4, "the peaked and one-hot rows are held sparse"
    # a point mass with nothing else: its residual and a penalty of 0 leave p itself
    one = rules.distribution(Z[3], 0.7)
    assert isinstance(one, Sparse) and one.ids.tolist() == [12345]
    assert rules.residual_point(one, 12345) is one
    assert rules.sample(rules.penalize(one, 12345, 0.0), np.random.default_rng(0)) == 12345


def test_verify_reads_lists_of_rows_as_the_stacked_array():
    from easd_local.engine.config import DecodeConfig

    rng = np.random.default_rng(3)
    zt = rng.normal(0, 2, (4, 4096)).astype(np.float32)
    zd = (zt[:3] + rng.normal(0, 1, (3, 4096))).astype(np.float32)
    drafts = [int(r.argmax()) for r in zd]
    for cfg in (DecodeConfig(mode="easd", tau_draft=0.0, tau_target=0.0, overlap=0.0),
                DecodeConfig(mode="sd", temperature=0.7, seed=4)):
        g = rules.Gate.of(cfg)
        a = rules.verify(drafts, zd, zt, cfg, g, np.random.default_rng(5))
        b = rules.verify(drafts, list(zd), zt, cfg, g, np.random.default_rng(5))
        assert a == b


def test_bench_controller_json_reports_every_mode(tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_controller.py"), "--n-prompts", "1", "--max-tokens", "12",
         "--repeats", "1", "--json"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["n_vocab"] == 306 and data["pair"] == "tiny pair"
    assert list(data["modes"]) == ["target", "sd", "sd-t0.7", "easd", "easd-tf", "sd:ngram-simple"]
    for mode, r in data["modes"].items():
        assert r["tokens"] > 0 and r["us_per_token"] > 0, mode
        assert set(r["split_us_per_token"]) == {"runtime", "rules", "gate", "scheduler"}, mode
        assert r["live_controller_us_per_token"] > 0, mode


def test_gpu_check_says_no_gpu_without_one(tmp_path):
    env = {**__import__("os").environ, "PATH": str(tmp_path)}  # no nvidia-smi on it
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py")], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stdout.startswith("no GPU:")


def test_gpu_check_pack_holds_what_the_build_needs_and_no_more(tmp_path):
    """``gpu_check.py --make-pack``'s filter on a stand-in sdist: llama.cpp's sources, the CUDA and
    CPU backends, gguf-py and the Python layer in; models, docs, tests, tools and the other GPU
    backends out (the pack must fit a lent machine's small working tree)."""
    import importlib.util
    import tarfile

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    root = tmp_path / "llama_cpp_python-9.9.9"
    src = root / "vendor" / "llama.cpp"
    files = ["CMakeLists.txt", "src/llama.cpp", "common/common.cpp", "examples/speculative-simple/x.cpp",
             "ggml/src/ggml-cuda/a.cu", "ggml/src/ggml-cpu/b.c", "ggml/src/ggml.c", "gguf-py/gguf/__init__.py",
             "vendor/nlohmann/json.hpp", "models/big.gguf", "docs/a.md", "tests/t.cpp", "tools/server/s.cpp",
             "ggml/src/ggml-vulkan/v.cpp", "ggml/src/ggml-metal/m.m"]
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_text("x")
    (root / "llama_cpp").mkdir()
    (root / "llama_cpp" / "llama_cpp.py").write_text("x")
    out = gc.make_pack(src, tmp_path / "out" / "pack.tar.xz")
    with tarfile.open(out) as tf:
        names = {n for n in tf.getnames() if tf.getmember(n).isfile()}
    inside = {n.removeprefix("pack/llama.cpp/") for n in names if n.startswith("pack/llama.cpp/")}
    assert inside == set(files[:9])
    assert "pack/python/llama_cpp/llama_cpp.py" in names
    assert any(n.startswith("pack/python/diskcache/") for n in names)
    assert not (tmp_path / "out" / "pack.tar.xz.part").exists()


def test_gpu_check_runs_llama_cpps_tool_as_ours_and_survives_its_crash(tmp_path):
    """``gpu_check.py``'s run of ``llama-speculative-simple``: without weight repacking where our
    loader's self-test turned it off (on an AMX host llama.cpp's kernels crash, llama.cpp
    #20824, and the tool skips the self-test), and a tool that dies by a signal is one line in
    the result, not the end of the run (our figures stand without it). A stand-in tool records
    its arguments and crashes."""
    import argparse
    import importlib.util
    import signal
    import stat

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    argv = tmp_path / "argv.txt"
    tool = tmp_path / "llama-speculative-simple"
    tool.write_text(f'#!/bin/sh\necho "$@" > {argv}\nkill -SEGV $$\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    args = argparse.Namespace(prompt="hi", max_tokens=8, gamma=4)
    for no_repack in (True, False):
        got = gc.run_native(tmp_path, "d.gguf", "t.gguf", args, no_repack)
        assert got == {"error": f"llama-speculative-simple exited -{int(signal.SIGSEGV)}:", "no_repack": no_repack}
        words = argv.read_text().split()
        assert ("--no-repack" in words) == no_repack and words[words.index("-ngld") + 1] == "99", words


def test_gpu_check_refuses_a_missing_or_broken_pack_in_one_line(tmp_path):
    script = [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--cpu-build", "--build-dir", str(tmp_path / "b")]
    r = subprocess.run(script + ["--pack", str(tmp_path / "none.tar.xz")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--pack" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "junk.tar.xz").write_text("not a pack")
    r = subprocess.run(script + ["--pack", str(tmp_path / "junk.tar.xz")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [
        f"error: --pack {tmp_path / 'junk.tar.xz'}: not a pack made by --make-pack (not a tar archive)"]


def test_controller_split_parts_add_up_to_the_generations_own_figure(tmp_path, tiny_draft, tiny_target):
    """``scripts/controller_split.py`` on the tiny pair (real llama.cpp): every part printed,
    and per round the parts add up to about the generation's own seconds_controller (the
    stamps' own cost and the prompt's Python are the difference)."""
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "controller_split.py"), "--draft", str(tiny_draft), "--target",
         str(tiny_target), "--max-tokens", "16", "--rounds", "2", "--threads", "1"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    rounds = [line for line in out.stdout.splitlines() if line.startswith("round ")]
    assert len(rounds) == 2
    for line in rounds:
        own = float(re.search(r"seconds_controller (\d+) µs", line).group(1))
        parts = {k: float(v) for k, v in re.findall(r"(after llama_decode|the rule \(Seq\.sample\)|emitting "
                                                      r"\(Seq\._emit\)|before llama_decode|the rest) (\d+)", line)}
        assert len(parts) == 5, line
        assert 0.5 * own <= sum(parts.values()) <= 1.5 * own + 20, line
    assert "of which the row's address" in out.stdout


def test_controller_split_names_a_missing_model_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "controller_split.py"), "--target",
                          str(tmp_path / "missing.gguf"), "--rounds", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "missing.gguf" in out.stderr



@pytest.mark.parametrize("backend", [False, True], ids=["numpy", "llama.cpp-argmax"])
def test_controller_floor_bare_loops_emit_easd_locals_tokens(tmp_path, tiny_draft, tiny_target, backend):
    """``scripts/controller_floor.py`` on the tiny pair (real llama.cpp): its bare target loop
    and its bare greedy SD loop (draft model, catch-up, verify block, both rollbacks) build
    easd-local's batches, so they emit easd-local's tokens in every round; each line carries
    both figures. With ``--backend-sampling`` the same loops with llama.cpp's argmax (a greedy
    sampler attached to the sequence, a verify block's rows sampled in the graph) emit the very
    same tokens too, and each line carries both bare loops' milliseconds a token."""
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "controller_floor.py"), "--draft", str(tiny_draft), "--target",
         str(tiny_target), "--max-tokens", "24", "--rounds", "2", "--threads", "1", "--gamma", "3"]
        + (["--backend-sampling"] if backend else []),
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    rounds = [line for line in out.stdout.splitlines() if " round " in line]
    assert len(rounds) == 4 and sum(line.startswith("sd ") for line in rounds) == 2, out.stdout
    for line in rounds:
        assert line.endswith("(same tokens)"), line
        if backend:
            assert re.search(r"bare loop +\d+ +bare, llama.cpp's argmax +\d+ +easd-local +\d+ +difference +-?\d+ +"
                             r"ms a token: bare [\d.]+, llama.cpp's argmax [\d.]+ ", line), line
        else:
            assert re.search(r"bare loop +\d+ +easd-local +\d+ +difference +-?\d+", line), line
    assert re.search(r"argmax straight after a decode \d+ µs, the same argmax again \d+ µs", out.stdout)


def test_the_bare_loop_without_backend_sampling_says_so_and_leaves_the_model_as_it_was(tiny_target, monkeypatch):
    """``controller_floor.Bare(..., sampled=True)`` over a llama-cpp-python without the
    (experimental) backend sampling API: one RuntimeError naming it (``gpu_check``'s child then
    records it beside the figures it has), and the model decodes on as before."""
    import importlib.util
    import types

    from easd_local.llamacpp import runtime
    from easd_local.llamacpp.runtime import LoadOptions, Model

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location("controller_floor", REPO / "scripts" / "controller_floor.py")
        cf = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cf)
    finally:
        sys.path.remove(str(REPO / "scripts"))
    with Model(tiny_target, LoadOptions(n_ctx=64, n_threads=1)) as m:
        without = types.SimpleNamespace(**{k: getattr(runtime._ll, k) for k in dir(runtime._ll)
                                           if not k.startswith("__") and k != "llama_set_sampler"})
        monkeypatch.setattr(runtime, "_ll", without)
        with pytest.raises(RuntimeError, match="no backend sampling"):
            cf.Bare(m, sampled=True)
        monkeypatch.undo()
        toks, _, _ = cf.bare_target(m, [1, 2, 3], 4)
        assert len(toks) == 4 and toks == cf.bare_target(m, [1, 2, 3], 4, sampled=True)[0]


def test_gpu_check_child_reports_our_modes_and_the_bare_loops(tmp_path, tiny_draft, tiny_target):
    """``gpu_check.py``'s child step (what runs over the built library on a GPU machine), here
    over the installed llama-cpp-python on the tiny pair: every mode's figures and both bare
    loops' µs a token."""
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--child", str(tiny_draft), str(tiny_target),
         "--max-tokens", "12"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for mode in ("target", "sd", "easd-tf"):
        assert got[mode]["tokens"] == 12 and got[mode]["controller_us_per_token"] > 0, got[mode]
    assert isinstance(got["repack_off"], bool)  # what llama-speculative-simple is then told
    for name in ("bare", "bare_lcpp"):  # reading the rows; llama.cpp's argmax in the graph
        for mode in ("target", "sd"):
            assert got[f"{name}_{mode}_us_per_token"] > 0 and got[f"{name}_{mode}_tokens_per_s"] > 0, got
    assert got["bare_lcpp_target_same_tokens"] and got["bare_lcpp_sd_same_tokens"], got
