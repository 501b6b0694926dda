"""easd_local.llamacpp.runtime.Model on real llama.cpp, with the tiny GGUF models.

All models here run with one thread: the test machine is shared, and ggml's worker
threads spin-wait on each other, so two threads on two busy cores can be 100x slower.
"""
from __future__ import annotations

import os
import random
import shutil
import tracemalloc

import numpy as np
import pytest

from easd_local.llamacpp import runtime
from easd_local.errors import ContextOverflowError, RuntimeFailure
from easd_local.llamacpp.runtime import LoadOptions, Model, ModelFile
from easd_local.llamacpp.vocab import Detokenizer, Vocab

pytest.importorskip("llama_cpp")

N_CTX = 512
OPTS = LoadOptions(n_ctx=N_CTX, n_threads=1, n_batch=512)

# Batched vs token-by-token logits.  llama.cpp's CPU matmul takes a different kernel for
# a one-token batch than for a multi-token one (multi-token batches of any size, 2..256,
# were bitwise identical to each other).  The ulp-level differences are then amplified
# where an activation lands near a Q8_0 rounding boundary when it is re-quantized for the
# next matmul, so the difference is sparse but not tiny: most positions are bitwise equal
# and a few positions late in a sequence differ by up to a few tenths of a logit.
# Measured (12 prompts x 256 positions, one thread, batch of 256 vs 256 single decodes):
#   tiny target Q8_0 max |diff| 0.361, tiny target Q4_0 0.370, tiny draft 0.376
#   (logits span about +-30; max softmax-probability difference 0.02).
# BATCH_TOL is ~2.7x the worst seen.  The greedy token (argmax) flipped at 10, 6 and 4 of
# those 3072 positions (target, Q4_0, draft), at near-ties, so argmax agreement is asserted
# on >= 98% of positions and everywhere the top-2 margin exceeds 2*BATCH_TOL.
BATCH_TOL = 1.0

# Prompt whose 256 tokens do show a batch-vs-single difference on both target files
# (words drawn with random.seed(2); the difference starts after position ~150).
_WORDS = "the cat sat on a mat and it was good then he ran in to house of stone where we found our way home again The I".split()


def _prompt_text(seed: int = 2, n_words: int = 300) -> str:
    rnd = random.Random(seed)
    return " ".join(rnd.choice(_WORDS) for _ in range(n_words))


MULTIBYTE = "naïve café – Ωmega 日本語 ½ 🙂👍🏽 ok"


@pytest.fixture(scope="module")
def target(tiny_target):
    with Model(tiny_target, OPTS) as m:
        yield m


@pytest.fixture(scope="module")
def target_q4(tiny_target_q4):
    with Model(tiny_target_q4, OPTS) as m:
        yield m


@pytest.fixture(scope="module")
def models(target, target_q4):
    return {"target": target, "target_q4": target_q4}


@pytest.fixture
def fresh(target):
    target.reset()
    return target


