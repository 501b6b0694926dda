"""What a rule does with a row of logits that holds a NaN or a +inf, or no finite logit: the
decoding steps read every row through a rule that takes its maximum or its argmax (greedy
``rules.best``, ``dist.tempered`` and the dense softmax, the gate's entropies), and the
maximum is finite exactly when the row is free of them (``max`` propagates NaN, is +inf
with a +inf, -inf with no finite logit). So the rule checks the row on its way, and the
scheduler needs no pass of its own over 152k logits a row. Below the rules and the gate.
"""

from __future__ import annotations

import math


class NonFiniteRow(ValueError):
    """A row of logits that holds a NaN or a +inf, or no finite logit, met by a rule. The
    scheduler names the model whose rows the step had just been sent
    (``runtime.non_finite_logits``)."""


def checked(top: float) -> float:
    """``top`` (a row's maximum or the logit of its argmax) when finite; else NonFiniteRow."""
    if not math.isfinite(top):
        raise NonFiniteRow("the model produced NaN or infinite logits")
    return top
