"""llama.cpp RPC servers: endpoint parsing, a reachability probe, and where the RPC backend
built by ``scripts/build_rpc.py`` lives. No ctypes here (``devices`` registers them).

An ``rpc-server`` (llama.cpp's ``tools/rpc``) lends its devices to another process over TCP;
llama.cpp then places model layers on them as on local GPUs. The protocol has no
authentication and no encryption: whoever reaches the port can run graphs and read or write
the server's memory. Bind it to 127.0.0.1, or use it only inside a trusted network.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
from pathlib import Path

from ..errors import ConfigError, RpcError

# The HELLO handshake of the vendored ggml-rpc (ggml-rpc.h, ggml-rpc.cpp, transport.h):
# | cmd u8 = 14 | size u64 = 24 | conn_caps[24] |  ->  | size u64 = 28 | major minor patch pad caps[24] |
RPC_PROTO_MAJOR = 7
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
CONNECT_TIMEOUT_S = 5.0
ENV_DIR = "EASD_LOCAL_RPC_DIR"  # a folder holding libggml-rpc.so and rpc-server
LIB_NAME = "libggml-rpc.so"  # rpc-server loads ``libggml-rpc*.so`` from its own folder
SERVER_NAME = "rpc-server"
BUILD_INFO = "BUILD_INFO.json"


def parse_endpoints(text: str | None, flag: str = "--rpc") -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]`` as llama.cpp's ``--rpc`` takes it, validated."""
    if text is None:
        return ()
    out: list[str] = []
    for item in text.split(","):
        item = item.strip()
        host, sep, port = item.rpartition(":")
        # llama.cpp splits at the first ':' (ggml-rpc parse_endpoint): an IPv6 literal cannot work
        if not sep or not host or ":" in host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{flag}: {item!r} is not HOST:PORT (e.g. 192.168.1.20:50052)")
        out.append(f"{host}:{int(port)}")
    if len(set(out)) != len(out):
        raise ConfigError(f"{flag}: an endpoint is listed twice: {text}")
    return tuple(out)


def parse_tensor_split(text: str | None) -> tuple[float, ...]:
    """``--tensor-split 3,1``: the share of offloaded layers per device, as llama.cpp takes it
    (comma- or slash-separated non-negative numbers, not all zero)."""
    if text is None:
        return ()
    try:
        vals = tuple(float(v) for v in text.replace("/", ",").split(","))
    except ValueError:
        raise ConfigError(f"--tensor-split: {text!r} is not a list of numbers like 3,1") from None
    if any(not math.isfinite(v) or v < 0 for v in vals) or not any(vals):
        raise ConfigError(f"--tensor-split: {text!r} needs non-negative numbers, not all zero")
    return vals


def probe(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> tuple[int, int, int]:
    """Connect to an rpc-server and exchange HELLO, within ``timeout`` seconds; return its
    protocol version. llama.cpp itself connects without a timeout and aborts the process on
    any failure, so every endpoint is checked here first."""
    host, _, port = endpoint.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except socket.gaierror as e:
        raise RpcError(f"RPC server {endpoint}: unknown host ({e.strerror or e})") from None
    except TimeoutError:
        raise RpcError(f"RPC server {endpoint}: no answer within {timeout:g} s (host down or port filtered?)") from None
    except OSError as e:
        raise RpcError(f"RPC server {endpoint}: cannot connect ({e.strerror or e}); is rpc-server running there?") from None
    try:
        with sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            head = _recv(sock, 8)
            (size,) = struct.unpack("<Q", head)
            if size != 4 + RPC_CONN_CAPS_SIZE:
                raise EOFError
            major, minor, patch = _recv(sock, size)[:3]
    except TimeoutError:
        raise RpcError(
            f"RPC server {endpoint}: connected, but no HELLO reply within {timeout:g} s "
            "(not an rpc-server, or one busy with another client: it serves one at a time)"
        ) from None
    except (EOFError, OSError):
        raise RpcError(
            f"RPC server {endpoint}: the handshake failed: not an rpc-server, or one built from another "
            f"llama.cpp version (this one speaks RPC protocol {RPC_PROTO_MAJOR}.x; rebuild it with "
            "scripts/build_rpc.py)"
        ) from None
    if major != RPC_PROTO_MAJOR:
        raise RpcError(
            f"RPC server {endpoint} speaks RPC protocol {major}.{minor}.{patch}; this llama.cpp speaks "
            f"{RPC_PROTO_MAJOR}.x: run an rpc-server built from the same llama.cpp (scripts/build_rpc.py)"
        )
    return major, minor, patch


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


# --------------------------------------------------------------------------- the build
def llama_cpp_python_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:  # pragma: no cover - an install without metadata
        import llama_cpp

        return str(llama_cpp.__version__)


def backend_dir() -> Path:
    """Where scripts/build_rpc.py puts ``libggml-rpc.so`` and ``rpc-server`` for the installed
    llama-cpp-python (one folder per version: a new llama-cpp-python needs a new build)."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(explicit).expanduser()
    from .. import paths

    return paths.home() / "llama.cpp-build" / f"llama-cpp-python-{llama_cpp_python_version()}" / "rpc"


def how_to_get() -> str:
    v = llama_cpp_python_version()
    return (
        "this llama-cpp-python has no RPC backend: build it with `python scripts/build_rpc.py` "
        f"(about a minute; from the llama.cpp that llama-cpp-python {v} vendors, into {backend_dir()}), "
        f'or reinstall with CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir '
        f"llama-cpp-python=={v}"
    )


def read_build_info(folder: Path) -> dict:
    try:
        return json.loads((folder / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return {}
