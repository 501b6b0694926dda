"""The batched engine (easd_local.engine.scheduler) on the tiny pair in real llama.cpp.

Sequences that share batches see llama.cpp's batched numerics: a one-token batch takes
another matmul kernel than a multi-token one, and in the unified KV cache a sequence's
cells sit at other indices than when it runs alone, which changes the rounding of the
attention sums (measured on the tiny target: up to ~0.12 logits). So a sequence at B = 4
equals its own B = 1 run up to a near-tie, and ``why_parted`` names the near-tie that
parted two texts (target or draft argmax, or the EASD gate's entropies / top-N boundary).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from easd_local.engine import decoding, rules
from easd_local.engine.config import DecodeConfig
from easd_local.engine.decoding import Finished, TokenEvent
from easd_local.errors import ConfigError, ContextOverflowError
from easd_local.engine.pair import load_pair
from easd_local.llamacpp.runtime import LoadOptions
from easd_local.engine.scheduler import Failed, Request, Scheduler

from test_decoding import check_stats

MODES = ("target", "draft", "sd", "easd", "easd-tf")
TIE_TOL = 0.25  # logits, as in test_decoding
GATE_TOL = 0.03  # nats: an entropy this close to its threshold is a gate near-tie
# gate thresholds that make the gate fire on the tiny pair
GATE = dict(tau_draft=0.5, tau_target=0.5, overlap=0.2)
TEXTS = ["The quick brown fox", "Once upon a time there", "In the beginning", "What is the answer to 12 * 7?"]


@pytest.fixture(scope="module")
def pair(tiny_draft, tiny_target):
    p = load_pair(tiny_draft, tiny_target, LoadOptions(n_ctx=512, n_threads=1, n_seq=4))
    yield p
    p.close()


def prompts_of(pair) -> list[list[int]]:
    # different lengths: 1 to 4 repetitions
    return [pair.target.vocab.tokenize(t * (i + 1)) for i, t in enumerate(TEXTS)]


def cfg_of(mode: str, **kw) -> DecodeConfig:
    return DecodeConfig(mode=mode, max_tokens=kw.pop("max_tokens", 48), **{**GATE, **kw})


def solo(pair, prompt, cfg: DecodeConfig, seed: int) -> tuple[Finished, list[TokenEvent]]:
    """The sequence's own B = 1 run (decoding.generate, fresh caches)."""
    pair.target.reset()
    pair.draft.reset()
    return decoding.generate_all(pair.target, pair.draft, prompt, cfg.replace(seed=seed), n_vocab=pair.n_vocab)


def drain(sched: Scheduler, results: dict, events: dict) -> None:
    while sched.active:
        for rid, ev in sched.step():
            if isinstance(ev, TokenEvent):
                events.setdefault(rid, []).append(ev)
            else:
                results[rid] = ev


def batch(pair, reqs: list[Request], n: int = 4) -> list[tuple[Finished | Failed, list[TokenEvent]]]:
    pair.target.reset()
    pair.draft.reset()
    sched = Scheduler(pair, n)
    rids = [sched.submit(r) for r in reqs]
    results, events = {}, {}
    drain(sched, results, events)
    return [(results[r], events.get(r, [])) for r in rids]


def _logits(model, prefix) -> np.ndarray:
    model.reset()
    return model.decode(list(prefix), logits_at=[-1])[0]


def _top2_margin(z: np.ndarray) -> float:
    a, b = np.sort(z)[-2:]
    return float(b - a)


