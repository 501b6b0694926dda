"""easd_local.engine.pair: the draft/target compatibility check and load_pair, on the tiny models."""
from __future__ import annotations

import pytest

from easd_local.errors import PairError
from easd_local.engine.pair import (
    VOCAB_MAX_SIZE_DIFFERENCE,
    Pair,
    check_compatible,
    check_pair_files,
    load_pair,
    open_models,
)
from easd_local.llamacpp.runtime import LoadOptions, ModelFile

pytest.importorskip("llama_cpp")

OPTS = LoadOptions(n_ctx=256, n_threads=1)


def test_draft_and_target_are_compatible(tiny_draft, tiny_target, tiny_spec):
    assert check_pair_files(tiny_draft, tiny_target) == tiny_spec.VOCAB_SIZE


def test_target_and_its_q4_are_compatible_both_ways(tiny_target, tiny_target_q4, tiny_spec):
    assert check_pair_files(tiny_target, tiny_target_q4) == tiny_spec.VOCAB_SIZE
    assert check_pair_files(tiny_target_q4, tiny_target) == tiny_spec.VOCAB_SIZE


def test_odd_vocabulary_is_rejected_naming_the_token(tiny_target, tiny_odd, tiny_spec):
    i = tiny_spec.ODD_FIRST_DIFF_ID
    assert i == 267
    with pytest.raises(PairError) as ei:
        check_pair_files(tiny_odd, tiny_target)
    assert str(ei.value) == f"vocabularies differ at token id {i}: draft 'ly' vs target 'ou'"
    with pytest.raises(PairError) as ei:
        check_pair_files(tiny_target, tiny_odd)
    assert str(ei.value) == f"vocabularies differ at token id {i}: draft 'ou' vs target 'ly'"


@pytest.fixture
def vocab_pair(tiny_draft, tiny_target):
    with ModelFile(tiny_draft) as d, ModelFile(tiny_target) as t:
        yield d, t


def test_vocab_size_difference_over_128_is_rejected(vocab_pair, tiny_spec):
    d, t = vocab_pair
    t.vocab.n_vocab = tiny_spec.VOCAB_SIZE + VOCAB_MAX_SIZE_DIFFERENCE + 1
    with pytest.raises(PairError) as ei:
        check_compatible(d, t)
    assert str(ei.value) == (
        f"vocabulary sizes differ by 129 (draft 306, target {306 + 129}; at most 128 allowed)"
    )


def test_vocab_size_difference_of_128_is_allowed_and_the_shared_size_is_the_smaller(vocab_pair, tiny_spec):
    d, t = vocab_pair
    d.vocab.n_vocab = tiny_spec.VOCAB_SIZE + VOCAB_MAX_SIZE_DIFFERENCE
    # only ids below the smaller vocabulary are compared (and ever decoded)
    assert check_compatible(d, t) == tiny_spec.VOCAB_SIZE


def test_recurrent_model_is_rejected(vocab_pair):
    d, t = vocab_pair
    t.recurrent = True
    t.architecture = "mamba"
    with pytest.raises(PairError, match=r"target tiny-target-q8_0\.gguf is a recurrent/hybrid model \(mamba\)"):
        check_compatible(d, t)


def test_load_pair_returns_both_models_and_the_shared_vocab(tiny_draft, tiny_target, tiny_spec):
    with load_pair(tiny_draft, tiny_target, OPTS) as pair:
        assert isinstance(pair, Pair)
        assert pair.n_vocab == tiny_spec.VOCAB_SIZE
        assert pair.draft.path == tiny_draft and pair.target.path == tiny_target
        assert pair.draft.n_ctx == pair.target.n_ctx == 256
        assert pair.target.decode([65, 66]).shape == (1, pair.n_vocab)
        assert pair.draft.decode([65, 66]).shape == (1, pair.n_vocab)
    assert pair.draft._ctx is None and pair.target._ctx is None  # closed


def test_load_pair_checks_before_loading(tiny_target, tiny_odd):
    with pytest.raises(PairError, match="token id 267"):
        load_pair(tiny_odd, tiny_target, OPTS)


def test_open_models_with_one_side(tiny_draft, tiny_target, tiny_spec):
    with open_models(None, tiny_target, OPTS) as p:
        assert p.draft is None and p.target is not None and p.n_vocab == tiny_spec.VOCAB_SIZE
    with open_models(tiny_draft, None, OPTS) as p:
        assert p.target is None and p.draft is not None
    with pytest.raises(ValueError):
        open_models(None, None)
