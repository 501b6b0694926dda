"""A GGUF file's facts read from its header (the ``gguf`` package's constants for types and
architectures): no llama.cpp load, so ``models inspect`` answers at once even for a
multi-GB file (only the header is read).

Nothing here prints; a file that cannot be read raises ModelLoadError with one line.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ChatTemplateError, ModelLoadError
from .gguf_file import check_gguf_file
from .template import compile_template

MAX_GGUF_VERSION = 3
# tokenizer.ggml.model -> llama.cpp's vocabulary type name
_VOCAB_TYPES = {"no_vocab": "none", "none": "none", "llama": "spm", "gpt2": "bpe", "bert": "wpm", "t5": "ugm",
                "rwkv": "rwkv", "plamo2": "plamo2"}
# which part of the header could not be read
_STAGES = {"_build_fields": "failed to read key-value pairs", "_build_tensor_info": "failed to read tensor info",
           "_build_tensors": "tensor data is not within the file bounds"}


@dataclass(frozen=True)
class GgufInfo:
    path: str
    file_size: int
    version: int
    architecture: str
    name: str
    n_params: int
    n_layers: int
    n_vocab: int
    vocab_type: str
    n_ctx_train: int
    file_type: str  # general.file_type as llama.cpp names it, without MOSTLY_ (e.g. Q4_K_M)
    chat_template: bool
    chat_template_error: str | None  # the template is there but does not compile (jinja2), or None
    recurrent: bool  # recurrent or hybrid state: the KV cache cannot be rolled back
    tensor_types: dict[str, int] = field(default_factory=dict)  # tensors per quantization type


def template_error(template: object) -> str | None:
    """Why a GGUF chat template does not compile, in one line, or None (also when there is
    none); no model is loaded."""
    if not isinstance(template, str):
        return None
    try:
        compile_template(template)
    except ChatTemplateError as e:
        return str(e)
    return None


def file_type_name(ftype: int) -> str:
    try:
        import gguf

        return gguf.LlamaFileType(ftype).name.removeprefix("MOSTLY_")
    except Exception:
        return f"type {ftype}"


class _Cut(Exception):
    """The header ends before what it declares."""


class _Header:
    """A GGUF header read straight from the file: key-values (large arrays are skipped and
    only counted) and tensor infos. gguf.GGUFReader builds a numpy view per array element,
    which takes seconds for a 152k-token vocabulary; this reads the same header in a blink."""

    _SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                12: "<d"}
    _KEEP_ARRAY = 64  # arrays up to this many items are kept; longer ones are only counted

    def __init__(self, data) -> None:
        self.data = data
        self.pos = 0
        self.fields: dict[str, object] = {}
        self.counts: dict[str, int] = {}  # array length of every array field
        self.tensors: list[tuple[str, tuple[int, ...], int, int]] = []  # name, dims, type, offset

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise _Cut()
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def _unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self._take(size))[0]

    def _string(self) -> str:
        n = self._unpack("<Q")
        return self._take(n).decode("utf-8", errors="replace")

    def _value(self, vtype: int, key: str):
        if vtype in self._SCALARS:
            return self._unpack(self._SCALARS[vtype])
        if vtype == 8:
            return self._string()
        if vtype == 9:
            itype, count = self._unpack("<I"), self._unpack("<Q")
            self.counts[key] = count
            if itype in self._SCALARS and count > self._KEEP_ARRAY:
                size = struct.calcsize(self._SCALARS[itype]) * count
                self._take(size)
                return None
            if itype == 8 and count > self._KEEP_ARRAY:
                for _ in range(count):
                    self._take(self._unpack("<Q"))
                return None
            return [self._value(itype, key) for _ in range(count)]
        raise ValueError(f"unknown value type {vtype}")

    def read(self) -> tuple[int, int]:
        """Parse the header; return (version, offset of the tensor data)."""
        self._take(4)
        version = self._unpack("<I")
        n_tensors, n_kv = self._unpack("<Q"), self._unpack("<Q")
        self.stage = "_build_fields"
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = self._value(self._unpack("<I"), key)
        self.stage = "_build_tensor_info"
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._unpack("<I")
            dims = tuple(self._unpack("<Q") for _ in range(n_dims))
            self.tensors.append((name, dims, self._unpack("<I"), self._unpack("<Q")))
        align = int(self.fields.get("general.alignment") or 32)
        start = (self.pos + align - 1) // align * align
        return version, start


def _reader(p: Path) -> tuple[_Header, int, int]:
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
    version = int.from_bytes(head[4:8], "little")
    if version > MAX_GGUF_VERSION or version < 1:
        raise ModelLoadError(f"{p}: GGUF version {version}; this reader only supports up to version {MAX_GGUF_VERSION}")
    h = _Header(b"")
    h.stage = "_build_fields"
    try:
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            h.data = mm
            version, data_start = h.read()
            h.data = b""
    except (_Cut, ValueError, struct.error, UnicodeError, OverflowError, MemoryError):
        raise ModelLoadError(f"{p}: truncated or corrupt GGUF ({size:,} bytes): {_STAGES[h.stage]}") from None
    return h, version, data_start


def tensor_type_histogram(types) -> dict[str, int]:
    """Count tensors per quantization type (ggml type ids), most common first."""
    import gguf

    hist: dict[str, int] = {}
    for t in types:
        name = gguf.GGMLQuantizationType(t).name
        hist[name] = hist.get(name, 0) + 1
    return dict(sorted(hist.items(), key=lambda kv: -kv[1]))


def _n_bytes(dims: tuple[int, ...], qtype: int) -> int:
    import gguf

    n = math.prod(dims)
    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    return n // block * type_size


def _parsed(path: str | os.PathLike) -> tuple[Path, _Header, int, int]:
    """(path, header, version, file size) of a file whose header parses and whose tensor data
    lies within it; ModelLoadError with one line otherwise."""
    p = check_gguf_file(path)
    h, version, data_start = _reader(p)
    size = p.stat().st_size
    try:
        end = max((data_start + off + _n_bytes(dims, qtype) for _, dims, qtype, off in h.tensors), default=0)
    except (ValueError, KeyError):
        raise ModelLoadError(f"{p}: truncated or corrupt GGUF ({size:,} bytes): unknown tensor type") from None
    if end > size:
        raise ModelLoadError(f"{p}: truncated or corrupt GGUF ({size:,} bytes): tensor data is not within the file "
                             f"bounds (needs {end:,})")
    return p, h, version, size


def check_gguf_header(path: str | os.PathLike) -> Path:
    """The whole header read, as ``read_gguf_info`` reads it, but an architecture the ``gguf``
    package does not know passes: the llama.cpp that loads the file may be newer."""
    return _parsed(path)[0]


def read_gguf_info(path: str | os.PathLike) -> GgufInfo:
    import gguf

    p, h, version, size = _parsed(path)
    fields = h.fields
    arch = str(fields.get("general.architecture") or "unknown")
    if arch not in set(gguf.MODEL_ARCH_NAMES.values()):
        raise ModelLoadError(f"{p}: unsupported architecture '{arch}' (llama.cpp does not know it)")
    recurrent = any(k.startswith((f"{arch}.ssm.", f"{arch}.wkv.", f"{arch}.rwkv")) for k in fields)
    ftype = fields.get("general.file_type")
    model = str(fields.get("tokenizer.ggml.model") or "none")
    return GgufInfo(
        path=str(p),
        file_size=size,
        version=version,
        architecture=arch,
        name=str(fields.get("general.name") or p.stem),
        n_params=sum(math.prod(dims) for _, dims, _, _ in h.tensors),
        n_layers=int(fields.get(f"{arch}.block_count") or 0),
        n_vocab=h.counts.get("tokenizer.ggml.tokens", 0),
        vocab_type=_VOCAB_TYPES.get(model, model),
        n_ctx_train=int(fields.get(f"{arch}.context_length") or 0),
        file_type=file_type_name(int(ftype)) if isinstance(ftype, int) else "unknown",
        chat_template=fields.get("tokenizer.chat_template") is not None,
        chat_template_error=template_error(fields.get("tokenizer.chat_template")),
        recurrent=recurrent,
        tensor_types=tensor_type_histogram([qtype for _, _, qtype, _ in h.tensors]),
    )
