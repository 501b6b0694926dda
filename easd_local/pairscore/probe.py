"""A short timing probe on this machine: what one decode of each kind SD is made of costs,
for the predicted speed-up. Each is timed ``reps`` times after a context of real text and
the median kept (this machine may be busy: the median shrugs off a stall); one model's shapes
are timed in turn within each round, so that a drift of the machine's speed over the probe
moves them alike and their ratios (the verify costs in one-token decodes) stand.

- the target, one token, logits at it: a ``target`` mode step;
- the target, k = 2..gamma+1 tokens with logits at every one: an SD verify of gamma = k − 1, up to
  a prompt lookup's longest proposal (``PROBE_GAMMA``): a verify's cost is not a straight line
  in its tokens (on a 2-core AMD EPYC with the default pair, 8 tokens cost 1.5 decodes more than
  7, and 16 tokens about one decode less than 15: llama.cpp's CPU kernels work in blocks of
  rows), so the lengths a lookup may propose are timed, not extrapolated;
- each draft, one token and two tokens, logits at the last: a drafting step, and the
  catch-up that starts a block after a bonus block.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

from ..calibrate import prefill
from ..engine.config import DecodeConfig
from ..llamacpp.runtime import Part
from .predict import GAMMAS, Costs

# the most drafted tokens a probe times a verify of: the draft model's gammas and a prompt
# lookup's longest proposal by default (--spec-ngram-size-m)
PROBE_GAMMA = max(max(GAMMAS), DecodeConfig.spec_ngram_size_m)


def time_shapes(model, context: Sequence[int], shapes: Sequence[tuple[Sequence[int], Sequence[int]]],
          reps: int) -> list[float]:
    """The median seconds of one decode of each (tokens, rows) shape after ``context``, the
    shapes taken in turn within each of ``reps`` rounds (after a warm-up round), so that a drift
    of this machine's speed falls on every shape alike: the costs are read as ratios of them."""
    prefill(model, context)
    n = len(context)
    times: list[list[float]] = [[] for _ in shapes]
    for r in range(reps + 1):  # the first round is a warm-up
        for i, (tokens, rows) in enumerate(shapes):
            t0 = time.perf_counter()
            model.decode_batch([Part(0, list(tokens), rows)])
            dt = time.perf_counter() - t0
            model.rollback(n)
            if r:
                times[i].append(dt)
    return [statistics.median(t) for t in times]


def time_verifies(target, context: Sequence[int], k_max: int, reps: int) -> list[float]:
    """The median seconds of the target's decode of k = 1..k_max tokens, logits at every one (a
    one-token step, then SD verifies of k − 1 drafted tokens), the last ``k_max`` of ``context``
    after the rest."""
    if len(context) < k_max + 1:
        raise ValueError(f"the probe needs at least {k_max + 1} tokens of context, got {len(context)}")
    ctx, toks = list(context[:-k_max]), list(context[-k_max:])
    return time_shapes(target, ctx, [(toks[:k], range(k)) for k in range(1, k_max + 1)], reps)


def probe(target, drafts: Sequence, context: Sequence[int], *, max_gamma: int = PROBE_GAMMA,
          reps: int = 5) -> list[Costs]:
    """Costs of the target with each draft, after ``context`` (prompt and some text: at
    least ``max_gamma + 2`` tokens; the last ``max_gamma + 1`` are the ones decoded)."""
    k_max = max_gamma + 1
    t_one, *t_verify = time_verifies(target, context, k_max, reps)  # checks the context's length
    ctx, toks = list(context[:-k_max]), list(context[-k_max:])
    verify = dict(zip(range(2, k_max + 1), t_verify))
    out = []
    for d in drafts:
        one, two = time_shapes(d, ctx, [(toks[:1], (0,)), (toks[:2], (1,))], reps)
        out.append(Costs(target_token=t_one, target_verify=verify, draft_token=one, draft_two=two))
    return out
