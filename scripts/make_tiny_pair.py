#!/usr/bin/env python3
"""Write a tiny, deterministic set of GGUF models for the test suite.

Design
------
* Four files, all architecture ``llama``, written with ``gguf.GGUFWriter`` and
  loadable by real llama.cpp:

  - ``target``    4 layers, 2-D matrices in Q8_0, norms in F32.
  - ``target_q4`` the *same* float weights as ``target``, matrices in Q4_0.
  - ``draft``     2 layers, Q8_0.  It is literally the target truncated: same
                  token embeddings, same output norm and output head, and the
                  target's first two blocks.  The target's blocks 2..3 write
                  into the residual stream with a small output scale
                  (``LATE_LAYER_SCALE``), so they only nudge the final hidden
                  state.  The draft's greedy token therefore equals the
                  target's on most, but not all, positions (measured ~0.7 on
                  the target's greedy continuations), which is what tests of
                  speculative acceptance need: both accepted and rejected
                  drafts.
  - ``odd``       an unrelated tiny llama (own random weights, 2 layers) with a
                  *different* vocabulary of the same size: one BPE merge is
                  replaced, so token text first differs at ``ODD_FIRST_DIFF_ID``
                  (and nowhere before it).  For vocab-incompatibility tests.

* Vocabulary (shared by draft/target/target_q4): byte-level BPE exactly like
  GPT-2/Qwen (``tokenizer.ggml.model = "gpt2"``, pre-tokenizer ``qwen2``).
  Token id ``b`` (0..255) is the byte ``b`` written with GPT-2's
  byte-to-unicode mapping (so ``id == byte value`` for single bytes), then
  ``len(MERGES)`` merged tokens of common English pairs ("Ġt", "he", "in",
  "Ġthe", ...) so real text tokenizes to fewer tokens than bytes, then three
  control tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``.
  Qwen2.5-instruct conventions: BOS = PAD = ``<|endoftext|>``,
  EOS = EOT = ``<|im_end|>``, ``add_bos_token = False``, a ChatML chat
  template.  llama.cpp treats both ``<|endoftext|>`` and ``<|im_end|>`` as
  end-of-generation (``llama_vocab_is_eog``).

* Biases.  The llama architecture has no output bias, so a "bias channel" is
  emulated: residual dimension 0 holds a constant (token embeddings carry
  ``BIAS_CHANNEL`` there, and no block writes to it), and column 0 of the
  output head holds a per-token bias.  It is used to make the control /
  end-of-generation tokens very unlikely (a 64-token greedy continuation does
  not stop early) and to prefer printable ASCII bytes and the merged tokens
  over control bytes and bytes >= 0x80 (so generated text is mostly valid,
  readable UTF-8).

* ``LOGIT_SCALE`` (the output-norm weight) sets the sharpness of the target's
  distribution; it is tuned so the target's T=1 softmax entropy along its own
  greedy continuations has a median around 1-2 nats with a wide spread (an
  entropy gate with thresholds in that range both fires and does not fire).

Everything is a pure function of ``seed``; the same seed gives byte-identical
files.  Writing all four files takes well under a second.

CLI: ``python scripts/make_tiny_pair.py OUT_DIR [--seed S] [--realistic | --wide]`` (the other
sets: ``write_realistic_models``, ``write_wide_models`` below)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import gguf

# --------------------------------------------------------------------------
# Public constants (other tests rely on these)
# --------------------------------------------------------------------------
N_BYTE_TOKENS = 256

# Merges in rank order; merged token i gets id N_BYTE_TOKENS + i.
# "Ġ" is the GPT-2 rendering of a space, "Ċ" of a newline.
MERGES: list[tuple[str, str]] = [
    ("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"),
    ("Ġ", "a"), ("r", "e"), ("o", "n"), ("Ġt", "he"), ("e", "n"),
    ("a", "t"), ("o", "u"), ("e", "d"), ("i", "s"), ("Ġ", "s"),
    ("Ġ", "w"), ("o", "r"), ("i", "t"), ("Ġ", "o"), ("Ġ", "c"),
    ("e", "s"), ("a", "l"), ("in", "g"), ("Ġ", "b"), ("Ġ", "f"),
    ("Ġ", "p"), ("a", "r"), ("l", "e"), ("Ġ", "m"), ("Ġ", "i"),
    ("Ġ", "d"), ("n", "d"), ("Ġa", "nd"), ("Ġo", "f"), ("Ġt", "o"),
    ("Ġi", "n"), ("Ġ", "h"), ("o", "m"), ("Ġ", "l"), ("Ġ", "n"),
    ("s", "t"), ("Ġ", "e"), ("i", "on"), ("Ġ", "T"), ("Ġ", "I"),
    ("Ċ", "Ċ"), ("Ġ", "Ġ"),
]
N_MERGES = len(MERGES)  # 47

ENDOFTEXT_ID = N_BYTE_TOKENS + N_MERGES  # 303  "<|endoftext|>"
IM_START_ID = ENDOFTEXT_ID + 1           # 304  "<|im_start|>"
IM_END_ID = ENDOFTEXT_ID + 2             # 305  "<|im_end|>"
VOCAB_SIZE = ENDOFTEXT_ID + 3            # 306

BOS_ID = ENDOFTEXT_ID
PAD_ID = ENDOFTEXT_ID
EOS_ID = IM_END_ID
EOT_ID = IM_END_ID
EOG_IDS = (ENDOFTEXT_ID, IM_END_ID)      # llama_vocab_is_eog is true for both
SPECIAL_IDS = (ENDOFTEXT_ID, IM_START_ID, IM_END_ID)

# The odd vocabulary replaces merge ("o","u") -> "ou" (index 11) by ("l","y") -> "ly".
_ODD_MERGE_INDEX = 11
_ODD_MERGE = ("l", "y")
ODD_FIRST_DIFF_ID = N_BYTE_TOKENS + _ODD_MERGE_INDEX  # 267: "ou" (target) vs "ly" (odd)
ODD_VOCAB_SIZE = VOCAB_SIZE  # same size on purpose: only token text differs

CONTEXT_LENGTH = 2048

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# Model shapes
N_EMBD = 128
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 256
TARGET_LAYERS = 4
DRAFT_LAYERS = 2
ODD_LAYERS = 2
ODD_N_EMBD = 64
ODD_N_FF = 128
RMS_EPS = 1e-5
ROPE_BASE = 10000.0

# Tuning knobs (see module docstring)
LATE_LAYER_SCALE = 0.3    # output scale of target blocks >= DRAFT_LAYERS
LOGIT_SCALE = 4.5         # output_norm weight
BIAS_CHANNEL = 3.0        # constant in residual dim 0
FINAL_RESIDUAL_RMS = 2.0  # measured rms of the last hidden state (bias calibration)
TOKEN_BIAS = {            # additive logit bias (roughly, in logit units)
    "special": -20.0,
    "nonprint": -12.0,     # control bytes and bytes >= 0x80
    "merge": 0.5,
}


# --------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character mapping."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _vocab(merges: list[tuple[str, str]]) -> tuple[list[str], list[int], list[str]]:
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    known = set(tokens)
    for a, b in merges:
        assert a in known and b in known, (a, b)
        t = a + b
        assert t not in known, t
        tokens.append(t)
        known.add(t)
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = ([gguf.TokenType.NORMAL] * (len(tokens) - 3)) + [gguf.TokenType.CONTROL] * 3
    return tokens, [int(t) for t in types], [f"{a} {b}" for a, b in merges]


def odd_merges() -> list[tuple[str, str]]:
    m = list(MERGES)
    m[_ODD_MERGE_INDEX] = _ODD_MERGE
    return m


def _token_bias() -> np.ndarray:
    bias = np.zeros(VOCAB_SIZE, dtype=np.float32)
    for b in range(256):
        if not (0x20 <= b < 0x7F or b == 0x0A):
            bias[b] = TOKEN_BIAS["nonprint"]
    bias[N_BYTE_TOKENS:ENDOFTEXT_ID] = TOKEN_BIAS["merge"]
    bias[list(SPECIAL_IDS)] = TOKEN_BIAS["special"]
    return bias


# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------
def _gauss(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _make_weights(rng: np.random.Generator, n_vocab: int, n_embd: int, n_ff: int,
                  n_layers: int, late_from: int, bias: np.ndarray) -> dict[str, np.ndarray]:
    """Random llama weights, numpy shapes (rows, cols) as in HF (ggml ne reversed)."""
    head_dim = n_embd // N_HEAD
    n_embd_kv = head_dim * N_HEAD_KV
    w: dict[str, np.ndarray] = {}

    emb = _gauss(rng, (n_vocab, n_embd), 1.0)
    emb[:, 0] = BIAS_CHANNEL
    w["token_embd.weight"] = emb

    for i in range(n_layers):
        scale = 1.0 if i < late_from else LATE_LAYER_SCALE
        p = f"blk.{i}."
        norm = np.ones(n_embd, dtype=np.float32)
        norm[0] = 0.0  # blocks do not read the bias channel
        w[p + "attn_norm.weight"] = norm.copy()
        w[p + "attn_q.weight"] = _gauss(rng, (n_embd, n_embd), 1.0 / np.sqrt(n_embd))
        w[p + "attn_k.weight"] = _gauss(rng, (n_embd_kv, n_embd), 1.0 / np.sqrt(n_embd))
        w[p + "attn_v.weight"] = _gauss(rng, (n_embd_kv, n_embd), 1.0 / np.sqrt(n_embd))
        wo = _gauss(rng, (n_embd, n_embd), scale / np.sqrt(n_embd))
        wo[0, :] = 0.0  # blocks do not write the bias channel
        w[p + "attn_output.weight"] = wo
        w[p + "ffn_norm.weight"] = norm.copy()
        w[p + "ffn_gate.weight"] = _gauss(rng, (n_ff, n_embd), 1.0 / np.sqrt(n_embd))
        w[p + "ffn_up.weight"] = _gauss(rng, (n_ff, n_embd), 1.0 / np.sqrt(n_embd))
        wd = _gauss(rng, (n_embd, n_ff), 2.0 * scale / np.sqrt(n_ff))
        wd[0, :] = 0.0
        w[p + "ffn_down.weight"] = wd

    w["output_norm.weight"] = np.full(n_embd, LOGIT_SCALE, dtype=np.float32)
    out = _gauss(rng, (n_vocab, n_embd), 1.0 / np.sqrt(n_embd))
    # After the final RMS norm, dim 0 holds about LOGIT_SCALE * BIAS_CHANNEL / rms(h);
    # rms(h) of the final residual is ~2 (measured), so column 0 adds ~``bias`` logits.
    out[:, 0] = bias / (LOGIT_SCALE * BIAS_CHANNEL / FINAL_RESIDUAL_RMS)
    w["output.weight"] = out
    return w


def _draft_of(target: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The draft: the target truncated to its first DRAFT_LAYERS blocks (the same arrays)."""
    return {k: v for k, v in target.items() if not k.startswith("blk.") or int(k.split(".")[1]) < DRAFT_LAYERS}