def why_parted(pair, prompt, cfg, ref: Finished, ref_ev, got: Finished, got_ev) -> str | None:
    """None if the two runs emitted the same tokens; else the near-tie at the first
    differing position that explains it, or "" if there is none."""
    n = min(len(ref.tokens), len(got.tokens))
    i = next((k for k in range(n) if ref.tokens[k] != got.tokens[k]), None)
    if i is None:
        return None if len(ref.tokens) == len(got.tokens) else ""
    prefix = list(prompt) + ref.tokens[:i]
    V = pair.n_vocab
    zt = _logits(pair.target, prefix)[:V]
    a, b = ref.tokens[i], got.tokens[i]
    reasons = []
    if abs(float(zt[a]) - float(zt[b])) < TIE_TOL or _top2_margin(zt) < TIE_TOL:
        reasons.append(f"target argmax near-tie at {i}")
    if cfg.mode in ("draft", "sd", "easd", "easd-tf"):
        zd = _logits(pair.draft, prefix)[:V]
        if _top2_margin(zd) < TIE_TOL:
            reasons.append(f"draft argmax near-tie at {i}")
        if cfg.mode in ("easd", "easd-tf"):
            h_t, h_d = float(rules.entropy(zt)), float(rules.entropy(zd))
            if abs(h_t - cfg.tau_target) < GATE_TOL or abs(h_d - cfg.tau_draft) < GATE_TOL:
                reasons.append(f"gate near-tie at {i} (H_t {h_t:.3f}, H_d {h_d:.3f})")
            N = cfg.top_n
            for z in (zt, zd):
                s = np.sort(z)[::-1]
                if float(s[N - 1] - s[N]) < TIE_TOL:
                    reasons.append(f"top-{N} boundary near-tie at {i}")
            # the gate picks the target's runner-up: a tie between 2nd and 3rd
            s = np.sort(zt)[::-1]
            if float(s[1] - s[2]) < TIE_TOL:
                reasons.append(f"runner-up near-tie at {i}")
    return "; ".join(reasons)


def assert_same_up_to_near_ties(pair, prompts, cfgs, seeds, got, *, max_parted: int) -> None:
    parted = []
    for k, (prompt, cfg, seed) in enumerate(zip(prompts, cfgs, seeds)):
        ref, ref_ev = solo(pair, prompt, cfg, seed)
        fin, ev = got[k]
        assert isinstance(fin, Finished), fin
        check_stats(fin, ev)
        why = why_parted(pair, prompt, cfg, ref, ref_ev, fin, ev)
        if why is not None:
            assert why, f"sequence {k} ({cfg.mode}) differs from its B=1 run with no near-tie to explain it"
            parted.append(f"{k}: {why}")
    assert len(parted) <= max_parted, parted


# ------------------------------------------------------------------------ B = 1


REFERENCE = Path(__file__).with_name("data") / "b1_reference.json"


@pytest.fixture(scope="module")
def pair1(tiny_draft, tiny_target):
    p = load_pair(tiny_draft, tiny_target, LoadOptions(n_ctx=512, n_threads=1))
    yield p
    p.close()


def _recorded_origin(mode: str, origin: str) -> str:
    """The reference was recorded before origins said what happened: an SD rejection was
    then "target" (now RESAMPLED) and draft mode's tokens were "draft" (now DRAFT_ONLY)."""
    if origin == "target" and mode in ("sd", "easd"):
        return decoding.RESAMPLED
    if origin == "draft" and mode == "draft":
        return decoding.DRAFT_ONLY
    return origin


def test_b1_reproduces_the_outputs_recorded_before_the_engine(pair1):
    """generate against what the single-sequence loop it replaced emitted (recorded by that
    loop on the tiny pair, every mode): the same tokens, origins and counters; on another
    CPU a text may part at a near-tie, which must then be named."""
    ref = json.loads(REFERENCE.read_text())
    parted = []
    for run in ref["runs"]:
        cfg = cfg_of(run["mode"], max_tokens=64)
        prompt = pair1.target.vocab.tokenize(run["text"])
        assert prompt == run["prompt"]
        fin, ev = solo(pair1, prompt, cfg, 0)
        check_stats(fin, ev)
        if fin.tokens == run["tokens"]:
            assert [e.origin for e in ev] == [_recorded_origin(run["mode"], o) for o in run["origins"]]
            assert {k: getattr(fin.stats, k) for k in run["stats"]} == run["stats"]
            continue
        old = Finished(stats=fin.stats, text="", tokens=run["tokens"])
        why = why_parted(pair1, prompt, cfg, old, [], fin, ev)
        assert why, f"{run['mode']} on {run['text']!r} differs from the recorded output with no near-tie"
        parted.append(why)
    # on the recording CPU's kernels none part; an AVX2-only CPU parts 5 of the 15 texts (each at
    # a named near-tie: the tiny random models have many). More than half would be no near-tie story
    assert len(parted) <= len(ref["runs"]) // 2, parted


# ------------------------------------------------------------------------ B = 4


