"""llama.cpp's devices: what this build can run on (backends, GPU offload), the RPC servers
whose devices take layers (``--rpc``), and where a model's layers went.

Part of the runtime layer (with ``runtime``, ``llama_log`` and ``vocab``): the only modules
that touch ctypes. ``rpc`` (no ctypes) parses endpoints, probes servers and knows where the
RPC backend built by ``scripts/build_rpc.py`` lives; this module loads and registers it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Sequence

import llama_cpp as _ll

from ..errors import ConfigError, RpcError
from . import llama_log
from . import rpc as _rpc


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can offload layers (CUDA, Metal, Vulkan...)."""
    return bool(_ll.llama_supports_gpu_offload())


def system_info() -> str:
    """llama.cpp's own ``llama_print_system_info()``: each compiled-in backend and its
    features, e.g. ``"CPU : SSE3 = 1 | AVX2 = 1 | ... | OPENMP = 1 | "``."""
    raw = _ll.llama_print_system_info()
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw or "")
    return text.strip()


def backends(info: str) -> list[str]:
    """The backend names in a ``system_info()`` string, in llama.cpp's order (["CUDA",
    "CPU"]): each backend's section starts with ``NAME : ``."""
    return [item.split(" : ", 1)[0].strip() for item in info.split("|") if " : " in item]


# --------------------------------------------------------------------------- devices (RPC)
# What llama.cpp's own ``--rpc`` does (common/arg.cpp add_rpc_devices): find the "RPC" backend
# in ggml's registry, take its ggml_backend_rpc_add_server, call that per endpoint, and give
# the servers' devices to the model (llama_model_params.devices, NULL-terminated). Unlike
# llama.cpp the per-server registries are not registered globally: a model loaded without
# --rpc (the draft, usually) keeps llama.cpp's default device choice, which would otherwise
# put its layers on the RPC servers as well.
_DEV_GPU, _DEV_IGPU = 1, 2  # enum ggml_backend_dev_type
_ABORT_CB = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_GGML_SIGS = {  # name: (restype, argtypes); in libggml (registry) or libggml-base
    "ggml_backend_reg_by_name": (ctypes.c_void_p, [ctypes.c_char_p]),
    "ggml_backend_load": (ctypes.c_void_p, [ctypes.c_char_p]),
    "ggml_backend_reg_get_proc_address": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "ggml_backend_reg_dev_count": (ctypes.c_size_t, [ctypes.c_void_p]),
    "ggml_backend_reg_dev_get": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
    "ggml_backend_reg_name": (ctypes.c_char_p, [ctypes.c_void_p]),
    "ggml_backend_dev_count": (ctypes.c_size_t, []),
    "ggml_backend_dev_get": (ctypes.c_void_p, [ctypes.c_size_t]),
    "ggml_backend_dev_type": (ctypes.c_int, [ctypes.c_void_p]),
    "ggml_backend_dev_name": (ctypes.c_char_p, [ctypes.c_void_p]),
    "ggml_backend_dev_description": (ctypes.c_char_p, [ctypes.c_void_p]),
    "ggml_backend_dev_backend_reg": (ctypes.c_void_p, [ctypes.c_void_p]),
    "ggml_set_abort_callback": (ctypes.c_void_p, [_ABORT_CB]),
    "ggml_commit": (ctypes.c_char_p, []),
    "ggml_version": (ctypes.c_char_p, []),
}


def ggml_lib_dir() -> Path:
    """Where llama-cpp-python loaded libllama from, and ggml beside it: its own ``lib`` folder,
    or a build of the user's own (``LLAMA_CPP_LIB_PATH``, which it reads at import)."""
    base = getattr(getattr(_ll, "llama_cpp", None), "_base_path", None)
    return Path(base) if base is not None else Path(_ll.__file__).parent / "lib"


