"""One llama.cpp model: load the weights, batched decode with logits at chosen positions,
per-sequence KV rollback. Its vocabulary and chat template are ``vocab``, llama.cpp's log
``llama_log``, devices and RPC servers ``devices``: together the runtime layer, the only
modules that touch ctypes.

It wraps llama-cpp-python's low-level API directly (not ``llama_cpp.Llama``) because
speculative decoding needs two things the high-level class does not give cheaply: logits
for a handful of chosen positions of one batch (``logits_all=True`` would allocate
n_ctx × n_vocab floats, 2.5 GB with a 152k vocabulary), and exact control of the KV cache
(roll back to the accepted prefix).

Several sequences (``LoadOptions.n_seq``): one context holds up to ``n_seq`` sequences,
ids 0..n_seq-1, each with its own positions, KV cells and token mirror, and
:meth:`Model.decode_batch` evaluates tokens of several of them in one ``llama_decode``.
The KV cache is *unified* (``kv_unified``): one buffer of ``n_seq × n_ctx`` cells shared
by all sequences. With separate per-sequence buffers llama.cpp splits a batch into
ubatches holding the same number of tokens of every sequence (``split_equal``), so a
batch of verify blocks of different lengths would run as several graphs; unified, it
runs as one. ``n_ctx`` is the context of each sequence (what ``--ctx`` says): this
module never lets a sequence grow past it, so the ``n_seq`` sequences always fit.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

try:
    import llama_cpp as _ll
except ImportError as _e:  # pragma: no cover - import-time guard for a broken install
    raise ImportError(
        "llama-cpp-python is not installed; install easd-local with pip (see README)"
    ) from _e

from .. import crashnote
from ..errors import ContextOverflowError, ModelLoadError, NonFiniteLogitsError, RuntimeFailure
from ..interrupts import deferred_interrupt
from . import devices, gguf_info, heap, llama_log, repack
from .gguf_file import check_gguf_file
from .gguf_info import file_type_name
from .vocab import ModelHandle, Vocab


def _address_getter(name: str):
    """llama.cpp's ``float * name(ctx, int32_t)`` bound afresh, returning the address as an int
    (None for NULL): llama-cpp-python's binding returns a ctypes pointer whose ``cast`` to an
    address cost more than the call itself, once per decode."""
    shared = getattr(_ll, name)
    lib = getattr(getattr(_ll, "llama_cpp", None), "_lib", None)
    if lib is None:  # pragma: no cover - another llama-cpp-python layout: cast each pointer
        return lambda ctx, j: ctypes.cast(shared(ctx, j), ctypes.c_void_p).value
    own = type(shared)((name, lib))
    own.argtypes, own.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.c_void_p
    return own


# the address of the logits row of batch index j (after synchronising with the backend)
logits_address = _address_getter("llama_get_logits_ith")


def common_prefix_len(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the longest common prefix of ``a`` and ``b``; the caller may vouch that the
    first ``start`` items already agree."""
    n = max(0, min(start, len(a), len(b)))
    for i in range(n, min(len(a), len(b))):
        if a[i] != b[i]:
            return i
        n = i + 1
    return n


# --------------------------------------------------------------------------- options/facts
@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = 4096
    n_threads: int | None = None  # None: all cores
    n_gpu_layers: int = 0  # -1 = all layers
    flash_attn: bool = False
    main_gpu: int = 0
    seed: int = 0  # kept for symmetry with llama.cpp; sampling happens in rules.py
    n_batch: int = 512
    verbose: bool = False
    rpc: tuple[str, ...] = ()  # llama.cpp RPC servers (HOST:PORT) whose devices take layers
    tensor_split: tuple[float, ...] = ()  # share of offloaded layers per device, as llama.cpp's
    n_seq: int = 1  # sequences the context holds (bench --parallel); n_ctx is per sequence
    # llama.cpp's extra buffer types (weights repacked for CPU_REPACK / AMX kernels): False is
    # --no-repack, True uses them without a self-test, None lets ``repack.decide`` choose
    extra_bufts: bool | None = None
    # False is --no-mmap: the weights read into memory of their own instead of mapped from the
    # file (llama.cpp: --no-mmap); slower to load, faster to decode on some CPUs (docs/cpus-and-gpus.md)
    mmap: bool = True

    def threads(self) -> int:
        return self.n_threads if self.n_threads and self.n_threads > 0 else (os.cpu_count() or 4)

    def batch_sizes(self, n_ctx: int | None = None) -> tuple[int, int]:
        """(n_batch, n_ubatch) of the context these options create (``n_ctx``: the context
        size when ``self.n_ctx`` is 0, i.e. the model's own)."""
        ctx = self.n_ctx if self.n_ctx > 0 else (n_ctx or 0)
        n_batch = min(self.n_batch, ctx) if ctx > 0 else self.n_batch
        # one ubatch per batch: a verify block is evaluated in one graph
        return n_batch, n_batch


