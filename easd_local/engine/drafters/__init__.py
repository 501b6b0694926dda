"""The drafters: what proposes the tokens the target verifies, each behind one interface
(``base.Drafter``: begin / draft / accept). ``make`` builds the kind ``--spec-type`` names;
``modes.DRAFTER_TABLE`` says what each kind needs and gives."""

from __future__ import annotations

from typing import Sequence

from ...errors import ConfigError
from ..modes import DRAFTER_TABLE
from ...llamacpp.runtime import Model
from .base import Ask, Consulting, Counters, Drafter, Proposal  # noqa: F401  (the package's interface)
from .chain import ChainDrafter
from .lookup import LookupDrafter
from .model import ModelDrafter, top_probability  # noqa: F401
from .ngram_mod import NgramModDrafter
from .policy import AcceptanceBook, extend_costs, linear_costs

K_MAX = 64  # the longest proposal any lookup makes (--spec-ngram-size-m is capped here)


def make(kind: str, model: Model | None, verify_costs: Sequence[float] | None = None) -> Drafter:
    """One drafter of ``kind`` (a ``DRAFTER_TABLE`` name); ``model`` is the draft model for
    the model drafter, ``verify_costs`` this machine's verify costs in one-token decodes
    (index k: k drafted tokens; None: not measured, ``policy.DEFAULT_SLOPE``)."""
    info = DRAFTER_TABLE.get(kind)
    if info is None:
        raise ConfigError(f"unknown drafter {kind!r}")
    if info.uses_model:
        if model is None:
            raise ConfigError(f"--spec-type {kind} drafts with the draft model, which is not loaded "
                              "(give --draft or a --pair)")
        return ModelDrafter(model)
    costs = extend_costs(verify_costs, K_MAX) if verify_costs else linear_costs(K_MAX)
    book = AcceptanceBook(costs)
    return LookupDrafter(book) if kind == "ngram-simple" else NgramModDrafter(book)


def chain(drafters: list[Drafter]) -> Drafter:
    return drafters[0] if len(drafters) == 1 else ChainDrafter(drafters)