@pytest.mark.parametrize("mode", MODES)
def test_b4_greedy_equals_each_sequences_own_run(pair, mode):
    prompts = prompts_of(pair)
    cfg = cfg_of(mode)
    got = batch(pair, [Request(p, cfg, reuse_cache=False) for p in prompts])
    assert_same_up_to_near_ties(pair, prompts, [cfg] * 4, [cfg.seed] * 4, got, max_parted=1)


class Rows:
    """Records the logits rows every decode hands out, by (model, sequence, position of
    the evaluated token)."""

    def __init__(self, pair, monkeypatch) -> None:
        self.rows: dict = {}
        cls = type(pair.target)
        orig = cls.decode_batch

        def recording(model, parts, **kw):
            starts = [model.seq_len(p.seq) for p in parts]
            out = orig(model, parts, **kw)
            role = "target" if model is pair.target else "draft"
            for p, st, z in zip(parts, starts, out):
                n = len(p.tokens)
                for r, i in enumerate(p.logits_at):
                    pos = st + (i + n if i < 0 else i)
                    self.rows.setdefault((role, p.seq), {}).setdefault(pos, []).append(z[r].copy())
            return out

        monkeypatch.setattr(cls, "decode_batch", recording)

    def take(self) -> dict:
        rows, self.rows = self.rows, {}
        return rows


def logits_differ_before(a: dict, seq_a: int, b: dict, seq_b: int, last_pos: int) -> bool:
    """Whether some logits row at a position <= last_pos differs between two runs."""
    for role in ("target", "draft"):
        ra, rb = a.get((role, seq_a), {}), b.get((role, seq_b), {})
        for pos in set(ra) & set(rb):
            if pos <= last_pos and any(not np.array_equal(x, y) for x in ra[pos] for y in rb[pos]):
                return True
    return False


@pytest.mark.parametrize("mode", MODES)
def test_b4_sampling_uses_each_sequences_own_generator(pair, mode, monkeypatch):
    """Each sequence samples from its own generator, seeded by the request (not the slot),
    so its text equals its B = 1 run with that seed as long as the two runs were handed the
    same logits. Where they part, some logits row before the parting position must differ
    (llama.cpp's batched numerics moved a CDF step past the uniform draw); a generator
    shared by the batch or seeded by the slot parts them with identical logits."""
    prompts = prompts_of(pair)
    cfg = cfg_of(mode, temperature=0.9)
    seeds = [101, 202, 303, 404]
    rows = Rows(pair, monkeypatch)
    got = batch(pair, [Request(p, cfg, rng_seed=s, reuse_cache=False) for p, s in zip(prompts, seeds)])
    batched = rows.take()
    same = 0
    for k, (p, s, (fin, ev)) in enumerate(zip(prompts, seeds, got)):
        check_stats(fin, ev)
        ref, _ = solo(pair, p, cfg, s)
        alone = rows.take()
        if ref.tokens == fin.tokens:
            same += 1
            continue
        i = next((j for j in range(min(len(ref.tokens), len(fin.tokens))) if ref.tokens[j] != fin.tokens[j]))
        assert logits_differ_before(alone, 0, batched, k, len(p) + i - 1), (
            f"sequence {k} parts from its B=1 run at {i} although both runs saw the same logits"
        )
    assert same >= 1
    # different seeds, different texts: the seed reaches the sequence
    assert len({tuple(fin.tokens) for fin, _ in got}) == 4


def test_b4_mixed_modes_in_one_batch(pair):
    """Sequences of different modes share the step: each still equals its own run."""
    prompts = prompts_of(pair)
    cfgs = [cfg_of(m) for m in ("sd", "easd-tf", "target", "easd")]
    got = batch(pair, [Request(p, c, reuse_cache=False) for p, c in zip(prompts, cfgs)])
    assert_same_up_to_near_ties(pair, prompts, cfgs, [0] * 4, got, max_parted=1)


def test_newcomers_join_between_steps(pair):
    prompts = prompts_of(pair)
    cfg = cfg_of("sd")
    pair.target.reset()
    pair.draft.reset()
    sched = Scheduler(pair, 4)
    rids = [sched.submit(Request(p, cfg, reuse_cache=False)) for p in prompts[:2]]
    results, events = {}, {}
    for _ in range(3):
        for rid, ev in sched.step():
            (events.setdefault(rid, []).append(ev) if isinstance(ev, TokenEvent) else results.__setitem__(rid, ev))
    assert sched.active == 2 and sched.free_slots() == 2
    rids += [sched.submit(Request(p, cfg, reuse_cache=False)) for p in prompts[2:]]
    drain(sched, results, events)
    got = [(results[r], events.get(r, [])) for r in rids]
    assert_same_up_to_near_ties(pair, prompts, [cfg] * 4, [0] * 4, got, max_parted=1)


