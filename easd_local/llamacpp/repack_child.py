"""The weight-repacking self-test's child (``repack.self_test`` runs it): load a model with
llama.cpp's extra buffer types on and decode the shapes every command takes; the parent
reads its JSON lines, or the signal it died of.

    python -m easd_local.llamacpp.repack_child MODEL.gguf THREADS NGL
"""

from __future__ import annotations

import json
import sys

from ..lifeline import die_with_parent

# what the child decodes: a prefill, single-token steps and a verify-sized block, the shapes
# every command takes
_PROBE_TEXT = ("The quick brown fox jumps over the lazy dog while twelve wizards quietly judge "
               "the boxing match; meanwhile 3 + 4 = 7 and 17 * 23 = 391.")


def _child(argv: list[str]) -> int:
    from .repack import extra_buffers
    from .runtime import LoadOptions, Model

    path, threads, ngl = argv[0], int(argv[1]), int(argv[2])
    opts = LoadOptions(n_ctx=256, n_threads=threads, n_gpu_layers=ngl, extra_bufts=True)
    with Model(path, opts) as m:
        used = extra_buffers(m.memory.model_buffers)
        print(json.dumps({"extra_buffers": used}), flush=True)
        toks = m.vocab.tokenize(_PROBE_TEXT, add_special=False)[:48] or [0] * 8
        m.decode(toks[:32], logits_at=list(range(len(toks[:32]))))  # a multi-token prefill
        for t in toks[32:34]:
            m.decode([t])  # one-token steps
        block = toks[34:39] if len(toks) >= 39 else toks[:5]
        m.decode(block, logits_at=list(range(len(block))))  # a verify block
    print(json.dumps({"decoded": True}), flush=True)
    return 0


if __name__ == "__main__":
    die_with_parent()  # before llama.cpp: a self-test outlives nothing that started it
    sys.exit(_child(sys.argv[1:]))
