"""llama-cpp-python's own ``Llama``, for the tests that check the tiny models against the
library itself rather than against the project's runtime, loaded under the weight-repacking
verdict the project's loader would apply (``repack.decide``: a self-test in a child, once per
model kind per session). Without it, an AMX CPU's crash (llama.cpp #20824) kills the suite
here, where the product survives it.

tests/ is on sys.path (rootdir conftest), so test modules import this as ``direct_llama``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import llama_cpp
import llama_cpp.llama_cpp as _ll

from easd_local.llamacpp import repack


def load_llama(path: str | Path, **kw) -> llama_cpp.Llama:
    """``llama_cpp.Llama(model_path=path, **kw)``, with llama.cpp's extra buffer types as the
    verdict allows; the verdict is kept as ``.repack``."""
    verdict = repack.decide(path, requested=None, threads=kw.get("n_threads") or 1,
                            n_gpu_layers=kw.get("n_gpu_layers", 0))
    with _extra_bufts(verdict.extra_bufts):
        llm = llama_cpp.Llama(model_path=str(path), **kw)
    llm.repack = verdict
    return llm


@contextlib.contextmanager
def _extra_bufts(on: bool):
    # Llama() takes no such argument: it builds its model parameters from
    # llama_model_default_params(), so that is where the flag goes, for this load only
    real = _ll.llama_model_default_params
    if not on:
        def params():
            p = real()
            p.use_extra_bufts = False
            return p

        _ll.llama_model_default_params = params
    try:
        yield
    finally:
        _ll.llama_model_default_params = real