# --------------------------------------------------------------------------- batched decode
@pytest.mark.parametrize("key", ["target", "target_q4"])
def test_batched_logits_match_token_by_token(models, key):
    m = models[key]
    toks = m.vocab.tokenize(_prompt_text())[:256]
    assert len(toks) == 256
    m.reset()
    single = np.concatenate([m.decode([t]) for t in toks])
    assert m.n_past == 256
    m.reset()
    batched = m.decode(toks, logits_at=tuple(range(len(toks))))
    assert batched.shape == single.shape == (256, m.n_vocab)
    diff = np.abs(batched - single).max()
    assert diff <= BATCH_TOL, f"max |batched - single| = {diff}"
    # greedy tokens agree except at near-ties (measured on this prompt: 2 of 256 flips on
    # Q8_0, 1 on Q4_0, all with a top-2 margin below 0.08)
    top2 = np.sort(single, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    flips = batched.argmax(1) != single.argmax(1)
    assert flips.mean() <= 0.02, f"{flips.sum()} argmax flips"
    assert (margin[flips] < 2 * BATCH_TOL).all()
    clear = margin > 2 * BATCH_TOL
    np.testing.assert_array_equal(batched.argmax(1)[clear], single.argmax(1)[clear])
    # multi-token batches of different sizes agree with each other exactly
    m.reset()
    m.decode(toks[:100], logits_at=())
    chunk = m.decode(toks[100:108], logits_at=tuple(range(8)))
    np.testing.assert_array_equal(chunk, batched[100:108])


def test_decode_longer_than_n_batch_is_chunked(tiny_target):
    """A decode of more tokens than n_batch goes through llama.cpp in several batches and
    still returns the requested rows in order."""
    with Model(tiny_target, LoadOptions(n_ctx=N_CTX, n_threads=1, n_batch=64)) as small, Model(
        tiny_target, OPTS
    ) as big:
        toks = small.vocab.tokenize(_prompt_text())[:200]
        at = (0, 63, 64, 130, -1)
        a = small.decode(toks, logits_at=at)
        b = big.decode(toks, logits_at=at)
        assert small.n_past == big.n_past == 200
        assert a.shape == (5, small.n_vocab)
        assert np.abs(a - b).max() <= BATCH_TOL
        assert (a.argmax(1) == b.argmax(1)).all()


# --------------------------------------------------------------------------- logits_at
def test_logits_at_rows_shape_dtype_and_order(fresh):
    m = fresh
    toks = m.vocab.tokenize("The quick brown fox jumps over the lazy dog")
    n = len(toks)
    full = m.decode(toks, logits_at=tuple(range(n)))
    assert full.shape == (n, m.n_vocab) and full.dtype == np.float32
    m.reset()
    r = m.decode(toks, logits_at=(-1, 0, 2, -2, 2))
    assert r.shape == (5, m.n_vocab) and r.dtype == np.float32
    np.testing.assert_array_equal(r, full[[n - 1, 0, 2, n - 2, 2]])
    # default: last position only
    m.reset()
    last = m.decode(toks)
    assert last.shape == (1, m.n_vocab)
    np.testing.assert_array_equal(last[0], full[-1])


def test_logits_at_empty_tuple_decodes_without_logits(fresh):
    m = fresh
    toks = m.vocab.tokenize("Hello there")
    r = m.decode(toks, logits_at=())
    assert r.shape == (0, m.n_vocab) and r.dtype == np.float32
    assert m.tokens == toks
    # nothing to evaluate, nothing asked: fine and no change
    assert m.decode([], logits_at=()).shape == (0, m.n_vocab)
    assert m.n_past == len(toks)


@pytest.mark.parametrize("at", [(5,), (-6,), (0, 5), (100,)])
def test_logits_at_out_of_range_is_value_error(fresh, at):
    m = fresh
    m.decode([65, 66], logits_at=())
    with pytest.raises(ValueError, match="out of range for 5 tokens"):
        m.decode([67, 68, 69, 70, 71], logits_at=at)
    assert m.tokens == [65, 66]  # nothing was decoded


def test_decode_nothing_with_default_logits_is_value_error(fresh):
    with pytest.raises(ValueError, match="out of range for 0 tokens"):
        fresh.decode([])


def test_start_pos_past_the_end_is_value_error(fresh):
    fresh.decode([65, 66, 67], logits_at=())
    with pytest.raises(ValueError, match="past the cache end"):
        fresh.decode([68], start_pos=4)


def test_result_is_k_compact_rows_not_a_context_sized_buffer(fresh):
    m = fresh
    toks = m.vocab.tokenize(_prompt_text())[:300]
    m.decode(toks, logits_at=(0, 150, -1))  # warm-up: one-time ctypes/numpy caches (~50 kB)
    m.reset()
    tracemalloc.start()
    try:
        r = m.decode(toks, logits_at=(0, 150, -1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.shape == (3, m.n_vocab)
    # exactly k rows, owned by the array, not a view into something bigger
    assert r.flags.owndata and r.base is None and r.flags.c_contiguous
    assert r.nbytes == 3 * m.n_vocab * 4
    # no n_tokens x n_vocab (let alone n_ctx x n_vocab) float buffer was allocated:
    # measured peak ~10 kB, such a buffer would be 367 kB (300 x 306 x 4)
    assert peak < 300 * m.n_vocab * 4 / 4, peak
    # a copy, not llama.cpp's logits buffer: a later decode does not change it
    before = r.copy()
    m.decode([65, 66, 67], logits_at=(0, 1, 2))
    np.testing.assert_array_equal(r, before)


# --------------------------------------------------------------------------- KV bookkeeping
def test_rollback_and_redecode_give_identical_logits(models):
    # Measured: bitwise identical (max |diff| 0.0) on target and target_q4, for the same
    # batch shape at the same positions; so this asserts exact equality.
    for m in models.values():
        m.reset()
        toks = m.vocab.tokenize(_prompt_text())[:120]
        m.decode(toks[:100], logits_at=())
        first = m.decode(toks[100:], logits_at=tuple(range(20)))
        m.rollback(100)
        assert m.n_past == 100 and m.tokens == toks[:100]
        again = m.decode(toks[100:], logits_at=tuple(range(20)))
        np.testing.assert_array_equal(again, first)
        # a different continuation after a rollback does not see the old one
        m.rollback(100)
        m.decode([65] * 20, logits_at=())
        m.rollback(100)
        np.testing.assert_array_equal(m.decode(toks[100:], logits_at=tuple(range(20))), first)


def test_tokens_and_n_past_bookkeeping(fresh):
    m = fresh
    assert m.n_past == 0 and m.tokens == []
    m.decode([65, 66, 67], logits_at=())
    m.decode([68])
    assert m.n_past == 4 and m.tokens == [65, 66, 67, 68]
    t = m.tokens
    t.append(1)  # a copy
    assert m.n_past == 4
    m.rollback(2)
    assert m.tokens == [65, 66] and m.n_past == 2
    m.rollback(2)  # at the end: no-op
    m.rollback(50)  # beyond the end: no-op
    assert m.tokens == [65, 66]
    with pytest.raises(ValueError):
        m.rollback(-1)
    assert m.common_prefix([65, 66, 99]) == 2
    assert m.common_prefix([65]) == 1
    m.rollback(0)
    assert m.n_past == 0
    m.decode([70, 71], logits_at=())
    m.reset()
    assert m.n_past == 0 and m.tokens == []


def test_decode_with_earlier_start_pos_rolls_back(fresh):
    m = fresh
    toks = m.vocab.tokenize(_prompt_text())[:40]
    m.decode(toks[:30], logits_at=())
    alt = [65, 66, 67, 68]
    r = m.decode(alt, start_pos=20, logits_at=(0, 1, 2, 3))
    assert m.tokens == toks[:20] + alt and m.n_past == 24
    m.reset()
    m.decode(toks[:20], logits_at=())
    ref = m.decode(alt, logits_at=(0, 1, 2, 3))
    np.testing.assert_array_equal(r, ref)
    # start_pos equal to the end appends
    m.decode([69], start_pos=24)
    assert m.n_past == 25


# --------------------------------------------------------------------------- context overflow
def test_decode_beyond_n_ctx_raises_context_overflow(tiny_target):
    with Model(tiny_target, LoadOptions(n_ctx=64, n_threads=1)) as m:
        n_ctx = m.n_ctx  # llama.cpp pads the context (to 256)
        assert n_ctx >= 64
        with pytest.raises(ContextOverflowError) as ei:
            m.decode([65] * (n_ctx + 1), logits_at=())
        msg = str(ei.value)
        assert f"{n_ctx + 1} tokens needed" in msg and f"holds {n_ctx}" in msg and "--ctx" in msg
        assert "\n" not in msg and m.n_past == 0
        m.decode([65] * (n_ctx - 4), logits_at=())
        with pytest.raises(ContextOverflowError, match=f"{n_ctx + 4} tokens needed"):
            m.decode([66] * 8)
        assert m.n_past == n_ctx - 4  # unchanged by the refused call
        assert m.decode([66] * 4).shape == (1, m.n_vocab)  # exactly full is fine
        assert m.n_past == n_ctx
        # rolling back makes room again
        m.decode([67] * 8, start_pos=n_ctx - 8)
        assert m.n_past == n_ctx


def test_cache_that_cannot_be_truncated_is_a_clear_failure(tiny_target, monkeypatch):
    with Model(tiny_target, LoadOptions(n_ctx=64, n_threads=1)) as m:
        m.decode([65, 66, 67, 68, 69], logits_at=())
        monkeypatch.setattr(runtime._ll, "llama_memory_seq_rm", lambda *a: False)
        with pytest.raises(RuntimeFailure) as ei:
            m.rollback(2)
        msg = str(ei.value)
        assert msg.startswith(f"{m.path.name}: llama.cpp cannot roll its KV cache back to position 2")
        assert "architecture 'llama' keeps recurrent state" in msg
        assert "speculative decoding needs a transformer whose cache can be truncated" in msg
        assert m.n_past == 5  # bookkeeping left alone
        with pytest.raises(RuntimeFailure, match="cannot roll its KV cache back to position 3"):
            m.decode([70], start_pos=3)
        m.rollback(5)  # no-op at the end: never asks llama.cpp


def test_vocab_only_load_is_the_vocabulary_without_a_context(tiny_target, target):
    """ModelFile (no weights) tokenizes and renders as the loaded model does, and has no
    context to decode with at all, rather than methods that raise."""
    with ModelFile(tiny_target) as f:
        assert not isinstance(f, Model) and isinstance(f.vocab, Vocab)
        for name in ("decode", "decode_batch", "rollback", "reset", "n_past", "n_ctx", "placement", "memory"):
            assert not hasattr(f, name), name
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": MULTIBYTE}]
        assert f.vocab.chat_tokens(msgs) == target.vocab.chat_tokens(msgs)
        assert f.vocab.tokenize(MULTIBYTE) == target.vocab.tokenize(MULTIBYTE)
        assert f.n_vocab == f.vocab.n_vocab == target.n_vocab
        assert f.vocab.eog_ids() == target.vocab.eog_ids()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc/self/maps")
def test_weights_read_into_memory_decode_as_the_mapped_ones(tiny_target, tmp_path):
    """--no-mmap (LoadOptions.mmap=False): llama.cpp reads the file instead of mapping it, and
    the model decodes bit for bit as the mapped one. A copy under its own name, so that no
    other model of this process maps the same path."""
    path = tmp_path / "own-target.gguf"
    shutil.copyfile(tiny_target, path)
    prompt = list(range(1, 40))
    rows = {}
    for mmap in (True, False):
        with Model(path, LoadOptions(n_ctx=N_CTX, n_threads=1, n_batch=512, mmap=mmap)) as m:
            with open("/proc/self/maps") as f:
                mapped = str(path) in f.read()
            assert mapped is mmap
            rows[mmap] = m.decode(prompt, logits_at=range(len(prompt)))
    np.testing.assert_array_equal(rows[True], rows[False])


def test_closed_model_cannot_decode(tiny_target):
    m = Model(tiny_target, LoadOptions(n_ctx=64, n_threads=1))
    m.close()
    with pytest.raises(RuntimeFailure, match="tiny-target-q8_0.gguf: model is closed"):
        m.decode([65])


# --------------------------------------------------------------------------- text
@pytest.mark.parametrize(
    "text", ["Hello, world!", "The quick brown fox\n\njumps over the lazy dog.", MULTIBYTE, "  a  b\tc "]
)
def test_tokenize_detokenize_round_trip(target, text):
    toks = target.vocab.tokenize(text)
    assert toks and all(0 <= t < target.n_vocab for t in toks)
    assert target.vocab.detokenize(toks) == text


def test_merges_make_text_shorter_and_specials_parse(target, tiny_spec):
    text = "in the house there is a cat and the other one"
    assert len(target.vocab.tokenize(text)) < len(text.encode())
    ids = target.vocab.tokenize("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tiny_spec.IM_START_ID and ids[-1] == tiny_spec.IM_END_ID
    raw = target.vocab.tokenize("<|im_start|>", parse_special=False)
    assert tiny_spec.IM_START_ID not in raw and len(raw) > 1
    # special tokens render only when asked
    assert target.vocab.detokenize([tiny_spec.IM_START_ID, 72, tiny_spec.IM_END_ID]) == "H"
    assert target.vocab.detokenize([tiny_spec.IM_START_ID, 72], special=True) == "<|im_start|>H"
    assert target.vocab.token_text(tiny_spec.ODD_FIRST_DIFF_ID) == b"ou"
    assert target.vocab.token_to_piece(32) == b" "


def test_detokenizer_never_emits_half_a_character(target):
    toks = target.vocab.tokenize(MULTIBYTE, add_special=False)
    pieces_bytes = [target.vocab.token_to_piece(t) for t in toks]
    # the vocabulary is byte-level: some multi-byte characters really are split
    assert any(p and not _valid_utf8(p) for p in pieces_bytes)
    d = target.vocab.streamer()
    assert isinstance(d, Detokenizer)
    emitted = [d.add(t) for t in toks]
    tail = d.flush()
    for piece in emitted:
        assert "\ufffd" not in piece
        piece.encode("utf-8")  # a complete str (no lone surrogates)
    assert tail == ""
    assert "".join(emitted) == MULTIBYTE
    # each emitted piece is a whole number of characters of the original, in order
    pos = 0
    for piece in emitted:
        assert MULTIBYTE.startswith(piece, pos)
        pos += len(piece)


def test_detokenizer_flush_reports_a_dangling_partial_character(target):
    toks = target.vocab.tokenize("é", add_special=False)  # 0xC3 0xA9: two byte tokens
    assert len(toks) == 2
    d = Detokenizer(target.vocab)
    assert d.add(toks[0]) == ""
    assert d.flush() == "\ufffd"


class _Pieces:
    """A vocabulary of byte pieces, as Detokenizer reads one (token_to_piece)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def token_to_piece(self, token: int) -> bytes:
        return self.pieces[token]


def test_detokenizer_matches_the_incremental_utf8_decoder_on_any_bytes():
    """Detokenizer decodes as codecs' incremental UTF-8 decoder with errors="replace" does:
    the same text piece by piece and at the flush, for valid, split, invalid and truncated bytes."""
    import codecs
    rng = random.Random(7)
    alphabet = [b"a", b" ", b"\xc3", b"\xa9", b"\xe2\x82", b"\xac", b"\xf0\x9f", b"\x98\x80", b"\xff",
                b"\x80", b"\xed\xa0\x80", b"", "日本".encode(), b"\xc0\xaf"]
    vocab = _Pieces(alphabet)
    for _ in range(300):
        toks = [rng.randrange(len(alphabet)) for _ in range(rng.randrange(1, 12))]
        d, ref = Detokenizer(vocab), codecs.getincrementaldecoder("utf-8")(errors="replace")
        assert [d.add(t) for t in toks] == [ref.decode(alphabet[t]) for t in toks]
        assert d.flush() == ref.decode(b"", final=True)


def _valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# --------------------------------------------------------------------------- chat template
def test_chat_template_chatml_and_eog(target, tiny_spec):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = target.vocab.apply_chat_template(msgs)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert target.vocab.apply_chat_template(msgs, add_generation_prompt=False) == text.removesuffix(
        "<|im_start|>assistant\n"
    )
    ids = target.vocab.chat_tokens(msgs)
    assert ids[0] == tiny_spec.IM_START_ID  # add_bos is False: no BOS in front
    assert ids.count(tiny_spec.IM_START_ID) == 3 and ids.count(tiny_spec.IM_END_ID) == 2
    assert target.vocab.detokenize(ids, special=True) == text
    assert target.vocab.eog_ids() == frozenset(tiny_spec.EOG_IDS) == {303, 305}
    assert target.vocab.is_eog(tiny_spec.IM_END_ID) and not target.vocab.is_eog(tiny_spec.IM_START_ID)
    v = target.vocab
    assert (v.bos_id, v.eos_id, v.add_bos) == (tiny_spec.BOS_ID, tiny_spec.EOS_ID, False)


# --------------------------------------------------------------------------- facts
@pytest.mark.parametrize(
    "key,file_type,qtype,n_layers_name",
    [("target", "Q8_0", "Q8_0", "tiny-target"), ("target_q4", "Q4_0", "Q4_0", "tiny-target-q4"),
     ("draft", "Q8_0", "Q8_0", "tiny-draft")],
)
def test_facts(tiny_models, tiny_spec, key, file_type, qtype, n_layers_name):
    with ModelFile(tiny_models[key]) as m:
        f = m.facts(with_tensor_types=True)
    assert f.path == str(tiny_models[key]) and f.file_size == tiny_models[key].stat().st_size
    assert f.architecture == "llama" and f.name == n_layers_name
    assert f.n_vocab == tiny_spec.VOCAB_SIZE and f.vocab_type == "bpe"
    assert f.n_ctx_train == tiny_spec.CONTEXT_LENGTH  # read from metadata on a vocab-only load
    assert f.file_type == file_type
    assert f.chat_template is True and f.recurrent is False
    # 2-D matrices quantized, norms F32
    assert set(f.tensor_types) == {qtype, "F32"}
    assert f.tensor_types[qtype] > f.tensor_types["F32"]
    assert f.n_params > 0


def test_facts_without_tensor_types_and_description(target):
    f = target.facts()
    assert f.tensor_types == {}
    assert "llama" in f.description
    assert target.meta("general.architecture") == "llama"
    assert target.meta("no.such.key") is None


# --------------------------------------------------------------------------- load failures
def test_missing_tensor_names_the_tensor(tmp_path, tiny_spec):
    """A header that llama.cpp accepts but whose tensors are incomplete: the message is
    llama.cpp's verdict, not one of the metadata lines it printed before failing."""
    import gguf

    path = tmp_path / "missing-tensor.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(16)
    w.add_block_count(1)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    tokens, types, merges = tiny_spec._vocab(tiny_spec.MERGES)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from easd_local.errors import ModelLoadError

    with pytest.raises(ModelLoadError) as ei:
        Model(path, LoadOptions(n_ctx=64, n_threads=1))
    msg = str(ei.value)
    assert msg.startswith(f"{path}: ") and msg.endswith("tensor 'output_norm.weight' not found"), msg
    assert "\n" not in msg and "=" not in msg


def test_a_decode_interrupted_before_its_bookkeeping_leaves_no_stray_cells(tiny_target, monkeypatch):
    """A Ctrl-C between llama_decode returning and the mirror's update leaves cells the mirror
    does not know; the sequence's next decode (or rollback) clears them first, so it scores
    as on a clean cache."""
    with Model(tiny_target, LoadOptions(n_ctx=64, n_threads=1)) as clean:
        clean.decode([65, 66], logits_at=())
        ref = clean.decode([67, 68, 69], logits_at=(-1,))
    with Model(tiny_target, LoadOptions(n_ctx=64, n_threads=1)) as m:
        m.decode([65, 66], logits_at=())
        real = runtime._logits_view

        def interrupted(*a):
            raise KeyboardInterrupt

        monkeypatch.setattr(runtime, "_logits_view", interrupted)
        with pytest.raises(KeyboardInterrupt):
            m.decode([90, 91, 92], logits_at=(-1,))  # in the cells, not in the mirror
        monkeypatch.setattr(runtime, "_logits_view", real)
        assert m.n_past == 2
        z = m.decode([67, 68, 69], logits_at=(-1,))
        np.testing.assert_allclose(z, ref, atol=1e-3)  # (the cells may sit at other indices)
        # the same through a rollback that asks for nothing past the mirror
        m.rollback(5)
        monkeypatch.setattr(runtime, "_logits_view", interrupted)
        with pytest.raises(KeyboardInterrupt):
            m.decode([90, 91], logits_at=(-1,))
        monkeypatch.setattr(runtime, "_logits_view", real)
        m.rollback(5)  # nothing of the mirror to drop: the stray cells go all the same
        assert m.decode([70], logits_at=(-1,)).shape == (1, m.n_vocab)


def _apart(code: str) -> str:
    """Run ``code`` in a Python of its own (a regression that crashes llama.cpp fails one test,
    not the whole run); its stdout."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    return r.stdout


def test_a_vocabulary_outlives_the_file_that_made_it(tiny_target):
    """``ModelFile(path).vocab`` keeps the model it reads alive (it used to read freed memory:
    a segfault)."""
    out = _apart(
        "import gc\n"
        "from easd_local.llamacpp.runtime import Model, ModelFile, LoadOptions\n"
        f"v = ModelFile({str(tiny_target)!r}).vocab\n"
        "gc.collect()\n"
        "toks = v.tokenize('hello there')\n"
        f"w = Model({str(tiny_target)!r}, LoadOptions(n_ctx=64, n_threads=1)).vocab\n"
        "gc.collect()\n"
        "assert w.tokenize('hello there') == toks and v.detokenize(toks) == w.detokenize(toks)\n"
        "print('ok', len(toks))\n"
    )
    assert out.startswith("ok ")


def test_the_vocabulary_of_a_closed_model_says_so(tiny_target):
    out = _apart(
        "from easd_local.errors import RuntimeFailure\n"
        "from easd_local.llamacpp.runtime import ModelFile\n"
        f"m = ModelFile({str(tiny_target)!r})\n"
        "v = m.vocab\n"
        "assert v.tokenize('hi')\n"
        "m.close()\n"
        "try:\n"
        "    v.tokenize('hi')\n"
        "except RuntimeFailure as e:\n"
        "    print(e)\n"
    )
    assert "the model is closed; its vocabulary cannot be used" in out
