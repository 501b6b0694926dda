"""The tiny GGUF model set (scripts/make_tiny_pair.py) loads in real llama.cpp
and has the properties the rest of the suite relies on."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")
from direct_llama import load_llama  # noqa: E402  (after the skip: it imports llama_cpp)

PROMPTS = [
    "The quick brown fox",
    "Once upon a time, there was",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]
N_POS = 32


def _load(path, logits_all=False):
    return load_llama(path, n_ctx=256, n_batch=256, n_threads=1, logits_all=logits_all, verbose=False)


def _entropy(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -(np.exp(logp) * logp).sum(axis=-1)


@pytest.fixture(scope="module")
def greedy_stats(tiny_target, tiny_draft, tiny_spec):
    """Target greedy continuations of PROMPTS and both models' logits along them."""
    tgt, dr = _load(tiny_target, True), _load(tiny_draft, True)
    agree, ent_t, ent_d, n_eog = [], [], [], 0
    for prompt in PROMPTS:
        toks = tgt.tokenize(prompt.encode(), add_bos=False, special=True)
        tgt.reset()
        tgt.eval(toks)
        cont = []
        for _ in range(N_POS):
            nxt = int(np.argmax(tgt.scores[tgt.n_tokens - 1]))
            cont.append(nxt)
            if nxt in tiny_spec.EOG_IDS:
                n_eog += 1
                break
            tgt.eval([nxt])
        seq = toks + cont
        dr.reset()
        dr.eval(seq[:-1])
        lt = np.array(tgt.scores[len(toks) - 1:len(seq) - 1])
        ld = np.array(dr.scores[len(toks) - 1:len(seq) - 1])
        assert list(lt.argmax(axis=1)) == cont
        agree.append(lt.argmax(axis=1) == ld.argmax(axis=1))
        ent_t.append(_entropy(lt))
        ent_d.append(_entropy(ld))
    return {"agree": np.concatenate(agree), "ent_t": np.concatenate(ent_t),
            "ent_d": np.concatenate(ent_d), "n_eog": n_eog}


@pytest.mark.parametrize("key", ["draft", "target", "target_q4", "odd"])
def test_loads_with_designed_vocab(tiny_models, tiny_spec, key):
    llm = _load(tiny_models[key])
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    assert n_vocab == (tiny_spec.ODD_VOCAB_SIZE if key == "odd" else tiny_spec.VOCAB_SIZE)
    assert llm.n_vocab() == n_vocab
    assert llama_cpp.llama_vocab_bos(vocab) == tiny_spec.BOS_ID
    assert llama_cpp.llama_vocab_eos(vocab) == tiny_spec.EOS_ID
    assert llama_cpp.llama_vocab_eot(vocab) == tiny_spec.EOT_ID
    assert not llama_cpp.llama_vocab_get_add_bos(vocab)
    eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    assert tuple(eog) == tiny_spec.EOG_IDS
    assert llama_cpp.llama_model_n_ctx_train(llm.model) == tiny_spec.CONTEXT_LENGTH
    assert llm.metadata.get("tokenizer.chat_template") == tiny_spec.CHAT_TEMPLATE
    assert llm.metadata.get("general.architecture") == "llama"
    # special tokens parse as single tokens; merges make text shorter than its bytes
    ids = llm.tokenize(b"<|im_start|>user\nhi<|im_end|>", add_bos=False, special=True)
    assert ids[0] == tiny_spec.IM_START_ID and ids[-1] == tiny_spec.IM_END_ID
    text = b"Once upon a time, there was a cat in the house and it was fine."
    assert len(llm.tokenize(text, add_bos=False)) < 0.8 * len(text)
    assert llm.detokenize(llm.tokenize(text, add_bos=False)) == text


def test_layer_counts(tiny_models, tiny_spec):
    blocks = {k: int(_load(p).metadata["llama.block_count"]) for k, p in tiny_models.items()}
    assert blocks == {"draft": tiny_spec.DRAFT_LAYERS, "target": tiny_spec.TARGET_LAYERS,
                      "target_q4": tiny_spec.TARGET_LAYERS, "odd": tiny_spec.ODD_LAYERS}


def test_odd_vocab_first_difference(tiny_target, tiny_odd, tiny_spec):
    lt, lo = _load(tiny_target), _load(tiny_odd)  # keep the models alive while using vocabs
    vt = llama_cpp.llama_model_get_vocab(lt.model)
    vo = llama_cpp.llama_model_get_vocab(lo.model)
    n = min(llama_cpp.llama_vocab_n_tokens(vt), llama_cpp.llama_vocab_n_tokens(vo))
    diffs = [i for i in range(n)
             if llama_cpp.llama_vocab_get_text(vt, i) != llama_cpp.llama_vocab_get_text(vo, i)]
    assert diffs and diffs[0] == tiny_spec.ODD_FIRST_DIFF_ID >= 5


def test_chat_template_renders_chatml(tiny_target):
    llm = _load(tiny_target)
    fmt = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
        template=llm.metadata["tokenizer.chat_template"], eos_token="<|im_end|>",
        bos_token="<|endoftext|>")
    out = fmt(messages=[{"role": "user", "content": "Hi"}])
    assert out.prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_draft_target_greedy_agreement(greedy_stats):
    rate = float(greedy_stats["agree"].mean())
    assert greedy_stats["agree"].size == len(PROMPTS) * N_POS
    assert 0.3 < rate < 0.95, rate


def test_target_entropy_range(greedy_stats):
    ent = greedy_stats["ent_t"]
    assert 0.5 <= float(np.median(ent)) <= 2.5
    assert np.percentile(ent, 10) < np.percentile(ent, 90) - 0.75  # spread, not constant
    assert greedy_stats["n_eog"] == 0


def test_deterministic_bytes(tmp_path, tiny_spec, tiny_models):
    def digests(d):
        return {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in d.items()}

    a = digests(tiny_spec.write_tiny_models(tmp_path / "a", seed=0))
    b = digests(tiny_spec.write_tiny_models(tmp_path / "b", seed=0))
    assert a == b == digests(tiny_models)
    c = digests(tiny_spec.write_tiny_models(tmp_path / "c", seed=1))
    assert c["target"] != a["target"]
