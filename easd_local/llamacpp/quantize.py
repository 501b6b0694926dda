"""llama.cpp's own quantizer (``llama_model_quantize``, what the ``llama-quantize`` tool
calls) on a GGUF file. Part of the runtime layer: it touches ctypes.

The quantization runs in a child process. ``llama_model_quantize`` is one long C call
(minutes for a 1 GB model) that Python's Ctrl-C cannot interrupt: a KeyboardInterrupt would
only be raised once the whole file was written. In a child it can be stopped at once: the
parent kills it and removes what it wrote. The child writes to ``<dst>.part-<pid>``; the
parent renames that into place only when the child reports success, so a failed, killed or
interrupted quantization never leaves a file that looks whole.

The child's llama.cpp log goes to its stderr, which the parent reads: llama.cpp announces
each tensor there (``[  12/ 291] blk.1.attn_q.weight ...``), which drives ``progress``, and
says there why a quantization failed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, ModelLoadError
from ..interrupts import cleanup_on_termination
from ..lifeline import child_env, die_with_parent
from . import gguf_info
from .gguf_file import check_gguf_file

# llama-quantize's names for the file types a user asks for (tools/quantize/quantize.cpp);
# the value is llama.cpp's enum llama_ftype
QUANT_TYPES: dict[str, int] = {
    "F32": 0, "F16": 1, "BF16": 32,
    "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7,
    "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
    "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30,
}
# file types whose weights are not quantized: the sources quantization is meant for
UNQUANTIZED = ("ALL_F32", "F32", "F16", "BF16")
# llama.cpp's words (tools/quantize/quantize.cpp, --allow-requantize)
REQUANTIZE_WARNING = ("requantizing from an already quantized type can severely reduce quality "
                      "compared to quantizing from 16-bit or 32-bit (llama.cpp's warning)")

_TENSOR_LINE = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]")

Progress = Callable[[int, int], None]  # (tensors done, tensors in the file)


def quant_type(name: str) -> int:
    """llama.cpp's file type for ``name`` (case-insensitive); ConfigError naming the known ones."""
    key = name.strip().upper()
    if key not in QUANT_TYPES:
        raise ConfigError(f"unknown quantization type {name!r}; one of {', '.join(QUANT_TYPES)}")
    return QUANT_TYPES[key]


def source_is_quantized(path: str | os.PathLike) -> tuple[bool, str]:
    """(whether ``path``'s weights are already quantized, its file type name) from the header."""
    ftype = gguf_info.read_gguf_info(path).file_type
    return ftype.upper() not in UNQUANTIZED, ftype


def check_source(src: str | os.PathLike, allow_requantize: bool) -> tuple[Path, str]:
    """(the checked source path, its file type); ConfigError for a quantized source without
    ``allow_requantize``."""
    src = check_gguf_file(src)
    quantized, src_type = source_is_quantized(src)
    if quantized and not allow_requantize:
        raise ConfigError(
            f"{src.name} is already quantized ({src_type}): {REQUANTIZE_WARNING}; pass --allow-requantize "
            "to do it anyway"
        )
    return src, src_type


def part_path(dst: Path, pid: int | None = None) -> Path:
    """Where the quantization of ``dst`` is written until it is whole."""
    return dst.with_name(f"{dst.name}.part-{os.getpid() if pid is None else pid}")


def quantize(src: str | os.PathLike, dst: str | os.PathLike, type_name: str, *,
             allow_requantize: bool = False, n_threads: int = 0, progress: Progress | None = None) -> Path:
    """Quantize ``src`` to ``dst`` as ``type_name`` (e.g. "Q4_K_M") with llama.cpp's quantizer,
    in a child process; ``progress(done, total)`` after each tensor.

    A source that is already quantized is refused unless ``allow_requantize``. Ctrl-C (or
    any exception) stops the child at once and leaves neither ``dst`` nor a part file."""
    src, _ = check_source(src, allow_requantize)
    dst = Path(dst)
    ftype = quant_type(type_name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = part_path(dst)
    cmd = [sys.executable, "-m", "easd_local.llamacpp.quantize", str(src), str(tmp), str(ftype),
           "1" if allow_requantize else "0", str(max(0, int(n_threads)))]
    tail: deque[str] = deque(maxlen=40)
    child = None
    with cleanup_on_termination():  # a SIGTERM too leaves no part file (the output's size)
        try:
            # its own session: the terminal's Ctrl-C reaches only this process, which then
            # ends the child itself (the child would ignore it until the C call returned)
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True, env=_child_env())
            reader = threading.Thread(target=_read_log, args=(child.stderr, tail, progress), daemon=True)
            reader.start()
            rc = child.wait()
            reader.join()
            if rc != 0:
                reason = _died(-rc) if rc < 0 else _failure(tail) or f"the quantizer exited with status {rc}"
                raise ModelLoadError(f"{src.name}: quantization to {type_name.upper()} failed: {reason}")
            os.replace(tmp, dst)
        except BaseException:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
            tmp.unlink(missing_ok=True)
            raise
    return dst


def _child_env() -> dict[str, str]:
    # the child imports this very package: the parent's sys.path decides where it is
    env = child_env()
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
    return env


def _read_log(stream, tail: deque, progress: Progress | None) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip()
        if line:
            tail.append(line)
        m = _TENSOR_LINE.search(line)
        if m and progress is not None:
            progress(int(m.group(1)), int(m.group(2)))
    stream.close()


def _died(signum: int) -> str:
    """Why a quantizer killed by ``signum`` stopped: the log's last lines say nothing of it."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum == signal.SIGKILL:
        return f"the quantizer was killed ({name}; by the out-of-memory killer, if memory ran out)"
    return f"llama.cpp's quantizer crashed ({name}); if it persists, report it with the output of `easd-local doctor`"


def _failure(tail: deque) -> str:
    keys = ("error", "failed", "unknown", "invalid", "cannot", "unsupported", "not ")
    bad = [ln for ln in tail if any(k in ln.lower() for k in keys) and not _TENSOR_LINE.search(ln)]
    return "; ".join(bad[-2:])


# ------------------------------------------------------------------------ the child


def _quantize_here(src: str, out: str, ftype: int, allow_requantize: bool, n_threads: int) -> int:
    """The llama.cpp call itself (in the child): llama.cpp's return code."""
    import llama_cpp as _ll

    from . import llama_log

    llama_log.ensure_backend(True)  # every line of llama.cpp's log to stderr, for the parent
    params = _ll.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = bool(allow_requantize)
    params.nthread = max(0, int(n_threads))
    return int(_ll.llama_model_quantize(src.encode("utf-8"), out.encode("utf-8"), params))


def _child_main(argv: list[str]) -> int:
    die_with_parent()  # a parent killed with SIGKILL cannot kill this child itself
    src, out, ftype, allow, threads = argv
    # llama.cpp creates the file itself, with the umask's permissions like any other
    return 0 if _quantize_here(src, out, int(ftype), allow == "1", int(threads)) == 0 else 1


if __name__ == "__main__":  # the child process of quantize()
    sys.exit(_child_main(sys.argv[1:]))