def _write(path: Path, name: str, weights: dict[str, np.ndarray], n_layers: int,
           n_embd: int, n_ff: int, merges: list[tuple[str, str]],
           qtype: gguf.GGMLQuantizationType, layout: np.ndarray | None = None, n_vocab: int = VOCAB_SIZE) -> None:
    """``layout`` (the wide pair): where each of the tiny vocabulary's tokens lies among
    ``n_vocab``, every other id a filler token."""
    tokens, types, merge_strs = _vocab(merges)
    ids = {"bos": BOS_ID, "eos": EOS_ID, "eot": EOT_ID, "pad": PAD_ID}
    if layout is not None:
        wide_tokens = [_fill_token(j) for j in range(n_vocab)]
        wide_types = [int(gguf.TokenType.NORMAL)] * n_vocab
        for i, j in enumerate(layout):
            wide_tokens[j], wide_types[j] = tokens[i], types[i]
        tokens, types = wide_tokens, wide_types
        ids = {k: int(layout[v]) for k, v in ids.items()}
    file_type = {gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
                 gguf.GGMLQuantizationType.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
                 gguf.GGMLQuantizationType.F16: gguf.LlamaFileType.MOSTLY_F16}[qtype]
    head_dim = n_embd // N_HEAD

    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_name(name)
    wr.add_context_length(CONTEXT_LENGTH)
    wr.add_embedding_length(n_embd)
    wr.add_block_count(n_layers)
    wr.add_feed_forward_length(n_ff)
    wr.add_head_count(N_HEAD)
    wr.add_head_count_kv(N_HEAD_KV)
    wr.add_rope_dimension_count(head_dim)
    wr.add_rope_freq_base(ROPE_BASE)
    wr.add_layer_norm_rms_eps(RMS_EPS)
    wr.add_vocab_size(len(tokens))
    wr.add_file_type(int(file_type))
    wr.add_quantization_version(gguf.GGML_QUANT_VERSION)

    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("qwen2")
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    wr.add_token_merges(merge_strs)
    wr.add_bos_token_id(ids["bos"])
    wr.add_eos_token_id(ids["eos"])
    wr.add_eot_token_id(ids["eot"])
    wr.add_pad_token_id(ids["pad"])
    wr.add_add_bos_token(False)
    wr.add_chat_template(CHAT_TEMPLATE)

    for tname, arr in weights.items():
        if arr.ndim == 2 and qtype == gguf.GGMLQuantizationType.F16:
            wr.add_tensor(tname, arr.astype(np.float16))
        elif arr.ndim == 2:
            q = gguf.quants.quantize(arr, qtype)
            wr.add_tensor(tname, q, raw_dtype=qtype)
        else:
            wr.add_tensor(tname, arr.astype(np.float32))

    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def write_tiny_models(out_dir: Path, seed: int = 0) -> dict[str, Path]:
    """Write draft/target/target_q4/odd GGUF files into ``out_dir``; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "draft": out_dir / "tiny-draft-q8_0.gguf",
        "target": out_dir / "tiny-target-q8_0.gguf",
        "target_q4": out_dir / "tiny-target-q4_0.gguf",
        "odd": out_dir / "tiny-odd-q8_0.gguf",
    }
    Q8, Q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0
    rng_main, rng_odd = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))

    bias = _token_bias()
    target = _make_weights(rng_main, VOCAB_SIZE, N_EMBD, N_FF, TARGET_LAYERS, DRAFT_LAYERS, bias)
    draft = _draft_of(target)
    odd = _make_weights(rng_odd, ODD_VOCAB_SIZE, ODD_N_EMBD, ODD_N_FF, ODD_LAYERS, ODD_LAYERS, bias)

    _write(paths["target"], "tiny-target", target, TARGET_LAYERS, N_EMBD, N_FF, MERGES, Q8)
    _write(paths["target_q4"], "tiny-target-q4", target, TARGET_LAYERS, N_EMBD, N_FF, MERGES, Q4)
    _write(paths["draft"], "tiny-draft", draft, DRAFT_LAYERS, N_EMBD, N_FF, MERGES, Q8)
    _write(paths["odd"], "tiny-odd", odd, ODD_LAYERS, ODD_N_EMBD, ODD_N_FF, odd_merges(), Q8)
    return paths


# The realistic-shape pair: the kernels real models take. The tiny pair's 128-wide Q8_0/Q4_0
# matrices are too small for llama.cpp's repacked (CPU_REPACK) and AMX weight layouts, which
# want rows that are multiples of 256 and the K-quant types of real files; these are
# 512 wide with a 1,536-wide FFN, written as F16 and quantized by llama.cpp's own quantizer to
# what real pairs use: the target Q4_K_M (Q4_K with Q6_K for some tensors), the draft Q5_0
# and Q8_0. A few MB each; the same seed gives the same files.
REAL_N_EMBD = 512
REAL_N_FF = 1536
REAL_TYPES = {"target": "Q4_K_M", "draft": "Q5_0", "draft_q8": "Q8_0"}


def write_realistic_models(out_dir: Path, seed: int = 0) -> dict[str, Path]:
    """Write the realistic-shape pair into ``out_dir``: keys ``target_f16`` and ``draft_f16``
    (the higher-precision sources), ``target`` (Q4_K_M), ``draft`` (Q5_0), ``draft_q8`` (Q8_0)."""
    from easd_local.llamacpp.quantize import quantize

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 256]))
    target = _make_weights(rng, VOCAB_SIZE, REAL_N_EMBD, REAL_N_FF, TARGET_LAYERS, DRAFT_LAYERS, _token_bias())
    draft = _draft_of(target)
    F16 = gguf.GGMLQuantizationType.F16
    paths = {"target_f16": out_dir / "real-target-f16.gguf", "draft_f16": out_dir / "real-draft-f16.gguf"}
    _write(paths["target_f16"], "real-target", target, TARGET_LAYERS, REAL_N_EMBD, REAL_N_FF, MERGES, F16)
    _write(paths["draft_f16"], "real-draft", draft, DRAFT_LAYERS, REAL_N_EMBD, REAL_N_FF, MERGES, F16)
    for key, qtype in REAL_TYPES.items():
        src = paths["target_f16" if key == "target" else "draft_f16"]
        paths[key] = quantize(src, out_dir / f"real-{key.split('_')[0]}-{qtype.lower()}.gguf", qtype)
    return paths


# The wide pair: the tiny pair at the default pair's vocabulary width. Rows of 151,936 logits take
# the controller's wide-row paths (sparse sampling, the entropy's bounds, top-N by blocks,
# sampling by blocks, the dense lookups), which a 306-token row never reaches. Every weight is
# the tiny pair's (same seed, same draws) and so is every tiny token, but spread over the wide
# vocabulary (tiny token i is wide token ``wide_ids()[i]``, as a real vocabulary's likely tokens
# lie all over it: every block of the blockwise paths holds some); the other ids are filler
# tokens that no text tokenizes to, whose logits lie about TAIL_BIAS below the head (like the far
# tail of a real model's row: together under 1e-9 of the mass at T = 1). So the wide pair emits
# what the tiny pair does, token for token through ``wide_ids``, up to near-ties of llama.cpp's
# kernels, by the wide-row code.
WIDE_VOCAB_SIZE = 151_936  # the default pair's (Qwen2.5)
TAIL_BIAS = -60.0


def _fill_token(j: int) -> str:
    return f"<fill{j}>"


def wide_ids(n_vocab: int = WIDE_VOCAB_SIZE) -> np.ndarray:
    """The wide pair's id of each tiny token (index: the tiny id): evenly spread, off the blocks'
    first entries (which the blockwise paths could treat apart)."""
    return np.arange(VOCAB_SIZE) * (n_vocab // VOCAB_SIZE) + 7


def write_wide_models(out_dir: Path, seed: int = 0, n_vocab: int = WIDE_VOCAB_SIZE) -> dict[str, Path]:
    """Write the wide draft/target (Q8_0, ``n_vocab`` tokens) into ``out_dir``; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"draft": out_dir / "wide-draft-q8_0.gguf", "target": out_dir / "wide-target-q8_0.gguf"}
    rng_main, _ = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    target = _make_weights(rng_main, VOCAB_SIZE, N_EMBD, N_FF, TARGET_LAYERS, DRAFT_LAYERS, _token_bias())
    layout = wide_ids(n_vocab)
    rng_fill = np.random.default_rng(np.random.SeedSequence([seed, n_vocab]))
    emb = _gauss(rng_fill, (n_vocab, N_EMBD), 1.0)
    emb[:, 0] = BIAS_CHANNEL
    out = _gauss(rng_fill, (n_vocab, N_EMBD), 1.0 / np.sqrt(N_EMBD))
    out[:, 0] = TAIL_BIAS / (LOGIT_SCALE * BIAS_CHANNEL / FINAL_RESIDUAL_RMS)
    emb[layout], out[layout] = target["token_embd.weight"], target["output.weight"]
    target["token_embd.weight"], target["output.weight"] = emb, out
    draft = _draft_of(target)
    Q8 = gguf.GGMLQuantizationType.Q8_0
    _write(paths["target"], "wide-target", target, TARGET_LAYERS, N_EMBD, N_FF, MERGES, Q8, layout, n_vocab)
    _write(paths["draft"], "wide-draft", draft, DRAFT_LAYERS, N_EMBD, N_FF, MERGES, Q8, layout, n_vocab)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--realistic", action="store_true",
                      help="write the realistic-shape pair (512 wide, Q4_K_M / Q5_0 / Q8_0) instead")
    kind.add_argument("--wide", action="store_true",
                      help="write the wide pair (the tiny pair with the default pair's 151,936-token vocabulary) instead")
    args = ap.parse_args(argv)
    write = write_realistic_models if args.realistic else write_wide_models if args.wide else write_tiny_models
    for key, p in write(args.out_dir, args.seed).items():
        print(f"{key}\t{p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