def ggml_lib_paths() -> dict[str, Path]:
    """llama-cpp-python's shared ggml libraries: {"ggml": registry, "ggml-base": core}."""
    libdir = ggml_lib_dir()
    out = {}
    for stem in ("ggml", "ggml-base"):
        found = [libdir / n for n in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll") if (libdir / n).exists()]
        if found:
            out[stem] = found[0]
    return out


def ggml_build() -> dict[str, str]:
    """The installed ggml's version and commit: what an RPC backend built for it must match."""
    fn = _devices().fn
    return {k: (fn[k]() or b"").decode() for k in ("ggml_version", "ggml_commit")}


class _Devices:
    """ggml's device registry and the RPC servers this process uses (one per process)."""

    def __init__(self) -> None:
        libdir = ggml_lib_dir()
        # already loaded by libllama: CDLL returns the same handles
        libs = [ctypes.CDLL(str(p)) for p in ggml_lib_paths().values()]
        self.fn = {}
        for name, (res, args) in _GGML_SIGS.items():
            f = next((getattr(lib, name) for lib in libs if hasattr(lib, name)), None)
            if f is None:
                raise RpcError(f"this llama-cpp-python's ggml ({libdir}) lacks {name}: too old for --rpc")
            f.restype, f.argtypes = res, args
            self.fn[name] = f
        self.lock = threading.Lock()
        self.servers: dict[str, list[int]] = {}  # endpoint -> its devices
        self._add_server = None
        self._abort_cb = None

    def _name(self, dev: int) -> str:
        return (self.fn["ggml_backend_dev_name"](dev) or b"?").decode("utf-8", "replace")

    def label(self, name: str) -> str:
        """A device name with where it is: ``RPC0 (10.0.0.2:50052)``; local ones as named."""
        for ep, devs in self.servers.items():
            if any(self._name(d) == name for d in devs):
                return f"{name} ({ep})"
        return name

    def _rpc_backend(self):
        """ggml_backend_rpc_add_server of the built-in RPC backend, else of the one that
        scripts/build_rpc.py built (loaded with ggml_backend_load, as GGML_BACKEND_DL does)."""
        if self._add_server is not None:
            return self._add_server
        fn = self.fn
        reg = fn["ggml_backend_reg_by_name"](b"RPC")
        if not reg:
            folder = _rpc.backend_dir()
            lib = folder / _rpc.LIB_NAME
            if not lib.is_file():
                raise RpcError(_rpc.how_to_get())
            built_for = _rpc.read_build_info(folder).get("ggml_commit")
            have = ggml_build()["ggml_commit"]
            if built_for != have:
                raise RpcError(
                    f"the RPC backend in {folder} was built for ggml {built_for or 'unknown'}, this "
                    f"llama-cpp-python has ggml {have}: rebuild it with `python scripts/build_rpc.py --force`"
                )
            sink = llama_log.sink()
            sink.mark()
            reg = fn["ggml_backend_load"](str(lib).encode())
            if not reg:
                why = "; ".join(sink.errors()[-2:]) or "see --verbose"
                raise RpcError(f"llama.cpp could not load {lib} ({why}): rebuild it with `python scripts/build_rpc.py --force`")
        addr = fn["ggml_backend_reg_get_proc_address"](reg, b"ggml_backend_rpc_add_server")
        if not addr:
            raise RpcError("this llama.cpp's RPC backend has no ggml_backend_rpc_add_server (too old for --rpc)")
        self._add_server = _ADD_SERVER(addr)
        return self._add_server

    def _install_abort_handler(self) -> None:
        # ggml-rpc aborts the process when a server drops (RPC_STATUS_ASSERT -> GGML_ABORT);
        # ggml calls this first, so the CLI can say so in one line before the process ends.
        if self._abort_cb is None and _FATAL_HANDLER is not None:
            self._abort_cb = _ABORT_CB(self._on_abort)
            self.fn["ggml_set_abort_callback"](self._abort_cb)

    def _on_abort(self, message: bytes) -> None:
        text = (message or b"").decode("utf-8", "replace").strip()
        head, sep, rest = text.partition(": ")  # "ggml-rpc.cpp:566: Remote RPC server crashed ..."
        detail = rest if sep and ".c" in head else text
        servers = ", ".join(self.servers) or "none"
        if "rpc" in text.lower():
            line = f"lost the RPC server ({servers}): {detail}; the run was abandoned"
        else:
            line = f"llama.cpp aborted: {detail}"
        try:
            _FATAL_HANDLER(line)
        finally:
            os._exit(RpcError.exit_code)

    def rpc_devices(self, endpoint: str) -> list[int]:
        with self.lock:
            if endpoint not in self.servers:
                # only on first use: rpc-server serves one client at a time, and once a model
                # uses the server this process's own connection keeps it busy
                _rpc.probe(endpoint)
                add = self._rpc_backend()
                self._install_abort_handler()
                reg = add(endpoint.encode())
                n = int(self.fn["ggml_backend_reg_dev_count"](reg)) if reg else 0
                if n == 0:
                    raise RpcError(f"RPC server {endpoint} offers no devices")
                self.servers[endpoint] = [self.fn["ggml_backend_reg_dev_get"](reg, i) for i in range(n)]
            return list(self.servers[endpoint])

    def local_gpus(self) -> list[int]:
        """The local GPUs llama.cpp would pick by default: discrete ones, else integrated.
        (llama.cpp also skips a GPU seen twice through two backends; not needed here.)"""
        fn = self.fn
        gpus: list[int] = []
        igpus: list[int] = []
        for i in range(int(fn["ggml_backend_dev_count"]())):
            dev = fn["ggml_backend_dev_get"](i)
            kind = fn["ggml_backend_dev_type"](dev)
            reg_name = (fn["ggml_backend_reg_name"](fn["ggml_backend_dev_backend_reg"](dev)) or b"").decode()
            if kind == _DEV_GPU and not reg_name.startswith("RPC"):
                gpus.append(dev)
            elif kind == _DEV_IGPU:
                igpus.append(dev)
        return gpus or igpus


def list_devices() -> list[dict[str, str]]:
    """Every device ggml's registry knows (CPU, GPUs, ...): name, description, kind."""
    fn = _devices().fn
    kinds = {0: "CPU", _DEV_GPU: "GPU", _DEV_IGPU: "iGPU", 3: "accelerator"}
    out = []
    for i in range(int(fn["ggml_backend_dev_count"]())):
        dev = fn["ggml_backend_dev_get"](i)
        out.append({"name": (fn["ggml_backend_dev_name"](dev) or b"?").decode("utf-8", "replace"),
                    "description": (fn["ggml_backend_dev_description"](dev) or b"").decode("utf-8", "replace"),
                    "kind": kinds.get(int(fn["ggml_backend_dev_type"](dev)), "other")})
    return out


_DEVICES: _Devices | None = None
_FATAL_HANDLER = None
_INIT_LOCK = threading.Lock()


def _devices() -> _Devices:
    global _DEVICES
    with _INIT_LOCK:
        if _DEVICES is None:
            _DEVICES = _Devices()
        return _DEVICES


def set_fatal_handler(handler) -> None:
    """``handler(message)`` runs when llama.cpp is about to abort the process (an RPC server
    dropped mid-run): it can report the one line; the process then exits with code 2."""
    global _FATAL_HANDLER
    _FATAL_HANDLER = handler


def model_devices(rpc: Sequence[str], tensor_split: Sequence[float]):
    """(NULL-terminated device array or None, ctypes float array or None) for the model
    parameters (``LoadOptions.rpc`` and ``.tensor_split``). None keeps llama.cpp's default
    choice (all local GPUs)."""
    devs = None
    if rpc:
        d = _devices()
        found = [dev for ep in rpc for dev in d.rpc_devices(ep)]
        # RPC devices first, as llama.cpp orders them ("to minimize network transfers")
        found += d.local_gpus()
        devs = (ctypes.c_void_p * (len(found) + 1))(*found, None)
    split = None
    if tensor_split:
        n_max = int(_ll.llama_max_devices())
        n_dev = len(devs) - 1 if devs is not None else n_max
        if len(tensor_split) > min(n_dev, n_max):
            n = min(n_dev, n_max)
            raise ConfigError(
                f"--tensor-split gives {len(tensor_split)} shares, but there {'is' if n == 1 else 'are'} "
                f"{n} device{'' if n == 1 else 's'} to split over"
            )
        split = (ctypes.c_float * n_max)(*tensor_split)
    return devs, split


def placement(layer_devices: Sequence[str]) -> dict[str, int]:
    """Layers per device, in first-use order (llama.cpp counts the output layer as one)."""
    d = _DEVICES
    return {(d.label(name) if d is not None else name): n for name, n in Counter(layer_devices).items()}
