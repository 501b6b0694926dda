#!/usr/bin/env python3
"""Build llama.cpp's RPC backend and ``rpc-server`` for the installed llama-cpp-python, and
start a local rpc-server.

    python scripts/build_rpc.py                 # build once (about a minute), then reuse
    python scripts/build_rpc.py --force         # rebuild
    python scripts/build_rpc.py serve           # rpc-server on 127.0.0.1:50052 (builds first)
    python scripts/build_rpc.py serve --host 0.0.0.0 --port 50052   # other machines: see below

What it builds: three C++ files of the llama.cpp that the installed llama-cpp-python vendors
(ggml/src/ggml-rpc/ggml-rpc.cpp + transport.cpp, tools/rpc/rpc-server.cpp), compiled and
linked against llama-cpp-python's own shared ggml libraries, so that the RPC code matches the
ggml in the process byte for byte in its data structures. The backend is built as a
loadable module (``GGML_BACKEND_DL``): easd-local's ``--rpc`` loads it with
``ggml_backend_load``, and ``rpc-server`` finds it next to itself. The sources come from the
llama-cpp-python sdist on PyPI (``pip download``, as scripts/bench_speed.py does), or from
``--llama-src DIR``. Output: ``$EASD_LOCAL_HOME/llama.cpp-build/llama-cpp-python-VERSION/rpc``
(or ``$EASD_LOCAL_RPC_DIR``). Linux and macOS; needs a C++17 compiler.

Security: the RPC protocol has no authentication and no encryption; anyone who reaches the
port can run computations on, and read and write the memory of, the serving process. ``serve``
binds to 127.0.0.1 unless ``--host`` says otherwise; expose it only on a network you trust.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speed import default_build_root, find_source  # noqa: E402  (one way to get the sources)

from easd_local.llamacpp import rpc  # noqa: E402

DEFAULT_PORT = 50052  # llama.cpp rpc-server's default


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def installed_libs() -> tuple[Path, Path, dict]:
    """(libggml-base, libggml, {ggml_version, ggml_commit}) of the installed llama-cpp-python."""
    from easd_local.llamacpp.devices import ggml_build, ggml_lib_paths

    paths = ggml_lib_paths()
    if set(paths) != {"ggml", "ggml-base"}:
        raise SystemExit("error: this llama-cpp-python does not ship shared ggml libraries (libggml, libggml-base)")
    return paths["ggml-base"], paths["ggml"], ggml_build()


def vendored_ggml_version(src: Path) -> str:
    import re

    text = (src / "ggml" / "CMakeLists.txt").read_text(errors="replace")
    parts = [re.search(rf"set\(GGML_VERSION_{k} (\d+)\)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else "unknown"


def is_built(out: Path, facts: dict) -> bool:
    info = rpc.read_build_info(out)
    return ((out / rpc.LIB_NAME).is_file() and (out / rpc.SERVER_NAME).is_file()
            and info.get("ggml_commit") == facts["ggml_commit"])


def build(out: Path, llama_src: Path | None, force: bool) -> Path:
    if platform.system() == "Windows":
        raise SystemExit("error: this script builds on Linux and macOS only; on Windows build llama.cpp with -DGGML_RPC=ON")
    base, ggml, facts = installed_libs()
    if is_built(out, facts) and not force:
        log(f"RPC backend and rpc-server already built in {out} (--force rebuilds)")
        return out
    version = rpc.llama_cpp_python_version()
    src = find_source(llama_src, default_build_root() / f"llama-cpp-python-{version}", version)
    src_version = vendored_ggml_version(src)
    if src_version != facts["ggml_version"]:
        raise SystemExit(f"error: {src} is ggml {src_version}, the installed llama-cpp-python has ggml "
                         f"{facts['ggml_version']}: the RPC code must come from the same llama.cpp")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise SystemExit("error: no C++ compiler found (install g++ or clang++, or set CXX)")
    out.mkdir(parents=True, exist_ok=True)
    g = src / "ggml"
    common = [cxx, "-O2", "-std=c++17", "-DNDEBUG", "-DGGML_SHARED", f"-I{g / 'include'}"]
    rpath = f"-Wl,-rpath,{base.parent}"
    strict = ["-Wl,--no-undefined"] if platform.system() == "Linux" else []
    tmp_lib, tmp_srv = out / (rpc.LIB_NAME + ".tmp"), out / (rpc.SERVER_NAME + ".tmp")
    steps = [
        ("RPC backend", [*common, "-fPIC", "-shared", "-DGGML_BACKEND_DL", "-DGGML_BACKEND_SHARED",
                         "-DGGML_BACKEND_BUILD", f"-I{g / 'src'}", f"-I{g / 'src' / 'ggml-rpc'}",
                         str(g / "src" / "ggml-rpc" / "ggml-rpc.cpp"), str(g / "src" / "ggml-rpc" / "transport.cpp"),
                         "-o", str(tmp_lib), *strict, str(base), rpath, "-lpthread"]),
        ("rpc-server", [*common, str(src / "tools" / "rpc" / "rpc-server.cpp"), "-o", str(tmp_srv),
                        str(ggml), str(base), rpath, "-lpthread"]),
    ]
    log(f"building llama.cpp's RPC backend and rpc-server from {src}")
    log(f"  against {base.parent} (ggml {facts['ggml_version']}, commit {facts['ggml_commit']})")
    t0 = time.perf_counter()
    for name, cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"error: compiling the {name} failed:\n{' '.join(cmd)}\n{r.stderr[-3000:]}")
        log(f"  {name}: {time.perf_counter() - t0:.0f} s")
    os.replace(tmp_lib, out / rpc.LIB_NAME)
    os.replace(tmp_srv, out / rpc.SERVER_NAME)
    # rpc-server must find the backend next to itself (ggml_backend_load_all)
    r = subprocess.run([str(out / rpc.SERVER_NAME), "--help"], capture_output=True, text=True, timeout=60)
    if "loaded RPC backend" not in r.stderr + r.stdout:
        raise SystemExit(f"error: the built rpc-server does not load {out / rpc.LIB_NAME}:\n{r.stderr[-2000:]}")
    dt = time.perf_counter() - t0
    info = {"llama_cpp_python": version, **facts, "source": str(src), "compiler": cxx,
            "seconds": round(dt, 1), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / rpc.BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    log(f"built in {dt:.0f} s: {out / rpc.LIB_NAME}, {out / rpc.SERVER_NAME}")
    return out


def serve(out: Path, host: str, port: int, threads: int | None, cache: bool) -> int:
    server = out / rpc.SERVER_NAME
    cmd = [str(server), "--host", host, "--port", str(port)]
    if threads:
        cmd += ["--threads", str(threads)]
    if cache:
        cmd.append("--cache")
    if host not in ("127.0.0.1", "localhost"):
        log(f"WARNING: rpc-server on {host}:{port} has no authentication: anyone who reaches this port can use "
            "and read this machine's memory. Use it only on a network you trust.")
    log(f"rpc-server on {host}:{port}; use it with --rpc {host if host != '0.0.0.0' else 'THIS-HOST'}:{port} (Ctrl-C stops it)")
    os.execv(str(server), cmd)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: where easd-local looks)")
    ap.add_argument("--llama-src", type=Path, default=None, help="a llama.cpp source tree (default: the sdist's)")
    ap.add_argument("--force", action="store_true", help="rebuild even if built")
    sub = ap.add_subparsers(dest="cmd")
    sp = sub.add_parser("serve", help="start rpc-server (built first if needed)")
    sp.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    sp.add_argument("--port", type=int, default=DEFAULT_PORT)
    sp.add_argument("--threads", type=int, default=None, help="CPU threads of the server (default: llama.cpp's)")
    sp.add_argument("--cache", action="store_true", help="rpc-server's local tensor cache (-c): faster reloads")
    args = ap.parse_args(argv)
    out = (args.out or rpc.backend_dir()).expanduser()
    build(out, args.llama_src, args.force)
    if args.cmd == "serve":
        return serve(out, args.host, args.port, args.threads, args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