def test_one_sequence_ends_while_the_others_go_on(tiny_draft, tiny_target):
    """EOS (a stop token) in one sequence and the end of its context in another, while the
    rest run to their token budget."""
    with load_pair(tiny_draft, tiny_target, LoadOptions(n_ctx=256, n_threads=1, n_seq=4)) as p:
        short = p.target.vocab.tokenize(TEXTS[0])
        cfg = cfg_of("easd", max_tokens=40)
        ref, _ = solo(p, short, cfg, 0)
        stop = ref.tokens[5]
        long_prompt = p.target.vocab.tokenize("word " * 400)[:230]
        reqs = [
            Request(short, cfg, reuse_cache=False),
            Request(short, cfg, stop_tokens=[stop], reuse_cache=False),
            Request(long_prompt, cfg, reuse_cache=False),
            Request(p.target.vocab.tokenize(TEXTS[1]), cfg.replace(mode="sd"), reuse_cache=False),
        ]
        got = batch(p, reqs)
        reasons = [fin.stats.stop_reason for fin, _ in got]
        assert reasons == ["length", "eos", "context", "length"]
        assert got[1][0].tokens[-1] == stop and len(got[1][0].tokens) <= ref.tokens.index(stop) + 1
        assert len(long_prompt) + got[2][0].stats.tokens == p.target.n_ctx
        assert got[0][0].stats.tokens == 40 == got[3][0].stats.tokens
        for fin, ev in got:
            check_stats(fin, ev)


def test_cancel_frees_the_slot_and_its_cells(pair):
    prompts = prompts_of(pair)
    pair.target.reset()
    pair.draft.reset()
    sched = Scheduler(pair, 2)
    a = sched.submit(Request(prompts[0], cfg_of("sd"), reuse_cache=False))
    b = sched.submit(Request(prompts[1], cfg_of("sd"), reuse_cache=False))
    with pytest.raises(RuntimeError, match="no free slot"):
        sched.submit(Request(prompts[2], cfg_of("sd")))
    sched.step()
    assert pair.target.seq_len(1) > 0 and pair.draft.seq_len(1) > 0
    sched.cancel(b)
    assert sched.active == 1 and sched.free_slots() == 1
    assert pair.target.seq_len(1) == 0 and pair.draft.seq_len(1) == 0
    assert pair.target.seq_len(0) > 0  # the other sequence is untouched
    results, events = {}, {}
    drain(sched, results, events)
    assert set(results) == {a}
    ref, _ = solo(pair, prompts[0], cfg_of("sd"), 0)
    assert results[a].tokens == ref.tokens or why_parted(pair, prompts[0], cfg_of("sd"), ref, [], results[a], [])


def test_a_failure_in_one_sequence_leaves_the_others(pair, monkeypatch):
    """Non-finite logits in one sequence end it with Failed; the others finish as alone."""
    prompts = prompts_of(pair)
    cfg = cfg_of("easd")
    orig = type(pair.target).decode_batch

    def poisoned(self, parts, **kw):
        out = orig(self, parts, **kw)
        for p, z in zip(parts, out):
            if self is pair.target and p.seq == 1 and self.seq_len(1) > len(prompts[1]) + 8:
                z[:] = np.nan
        return out

    monkeypatch.setattr(type(pair.target), "decode_batch", poisoned)
    got = batch(pair, [Request(p, cfg, reuse_cache=False) for p in prompts[:3]], n=3)
    monkeypatch.undo()
    assert isinstance(got[1][0], Failed) and "NaN or infinite logits" in got[1][0].message
    assert got[1][1], "it emitted tokens before the failure"
    ok = [got[0], got[2]]
    assert_same_up_to_near_ties(pair, [prompts[0], prompts[2]], [cfg] * 2, [0, 0], ok, max_parted=1)
    # generate (B = 1) raises the failure
    monkeypatch.setattr(type(pair.target), "decode_batch",
                        lambda self, parts, **kw: [np.full_like(z, np.nan) for z in orig(self, parts, **kw)])
    with pytest.raises(Exception, match="NaN or infinite logits"):
        solo(pair, prompts[0], cfg, 0)


