#!/usr/bin/env python3
"""The GPU check (issue 46): a pair with every layer on an NVIDIA GPU, our target, sd and easd-tf
side by side with the controller's share of each, and llama.cpp's own
``llama-speculative-simple`` on the same prompt and files.

    python scripts/gpu_check.py                        # the default pair (pulled), build once, run
    python scripts/gpu_check.py --pair wide --json     # the wide pair, written on the spot (below)
    python scripts/gpu_check.py --make-pack .gpu/llama-src.tar.xz   # here: what a lent machine needs

What it does, on a machine with ``nvidia-smi`` and the CUDA toolkit (``nvcc``, CMake):

1. one CMake build, with CUDA for this machine's GPU only (``CMAKE_CUDA_ARCHITECTURES=native``),
   of the llama.cpp that the installed llama-cpp-python vendors: its shared library and
   ``llama-speculative-simple`` (``--build-dir``, default
   ``$EASD_LOCAL_HOME/llama.cpp-build/llama-cpp-python-VERSION-cuda``; kept for later runs);
2. our modes in a child process that loads llama-cpp-python's Python layer over that library
   (``LLAMA_CPP_LIB_PATH``): one warm-up generation, then greedy generations of
   ``--max-tokens`` tokens in modes target, sd and easd-tf with every layer offloaded
   (``n_gpu_layers=-1``): tokens/s, and ``seconds_controller`` (everything outside
   ``llama_decode`` and its wait for the device) as a share of the time and per token; then
   ``scripts/controller_floor.py``'s bare loops (target, greedy sd) on the same pair: the least
   a Python loop pays between these decodes, reading the rows, and the same loops with
   llama.cpp's argmax in the decode's graph (a greedy sampler attached: no row leaves the GPU);
3. ``llama-speculative-simple`` from the same build, ``-ngl 99 -ngld 99``, on the same prompt,
   files and gamma: its tokens/s.

``--pair wide``: the wide pair of the test suite (``make_tiny_pair.py --wide``: a 4-layer,
128-wide model with the default pair's 151,936-token vocabulary), written into a temporary
folder. Its decodes take little time on a GPU, so what a token costs there is mostly the
controller: its microseconds per token at the real vocabulary are what a GPU host pays on top of
any model's decode. ``--pair default`` needs the default pair pulled (1.6 GB).

Sources: ``--llama-src DIR`` (a llama.cpp tree), ``--pack FILE`` (made by ``--make-pack``), else
the llama-cpp-python sdist (as ``scripts/bench_speed.py`` finds it). A lent machine that
reaches no network and takes a small working tree gets the pack: ``--make-pack OUT`` writes a
tar.xz of llama-cpp-python's Python layer, its vendored llama.cpp without models, docs, tests,
tools and the other GPU backends, gguf-py, and diskcache (which llama-cpp-python imports), a
few MB. There: ``python3 scripts/gpu_check.py --pack .gpu/llama-src.tar.xz --pair wide``.

Without a GPU it says so and exits with status 2, having built and run nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT = ("Write a Python function that returns the n-th Fibonacci number iteratively, "
          "then explain its running time in two sentences.")
MODES = ("target", "sd", "easd-tf")
NO_GPU = 2
# llama.cpp's shared library and the one tool, nothing else; CUDA for this machine's GPU only
BUILD_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_EXAMPLES=ON",
)
CUDA_FLAGS = ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native")
TARGETS = ("llama", "llama-speculative-simple")
# what the pack leaves out of the vendored llama.cpp: not built here, or not source at all
PACK_DROP = {"models", "docs", "tests", "benches", "tools", "media", "app", "ci", "skills", "scripts",
             "conversion", "grammars", "requirements", ".devops", ".github"}
PACK_DROP_BACKENDS = {"ggml-cann", "ggml-et", "ggml-hexagon", "ggml-hip", "ggml-metal", "ggml-musa", "ggml-opencl",
                      "ggml-openvino", "ggml-sycl", "ggml-virtgpu", "ggml-vulkan", "ggml-webgpu", "ggml-zdnn",
                      "ggml-zendnn"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def find_gpu() -> str | None:
    """The GPUs ``nvidia-smi -L`` lists, or None (with the reason logged)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        log("nvidia-smi not found")
        return None
    try:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"nvidia-smi failed: {e}")
        return None
    gpus = r.stdout.strip()
    if r.returncode != 0 or "GPU" not in gpus:
        log(f"nvidia-smi lists no GPU: {(r.stderr or r.stdout).strip()[:300]}")
        return None
    return gpus


