"""Every mode's outputs on the tiny pair, pinned: tokens, origins, the gate's figures and the
counters, greedy and sampled (the documented order of random draws), one sequence at a time
and four sequences sharing batches.

Recorded by the code as it was before the per-mode steps were rewritten as generators
(issue 36), so a change of shape that changes behaviour fails here. On a machine whose
llama.cpp has the same CPU features as the recording one the kernels are the same, so every
figure must be identical; elsewhere a text may part at a near-tie of llama.cpp's numerics,
which ``test_scheduler.why_parted`` must then name (as the B = 1 reference test does).
Machines whose kernels part many texts at near-ties have pins of their own, recorded by the
same old code on those kernels (``pinned_outputs-KEY.json``, KEY from llama.cpp's system info
and repacking): where one matches, every figure must be identical to it.

    python tests/test_pinned_outputs.py --write     # record again (only on purpose)
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import pytest

from easd_local.engine import decoding
from easd_local.engine.config import DecodeConfig
from easd_local.engine.decoding import Finished, TokenEvent
from easd_local.llamacpp.devices import system_info
from easd_local.engine.pair import load_pair
from easd_local.llamacpp.runtime import LoadOptions
from easd_local.engine.scheduler import Request, Scheduler

PINNED = Path(__file__).with_name("data") / "pinned_outputs.json"
MODES = ("target", "draft", "sd", "easd", "easd-tf")
TEXTS = ["The quick brown fox", "Once upon a time there", "What is the answer to 12 * 7?"]
GATE = dict(tau_draft=0.5, tau_target=0.5, overlap=0.2)  # thresholds at which the gate fires on the tiny pair
SAMPLED = dict(temperature=0.8, top_k=20, top_p=0.95)
COUNTERS = ("tokens", "drafted", "accepted", "draft_accepted", "sd_rejections", "easd_fires", "bonus",
            "target_tokens", "target_calls", "verify_calls", "verified_tokens", "draft_calls", "draft_consults",
            "target_first_tokens", "catchup_calls", "catchup_tokens", "prompt_tokens", "stop_reason")


def _figure(x):
    if x is None:
        return None
    return "nan" if math.isnan(x) else round(float(x), 5)


def _record(label: str, text: str, cfg: DecodeConfig, seed, fin: Finished, events: list[TokenEvent]) -> dict:
    return {
        "label": label, "text": text, "mode": cfg.mode, "seed": seed,
        "tokens": list(fin.tokens),
        "origins": [e.origin for e in events],
        "gate": [[_figure(e.h_draft), _figure(e.h_target), _figure(e.overlap)] for e in events],
        "stats": {k: getattr(fin.stats, k) for k in COUNTERS},
    }


def _solo_runs() -> list[tuple[str, str, DecodeConfig]]:
    runs = []
    for mode in MODES:
        for text in TEXTS:
            runs.append(("greedy gate", text, DecodeConfig(mode=mode, max_tokens=37, **GATE)))
        runs.append(("sampled gate", TEXTS[0], DecodeConfig(mode=mode, max_tokens=37, seed=5, **GATE, **SAMPLED)))
    for mode in ("easd", "easd-tf"):
        runs.append(("greedy defaults", TEXTS[1], DecodeConfig(mode=mode, max_tokens=37)))
    runs.append(("sd p_min", TEXTS[2], DecodeConfig(mode="sd", max_tokens=37, gamma=6, draft_p_min=0.3)))
    runs.append(("easd p_min sampled", TEXTS[2],
                 DecodeConfig(mode="easd", max_tokens=37, gamma=6, draft_p_min=0.2, seed=9, **GATE, **SAMPLED)))
    runs.append(("easd penalty sampled", TEXTS[1],
                 DecodeConfig(mode="easd", max_tokens=37, penalty=0.3, seed=11, **GATE, **SAMPLED)))
    return runs


def _batched_runs() -> list[tuple[str, list[tuple[str, DecodeConfig, int | None, tuple[int, ...]]]]]:
    greedy = [(TEXTS[i % 3] * (i + 1), DecodeConfig(mode=m, max_tokens=33, **GATE), None, ())
              for i, m in enumerate(("sd", "easd-tf", "target", "easd"))]
    sampled = [(TEXTS[i % 3], DecodeConfig(mode=m, max_tokens=29, **GATE, **SAMPLED), 100 + i, ())
               for i, m in enumerate(("draft", "easd", "sd", "easd-tf"))]
    # stop tokens (ids the greedy runs above emit early) and a prompt that fills the context
    long_text = "word " * 160
    ends = [(TEXTS[0], DecodeConfig(mode="easd", max_tokens=40, **GATE), None, (292,)),
            (TEXTS[0], DecodeConfig(mode="easd-tf", max_tokens=40, **GATE), None, (298,)),
            (long_text, DecodeConfig(mode="sd", max_tokens=200, gamma=6), None, ()),
            (TEXTS[0], DecodeConfig(mode="sd", max_tokens=40, **GATE), None, (291,))]
    return [("batched greedy", greedy), ("batched sampled", sampled), ("batched ends", ends)]


def collect(draft: Path, target: Path) -> dict:
    """Every pinned run, in order, on a fresh load of the pair."""
    out = []
    with load_pair(draft, target, LoadOptions(n_ctx=512, n_threads=1)) as pair:
        repack = pair.target.repack.extra_bufts
        for label, text, cfg in _solo_runs():
            pair.target.reset()
            pair.draft.reset()
            prompt = pair.target.vocab.tokenize(text)
            fin, events = decoding.generate_all(pair.target, pair.draft, prompt, cfg, n_vocab=pair.n_vocab)
            out.append(_record(label, text, cfg, None, fin, events))
    with load_pair(draft, target, LoadOptions(n_ctx=512, n_threads=1, n_seq=4)) as pair:
        for label, reqs in _batched_runs():
            pair.target.reset()
            pair.draft.reset()
            sched = Scheduler(pair, 4)
            rids = []
            for text, cfg, seed, stops in reqs:
                prompt = pair.target.vocab.tokenize(text)
                rids.append(sched.submit(Request(prompt, cfg, rng_seed=seed, stop_tokens=stops, reuse_cache=False)))
            events: dict = {}
            results: dict = {}
            while sched.active:
                for rid, ev in sched.step():
                    if isinstance(ev, TokenEvent):
                        events.setdefault(rid, []).append(ev)
                    else:
                        results[rid] = ev
            for rid, (text, cfg, seed, _) in zip(rids, reqs):
                assert isinstance(results[rid], Finished), results[rid]
                out.append(_record(label, text, cfg, seed, results[rid], events.get(rid, [])))
    return {"system_info": system_info(), "repack": repack, "runs": out}


def kernels_key(system: str, repack) -> str:
    return hashlib.sha256(f"{system}|{repack}".encode()).hexdigest()[:12]


def test_every_mode_emits_what_was_pinned(tiny_draft, tiny_target):
    got = collect(tiny_draft, tiny_target)
    own = PINNED.with_name(f"pinned_outputs-{kernels_key(got['system_info'], got['repack'])}.json")
    pinned = json.loads((own if own.exists() else PINNED).read_text())
    assert len(got["runs"]) == len(pinned["runs"])
    same_kernels = (got["system_info"], got["repack"]) == (pinned["system_info"], pinned["repack"])
    parted = []
    for new, old in zip(got["runs"], pinned["runs"]):
        where = f"{old['label']} {old['mode']} on {old['text']!r}"
        assert (new["label"], new["mode"], new["text"]) == (old["label"], old["mode"], old["text"])
        if same_kernels or new["tokens"] == old["tokens"]:
            assert new == old, where
            continue
        parted.append(where)
    if parted:  # another CPU's kernels: each parting must be a near-tie (see the module docstring)
        _explain(tiny_draft, tiny_target, pinned, got, parted)


def _explain(draft, target, pinned, got, parted) -> None:
    from test_scheduler import why_parted

    assert len(parted) <= 4, parted
    with load_pair(draft, target, LoadOptions(n_ctx=512, n_threads=1)) as pair:
        for new, old in zip(got["runs"], pinned["runs"]):
            if new["tokens"] == old["tokens"]:
                continue
            cfg = DecodeConfig(mode=old["mode"], **GATE)
            prompt = pair.target.vocab.tokenize(old["text"])
            a = Finished(stats=decoding.Stats(), text="", tokens=old["tokens"])
            b = Finished(stats=decoding.Stats(), text="", tokens=new["tokens"])
            assert why_parted(pair, prompt, cfg, a, [], b, []), f"{old['label']} {old['mode']}: no near-tie"


if __name__ == "__main__":  # python tests/test_pinned_outputs.py --write
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import make_tiny_pair
    import tempfile

    paths = make_tiny_pair.write_tiny_models(Path(tempfile.mkdtemp(prefix="easd-pin-")), seed=0)
    data = collect(paths["draft"], paths["target"])
    data = {"note": "every mode's outputs on the tiny pair (seed 0) before issue 36's rewrite of the steps; "
                    "written by tests/test_pinned_outputs.py --write", **data}
    head = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in data.items() if k != "runs")
    runs = ",\n".join(json.dumps(r, separators=(",", ":")) for r in data["runs"])
    PINNED.write_text("{" + head + ', "runs": [\n' + runs + "\n]}\n")  # one run a line
    print(f"wrote {PINNED}: {len(data['runs'])} runs")