@pytest.mark.parametrize("mode,which,temperature,spec", [
    ("target", "target", 0.0, "draft"), ("sd", "target", 0.0, "draft"), ("sd", "draft", 0.0, "draft"),
    ("target", "target", 0.7, "draft"), ("sd", "target", 0.7, "draft"), ("sd", "draft", 0.7, "draft"),
    ("sd", "target", 0.7, "ngram-simple"), ("easd", "target", 0.0, "draft"), ("easd", "draft", 0.0, "draft"),
    ("easd", "draft", 0.7, "draft"), ("easd-tf", "target", 0.0, "draft"), ("easd-tf", "draft", 0.0, "draft"),
    ("easd-tf", "draft", 0.7, "draft"), ("sd", "draft", 0.0, "draft-p-min")])
@pytest.mark.parametrize("poison", ["nan", "+inf", "all -inf"])
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a rule raises before numpy would warn (stderr)
def test_rows_are_checked_by_the_rules_that_read_them(pair, monkeypatch, mode, which, temperature, spec, poison):
    """The scheduler makes no pass of its own over the rows: each rule that reads one checks it
    (engine.finite: greedy argmax, the sampling softmax, the gate's entropy of a consulted
    draft row). A NaN, a +inf or a row without a finite logit still fails the sequence in
    every mode, greedy or sampled, naming the model the row came from; the other sequence
    finishes."""
    prompts = prompts_of(pair)
    extra = {"spec_type": "draft", "draft_p_min": 0.01} if spec == "draft-p-min" else {"spec_type": spec}
    cfg = cfg_of(mode, max_tokens=16, temperature=temperature, **extra)
    model = pair.target if which == "target" else pair.draft
    orig = type(pair.target).decode_batch

    def poisoned(self, parts, **kw):
        out = orig(self, parts, **kw)
        for p, z in zip(parts, out):
            if self is model and p.seq == 1 and len(z) and self.seq_len(1) > len(prompts[1]) + 4:
                if poison == "nan":  # the first row is read at every step, the last one not always
                    z[0, 3] = z[-1, 3] = np.nan
                elif poison == "+inf":
                    z[:, 5] = np.inf
                else:
                    z[:] = -np.inf
        return out

    monkeypatch.setattr(type(pair.target), "decode_batch", poisoned)
    got = batch(pair, [Request(p, cfg, reuse_cache=False) for p in prompts[:2]], n=2)
    monkeypatch.undo()
    assert isinstance(got[0][0], Finished)
    assert isinstance(got[1][0], Failed), got[1][0]
    assert got[1][0].message.startswith(f"{model.path}: the model produced NaN or infinite logits"), got[1][0].message


def test_submit_refuses_bad_requests_at_once(pair):
    sched = Scheduler(pair, 2)
    with pytest.raises(ConfigError, match="gamma"):
        sched.submit(Request([1, 2], DecodeConfig(gamma=0)))
    with pytest.raises(ConfigError, match="empty prompt"):
        sched.submit(Request([], DecodeConfig()))
    with pytest.raises(ContextOverflowError, match="context holds 512"):
        sched.submit(Request([65] * 600, DecodeConfig()))
    assert sched.active == 0 and sched.free_slots() == 2
    with pytest.raises(ConfigError, match="loaded for 4 sequences, not 5"):
        Scheduler(pair, 5)


def test_easd_repick_of_the_gated_token_goes_on(pair1):
    """Sampled EASD with a penalty > 0 may re-pick the very draft token the gate fired on
    (lambda = 1 leaves its probability as it was); the draft then already holds the whole
    sequence and must still evaluate its last token for the next drafting round (this once
    failed the sequence with "logits_at [-1] out of range for 0 tokens")."""
    prompt = pair1.target.vocab.tokenize(TEXTS[0])
    for seed in range(3):
        cfg = cfg_of("easd", temperature=0.8, penalty=1.0, seed=seed)
        fin, ev = solo(pair1, prompt, cfg, seed)
        check_stats(fin, ev)
        assert fin.stats.tokens == cfg.max_tokens and fin.stats.easd_fires > 0
