"""Why llama.cpp could not load a model file, in one line, from what it logged.

llama.cpp explains a NULL model only in its log; ``llama_log`` captures the log and this
module (pure string work, no llama.cpp) picks the most specific explanation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def _strip_prefix(line: str) -> str:
    """'llama_model_load: error loading model: x: detail' -> 'detail'."""
    line = line.strip()
    while True:
        if line.startswith("error loading model: "):
            line = line.removeprefix("error loading model: ")
            continue
        head, sep, rest = line.partition(": ")
        if sep and head and head.replace("_", "").isalnum():
            line = rest
        else:
            return line.strip()


def load_failure_reason(path: Path, size: int, errors: Sequence[str], tail: Sequence[str]) -> str:
    """One line naming ``path`` and the cause; ``errors`` are the log's error lines,
    ``tail`` its last lines (the GGUF parser's own lines carry no error keyword)."""
    generic = ("failed to load model", "error loading model: llama_model_loader")
    # metadata dumps ("print_info: rope_finetuned = unknown") match the error keywords
    # but explain nothing
    noise = ("print_info:", "llama_model_loader: - ")
    errs = [e for e in errors if not any(g in e for g in generic) and not e.startswith(noise)]
    # llama.cpp's own verdict first
    errs.sort(key=lambda e: "error loading model" not in e)
    text = " ".join(errs).lower()
    if "unknown model architecture" in text:
        arch = next(e for e in errs if "unknown model architecture" in e.lower())
        detail = arch.lower().split("unknown model architecture", 1)[-1].strip(" :'\"")
        return f"{path}: unsupported architecture '{detail}' (this llama.cpp does not know it)"
    if "not within the file bounds" in text:
        line = next(e for e in errs if "not within the file bounds" in e)
        return f"{path}: truncated or corrupt GGUF ({size:,} bytes): {_strip_prefix(line)}"
    # The GGUF parser states the precise header problem (a newer GGUF version, an
    # absurd tensor count...) on a line before its generic "failed to read header";
    # that line carries none of the error keywords, so take the parser's lines as is.
    parser = list(dict.fromkeys(_strip_prefix(ln) for ln in tail if ln.startswith("gguf_")))
    if parser:
        specific = [ln for ln in parser if not ln.startswith("failed to read")]
        hint = "" if specific else "; truncated or corrupt?"
        return f"{path}: not a loadable GGUF ({size:,} bytes{hint}): {'; '.join(parser[-3:])}"
    if errs:
        return f"{path}: not a loadable GGUF ({size:,} bytes; truncated or corrupt?): {_strip_prefix(errs[0])}"
    return f"{path}: llama.cpp could not load it (corrupt GGUF?); rerun with --verbose for its log"