def find_nvcc() -> str | None:
    return shutil.which("nvcc") or next(
        (str(p) for p in (Path("/usr/local/cuda/bin/nvcc"),) if p.is_file()), None)


# ------------------------------------------------------------------ 0. sources and the pack
def sdist_root(llama_src: Path) -> Path:
    """The llama-cpp-python source whose vendored llama.cpp is ``llama_src``."""
    return llama_src.parent.parent


def make_pack(llama_src: Path, out: Path) -> Path:
    """Write the pack (see the module docstring) to ``out``, whole or not at all."""
    import diskcache

    python = sdist_root(llama_src) / "llama_cpp"
    if not (python / "llama_cpp.py").is_file():
        raise SystemExit(f"error: no llama-cpp-python Python layer beside {llama_src} (at {python})")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if len(parts) > 2 and parts[1] == "llama.cpp" and (
                parts[2] in PACK_DROP or parts[2:4] == ("ggml", "src") and len(parts) > 4
                and parts[4] in PACK_DROP_BACKENDS):
            return None
        return None if "__pycache__" in parts else info

    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    try:
        with tarfile.open(part, "w:xz") as tf:
            tf.add(llama_src, "pack/llama.cpp", filter=keep)
            tf.add(python, "pack/python/llama_cpp", filter=keep)
            tf.add(Path(diskcache.__file__).parent, "pack/python/diskcache", filter=keep)
        part.replace(out)
    finally:
        part.unlink(missing_ok=True)
    return out


def unpack(pack: Path, into: Path) -> tuple[Path, Path]:
    """(the llama.cpp tree, the folder of llama-cpp-python's Python layer) of a pack, unpacked
    into ``into`` once."""
    root = into / "pack"
    if not (root / "llama.cpp" / "CMakeLists.txt").is_file():
        into.mkdir(parents=True, exist_ok=True)
        try:
            with tarfile.open(pack) as tf:
                tf.extractall(into, filter="data") if hasattr(tarfile, "data_filter") else tf.extractall(into)
        except tarfile.TarError:
            raise SystemExit(f"error: --pack {pack}: not a pack made by --make-pack (not a tar archive)") from None
        if not (root / "llama.cpp" / "CMakeLists.txt").is_file():
            raise SystemExit(f"error: --pack {pack}: not a pack made by --make-pack (no pack/llama.cpp in it)")
    return root / "llama.cpp", root / "python"


def sources(args) -> tuple[Path, Path]:
    """(llama.cpp tree, the folder holding the matching ``llama_cpp`` Python package)."""
    import bench_speed as bs

    if args.pack:
        return unpack(args.pack, build_dir(args) / "src")
    version = bs.llama_cpp_python_version()
    if args.llama_src:
        src = args.llama_src.expanduser()
    else:
        src = bs.find_source(None, bs.default_build_root() / f"llama-cpp-python-{version}", version)
    if not (sdist_root(src) / "llama_cpp" / "llama_cpp.py").is_file():
        log(f"note: {src} is not inside a llama-cpp-python source; the installed llama-cpp-python {version}'s "
            "Python layer is loaded over the library built from it (they must be the same llama.cpp)")
    return src, sdist_root(src)


def build_dir(args) -> Path:
    import bench_speed as bs

    if args.build_dir:
        return args.build_dir.expanduser()
    kind = "cuda" if args.cuda else "cpu"
    if args.pack:  # llama-cpp-python need not be installed where the pack goes
        return bs.default_build_root() / f"gpu-check-pack-{kind}"
    return bs.default_build_root() / f"llama-cpp-python-{bs.llama_cpp_python_version()}-{kind}"


