"""Measure the lossless ways to decode a pair (``engine.ways.WAYS``) on this machine: the
timing probe's verify costs, then each way decoding the same few prompts greedily, in turn,
prompt by prompt (the order rotates, so that a machine slowing down or speeding up hits every
way alike). What ``easd-local pair costs`` records and the default mode reads."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..bench.rerun import logits_after
from ..engine.config import DecodeConfig
from ..engine.decoding import generate_all
from ..engine.near_ties import first_difference
from ..engine.pair import Pair
from ..llamacpp.runtime import Model
from ..engine.ways import WAYS, Way
from .predict import Costs
from .probe import probe

# Two requests that edit code given in the prompt (the default pair is a coder) and two
# grade-school maths questions: what the tool's users ask of it, in both kinds.
PROMPTS = (
    "Add type hints to this Python function and return the whole function:\n\n"
    "def moving_average(values, window):\n"
    "    if window <= 0:\n"
    "        raise ValueError('window must be positive')\n"
    "    out = []\n"
    "    total = 0\n"
    "    for i, v in enumerate(values):\n"
    "        total += v\n"
    "        if i >= window:\n"
    "            total -= values[i - window]\n"
    "        if i >= window - 1:\n"
    "            out.append(total / window)\n"
    "    return out\n",
    "Rename the variable `cnt` to `count` everywhere in this JavaScript and return the whole code:\n\n"
    "function countWords(text) {\n"
    "  const cnt = new Map();\n"
    "  for (const word of text.toLowerCase().split(/\\s+/)) {\n"
    "    if (!word) continue;\n"
    "    cnt.set(word, (cnt.get(word) || 0) + 1);\n"
    "  }\n"
    "  return [...cnt.entries()].sort((a, b) => b[1] - a[1]);\n"
    "}\n",
    "A baker makes 48 muffins. She sells 3/4 of them in the morning and half of the rest in the "
    "afternoon. How many muffins are left at the end of the day?",
    "Tom reads 12 pages on Monday, twice as many on Tuesday, and 5 fewer than Tuesday on Wednesday. "
    "How many pages did he read in the three days?",
)


@dataclass
class WayRun:
    tokens: int = 0
    seconds: float = 0.0
    texts_differing: int = 0  # greedy texts that are not the target's (near-ties of batch shape)
    per_prompt: list[float] = field(default_factory=list)  # tokens/s
    parting_gaps: list[float] = field(default_factory=list)  # ``parting_gap`` of each text that differs

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def verify_costs(c: Costs) -> list[float]:
    """The probe's costs as one-token decodes per k drafted tokens (index 0: no draft)."""
    out = [1.0]
    for k in sorted(c.target_verify):
        out.append(c.target_verify[k] / c.target_token)
    return out


def measure(target: Model, draft: Model | None, prompts: Sequence[list[int]], max_tokens: int,
            on_progress: Callable[[str], None] = lambda s: None) -> tuple[dict[str, WayRun], Costs | None]:
    """Each way of ``WAYS`` that the loaded models allow, on every prompt; the probe's costs
    (None without a draft model: the probe times a draft too)."""
    context = list(prompts[0]) + list(prompts[1])
    costs = probe(target, [draft] if draft is not None else [target], context)[0]
    vc = verify_costs(costs)
    ways = [w for w in WAYS if draft is not None or not w.uses_draft_model]
    runs = {w.name: WayRun() for w in ways}
    V = min(m.n_vocab for m in (target, draft) if m is not None)
    parted: list[tuple[str, list[int], list[int], list[int]]] = []  # (way, prompt, the target's tokens, the way's)
    for i, prompt in enumerate(prompts):
        order = ways if i % 2 == 0 else list(reversed(ways))
        ref = None
        results = {}
        for w in order:
            on_progress(f"prompt {i + 1}/{len(prompts)} · {w.name}")
            results[w.name] = _run(target, draft, w, prompt, max_tokens, vc, V)
        ref = results["target"].tokens
        for w in ways:
            fin = results[w.name]
            r = runs[w.name]
            r.tokens += fin.stats.tokens
            r.seconds += fin.stats.seconds_generating
            r.per_prompt.append(fin.stats.tokens_per_s)
            if fin.tokens != ref:
                r.texts_differing += 1
                parted.append((w.name, list(prompt), list(ref), list(fin.tokens)))
    if parted:  # after every timed run, so that these decodes disturb none
        on_progress("where the texts part")
    for name, prompt, ref, tokens in parted:
        gap = parting_gap(target, prompt, ref, tokens, V)
        if gap is not None:
            runs[name].parting_gaps.append(gap)
    return runs, costs


