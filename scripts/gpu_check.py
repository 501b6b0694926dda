#!/usr/bin/env python3
"""The GPU check (issue 46): the default pair with every layer on an NVIDIA GPU, our target, sd
and easd-tf side by side with the controller's share of each, and llama.cpp's own
``llama-speculative-simple`` on the same prompt.

    python scripts/gpu_check.py                    # build once (many minutes), then run
    python scripts/gpu_check.py --max-tokens 256 --json

What it does, on a machine with ``nvidia-smi`` and the CUDA toolkit (``nvcc``):

1. a virtual environment of its own (``--venv``, default ``$EASD_LOCAL_HOME/gpu-venv``, made
   with ``--system-site-packages`` so easd-local's other dependencies come from this Python),
   into which llama-cpp-python (the installed version, from its sdist) is built with CUDA
   (``CMAKE_ARGS=-DGGML_CUDA=on``); kept for later runs;
2. in that environment: the default pair (``easd-local pull`` first) loaded with every layer
   offloaded (``n_gpu_layers=-1``), one warm-up generation, then greedy generations of
   ``--max-tokens`` tokens in modes target, sd and easd-tf: tokens/s, and
   ``seconds_controller`` (everything outside ``llama_decode``) as a share of the time and
   per token;
3. ``llama-speculative-simple`` built with CUDA from the same llama.cpp (the sdist's vendored
   tree, as ``scripts/bench_speed.py`` builds it, in a build folder of its own), run with
   ``-ngl 99 -ngld 99`` on the same prompt and gamma: its tokens/s.

Without a GPU it says so and exits with status 2, having built and run nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT = ("Write a Python function that returns the n-th Fibonacci number iteratively, "
          "then explain its running time in two sentences.")
MODES = ("target", "sd", "easd-tf")
NO_GPU = 2


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


# ------------------------------------------------------------------ 1. the CUDA venv
def venv_python(venv: Path) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / "python"


def venv_has_cuda(py: Path) -> bool:
    if not py.is_file():
        return False
    r = subprocess.run([str(py), "-c", "import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() "
                        "else 1)"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    return r.returncode == 0


def build_venv(venv: Path, version: str, source: str | None, jobs: int) -> Path:
    py = venv_python(venv)
    if venv_has_cuda(py):
        log(f"CUDA llama-cpp-python: reusing {venv}")
        return py
    if not py.is_file():
        log(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    spec = source or f"llama-cpp-python=={version}"
    env = {**os.environ, "CMAKE_ARGS": "-DGGML_CUDA=on", "FORCE_CMAKE": "1", "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
           "PYTHONPATH": ""}
    if not find_nvcc():
        raise SystemExit("error: a GPU but no CUDA toolkit (nvcc): install it, or put its bin/ on PATH")
    env["PATH"] = f"{Path(find_nvcc()).parent}{os.pathsep}{env.get('PATH', '')}"
    log(f"building llama-cpp-python {version} with CUDA into {venv} (many minutes)")
    cmd = [str(py), "-m", "pip", "install", "--no-deps", "--force-reinstall", "--no-binary", "llama-cpp-python",
           "--no-cache-dir", spec]
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0 or not venv_has_cuda(py):
        raise SystemExit(f"error: building llama-cpp-python with CUDA failed ({' '.join(cmd)})")
    return py


# ------------------------------------------------------------------ 2. our modes (in the venv)
def run_ours(max_tokens: int, gamma: int, prompt_text: str) -> dict:
    from easd_local.engine import decoding
    from easd_local.engine.config import DecodeConfig
    from easd_local.engine.pair import load_pair
    from easd_local.llamacpp.runtime import LoadOptions
    from easd_local.store.resolve import resolve_pair

    files = resolve_pair("default", None, None)
    out = {"draft": str(files.draft), "target": str(files.target)}
    with load_pair(files.draft, files.target, LoadOptions(n_ctx=4096, n_gpu_layers=-1)) as pair:
        out["placement"] = {"target": pair.target.placement, "draft": pair.draft.placement}
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
    return out


# ------------------------------------------------------------------ 3. llama-speculative-simple
def run_native(args, draft: str, target: str, prompt_text: str) -> dict:
    import bench_speed as bs

    version = bs.llama_cpp_python_version()
    build_dir = (args.build_dir or bs.default_build_root() / f"llama-cpp-python-{version}-cuda").expanduser()
    tools = ("llama-speculative-simple",)
    if not bs.have_tools(build_dir, tools):
        src = bs.find_source(args.llama_src, bs.default_build_root() / f"llama-cpp-python-{version}", version)
        bs.CMAKE_FLAGS = (*bs.CMAKE_FLAGS, "-DGGML_CUDA=ON")
        bs.build_tools(src, build_dir, args.jobs, tools)
    exe = bs.tool_paths(build_dir, tools)["llama-speculative-simple"]
    with tempfile.TemporaryDirectory() as tmp:
        pf = Path(tmp) / "prompt.txt"
        pf.write_text(prompt_text)
        ns = argparse.Namespace(target=target, draft=draft, max_tokens=args.max_tokens, threads=os.cpu_count() or 4,
                                ctx=4096, flash_attn=False, gamma=args.gamma)
        cmd = bs.native_sd_cmd({"llama-speculative-simple": exe}, ns, pf) + ["-ngl", "99", "-ngld", "99"]
        bs.run_native(cmd, bs.parse_speculative, 600)  # a warm-up
        r = bs.run_native(cmd, bs.parse_speculative, 600)
    return {"tokens": r["tokens"], "tokens_per_s": r["tokens_per_s"], "acceptance_rate": round(r["acceptance_rate"], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", type=Path, help="the CUDA virtual environment (default $EASD_LOCAL_HOME/gpu-venv)")
    ap.add_argument("--llama-cpp-python", dest="source", help="pip spec or sdist path of llama-cpp-python "
                    "(default: the installed version from the package index)")
    ap.add_argument("--llama-src", type=Path, help="llama.cpp source tree for llama-speculative-simple")
    ap.add_argument("--build-dir", type=Path, help="build folder for llama-speculative-simple")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--no-native", action="store_true", help="skip llama-speculative-simple")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # step 2, inside the venv
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_ours(a.max_tokens, a.gamma, a.prompt)))
        return 0

    gpus = find_gpu()
    if gpus is None:
        print("no GPU: this machine has no NVIDIA GPU that nvidia-smi can see; nothing was built or run "
              "(run scripts/gpu_check.py on a machine with a CUDA GPU)")
        return NO_GPU
    log(gpus)
    from easd_local import paths
    import bench_speed as bs

    version = bs.llama_cpp_python_version()
    py = build_venv((a.venv or paths.home() / "gpu-venv").expanduser(), version, a.source, a.jobs)
    cmd = [str(py), str(Path(__file__).resolve()), "--child", "--max-tokens", str(a.max_tokens), "--gamma",
           str(a.gamma), "--prompt", a.prompt]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if r.returncode != 0:
        raise SystemExit(f"error: the run in the CUDA venv failed:\n{r.stderr[-3000:]}")
    ours = json.loads(r.stdout.strip().splitlines()[-1])
    native = None if a.no_native else run_native(a, ours["draft"], ours["target"], a.prompt)
    result = {"gpus": gpus, "max_tokens": a.max_tokens, "gamma": a.gamma, "ours": ours,
              "llama-speculative-simple": native}
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"{gpus}\ndefault pair, every layer on the GPU ({ours['placement']}), greedy, {a.max_tokens} tokens, "
          f"gamma {a.gamma}")
    print(f"{'':26} {'tok/s':>8} {'controller':>11} {'us/token':>9}")
    for m in MODES:
        o = ours[m]
        share = f"{100 * o['controller_share']:.1f} %" if o["controller_share"] is not None else "-"
        print(f"{'ours ' + m:26} {o['tokens_per_s']:>8} {share:>11} {o['controller_us_per_token']:>9}")
    if native:
        print(f"{'llama-speculative-simple':26} {native['tokens_per_s']:>8} {'-':>11} {'-':>9}"
              f"   (acceptance {native['acceptance_rate']:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
