"""Several sequences in one llama.cpp context (runtime.Model with n_seq > 1), on the tiny
target in real llama.cpp: per-sequence mirrors, batched decode, per-sequence rollback,
per-sequence context, and the KV-cache refusal."""

from __future__ import annotations

import numpy as np
import pytest

from easd_local.llamacpp import runtime
from easd_local.errors import ContextOverflowError, ModelLoadError
from easd_local.llamacpp.runtime import LoadOptions, Model, Part

TEXTS = ["The quick brown fox jumps over the lazy dog and then", "Once upon a time there was a", "hello"]


@pytest.fixture(scope="module")
def m3(tiny_target):
    with Model(tiny_target, LoadOptions(n_ctx=256, n_threads=1, n_seq=3)) as m:
        yield m


def test_context_is_per_sequence(m3):
    assert m3.n_seq == 3 and m3.n_ctx == 256 and m3.n_ctx_total == 3 * 256
    assert m3.kv_bytes == m3.kv_cache_bytes(3 * 256) > 0
    m3.reset()
    # every sequence can fill its own context; one more token in one of them is refused
    m3.decode_batch([Part(s, [65] * 256, ()) for s in range(3)])
    assert [m3.seq_len(s) for s in range(3)] == [256, 256, 256]
    with pytest.raises(ContextOverflowError, match="257 tokens needed, the context holds 256"):
        m3.decode_batch([Part(1, [66])])
    assert m3.seq_len(1) == 256
    m3.reset()


def test_rollback_of_one_sequence_leaves_the_others_untouched(m3):
    """Sequences overlap in positions; removing sequence 0's cells from position 3 on must
    not touch sequence 1's cells at the same positions. Measured bitwise identical."""
    m3.reset()
    a, b = (m3.vocab.tokenize(t) for t in TEXTS[:2])
    m3.decode_batch([Part(0, a, ()), Part(1, b, ())])
    ref = m3.decode_batch([Part(1, [65])])[0]
    m3.rollback(len(b), seq=1)
    m3.rollback(3, seq=0)
    assert m3.seq_tokens(0) == a[:3] and m3.seq_tokens(1) == b
    got = m3.decode_batch([Part(1, [65])])[0]
    np.testing.assert_array_equal(got, ref)
    # and clearing a whole sequence leaves the other's logits as they were
    m3.rollback(len(b), seq=1)
    m3.reset_seq(0)
    assert m3.seq_len(0) == 0 and m3.seq_len(1) == len(b)
    np.testing.assert_array_equal(m3.decode_batch([Part(1, [65])])[0], ref)
    m3.reset()


def test_batch_of_sequences_returns_each_its_own_rows(m3, tiny_target):
    """One decode carrying three sequences of different lengths, logits at chosen rows,
    equals each sequence decoded alone (first in its cache: the same cell layout)."""
    toks = [m3.vocab.tokenize(t) for t in TEXTS]
    ats = [(0, -1), tuple(range(len(toks[1]))), (-1,)]
    with Model(tiny_target, LoadOptions(n_ctx=256, n_threads=1)) as alone:
        refs = []
        for t, at in zip(toks, ats):
            alone.reset()
            refs.append(alone.decode(t, logits_at=at))
    m3.reset()
    got = m3.decode_batch([Part(s, t, at) for s, (t, at) in enumerate(zip(toks, ats))])
    for s in range(3):
        assert got[s].shape == (len(ats[s]), m3.n_vocab)
        # batched vs alone: llama.cpp's numerics may differ slightly (cell layout)
        assert np.abs(got[s] - refs[s]).max() < 1.0
        assert (got[s].argmax(1) == refs[s].argmax(1)).all()
        assert m3.seq_tokens(s) == toks[s]
    m3.reset()


def test_batch_argument_errors(m3):
    m3.reset()
    with pytest.raises(ValueError, match="appears twice"):
        m3.decode_batch([Part(0, [65]), Part(0, [66])])
    with pytest.raises(ValueError, match="sequence 3 out of range"):
        m3.decode_batch([Part(3, [65])])
    assert [m3.seq_len(s) for s in range(3)] == [0, 0, 0]


def test_kv_cache_that_does_not_fit_is_refused_before_decoding(tiny_target, monkeypatch):
    monkeypatch.setattr(runtime, "available_memory", lambda: 1000)
    with pytest.raises(ModelLoadError) as ei:
        Model(tiny_target, LoadOptions(n_ctx=256, n_threads=1, n_seq=4))
    msg = str(ei.value)
    assert "KV cache for 4 sequences × 256 tokens needs" in msg and "lower --parallel or --ctx" in msg
    assert "\n" not in msg
    with pytest.raises(ModelLoadError, match="at most 256 sequences"):
        Model(tiny_target, LoadOptions(n_ctx=256, n_threads=1, n_seq=300))


def test_a_lent_one_token_decode_is_the_copying_decode(m3):
    """The scheduler's commonest decode, tokens of which the last one's row is wanted, lent
    (its own short path in ``decode_batch``): the same row as the copying path's, a view over llama.cpp's
    buffer, the same mirror; and the same refusals (a full context, an unknown sequence),
    leaving the sequence as it was."""
    m3.reset()
    a = m3.vocab.tokenize(TEXTS[0])
    m3.decode_batch([Part(2, a, ())])
    ref = ref_one = m3.decode_batch([Part(2, [65])])[0]
    m3.rollback(len(a), seq=2)
    lent = m3.decode_batch([Part(2, [65])], lend=True)
    assert len(lent) == 1 and lent[0].shape == (1, m3.n_vocab) and not lent[0].flags.owndata
    np.testing.assert_array_equal(lent[0], ref)
    assert m3.seq_tokens(2) == a + [65]
    # several tokens, the last one's row (a drafter's catch-up): the same as copied
    m3.rollback(len(a), seq=2)
    ref = m3.decode_batch([Part(2, [65, 66, 67])])[0]
    m3.rollback(len(a), seq=2)
    lent = m3.decode_batch([Part(2, [65, 66, 67])], lend=True)[0]
    assert lent.shape == (1, m3.n_vocab) and not lent.flags.owndata
    np.testing.assert_array_equal(lent, ref)
    assert m3.seq_tokens(2) == a + [65, 66, 67]
    # a verify block of no drafts asks its one row as range(0, 1): the same row
    m3.rollback(len(a), seq=2)
    np.testing.assert_array_equal(m3.decode_batch([Part(2, [65], range(1))], lend=True)[0], ref_one)
    m3.rollback(len(a) + 1, seq=2)
    with pytest.raises(ValueError, match="sequence 3 out of range"):
        m3.decode_batch([Part(3, [65])], lend=True)
    m3.decode_batch([Part(1, [65] * 256, ())])
    with pytest.raises(ContextOverflowError, match="257 tokens needed, the context holds 256"):
        m3.decode_batch([Part(1, [66])], lend=True)
    assert m3.seq_len(1) == 256 and m3.seq_tokens(2) == a + [65]
    m3.reset()