@dataclass(frozen=True)
class ModelFacts:
    path: str
    file_size: int
    architecture: str
    name: str
    n_params: int
    n_vocab: int
    vocab_type: str
    n_ctx_train: int
    file_type: str  # general.file_type as llama.cpp names it (e.g. MOSTLY_Q4_K_M)
    description: str  # llama.cpp's one-line model description
    chat_template: bool
    recurrent: bool
    tensor_types: dict[str, int] = field(default_factory=dict)  # filled by facts(with_tensor_types=True)
    chat_template_error: str | None = None  # the template is there but cannot be used


def padded_ctx(n_ctx: int) -> int:
    """The context llama.cpp actually allocates for ``n_ctx`` (it rounds up to 256)."""
    return -(-max(1, n_ctx) // 256) * 256


def available_memory() -> int | None:
    """Bytes of memory the system can still hand out (Linux MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class Part(NamedTuple):
    """One sequence's share of a batched decode: ``tokens`` appended at the end of sequence
    ``seq``, logits returned for the indices in ``logits_at`` (negatives from the end)."""

    seq: int
    tokens: Sequence[int]
    logits_at: Sequence[int] = (-1,)


# --------------------------------------------------------------------------- the model
class ModelFile:
    """A GGUF file loaded into llama.cpp (a ``llama_model``) without a context: its metadata,
    facts and vocabulary (``vocab``). ``ModelFile(path)`` loads the vocabulary only (no
    weights: fast, little memory), which pair checks and tokenizing need; :class:`Model`
    loads the weights (``weights=True``) and adds the context it decodes with."""

    def __init__(self, path: str | os.PathLike, opts: LoadOptions = LoadOptions(), *, weights: bool = False,
                 extra_bufts: bool = True):
        self.path = check_gguf_file(path)
        self.name = self.path.name  # every decode names its file in its errors: read once
        self.opts = opts
        self._model = None
        sink = llama_log.ensure_backend(opts.verbose)
        sink.mark()

        mparams = _ll.llama_model_default_params()
        mparams.n_gpu_layers = opts.n_gpu_layers if opts.n_gpu_layers >= 0 else 0x7FFFFFFF
        mparams.main_gpu = opts.main_gpu
        mparams.vocab_only = not weights
        mparams.use_extra_bufts = bool(extra_bufts)
        if weights and not opts.mmap:
            mparams.load_mode = _ll.LLAMA_LOAD_MODE_NONE  # read, not mapped (llama.cpp's default: auto)
        devs, split = devices.model_devices(opts.rpc, opts.tensor_split) if weights else (None, None)
        if devs is not None:
            mparams.devices = ctypes.cast(devs, ctypes.c_void_p)
        if split is not None:
            mparams.tensor_split = split
        # llama.cpp logs through a Python callback while it loads, where a KeyboardInterrupt
        # would be swallowed with a traceback: hold Ctrl-C, and stop the load at its next
        # progress report (returning False aborts it)
        with deferred_interrupt() as ctrl_c:
            keep_going = _ll.llama_progress_callback(lambda _p, _u: not ctrl_c.pending)
            mparams.progress_callback = keep_going
            model = _ll.llama_model_load_from_file(str(self.path).encode("utf-8"), mparams)
            if ctrl_c.pending:
                if model:
                    _ll.llama_model_free(model)
                model = None
        if not model:
            raise ModelLoadError(sink.load_failure(self.path))
        self._model, self._handle = model, ModelHandle(model)
        self.n_ctx_train = int(_ll.llama_model_n_ctx_train(model))
        self.architecture = self.meta("general.architecture") or "unknown"
        self.recurrent = bool(_ll.llama_model_is_recurrent(model) or _ll.llama_model_is_hybrid(model))
        self.vocab = Vocab(self._handle, self.path, self._chat_template())

    @property
    def n_vocab(self) -> int:
        """Tokens in the vocabulary: the width of a row of logits."""
        return self.vocab.n_vocab

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Free the model now (its vocabulary then refuses to work)."""
        self._model = None
        handle = getattr(self, "_handle", None)
        if handle is not None:
            handle.free()

    def _drop(self) -> None:
        """What a dropped object frees: the model goes with the last holder of its handle (its
        vocabulary may outlive this object)."""
        self._model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self._drop()
        except Exception:
            pass

    # ------------------------------------------------------------------ metadata
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = _ll.llama_model_meta_val_str(self._model, key.encode(), buf, ctypes.sizeof(buf))
        if n < 0:
            return None
        if n >= ctypes.sizeof(buf):
            buf = ctypes.create_string_buffer(n + 1)
            _ll.llama_model_meta_val_str(self._model, key.encode(), buf, ctypes.sizeof(buf))
        return buf.value.decode("utf-8", errors="replace")

    def _chat_template(self) -> str | None:
        ptr = _ll.llama_model_chat_template(self._model, None)
        if ptr:
            return ptr.decode("utf-8", errors="replace") if isinstance(ptr, bytes) else str(ptr)
        return self.meta("tokenizer.chat_template")

    def facts(self, with_tensor_types: bool = False) -> ModelFacts:
        desc = ctypes.create_string_buffer(256)
        _ll.llama_model_desc(self._model, desc, ctypes.sizeof(desc))
        ftype = self.meta("general.file_type")
        # a vocab-only load skips the hyper-parameters: read them from the metadata
        n_ctx_train = self.n_ctx_train or int(self.meta(f"{self.architecture}.context_length") or 0)
        has_template = self.vocab.chat_template is not None
        return ModelFacts(
            path=str(self.path),
            file_size=self.path.stat().st_size,
            architecture=self.architecture,
            name=self.meta("general.name") or self.path.stem,
            n_params=int(_ll.llama_model_n_params(self._model)),
            n_vocab=self.n_vocab,
            vocab_type=self.vocab.type_name,
            n_ctx_train=n_ctx_train,
            file_type=file_type_name(int(ftype)) if ftype and ftype.isdigit() else (ftype or "unknown"),
            description=desc.value.decode("utf-8", errors="replace").strip() or "-",
            chat_template=has_template,
            chat_template_error=self.vocab.chat_template_error() if has_template else None,
            recurrent=self.recurrent,
            tensor_types=gguf_info.read_gguf_info(self.path).tensor_types if with_tensor_types else {},
        )


class Model(ModelFile):
    """A loaded GGUF model (weights) with one llama.cpp context holding ``n_seq`` sequences.

    Each sequence has a token mirror of what is in its KV cells: ``seq_tokens(s)[i]`` sits at
    position i of sequence s. The single-sequence API (``tokens``, ``n_past``, ``decode``,
    ``rollback``, ``common_prefix`` without ``seq``) is sequence 0.
    """

    def __init__(self, path: str | os.PathLike, opts: LoadOptions = LoadOptions()):
        self._ctx = None
        self._batch = None
        # seconds spent inside llama_decode, summed over this model's decodes: the model's own
        # time; everything around it (filling the batch, reading the logits) is the caller's
        self.seconds_decode = 0.0
        self.n_seq = max(1, int(opts.n_seq))
        self._seqs: list[list[int]] = [[] for _ in range(self.n_seq)]
        self._tokens = self._seqs[0]  # sequence 0, the single-sequence API
        # sequences whose cells may hold what their mirror lacks (a decode that did not reach
        # its bookkeeping: a Ctrl-C, an error); their next decode clears past the mirror first
        self._unsure: set[int] = set()
        path = check_gguf_file(path)
        heap.keep_freed_blocks()
        self.repack = repack.decide(path, requested=opts.extra_bufts, threads=opts.threads(),
                                    n_gpu_layers=opts.n_gpu_layers, rpc=bool(opts.rpc))
        crashnote.note(f"while loading {path.name} ({self._repack_words()})")
        super().__init__(path, opts, weights=True, extra_bufts=self.repack.extra_bufts)
        sink = llama_log.sink()  # still holding what this load logged
        self.placement = devices.placement(sink.layer_devices)  # device label -> layers
        where = " + ".join(f"{dev} {n}" for dev, n in self.placement.items()) or "CPU"
        self._decode_note = f"while decoding with {self.path.name} (layers on {where}; {self._repack_words()})"
        # on a GPU or RPC server llama_decode only queues the work (``_timed_decode``)
        self._sync = None if set(self.placement) <= {"CPU"} else _ll.llama_synchronize
        model = self._model

        if self.n_seq > 256:  # llama.cpp's LLAMA_MAX_SEQ
            self.close()
            raise ModelLoadError(f"{self.path.name}: at most 256 sequences per context, asked for {self.n_seq}")
        per_seq = padded_ctx(opts.n_ctx if opts.n_ctx > 0 else self.n_ctx_train)
        n_ctx = per_seq * self.n_seq
        need = self.kv_cache_bytes(n_ctx)
        short = _short_of_memory(self.path.name, opts, self.n_seq, per_seq, need)
        if short is not None:
            self.close()
            raise ModelLoadError(short)
        cparams = _context_params(opts, n_ctx, self.n_seq)
        with deferred_interrupt():
            ctx = _ll.llama_init_from_model(model, cparams)
            self._ctx = ctx or None  # close() frees it if Ctrl-C ends the load here
        self.memory = llama_log.parse_buffers(sink.buffer_lines)
        if not ctx:
            reason = "; ".join(sink.errors()[-2:]) or "llama.cpp could not create a context"
            self.close()
            hint = "try a smaller --ctx" + (" or --parallel" if self.n_seq > 1 else "")
            raise ModelLoadError(
                f"{self.path}: {reason} (a KV cache of {fmt_bytes(need)} for {self.n_seq} × {per_seq} tokens; {hint})"
            )
        self._ctx = ctx
        self._mem = _ll.llama_get_memory(ctx)
        self.n_ctx_total = int(_ll.llama_n_ctx(ctx))
        self.n_ctx = self.n_ctx_total // self.n_seq  # per sequence
        self.kv_bytes = self.kv_cache_bytes(self.n_ctx_total)
        self.n_batch = int(cparams.n_batch)
        self._batch = _ll.llama_batch_init(self.n_batch, 0, 1)
        # the batch's arrays, read once: each attribute read of a ctypes pointer field builds a
        # new pointer object, and a step fills the batch every decode
        b = self._batch
        self._fields = (b.token, b.pos, b.n_seq_id, b.seq_id, b.logits)
        crashnote.note(f"after loading {self.path.name} (layers on {where}; {self._repack_words()})")

    def _repack_words(self) -> str:
        return "weight repacking on" if self.repack.extra_bufts else "weight repacking off"

    def close(self) -> None:
        _free_context(self)
        super().close()

    def _drop(self) -> None:
        _free_context(self)
        super()._drop()

    def kv_cache_bytes(self, n_cells: int) -> int:
        """Bytes of an f16 K+V cache of ``n_cells`` cells (llama.cpp's default cache type)."""
        n_layer = int(_ll.llama_model_n_layer(self._model))
        n_head = max(1, int(_ll.llama_model_n_head(self._model)))
        n_head_kv = int(_ll.llama_model_n_head_kv(self._model))
        head_dim = int(_ll.llama_model_n_embd(self._model)) // n_head
        return 2 * n_layer * n_head_kv * head_dim * 2 * int(n_cells)

    # ------------------------------------------------------------------ KV cache
    @property
    def tokens(self) -> list[int]:
        """Tokens currently in sequence 0's KV cells (a copy)."""
        return list(self._tokens)

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    def seq_tokens(self, seq: int) -> list[int]:
        """Tokens currently in sequence ``seq``'s KV cells (a copy)."""
        return list(self._seqs[seq])

    def seq_len(self, seq: int) -> int:
        return len(self._seqs[seq])

    def _seq_rm(self, seq: int, p0: int) -> bool:
        # only this sequence's cells from p0 on; a negative seq id would mean "every sequence"
        assert 0 <= seq < self.n_seq
        return bool(_ll.llama_memory_seq_rm(self._mem, seq, p0, -1))

    def rollback(self, n: int, seq: int = 0) -> None:
        """Drop sequence ``seq``'s KV entries from position ``n`` on (no other sequence's).
        Recurrent/hybrid models cannot do this (llama_memory_seq_rm returns False): that is
        an error, never silent corruption."""
        if n < 0:
            raise ValueError("rollback position must be >= 0")
        mirror = self._seqs[seq]
        if n >= len(mirror) and seq not in self._unsure:
            return
        if not self._seq_rm(seq, min(n, len(mirror))):  # unsure: unknown cells lie past the mirror
            raise RuntimeFailure(
                f"{self.path.name}: llama.cpp cannot roll its KV cache back to position {n} "
                f"(architecture '{self.architecture}' keeps recurrent state); speculative decoding needs a "
                "transformer whose cache can be truncated"
            )
        self._unsure.discard(seq)
        del mirror[n:]

    def reset(self) -> None:
        """Empty every sequence."""
        _ll.llama_memory_clear(self._mem, True)
        for mirror in self._seqs:
            mirror.clear()
        self._unsure.clear()

    def reset_seq(self, seq: int) -> None:
        """Empty sequence ``seq`` only."""
        self.rollback(0, seq)

    def save_seq(self, seq: int) -> tuple[list[int], ctypes.Array]:
        """Sequence ``seq``'s tokens and KV cells, serialized by llama.cpp into pages of their
        own (freed to the OS when dropped; MB-sized heap buffers stay with the process)."""
        n = int(_ll.llama_state_seq_get_size(self._ctx, seq))
        buf = (ctypes.c_uint8 * n).from_buffer(mmap.mmap(-1, n)) if n else (ctypes.c_uint8 * 0)()
        got = int(_ll.llama_state_seq_get_data(self._ctx, buf, n, seq)) if n else 0
        if got != n:
            raise RuntimeFailure(f"{self.path.name}: llama.cpp saved {got} of {n} bytes of sequence {seq}")
        return list(self._seqs[seq]), buf

    def load_seq(self, seq: int, tokens: Sequence[int], data: ctypes.Array) -> bool:
        """Sequence ``seq`` := a ``save_seq``; False (the sequence empty) without free cells."""
        self.reset_seq(seq)
        if not tokens:
            return True
        if int(_ll.llama_state_seq_set_data(self._ctx, data, len(data), seq)) == 0:
            self._seq_rm(seq, 0)
            return False
        self._seqs[seq][:] = tokens
        return True

    def common_prefix(self, tokens: Sequence[int], start: int = 0, seq: int = 0) -> int:
        """Length of the longest common prefix of sequence ``seq``'s cache and ``tokens``;
        the caller may vouch that the first ``start`` tokens already agree."""
        return common_prefix_len(self._seqs[seq], tokens, start)

    # ------------------------------------------------------------------ decode
    def decode(
        self, tokens: Sequence[int], *, start_pos: int | None = None, logits_at: Sequence[int] = (-1,), seq: int = 0
    ) -> np.ndarray:
        """Evaluate ``tokens`` at positions start_pos, start_pos+1, ... of sequence ``seq``
        and return the logits for the token indices in ``logits_at`` (indices into
        ``tokens``; negatives count from the end) as one compact float32 array of shape
        (len(logits_at), n_vocab).

        ``start_pos`` defaults to the end of the sequence; an earlier start rolls back first.
        Only the requested rows are computed by llama.cpp and copied out."""
        if self._ctx is None:
            raise RuntimeFailure(f"{self.path.name}: model is closed")
        n_have = len(self._seqs[seq])
        if start_pos is None:
            start_pos = n_have
        if start_pos > n_have:
            raise ValueError(f"start_pos {start_pos} is past the cache end {n_have}")
        part = Part(seq, tokens, logits_at)
        _rows_wanted(part, start_pos, self.n_ctx)
        self.rollback(start_pos, seq)
        return self.decode_batch([part])[0]

    def decode_batch(self, parts: Sequence[Part], *, lend: bool = False) -> list[np.ndarray]:
        """Evaluate several sequences' tokens in one ``llama_decode`` (several when they
        exceed n_batch): each part's tokens are appended at the end of its sequence. Returns,
        per part, its requested rows as one compact float32 array (len(logits_at), n_vocab).
        Only the rows asked for are computed and read.

        By default the rows are copies, each checked to be finite. ``lend=True`` (the decoding
        loop, ``scheduler``) lends them instead when the batch is one ``llama_decode``: each
        part's rows are a numpy view over llama.cpp's own logits buffer (no copy out), valid
        until this model's next decode, which overwrites them; whoever keeps a row past that
        copies it; nobody writes into one; the borrower checks them (the decoding rules check
        each row they read: ``engine.finite``), where it can fail just their sequence. The rows
        of a longer batch are copied all the same.

        At most one part per sequence. A failed decode leaves every sequence as it was."""
        if self._ctx is None:
            raise RuntimeFailure(f"{self.name}: model is closed")
        if lend and len(parts) == 1 and _last_row_only(parts[0], self.n_batch):
            return [_decode_last(self, parts[0])]
        starts, wants = _plan(parts, self._seqs, self.n_ctx)
        crashnote.note(self._decode_note)
        # (part, token index, wanted row or -1) in batch order; a Ctrl-C that lands between
        # llama_decode returning and the bookkeeping below can leave cells the mirror does
        # not know about: clear them before writing (``_unsure``: only then, a call into
        # llama.cpp that walks every cell spared on every other decode)
        flat: list[tuple[int, int, int]] = []
        for k, (p, want) in enumerate(zip(parts, wants)):
            if not p.tokens:
                continue
            if p.seq in self._unsure:
                self._seq_rm(p.seq, starts[k])
            self._unsure.add(p.seq)
            row_of = {idx: r for r, idx in enumerate(want)}
            flat.extend((k, j, row_of.get(j, -1)) for j in range(len(p.tokens)))
        lend = lend and len(flat) <= self.n_batch
        outs = None if lend else [np.empty((len(w), self.n_vocab), dtype=np.float32) for w in wants]
        for c0 in range(0, len(flat), self.n_batch):
            outs_at = _fill_batch(self._batch, self._fields, flat[c0 : c0 + self.n_batch], parts, starts)
            rc = _timed_decode(self)
            if rc != 0:
                for k, p in enumerate(parts):  # every sequence as it was before this call
                    self._seq_rm(p.seq, starts[k])
                _decode_failed(self.name, rc)
            if lend:
                outs = fresh = _lent_rows(self._ctx, self.name, self.n_vocab, outs_at, wants)
            else:
                fresh = [_logits_view(self._ctx, self.name, self.n_vocab, j, 1)[0] for j, _, _ in outs_at]
                for (_, k, row), z in zip(outs_at, fresh):
                    outs[k][row] = z
            if not lend and not all(all_finite(z) for z in fresh):
                for k, p in enumerate(parts):  # every sequence as it was, as for a failed decode
                    self._seq_rm(p.seq, starts[k])
                raise non_finite_logits(self.path)
        for p in parts:
            self._seqs[p.seq].extend(p.tokens)
            self._unsure.discard(p.seq)
        return [_in_asked_order(p, want, out) for p, want, out in zip(parts, wants, outs)]


def _timed_decode(m: Model) -> int:
    """``llama_decode`` of ``m``'s filled batch, its seconds added to ``m.seconds_decode``; on a
    GPU or RPC server (``m._sync``) with the wait for the device, which ``llama_decode`` only
    queues (llama.cpp would wait when the logits are read, on the caller's clock)."""
    t0 = time.perf_counter()
    rc = _ll.llama_decode(m._ctx, m._batch)
    if m._sync is not None:
        m._sync(m._ctx)
    m.seconds_decode += time.perf_counter() - t0
    return rc


def _last_row_only(part: Part, n_batch: int) -> bool:
    """Whether ``part`` is one decode that wants its last token's row alone (``(-1,)``; a
    verify block of no drafts asks ``range(0, 1)``)."""
    n = len(part.tokens)
    return 0 < n <= n_batch and part.logits_at in ((-1,), range(n - 1, n))


def _decode_last(m: Model, part: Part) -> np.ndarray:
    """``decode_batch([part], lend=True)`` for the commonest decode, tokens of one sequence of
    which only the last one's row is wanted (a target or draft mode token, a drafting round
    and its catch-up, easd-tf's target token), with the same checks, bookkeeping and errors,
    and the row lent. Each line of Python after a decode costs microseconds here (the decode
    has swept the caches, docs/controller.md), so this spares the general path's plan, batch
    list and row bookkeeping."""
    seq, tokens = part.seq, part.tokens
    if not 0 <= seq < len(m._seqs):
        _plan([part], m._seqs, m.n_ctx)  # raises what the general path raises
    mirror = m._seqs[seq]
    start = len(mirror)
    _rows_wanted(part, start, m.n_ctx)  # a full context: ContextOverflowError
    crashnote.note(m._decode_note)
    if seq in m._unsure:  # as in decode_batch
        m._seq_rm(seq, start)
    m._unsure.add(seq)
    token, pos, n_seq_id, seq_id, logits = m._fields
    n = len(tokens)
    for j in range(n):
        token[j], pos[j], n_seq_id[j], seq_id[j][0], logits[j] = tokens[j], start + j, 1, seq, False
    logits[n - 1] = True
    m._batch.n_tokens = n
    rc = _timed_decode(m)
    if rc != 0:
        m._seq_rm(seq, start)
        _decode_failed(m.name, rc)
    z = _logits_view(m._ctx, m.name, m.n_vocab, n - 1, 1)
    mirror.extend(tokens)
    m._unsure.discard(seq)
    return z


def _free_context(m: Model) -> None:
    """``m``'s batch and context, before the model they were made from; each handle is taken off
    the object before it is freed (a Ctrl-C between the two then leaks it; the other order
    would free it again from __del__: a double free)."""
    batch, m._batch = m._batch, None
    if batch is not None:
        _ll.llama_batch_free(batch)
    ctx, m._ctx = m._ctx, None
    if ctx:
        _ll.llama_free(ctx)


def non_finite_logits(path) -> NonFiniteLogitsError:
    """The error for a model whose logits hold a NaN or an infinity. Corrupt weights (flipped
    bytes, a broken quantization) give them; sampling from them fails and greedy argmax
    silently emits token 0. Checked where every logits row leaves llama.cpp (lent rows: by
    the borrower)."""
    return NonFiniteLogitsError(
        f"{path}: the model produced NaN or infinite logits; its weights look corrupt "
        "(re-download or re-convert the file)"
    )


class _Rows:
    """llama.cpp's logits memory as numpy sees it (the array interface): building an array
    from this takes a few microseconds, ``np.ctypeslib.as_array`` tens."""

    __slots__ = ("__array_interface__",)

    def __init__(self, addr: int, n: int, n_vocab: int) -> None:
        self.__array_interface__ = {"data": (addr, False), "shape": (n, n_vocab), "typestr": "<f4", "version": 3}


def _logits_addr(ctx, name: str, j: int) -> int:
    addr = logits_address(ctx, j)
    if not addr:
        raise RuntimeFailure(f"{name}: llama.cpp returned no logits for batch index {j}")
    return addr


_views: dict[tuple[int, int, int], np.ndarray] = {}  # (address, rows, width) -> a view there


def _logits_view(ctx, name: str, n_vocab: int, j: int, n: int) -> np.ndarray:
    """A (n, n_vocab) view over llama.cpp's logits of batch index j and the n - 1 output
    rows after it (rows of one decode lie one after another in batch order). Views are kept
    by address: a decode's rows mostly lie where the last one's did, and a view is only an
    address and a shape, so the kept one is the one numpy would build (in tens of µs, right
    after a decode has swept the caches)."""
    return _view_at(_logits_addr(ctx, name, j), n, n_vocab)


def _view_at(addr: int, n: int, n_vocab: int) -> np.ndarray:
    """The kept (n, n_vocab) float32 view at ``addr`` (``_logits_view``)."""
    key = (addr, n, n_vocab)
    z = _views.get(key)
    if z is None:
        if len(_views) >= 256:
            _views.clear()
        z = _views[key] = np.asarray(_Rows(*key))
    return z


def _lent_rows(ctx, name: str, n_vocab: int, outs_at: list[tuple[int, int, int]],
               wants: list[list[int]]) -> list[np.ndarray]:
    """Each part's rows as one view over llama.cpp's buffer (``decode_batch(..., lend=True)``);
    ``outs_at``: (batch index, part, row) of every row, in batch order."""
    outs = [np.empty((0, n_vocab), dtype=np.float32) if not w else None for w in wants]
    i = 0
    while i < len(outs_at):
        j0, k, _ = outs_at[i]
        n = len(wants[k])  # the part's rows follow one another in the batch
        addr = _logits_addr(ctx, name, j0)
        z = _view_at(addr, n, n_vocab)
        # (the address known, not ``z.ctypes.data``: numpy builds a Python object for that,
        # a hundred microseconds after a decode has swept the caches)
        if n > 1 and _logits_addr(ctx, name, outs_at[i + n - 1][0]) != \
                addr + (n - 1) * n_vocab * 4:  # not where expected: copy them one by one
            z = np.stack([_logits_view(ctx, name, n_vocab, j, 1)[0] for j, _, _ in outs_at[i:i + n]])
        outs[k] = z
        i += n
    return outs


def _short_of_memory(name: str, opts: LoadOptions, n_seq: int, per_seq: int, need: int) -> str | None:
    """Why a KV cache of ``need`` bytes cannot fit in free memory, or None (on a GPU llama.cpp
    refuses it itself)."""
    if opts.n_gpu_layers != 0 and devices.gpu_offload_supported():
        return None
    avail = available_memory()
    if avail is None or need <= avail:
        return None
    return (f"{name}: a KV cache for {n_seq} sequence{'s' if n_seq != 1 else ''} × {per_seq} tokens needs "
            f"{fmt_bytes(need)}, but only {fmt_bytes(avail)} of memory is free (lower --parallel or --ctx)")


def all_finite(z: np.ndarray) -> bool:
    """Whether ``z`` is free of what breaks the rules: a NaN or a +inf (``max`` propagates
    NaN), or a row without one finite logit. One vectorised pass, which costs tens of
    microseconds at a real vocabulary (the row has just left llama.cpp's caches). A -inf logit
    is a token with probability 0, which every rule handles (argmax, softmax, entropy)."""
    return not z.size or bool(np.isfinite(z.max(axis=-1)).all())


# --------------------------------------------------------------------------- batches
def _context_params(opts: LoadOptions, n_ctx: int, n_seq: int):
    cparams = _ll.llama_context_default_params()
    cparams.n_ctx = n_ctx
    # one ubatch per batch: a verify block (or a step of all sequences) is one graph
    cparams.n_batch, cparams.n_ubatch = opts.batch_sizes(n_ctx)
    cparams.n_seq_max = n_seq
    cparams.kv_unified = True  # see the module docstring
    cparams.n_threads = opts.threads()
    cparams.n_threads_batch = opts.threads()
    cparams.flash_attn_type = (
        _ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if opts.flash_attn else _ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    cparams.no_perf = True
    return cparams


def _plan(parts: Sequence[Part], seqs: list[list[int]], n_ctx: int) -> tuple[list[int], list[list[int]]]:
    """Where each part starts in its sequence and the rows it wants; ValueError for a part of
    an unknown sequence or a sequence twice in one batch."""
    seen: set[int] = set()
    starts: list[int] = []
    wants: list[list[int]] = []
    for p in parts:
        if not 0 <= p.seq < len(seqs):
            raise ValueError(f"sequence {p.seq} out of range (the context holds {len(seqs)})")
        if p.seq in seen:
            raise ValueError(f"sequence {p.seq} appears twice in one batch")
        seen.add(p.seq)
        start = len(seqs[p.seq])
        wants.append(_rows_wanted(p, start, n_ctx))
        starts.append(start)
    return starts, wants


def _rows_wanted(part: Part, start: int, n_ctx: int) -> list[int]:
    """The sorted distinct rows ``part`` asks for; ValueError / ContextOverflowError for a
    part that cannot be decoded at ``start`` in a sequence of ``n_ctx`` cells."""
    n = len(part.tokens)
    at = part.logits_at
    if at == (-1,) and n:  # a step's usual ask: its last token's row
        want = [n - 1]
    elif type(at) is range and at.step == 1 and at.start >= 0:  # a verify block's: its rows in order
        want = list(at)
    else:
        want = sorted({(i + n) if i < 0 else i for i in part.logits_at})
    if want and (want[0] < 0 or want[-1] >= n):
        raise ValueError(f"logits_at {list(part.logits_at)} out of range for {n} tokens")
    if start + n > n_ctx:
        raise ContextOverflowError(f"context full: {start + n} tokens needed, the context holds {n_ctx} (raise --ctx)")
    return want


def _fill_batch(batch, fields, chunk: list[tuple[int, int, int]], parts: Sequence[Part],
                starts: list[int]) -> list[tuple[int, int, int]]:
    """Write ``chunk`` ((part, token index, wanted row or -1) each) into llama.cpp's
    ``batch``, whose arrays are ``fields``; return (batch index, part, row) of the rows to
    copy out after the decode."""
    token, pos, n_seq_id, seq_id, logits = fields
    outs_at = []
    for j, (k, i, row) in enumerate(chunk):
        p = parts[k]
        token[j] = p.tokens[i]
        pos[j] = starts[k] + i
        n_seq_id[j] = 1
        seq_id[j][0] = p.seq
        logits[j] = row >= 0
        if row >= 0:
            outs_at.append((j, k, row))
    batch.n_tokens = len(chunk)
    return outs_at


def _decode_failed(name: str, rc: int) -> None:
    """Raise what ``llama_decode``'s return code ``rc`` means."""
    if rc == 1:
        raise ContextOverflowError(f"{name}: no room left in the KV cache (raise --ctx)")
    if rc == 2:
        raise KeyboardInterrupt
    raise RuntimeFailure(f"{name}: llama_decode failed with code {rc}")


def _in_asked_order(part: Part, want: list[int], out: np.ndarray) -> np.ndarray:
    """The rows of ``out`` (in ``want``'s sorted order) in the order ``part.logits_at`` asked."""
    if len(want) == len(part.logits_at) == 1 or part.logits_at == range(len(want)):  # asked in order
        return out
    n = len(part.tokens)
    order = [want.index((i + n) if i < 0 else i) for i in part.logits_at]
    return out if order == list(range(len(want))) else out[order]
