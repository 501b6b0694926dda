"""Load a draft/target pair and check that the draft can speak for the target.

The compatibility rules follow llama.cpp's ``common_speculative_are_compatible``: same
vocabulary type, same BOS/EOS handling, vocabulary sizes within 128 of each other, and
identical token text for every id in the shared range (the first few ids are skipped, as
llama.cpp does, because converters disagree about padding/control tokens there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..errors import PairError
from . import drafters as _drafters
from .drafters import Drafter
from ..llamacpp.runtime import LoadOptions, Model, ModelFile

VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp: SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5  # llama.cpp: SPEC_VOCAB_CHECK_START_TOKEN_ID


def _show(text: bytes) -> str:
    return repr(text.decode("utf-8", errors="replace"))


def check_compatible(draft: ModelFile, target: ModelFile) -> int:
    """Raise PairError naming what differs; return the shared vocabulary size.

    Decoding uses only ids below the returned size (the shorter vocabulary)."""
    d, t = draft.vocab, target.vocab
    if d.vocab_type != t.vocab_type:
        raise PairError(f"vocabulary types differ: draft {d.vocab_type}, target {t.vocab_type}")
    if d.add_bos != t.add_bos or (t.add_bos and d.bos_id != t.bos_id):
        raise PairError(
            f"BOS handling differs: draft add_bos={d.add_bos} bos={d.bos_id}, "
            f"target add_bos={t.add_bos} bos={t.bos_id}"
        )
    if d.add_eos != t.add_eos or d.eos_id != t.eos_id:
        raise PairError(
            f"EOS differs: draft add_eos={d.add_eos} eos={d.eos_id}, target add_eos={t.add_eos} eos={t.eos_id}"
        )
    diff = abs(d.n_vocab - t.n_vocab)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        raise PairError(
            f"vocabulary sizes differ by {diff} (draft {d.n_vocab}, target {t.n_vocab}; "
            f"at most {VOCAB_MAX_SIZE_DIFFERENCE} allowed)"
        )
    n_shared = min(d.n_vocab, t.n_vocab)
    for i in range(VOCAB_CHECK_START_TOKEN_ID, n_shared):
        a, b = d.token_text(i), t.token_text(i)
        if a != b:
            raise PairError(f"vocabularies differ at token id {i}: draft {_show(a)} vs target {_show(b)}")
    for m, role in ((draft, "draft"), (target, "target")):
        if m.recurrent:
            raise PairError(
                f"{role} {m.path.name} is a recurrent/hybrid model ({m.architecture}): its cache cannot be "
                "rolled back, which speculative decoding needs"
            )
    return n_shared


@dataclass
class Pair:
    """The target, the draft model when one is loaded, and the drafters decoding uses (one
    of each kind, built on first use and kept: a learning drafter keeps what it learnt)."""

    draft: Model | None  # None when no mode in use needs the draft model
    target: Model | None  # None when only the draft is needed (mode draft)
    n_vocab: int  # shared vocabulary size: decoding looks only at ids below this
    # this machine's verify costs in one-token decodes (index k: k drafted tokens), for the
    # lookup drafters' proposal lengths; None: not measured
    verify_costs: Sequence[float] | None = None
    _drafters: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def models(self) -> tuple[Model, ...]:
        return tuple(m for m in (self.target, self.draft) if m is not None)

    def drafter(self, kinds: Sequence[str]) -> Drafter:
        """The drafter for ``kinds`` (``DecodeConfig.drafters``), tried in that order."""
        key = tuple(kinds)
        d = self._drafters.get(key)
        if d is None:
            d = self._drafters[key] = _drafters.chain([self._one(k) for k in key])
        return d

    def _one(self, kind: str) -> Drafter:
        d = self._drafters.get((kind,))
        if d is None:
            d = self._drafters[(kind,)] = _drafters.make(kind, self.draft, self.verify_costs)
        return d

    def use_drafter(self, kind: str, drafter: Drafter) -> None:
        """Draft ``kind`` (a ``--spec-type`` name) with ``drafter`` from now on: a drafter of
        one's own plugs in here."""
        self._drafters = {k: d for k, d in self._drafters.items() if kind not in k}
        self._drafters[(kind,)] = drafter

    def close(self) -> None:
        for m in (self.draft, self.target):
            if m is not None:
                m.close()

    def __enter__(self) -> "Pair":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_pair_files(draft_path: str | Path, target_path: str | Path) -> int:
    """Vocabulary-only check of two files (fast: no weights are loaded)."""
    with ModelFile(draft_path) as d, ModelFile(target_path) as t:
        return check_compatible(d, t)


def load_pair(
    draft_path: str | Path,
    target_path: str | Path,
    target_opts: LoadOptions = LoadOptions(),
    draft_opts: LoadOptions | None = None,
) -> Pair:
    """Check the vocabularies first (cheap), then load both models for decoding."""
    check_pair_files(draft_path, target_path)
    target = Model(target_path, target_opts)
    try:
        draft = Model(draft_path, draft_opts or target_opts)
    except BaseException:
        target.close()
        raise
    return Pair(draft=draft, target=target, n_vocab=min(draft.n_vocab, target.n_vocab))


def open_models(
    draft_path: str | Path | None,
    target_path: str | Path | None,
    target_opts: LoadOptions = LoadOptions(),
    draft_opts: LoadOptions | None = None,
) -> Pair:
    """Load what was given: both (checked as a pair) or just one model."""
    if draft_path is not None and target_path is not None:
        return load_pair(draft_path, target_path, target_opts, draft_opts)
    if target_path is not None:
        t = Model(target_path, target_opts)
        return Pair(draft=None, target=t, n_vocab=t.n_vocab)
    if draft_path is not None:
        d = Model(draft_path, draft_opts or target_opts)
        return Pair(draft=d, target=None, n_vocab=d.n_vocab)
    raise ValueError("no model path given")
