"""A short timing probe on this machine: what one decode of each kind SD is made of costs,
for the predicted speed-up. Each is timed ``reps`` times after a context of real text and
the median kept (this machine may be busy: the median shrugs off a stall).

- the target, one token, logits at it: a ``target`` mode step;
- the target, k = 2..gamma+1 tokens with logits at every one: an SD verify of gamma = k − 1;
- each draft, one token and two tokens, logits at the last: a drafting step, and the
  catch-up that starts a block after a bonus block.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

from ..calibrate import prefill
from ..llamacpp.runtime import Part
from .predict import GAMMAS, Costs


def _time(model, context: Sequence[int], tokens: Sequence[int], rows: Sequence[int], reps: int) -> float:
    prefill(model, context)
    n = len(context)
    times = []
    for r in range(reps + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        model.decode_batch([Part(0, list(tokens), rows)])
        dt = time.perf_counter() - t0
        model.rollback(n)
        if r:
            times.append(dt)
    return statistics.median(times)


def probe(target, drafts: Sequence, context: Sequence[int], *, max_gamma: int = max(GAMMAS),
          reps: int = 5) -> list[Costs]:
    """Costs of the target with each draft, after ``context`` (prompt and some text: at
    least ``max_gamma + 2`` tokens; the last ``max_gamma + 1`` are the ones decoded)."""
    k_max = max_gamma + 1
    if len(context) < k_max + 1:
        raise ValueError(f"the probe needs at least {k_max + 1} tokens of context, got {len(context)}")
    ctx, toks = list(context[:-k_max]), list(context[-k_max:])
    t_one = _time(target, ctx, toks[:1], (0,), reps)
    verify = {k: _time(target, ctx, toks[:k], range(k), reps) for k in range(2, k_max + 1)}
    out = []
    for d in drafts:
        one = _time(d, ctx, toks[:1], (0,), reps)
        two = _time(d, ctx, toks[:2], (1,), reps)
        out.append(Costs(target_token=t_one, target_verify=verify, draft_token=one, draft_two=two))
    return out