# ------------------------------------------------------------------ 1. one build
def build(src: Path, bdir: Path, jobs: int, cuda: bool) -> Path:
    """llama.cpp's shared library and llama-speculative-simple, built once; their folder."""
    bin_dir = bdir / "build" / "bin"
    if (bin_dir / "libllama.so").is_file() and (bin_dir / "llama-speculative-simple").is_file():
        log(f"llama.cpp {'CUDA ' if cuda else ''}build: reusing {bin_dir}")
        return bin_dir
    if cuda and not find_nvcc():
        raise SystemExit("error: a GPU but no CUDA toolkit (nvcc): install it, or put its bin/ on PATH")
    env = dict(os.environ)
    if cuda:
        env["PATH"] = f"{Path(find_nvcc()).parent}{os.pathsep}{env.get('PATH', '')}"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    flags = (*BUILD_FLAGS, *(CUDA_FLAGS if cuda else ()))
    steps = [("configure", ["cmake", "-S", str(src), "-B", str(bdir / "build"), *gen, *flags]),
             ("build", ["cmake", "--build", str(bdir / "build"), "--config", "Release", "-j", str(jobs),
                        "--target", *TARGETS])]
    bdir.mkdir(parents=True, exist_ok=True)
    log(f"building llama.cpp ({', '.join(TARGETS)}) from {src} into {bdir / 'build'}: {' '.join(flags)}")
    t0 = time.perf_counter()
    for name, cmd in steps:
        logf = bdir / f"build-{name}.log"
        with open(logf, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        if r.returncode != 0:
            tail = "\n".join(logf.read_text(errors="replace").splitlines()[-30:])
            raise SystemExit(f"error: llama.cpp {name} failed (exit {r.returncode}); see {logf}:\n{tail}")
        log(f"  {name}: done after {time.perf_counter() - t0:.0f} s")
    return bin_dir


# ------------------------------------------------------------------ 2. our modes (in the child)
def run_ours(draft: str, target: str, max_tokens: int, gamma: int, prompt_text: str) -> dict:
    import llama_cpp

    from easd_local.engine import decoding
    from easd_local.engine.config import DecodeConfig
    from easd_local.engine.pair import load_pair
    from easd_local.llamacpp.runtime import LoadOptions

    import controller_floor

    out = {"draft_file": draft, "target_file": target, "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
           "library": os.environ.get("LLAMA_CPP_LIB_PATH")}
    controller_floor.outputs_per_seq(gamma + 1)  # a verify block's rows for the bare loops' sampler
    with load_pair(Path(draft), Path(target), LoadOptions(n_ctx=4096, n_gpu_layers=-1)) as pair:
        out["placement"] = {"target": pair.target.placement, "draft": pair.draft.placement}
        # llama.cpp's own tool skips our loader's repacking self-test: it runs without repacking
        # where the self-test turned it off (an AMX host whose kernels crash, llama.cpp #20824)
        out["repack_off"] = not (pair.target.repack.extra_bufts and pair.draft.repack.extra_bufts)
        out["n_vocab"] = pair.n_vocab
        prompt = pair.target.vocab.tokenize(prompt_text)
        for i, mode in enumerate(("target", *MODES)):  # the first: a warm-up
            pair.target.reset()
            pair.draft.reset()
            cfg = DecodeConfig(mode=mode, max_tokens=max_tokens, gamma=gamma)
            fin, _ = decoding.generate_all(pair.target, pair.draft, prompt, cfg, n_vocab=pair.n_vocab)
            s = fin.stats
            if i == 0:
                continue
            out[mode] = {
                "tokens": s.tokens,
                "tokens_per_s": round(s.tokens_per_s, 2),
                "controller_share": round(s.seconds_controller / s.seconds_total, 4) if s.seconds_total else None,
                "controller_us_per_token": round(1e6 * s.seconds_controller / s.tokens, 1) if s.tokens else None,
                "target_decode_s": round(s.seconds_target, 3),
                "draft_decode_s": round(s.seconds_draft, 3),
            }
        # the least a Python loop pays between these decodes (scripts/controller_floor.py), reading
        # the rows (numpy's argmax) and with llama.cpp's argmax in the decode's graph (no row leaves
        # the device: the lever left under that floor, docs/controller.md)
        bare_tokens: dict[str, list[int]] = {}
        for sampled, name in ((False, "bare"), (True, "bare_lcpp")):
            try:
                bare = {"target": controller_floor.bare_target(pair.target, prompt, max_tokens, sampled),
                        "sd": controller_floor.bare_sd(pair.target, pair.draft, prompt, max_tokens, gamma, sampled)}
            except Exception as e:  # e.g. llama.cpp cannot sample on this backend: the figures above stand
                out[f"{name}_error"] = f"{type(e).__name__}: {e}"
                continue
            for mode, (toks, wall, dec) in bare.items():
                out[f"{name}_{mode}_us_per_token"] = round(1e6 * (wall - dec) / len(toks), 1)
                out[f"{name}_{mode}_tokens_per_s"] = round(len(toks) / wall, 2)
                if sampled:
                    out[f"{name}_{mode}_same_tokens"] = toks == bare_tokens.get(mode)
            bare_tokens = {mode: toks for mode, (toks, _, _) in bare.items()}
    return out


def child_env(bin_dir: Path, python: Path, llama_src: Path) -> dict:
    """The child's environment: llama-cpp-python's Python layer (and gguf-py, diskcache where the
    machine lacks them) over the library just built."""
    paths = [str(REPO), str(python), str(llama_src / "gguf-py")]
    return {**os.environ, "LLAMA_CPP_LIB_PATH": str(bin_dir), "PYTHONPATH": os.pathsep.join(paths)}


def the_pair(kind: str, tmp: Path) -> tuple[str, str]:
    if kind == "wide":
        import make_tiny_pair

        paths = make_tiny_pair.write_wide_models(tmp, seed=0)
        return str(paths["draft"]), str(paths["target"])
    from easd_local.store.resolve import resolve_pair

    files = resolve_pair("default", None, None)
    if files.draft is None or files.target is None or not Path(files.target).is_file():
        raise SystemExit("error: the default pair is not pulled (run `easd-local pull`, or use --pair wide)")
    return str(files.draft), str(files.target)


# ------------------------------------------------------------------ 3. llama-speculative-simple
def run_native(bin_dir: Path, draft: str, target: str, args, no_repack: bool) -> dict:
    """llama-speculative-simple's figures, or ``{"error": ...}`` where it failed (our figures
    stand without it)."""
    import bench_speed as bs

    exe = bin_dir / "llama-speculative-simple"
    with tempfile.TemporaryDirectory() as tmp:
        pf = Path(tmp) / "prompt.txt"
        pf.write_text(args.prompt)
        ns = argparse.Namespace(target=target, draft=draft, max_tokens=args.max_tokens, threads=os.cpu_count() or 4,
                                ctx=4096, flash_attn=False, gamma=args.gamma, no_repack=no_repack)
        cmd = bs.native_sd_cmd({"llama-speculative-simple": exe}, ns, pf) + ["-ngl", "99", "-ngld", "99"]
        try:
            bs.run_native(cmd, bs.parse_speculative, 600)  # a warm-up
            r = bs.run_native(cmd, bs.parse_speculative, 600)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            return {"error": str(e).splitlines()[0], "no_repack": no_repack}
    return {"tokens": r["tokens"], "tokens_per_s": r["tokens_per_s"], "acceptance_rate": round(r["acceptance_rate"], 3),
            "no_repack": no_repack}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--pair", choices=("default", "wide"), default="default",
                    help="the default pair (pulled), or the wide pair written on the spot")
    ap.add_argument("--pack", type=Path, help="sources from a --make-pack file")
    ap.add_argument("--make-pack", type=Path, metavar="OUT", help="write the pack to OUT and stop")
    ap.add_argument("--llama-src", type=Path, help="llama.cpp source tree (default: the llama-cpp-python sdist's)")
    ap.add_argument("--build-dir", type=Path, help="build folder (kept for later runs)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--no-native", action="store_true", help="skip llama-speculative-simple")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cpu-build", dest="cuda", action="store_false",
                    help="build without CUDA and run without a GPU: checks this script's build and runs here")
    ap.add_argument("--child", nargs=2, metavar=("DRAFT", "TARGET"), help=argparse.SUPPRESS)  # step 2
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_ours(*a.child, a.max_tokens, a.gamma, a.prompt)))
        return 0
    if a.pack and not a.pack.is_file():
        ap.error(f"--pack {a.pack}: no such file")
    if a.make_pack:
        src, _ = sources(argparse.Namespace(**{**vars(a), "pack": None}))
        try:
            out = make_pack(src, a.make_pack)
        except OSError as e:
            print(f"error: cannot write {a.make_pack}: {e.strerror or e}", file=sys.stderr)
            return 1
        print(f"{out} ({out.stat().st_size / 1e6:.1f} MB)")
        return 0

    gpus = find_gpu() if a.cuda else "no GPU (--cpu-build)"
    if gpus is None:
        print("no GPU: this machine has no NVIDIA GPU that nvidia-smi can see; nothing was built or run "
              "(run scripts/gpu_check.py on a machine with a CUDA GPU)")
        return NO_GPU
    log(gpus)
    src, python = sources(a)
    try:
        import gguf  # noqa: F401  (the wide pair is written with it)
    except ImportError:
        sys.path.insert(0, str(src / "gguf-py"))
    bin_dir = build(src, build_dir(a), a.jobs, a.cuda)
    with tempfile.TemporaryDirectory(prefix="easd-gpu-check-") as tmp:
        draft, target = the_pair(a.pair, Path(tmp))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", draft, target, "--max-tokens",
               str(a.max_tokens), "--gamma", str(a.gamma), "--prompt", a.prompt]
        r = subprocess.run(cmd, capture_output=True, text=True, env=child_env(bin_dir, python, src))
        if r.returncode != 0:
            raise SystemExit(f"error: our run over the built library failed:\n{r.stderr[-3000:]}")
        ours = json.loads(r.stdout.strip().splitlines()[-1])
        if a.cuda and not ours["gpu_offload"]:
            raise SystemExit(f"error: the library in {bin_dir} has no GPU offload")
        native = None if a.no_native else run_native(bin_dir, draft, target, a, ours.get("repack_off", False))
    result = {"gpus": gpus, "pair": a.pair, "max_tokens": a.max_tokens, "gamma": a.gamma, "ours": ours,
              "llama-speculative-simple": native}
    if a.json:
        print(json.dumps(result))
        return 0
    where = "every layer on the GPU" if a.cuda else "CPU build, no GPU"
    print(f"{gpus}\n{a.pair} pair ({ours['n_vocab']:,} tokens), {where} ({ours['placement']}), greedy, "
          f"{a.max_tokens} tokens, gamma {a.gamma}")
    print(f"{'':34} {'tok/s':>8} {'controller':>11} {'us/token':>9}")
    for m in MODES:
        o = ours[m]
        share = f"{100 * o['controller_share']:.1f} %" if o["controller_share"] is not None else "-"
        print(f"{'ours ' + m:34} {o['tokens_per_s']:>8} {share:>11} {o['controller_us_per_token']:>9}")
    for name, words in (("bare", "bare Python loop"), ("bare_lcpp", "bare, llama.cpp's argmax")):
        if f"{name}_error" in ours:
            print(f"{words}: {ours[f'{name}_error']}")
            continue
        for m in ("target", "sd"):
            print(f"{words + ', ' + m:34} {ours[f'{name}_{m}_tokens_per_s']:>8} {'-':>11} "
                  f"{ours[f'{name}_{m}_us_per_token']:>9}"
                  + ("" if ours.get(f"{name}_{m}_same_tokens", True) else "   (tokens differ from the bare loop's)"))
    print("(the bare loops' tok/s count the prompt's evaluation in their time)")
    if native and "error" in native:
        print(f"llama-speculative-simple: {native['error']}")
    elif native:
        print(f"{'llama-speculative-simple':34} {native['tokens_per_s']:>8} {'-':>11} {'-':>9}"
              f"   (acceptance {native['acceptance_rate']:.0%}"
              + (", --no-repack as ours" if native["no_repack"] else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
