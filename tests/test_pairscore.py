"""`easd-local pair score` (issue 39): the maths on known inputs, and the command on the tiny
pair in real llama.cpp: a row per draft, α against a direct numpy computation over the same
logits, a model against itself, and the prediction against what `generate --mode sd` measures
along the same text."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from easd_local.bench.prompt import build_messages
from easd_local.cli import app
from easd_local.llamacpp.runtime import LoadOptions, Model, Part
from easd_local.pairscore import predict
from easd_local.pairscore.corpus import read_dataset, tokenize

runner = CliRunner()
FAST = ["--ctx", "1024", "--threads", "1"]

pytestmark = pytest.mark.usefixtures("easd_home")


def score(*args):
    return runner.invoke(app, ["pair", "score", *[str(a) for a in args]])


def score_json(*args) -> dict:
    r = score(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ the maths


def test_simulation_follows_greedy_sd_block_by_block():
    # agree: T T F T T T T F  (8 positions), gamma 2
    agree = [True, True, False, True, True, True, True, False]
    sim = predict.simulate(agree, 2)
    # block 0: accepts 2 (pos 0,1) + bonus (pos 2) -> next 3; block 1: accepts 3,4 + bonus 5 -> next 6;
    # block 2: accepts 6, rejects 7 -> emits 2: 8 tokens, 3 verifies
    assert (sim.tokens, sim.verifies, sim.accepted, sim.bonus) == (8, 3, 5, 2)
    assert sim.drafted == 6 and sim.verify_sizes == {3: 3}
    # gamma 4: block 0: 0,1 then 2 rejected -> 3 emitted; block 1: 3,4,5,6 then bonus = 7 -> 5 emitted
    assert predict.simulate(agree, 4).verifies == 2
    # a budget stops drafting near it: gamma 4 with 5 tokens allowed
    sim = predict.simulate([True] * 5, 4, budget=5)
    assert (sim.tokens, sim.verifies) == (5, 1) and sim.drafted == 4
    # all agree to the text's end (its end-of-generation token): no bonus, drafting stopped there
    sim = predict.simulate([True] * 3, 4)
    assert (sim.tokens, sim.verifies, sim.bonus, sim.drafted) == (3, 1, 0, 3)


def test_easd_simulation_ends_a_block_at_a_fire():
    agree = [True] * 6
    fires = [False, True, False, False, False, False]
    sim = predict.simulate(agree, 4, fires=fires)
    # block 0: accepts pos 0, fires at 1 (re-picked) -> 2 tokens; block 1: 2..5 accepted, no bonus (end)
    assert (sim.fires, sim.verifies, sim.tokens) == (1, 2, 6)


def test_iid_formula():
    assert predict.iid_tokens_per_verify(0.0, 4) == 1.0
    assert predict.iid_tokens_per_verify(1.0, 4) == 5.0
    assert predict.iid_tokens_per_verify(0.5, 2) == pytest.approx(1.75)


def test_alpha_and_kl_rows_against_numpy():
    rng = np.random.default_rng(0)
    zt = rng.normal(size=(5, 300)).astype(np.float32) * 3
    zd = zt + rng.normal(size=(5, 300)).astype(np.float32)

    def softmax(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    p, q = softmax(zt.astype(np.float64)), softmax(zd.astype(np.float64))
    assert np.allclose(predict.alpha_rows(zt, zd, 1.0), np.minimum(p, q).sum(-1), atol=1e-5)
    assert np.allclose(predict.kl_rows(zt, zd), (p * (np.log(p) - np.log(q))).sum(-1), atol=1e-4)
    assert np.allclose(predict.alpha_rows(zt, zt, 1.0), 1.0, atol=1e-5)
    assert np.allclose(predict.kl_rows(zt, zt), 0.0, atol=1e-6)
    greedy = predict.alpha_rows(zt, zd, 0.0)
    assert set(np.unique(greedy)) <= {0.0, 1.0}
    assert np.array_equal(greedy == 1.0, zt.argmax(-1) == zd.argmax(-1))


def test_speedup_uses_the_probe_costs():
    sim = predict.simulate([True, True, False] * 4, 2)  # 12 tokens in blocks of 3
    costs = predict.Costs(target_token=1.0, target_verify={3: 1.5}, draft_token=0.25, draft_two=0.3)
    # per block: 2 drafts (0.5) + a verify (1.5) = 2 s for 3 tokens; after a bonus block, +0.05
    expected = 12 * 1.0 / (sim.verifies * 2.0 + sim.bonus * 0.05)
    assert predict.speedup(sim, costs) == pytest.approx(expected)


# ------------------------------------------------------------------ the command


def test_two_drafts_print_a_row_each(tiny_draft, tiny_target, tiny_target_q4, tmp_path):
    png = tmp_path / "fig.png"
    r = score("-m", tiny_target, "-md", tiny_draft, "-md", tiny_target_q4, "--dataset", "gsm8k", "--limit", 2,
              "--plot", png, *FAST)
    assert r.exit_code == 0, r.output
    main = r.stdout.split("speed-up over the target, by γ")[0]
    assert main.count("tiny-draft-q8_0") == 1 and main.count("tiny-target-q4_0") == 1
    assert "approximation" in r.output  # the reference solutions are not the target's text
    assert png.stat().st_size > 1000


def test_alpha_equals_numpy_over_the_same_logits(tiny_draft, tiny_target):
    # one text, scored in one batch (--chunk 1024), against the same batch decoded here
    res = score_json("-m", tiny_target, "-md", tiny_draft, "--dataset", "gsm8k", "--limit", 1, "--chunk", 1024,
                     "--no-probe", *FAST)
    opts = LoadOptions(n_ctx=1024, n_threads=1)
    with Model(tiny_target, opts) as t, Model(tiny_draft, opts) as d:
        (item,) = tokenize(read_dataset("gsm8k", limit=1), t.vocab).items
        seq = item.prompt + item.text
        start = len(item.prompt) - 1
        toks = seq[start : start + len(item.text)]
        zs = []
        for m in (t, d):
            m.decode_batch([Part(0, seq[:start], ())])
            zs.append(m.decode_batch([Part(0, toks, range(len(toks)))])[0].astype(np.float64))
    V = min(zs[0].shape[1], zs[1].shape[1])
    p, q = (np.exp(z[:, :V] - z[:, :V].max(1, keepdims=True)) for z in zs)
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    alpha = float(np.minimum(p, q).sum(1).mean())
    agree = float((zs[0][:, :V].argmax(1) == zs[1][:, :V].argmax(1)).mean())
    (dr,) = res["drafts"]
    assert dr["positions"] == len(item.text)
    assert abs(dr["alpha"] - alpha) < 1e-4
    assert abs(dr["greedy_agreement"] - agree) < 1e-4
    assert 0.0 < alpha < 1.0


def test_a_model_against_itself(tiny_target):
    res = score_json("-m", tiny_target, "-md", tiny_target, "--dataset", "gsm8k", "--limit", 2, "--no-probe", *FAST)
    (dr,) = res["drafts"]
    assert dr["greedy_agreement"] == 1.0 and dr["alpha"] == 1.0
    assert dr["kl_target_draft_nats"] == pytest.approx(0.0, abs=1e-4)
    # every draft token accepted: gamma + 1 tokens per verify but where a text ends
    assert 4.5 < dr["tokens_per_verify_greedy_simulated"]["4"] <= 5.0


def test_json_keys_say_what_they_hold(tiny_draft, tiny_target):
    res = score_json("-m", tiny_target, "-md", tiny_draft, "--dataset", "gsm8k", "--limit", 1, *FAST)
    dr = res["drafts"][0]
    for key in ("greedy_agreement", "alpha", "kl_target_draft_nats", "tokens_per_verify_greedy_simulated",
                "tokens_per_verify_iid_from_alpha", "speedup_greedy_simulated", "best_gamma_greedy",
                "draft_cost_over_target_cost", "verify_cost_over_decode", "h_draft_nats", "h_target_nats", "gate",
                "gate_at_calibration_percentiles"):
        assert key in dr, key
    assert set(dr["tokens_per_verify_greedy_simulated"]) == {str(g) for g in range(1, 9)}
    assert 1 <= dr["best_gamma_greedy"] <= 8
    assert res["corpus"]["kind"] == "dataset" and not res["corpus"]["faithful"]
    assert [c["percentile"] for c in dr["gate_at_calibration_percentiles"]] == [50, 75, 90, 95, 99]


def test_prediction_against_generate_mode_sd(tiny_draft, tiny_target, tmp_path):
    """Along the target's own greedy text (bench's target rows), the predicted tokens per
    verify at gamma 4 is within 5 % of what `generate --mode sd` measures on the same
    questions, pooled (tokens ÷ target verifies). Not exact: greedy `sd` verifies in batches of
    5 and the pass in batches of 64, so at argmax near-ties its text may part from the target's."""
    out = tmp_path / "r.jsonl"
    n_tok = 150
    r = runner.invoke(app, ["bench", "--dataset", "gsm8k", "--limit", "4", "--modes", "target", "--draft",
                            str(tiny_draft), "--target", str(tiny_target), "--max-tokens", str(n_tok), "--parallel", "1",
                            *FAST, "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    tokens = verifies = 0
    for row in rows:
        prompt = build_messages(row["question"])[0]["content"]
        g = runner.invoke(app, ["generate", prompt, "--mode", "sd", "--gamma", "4", "-n", str(n_tok), "--draft",
                                str(tiny_draft), "--target", str(tiny_target), "--json", *FAST])
        assert g.exit_code == 0, g.output
        obj = json.loads(g.stdout.strip().splitlines()[-1])
        assert obj["prompt_tokens"] == row["stats"]["prompt_tokens"]
        tokens += obj["tokens"]
        verifies += obj["target_calls"]
    measured = tokens / verifies
    res = score_json("-m", tiny_target, "-md", tiny_draft, "--from", out, "--no-probe", *FAST)
    assert res["corpus"]["faithful"] and res["corpus"]["texts"] == 4
    predicted = res["drafts"][0]["tokens_per_verify_greedy_simulated"]["4"]
    assert 1.3 < measured < 4.5  # the tiny pair accepts some drafts, not all
    assert abs(predicted / measured - 1) < 0.05, (predicted, measured)


def test_from_sets_measured_runs_beside_the_prediction(tiny_draft, tiny_target, tmp_path):
    out = tmp_path / "r.jsonl"
    r = runner.invoke(app, ["bench", "--dataset", "gsm8k", "--limit", "2", "--modes", "target,sd,easd-tf", "--draft",
                            str(tiny_draft), "--target", str(tiny_target), "--max-tokens", "80", "--parallel", "1",
                            *FAST, "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = score_json("-m", tiny_target, "-md", tiny_draft, "--from", out, "--no-probe", *FAST)
    by_mode = {m["mode"]: m for m in res["drafts"][0]["measured"]}
    assert set(by_mode) == {"sd", "easd-tf"}
    sd = by_mode["sd"]
    assert sd["problems"] == 2 and sd["gamma"] == 4
    assert abs(sd["tokens_per_verify_predicted"] / sd["tokens_per_verify_measured"] - 1) < 0.1
    tf = by_mode["easd-tf"]
    assert tf["fires_per_100_measured"] > 0 and tf["fires_per_100_predicted"] > 0
    # the table says so too
    r = score("-m", tiny_target, "-md", tiny_draft, "--from", out, "--no-probe", *FAST)
    assert r.exit_code == 0 and "measured on the same problems" in r.stdout


@pytest.mark.parametrize("args, says", [
    (["--dataset", "gsm8k", "--text", "x.txt"], "give one corpus"),
    (["--text", "no-such.txt"], "--text no-such.txt: No such file"),
    (["--from", "no-such.jsonl"], "results file 'no-such.jsonl' not found"),
    (["--dataset", "amc23"], "has no reference solutions"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--temperature", "-1"], "temperature"),
    (["--target-writes", "--text", "x.txt"], "--target-writes answers a dataset's questions"),
    (["--max-tokens", "5"], "--max-tokens is the budget of the answers --target-writes generates"),
    (["--target-writes", "--max-tokens", "0"], "--max-tokens must be >= 1"),
])
def test_bad_input_is_one_line(args, says, tiny_draft, tmp_path):
    # checked before any model loads: the target named here does not exist
    r = score("-m", tmp_path / "missing.gguf", "-md", tiny_draft, *args, *FAST)
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1, r.output


def test_from_a_file_without_the_method(tiny_draft, tiny_target, tmp_path):
    out = tmp_path / "r.jsonl"
    r = runner.invoke(app, ["bench", "--dataset", "gsm8k", "--limit", "1", "--modes", "sd", "--draft", str(tiny_draft),
                            "--target", str(tiny_target), "--max-tokens", "8", *FAST, "--out", str(out)])
    assert r.exit_code == 0, r.output
    r = score("-m", tiny_target, "-md", tiny_draft, "--from", out, *FAST)
    assert r.exit_code == 2 and "no rows of method 'target'" in r.output
    # the sd rows are the target's text too (sd is lossless): --method sd scores along them
    res = score_json("-m", tiny_target, "-md", tiny_draft, "--from", out, "--method", "sd", "--no-probe", *FAST)
    assert res["corpus"]["texts"] == 1 and not math.isnan(res["drafts"][0]["alpha"])


def test_text_file_corpus(tiny_draft, tiny_target, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("the cat sat on the mat and the dog sat on the log. " * 40, encoding="utf-8")
    res = score_json("-m", tiny_target, "-md", tiny_draft, "--text", f, "--no-probe", "--ctx", "256", "--threads", "1")
    assert res["corpus"]["kind"] == "text" and res["corpus"]["texts"] >= 2
    assert res["drafts"][0]["positions"] == res["corpus"]["positions"]


def test_target_writes_first_scores_along_benchs_target_rows(tiny_draft, tiny_target, tmp_path):
    """--target-writes: the target answers the questions here (greedy, target alone), and the
    score along its answers is the score along bench's target rows of the same questions: the
    same texts, so the same positions and the same simulated SD, with no results file."""
    out = tmp_path / "r.jsonl"
    r = runner.invoke(app, ["bench", "--dataset", "gsm8k", "--limit", "3", "--modes", "target", "--draft",
                            str(tiny_draft), "--target", str(tiny_target), "--max-tokens", "60", "--parallel", "1",
                            *FAST, "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    along_rows = score_json("-m", tiny_target, "-md", tiny_draft, "--from", out, "--no-probe", *FAST)
    written = score_json("-m", tiny_target, "-md", tiny_draft, "--dataset", "gsm8k", "--target-writes", "--limit", 3,
                         "--max-tokens", 60, "--no-probe", *FAST)
    c = written["corpus"]
    assert c["kind"] == "written" and c["faithful"] and c["texts"] == 3
    assert c["positions"] == sum(len(r["completion_tokens"]) for r in rows) == along_rows["corpus"]["positions"]
    assert any("the target wrote these 3 answers here first" in n for n in c["notes"])
    a, b = along_rows["drafts"][0], written["drafts"][0]
    assert a["tokens_per_verify_greedy_simulated"] == b["tokens_per_verify_greedy_simulated"]
    assert a["greedy_agreement"] == b["greedy_agreement"]
    assert c["target_argmax_is_text"] > 0.9  # its own greedy text, up to batch-shape near-ties
    # the table does not call it an approximation
    r = score("-m", tiny_target, "-md", tiny_draft, "--target-writes", "--limit", 1, "--max-tokens", 20, "--no-probe",
              *FAST)
    assert r.exit_code == 0, r.output
    assert "answers the target wrote here" in r.stdout and "approximation" not in r.stdout


def test_a_text_too_short_for_the_timing_probe_says_so(tiny_draft, tiny_target, tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("the cat sat", encoding="utf-8")
    res = score_json("-m", tiny_target, "-md", tiny_draft, "--text", f, *FAST)
    dr = res["drafts"][0]
    assert "speedup_greedy_simulated" not in dr
    assert "no timing probe: every text is shorter than" in res["lookup"]["costs"]
    assert "--no-probe" not in res["lookup"]["costs"]  # not given
    # a text file is an approximation, and the corpus says why
    assert not res["corpus"]["faithful"] and any("a text file is not the target's own" in n
                                                  for n in res["corpus"]["notes"])
    r = score("-m", tiny_target, "-md", tiny_draft, "--text", f, *FAST)
    assert r.exit_code == 0 and "note: no timing probe" in r.stderr and "note: an approximation" in r.stderr


def test_the_probe_takes_the_first_text_long_enough():
    from types import SimpleNamespace

    from easd_local.cli.pair import _probe_context
    from easd_local.pairscore.corpus import Item
    from easd_local.pairscore.probe import PROBE_GAMMA

    def scored(n):
        return SimpleNamespace(item=Item(f"t{n}", [1], list(range(2, 2 + n))))

    ps = SimpleNamespace(scored=[scored(3), scored(PROBE_GAMMA + 5)])
    assert _probe_context(ps) == [1, *range(2, PROBE_GAMMA + 7)]
    assert _probe_context(SimpleNamespace(scored=[scored(3)])) is None


def test_one_threshold_off_leaves_the_other_as_it_is(tiny_draft, tiny_target):
    res = score_json("-m", tiny_target, "-md", tiny_draft, "--dataset", "gsm8k", "--limit", 1, "--no-probe",
                     "--tau-draft", "inf", "--tau-target", 0.5, *FAST)
    gate = res["drafts"][0]["gate"]
    assert gate["tau_draft"] == "inf" and gate["tau_target"] == 0.5
    assert gate["fires_per_100_easd_tf_greedy"] == 0.0
