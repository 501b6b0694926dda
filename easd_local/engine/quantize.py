"""llama.cpp's own quantizer (``llama_model_quantize``, what the ``llama-quantize`` tool
calls) on a GGUF file. Part of the runtime layer: it touches ctypes.

The output is written beside its final name and renamed into place only when llama.cpp
reports success, so a failed or killed quantization never leaves a file that looks whole.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import llama_cpp as _ll

from ..errors import ConfigError, ModelLoadError
from . import gguf_info, llama_log
from .gguf_file import check_gguf_file

# llama-quantize's names for the file types a user asks for (tools/quantize/quantize.cpp);
# the value is llama.cpp's enum llama_ftype
QUANT_TYPES: dict[str, int] = {
    "F32": 0, "F16": 1, "BF16": 32,
    "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7,
    "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
    "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30,
}
# file types whose weights are already quantized: quantizing them again compounds the error
_UNQUANTIZED = {"ALL_F32", "F32", "F16", "BF16"}


def quant_type(name: str) -> int:
    """llama.cpp's file type for ``name`` (case-insensitive); ConfigError naming the known ones."""
    key = name.strip().upper()
    if key not in QUANT_TYPES:
        raise ConfigError(f"unknown quantization type {name!r}; one of {', '.join(QUANT_TYPES)}")
    return QUANT_TYPES[key]


def source_is_quantized(path: str | os.PathLike) -> tuple[bool, str]:
    """(whether ``path``'s weights are already quantized, its file type name) from the header."""
    ftype = gguf_info.read_gguf_info(path).file_type
    return ftype.upper() not in _UNQUANTIZED, ftype


def quantize(src: str | os.PathLike, dst: str | os.PathLike, type_name: str, *,
             allow_requantize: bool = False, n_threads: int = 0) -> Path:
    """Quantize ``src`` to ``dst`` as ``type_name`` (e.g. "Q4_K_M") with llama.cpp's quantizer.

    A source that is already quantized is refused unless ``allow_requantize`` (llama.cpp's
    own warning: requantizing reduces quality much more than quantizing from F16/F32)."""
    src = check_gguf_file(src)
    dst = Path(dst)
    ftype = quant_type(type_name)
    quantized, src_type = source_is_quantized(src)
    if quantized and not allow_requantize:
        raise ConfigError(
            f"{src.name} is already quantized ({src_type}); quantizing it again loses much more quality than "
            "quantizing from F16/F32 (llama.cpp's warning): pass --allow-requantize to do it anyway"
        )
    sink = llama_log.ensure_backend(False)
    sink.mark()
    params = _ll.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = bool(allow_requantize)
    params.nthread = max(0, int(n_threads))
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dst.name + ".", suffix=".part", dir=dst.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # a model file like any other, not mkstemp's owner-only 0600
    try:
        rc = _ll.llama_model_quantize(str(src).encode("utf-8"), tmp.encode("utf-8"), params)
        if rc != 0:
            reason = "; ".join(sink.errors()[-2:]) or f"llama_model_quantize returned {rc}"
            raise ModelLoadError(f"{src.name}: quantization to {type_name.upper()} failed: {reason}")
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return dst