def parting_gap(target: Model, prompt: list[int], ref: list[int], tokens: list[int], V: int) -> float | None:
    """Where a lossless way's greedy ``tokens`` first part from the target alone's ``ref``: the
    gap between the target's logits of the two tokens there, evaluated again on the prompt and
    the common tokens (one batch, as ``bench parted`` does). Under
    ``near_ties.ARGMAX_NEAR_TIE`` an argmax near-tie, which the verify's batch shape may round
    the other way; above it, a defect. None when the texts do not part at a token (equal, or
    one ends where the other goes on)."""
    k = first_difference(ref, tokens)
    if k is None or k >= len(ref) or k >= len(tokens):
        return None
    z = logits_after(target, list(prompt) + list(ref[:k]), V)
    return abs(float(z[tokens[k]] - z[ref[k]]))


def _run(target: Model, draft: Model | None, w: Way, prompt: list[int], max_tokens: int, vc: list[float], V: int):
    for m in (target, draft):
        if m is not None:
            m.reset()
    d = draft if w.uses_draft_model else None
    pair = Pair(draft=d, target=target, n_vocab=V, verify_costs=vc)
    cfg = DecodeConfig(mode=w.mode, spec_type=w.spec_type, max_tokens=max_tokens)
    fin, _ = generate_all(target, d, prompt, cfg, n_vocab=V, pair=pair)
    return fin


def ratios(runs: dict[str, WayRun]) -> dict[str, float]:
    base = runs["target"].tokens_per_s
    return {name: (r.tokens_per_s / base if base > 0 else 0.0) for name, r in runs.items()}


def prompt_ratios(runs: dict[str, WayRun]) -> dict[str, list[float]]:
    """Each way's speed over the target alone's on each prompt (in ``PROMPTS``' order): where a
    way pays and where it does not (lookup on the code edits, not on the maths), and how far one
    figure can be trusted on a machine whose speed moves."""
    base = runs["target"].per_prompt
    return {name: [x / b if b > 0 else 0.0 for x, b in zip(r.per_prompt, base)] for name, r in runs.items()}


def entry(runs: dict[str, WayRun], costs: Costs | None, *, max_tokens: int, n_threads: int, load: tuple,
          system: str, labels: dict) -> dict:
    """What is recorded (``store.costs``)."""
    return {
        "ratios": {k: round(v, 4) for k, v in ratios(runs).items()},
        "prompt_ratios": {k: [round(x, 4) for x in v] for k, v in prompt_ratios(runs).items()},
        "tokens_per_s": {k: round(r.tokens_per_s, 3) for k, r in runs.items()},
        "texts_differing": {k: r.texts_differing for k, r in runs.items()},
        "parting_gaps": {k: [round(g, 4) for g in r.parting_gaps] for k, r in runs.items()},
        "verify_costs": [round(x, 4) for x in verify_costs(costs)] if costs else None,
        "draft_token": round(costs.draft_token / costs.target_token, 4) if costs else None,
        "prompts": len(next(iter(runs.values())).per_prompt), "max_tokens": max_tokens, "threads": n_threads,
        "load_avg": list(load), "system_info": system, "models": labels,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
