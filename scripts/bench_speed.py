#!/usr/bin/env python3
"""Side-by-side decoding speed: easd-local against llama.cpp's own tools, same pair.

What is compared (greedy, same prompts, same draft length and thread count):

==============  =====================================  ====================================
                easd-local (this process)              llama.cpp (a subprocess per prompt)
==============  =====================================  ====================================
target only     ``generate`` mode ``target``           ``llama-completion -no-cnv``
SD              ``generate`` mode ``sd``               ``llama-speculative-simple``
EASD            ``generate`` mode ``easd``             (no counterpart: compared with our sd)
==============  =====================================  ====================================

Speeds are generation tokens/s, prompt excluded on both sides:

* ours: ``Stats.tokens_per_s`` = generated tokens / (total - prompt) seconds, which counts
  every decode, the numpy maths and all Python overhead of the loop;
* ``llama-speculative-simple``: its "decoded N tokens in X seconds" line (wall time of the
  whole speculative loop after the prompt);
* ``llama-completion``: eval runs / (eval time + sampling time) from its perf print, i.e.
  decode plus sampling; its pure "eval" figure (decode only) is reported too.

Prompts: the first ``--n-prompts`` GSM8K *test* questions, rendered with the target's chat
template (the same Jinja formatter easd-local uses). Each rendered prompt is written to a
file passed with ``-f``; llama.cpp's ``-f`` drops one trailing newline, so the file gets one
extra ``\\n``. Both llama.cpp tools tokenize with ``common_tokenize(ctx, prompt, true, true)``
(add special tokens, parse special tokens); our side tokenizes the same text with
``add_special=True, parse_special=True``, and the script checks that llama.cpp reports the
same prompt length.

Runs alternate the systems (ours target, llama.cpp target, ours sd, llama.cpp sd, ours easd,
for each prompt; the order is reversed on odd repetitions) so that slow drift of a shared
machine hits both sides alike. Ratios are taken per (prompt, repetition) and summarised as
min / median / max; the tokens/s columns are token-weighted over all runs.

llama.cpp's tools are built once from the llama.cpp vendored in the llama-cpp-python
sdist of the installed version, into ``$EASD_LOCAL_HOME/llama.cpp-build/`` (see
``--build-dir``), and reused afterwards. ``--ours-only`` never builds and never runs
llama.cpp; ``--no-build`` runs the native half only if the tools are already built.

Usage::

    python scripts/bench_speed.py                    # catalog default pair, 10 prompts
    python scripts/bench_speed.py --draft D.gguf --target T.gguf --n-prompts 10 \\
        --max-tokens 128 --reps 2 --threads 2 --gamma 4 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

TOOLS = ("llama-speculative-simple", "llama-completion")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    # on, so that scripts/bench_serve.py can build llama-server in the same tree; only the
    # targets asked for are built. No web UI: no npm, and no download from the HF bucket.
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
TARGET_SPEEDS = {  # the goals this script checks (ratio, description)
    "sd": (0.90, "our sd >= 0.90x llama-speculative-simple"),
    "target": (0.95, "our target >= 0.95x llama.cpp target-only"),
    "easd": (0.95, "our easd >= 0.95x our sd"),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- building


def llama_cpp_python_version() -> str:
    try:
        from importlib.metadata import version

        return version("llama-cpp-python")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        import llama_cpp

        return llama_cpp.__version__


def default_build_root() -> Path:
    from easd_local import paths

    return paths.home() / "llama.cpp-build"


def tool_paths(build_dir: Path, tools: tuple[str, ...] = TOOLS) -> dict[str, Path]:
    return {t: build_dir / "build" / "bin" / t for t in tools}


def have_tools(build_dir: Path, tools: tuple[str, ...] = TOOLS) -> bool:
    return all(p.is_file() and os.access(p, os.X_OK) for p in tool_paths(build_dir, tools).values())


def _is_llama_src(p: Path) -> bool:
    return (p / "CMakeLists.txt").is_file() and (p / "examples" / "speculative-simple").is_dir() and (
        p / "tools" / "completion"
    ).is_dir()


def find_source(explicit: Path | None, build_dir: Path, version: str) -> Path:
    """llama.cpp sources: --llama-src, $EASD_LLAMA_CPP_SRC, an sdist already unpacked in the
    build dir, else ``pip download`` of the llama-cpp-python sdist (unpacked there)."""
    for cand in (explicit, os.environ.get("EASD_LLAMA_CPP_SRC")):
        if cand:
            p = Path(cand).expanduser()
            if not _is_llama_src(p):
                raise SystemExit(f"error: {p} is not a llama.cpp source tree (no examples/speculative-simple)")
            return p
    unpacked = build_dir / "src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if _is_llama_src(unpacked):
        return unpacked
    dl = build_dir / "src"
    dl.mkdir(parents=True, exist_ok=True)
    log(f"downloading the llama-cpp-python {version} sdist (for its vendored llama.cpp) into {dl}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
           f"llama-cpp-python=={version}", "-d", str(dl)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: pip download failed:\n{r.stderr[-2000:]}\n(give --llama-src DIR instead)")
    archives = sorted(dl.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not archives:
        raise SystemExit(f"error: pip download left no llama_cpp_python-{version}.tar.gz in {dl}")
    with tarfile.open(archives[0]) as tf:
        tf.extractall(dl, filter="data") if hasattr(tarfile, "data_filter") else tf.extractall(dl)
    if not _is_llama_src(unpacked):
        raise SystemExit(f"error: the sdist has no vendored llama.cpp at {unpacked}")
    return unpacked


def build_tools(src: Path, build_dir: Path, jobs: int, tools: tuple[str, ...] = TOOLS) -> float:
    """Configure and build only ``tools``; returns the seconds it took. Logs go to
    build_dir/build-*.log; on failure the tail is shown."""
    bdir = build_dir / "build"
    bdir.mkdir(parents=True, exist_ok=True)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = [
        ("configure", ["cmake", "-S", str(src), "-B", str(bdir), *gen, *CMAKE_FLAGS]),
        ("build", ["cmake", "--build", str(bdir), "--config", "Release", "-j", str(jobs), "--target", *tools]),
    ]
    log(f"BUILDING llama.cpp tools {', '.join(tools)} (once; later runs reuse them)")
    log(f"  source: {src}")
    log(f"  into:   {bdir}")
    log(f"  flags:  {' '.join(CMAKE_FLAGS)}, -j{jobs}  (this takes a while on a small machine)")
    t0 = time.perf_counter()
    for name, cmd in steps:
        logf = build_dir / f"build-{name}.log"
        with open(logf, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            tail = logf.read_text(errors="replace").splitlines()[-30:]
            raise SystemExit(f"error: llama.cpp {name} failed (exit {r.returncode}); see {logf}:\n" + "\n".join(tail))
        log(f"  {name}: done after {time.perf_counter() - t0:.0f} s")
    dt = time.perf_counter() - t0
    if not have_tools(build_dir, tools):
        raise SystemExit(f"error: the build finished but {', '.join(tools)} are not in {bdir / 'bin'}")
    log(f"built llama.cpp tools in {dt / 60:.1f} min")
    (build_dir / "BUILD_INFO.json").write_text(json.dumps(
        {"source": str(src), "tools": list(tools), "flags": list(CMAKE_FLAGS), "jobs": jobs, "seconds": round(dt, 1),
         "date": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2) + "\n")
    return dt


def add_build_options(ap, no_build_help: str) -> None:
    """The options ``ensure_tools`` reads (--no-build, --llama-src, --build-dir, --jobs)."""
    ap.add_argument("--no-build", action="store_true", help=no_build_help)
    ap.add_argument("--llama-src", type=Path, help="llama.cpp source tree (default: the llama-cpp-python sdist's)")
    ap.add_argument("--build-dir", type=Path, help="build cache (default $EASD_LOCAL_HOME/llama.cpp-build/<version>)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for the build (default 2)")


def ensure_tools(args, tools: tuple[str, ...] = TOOLS) -> dict[str, Path] | None:
    """Paths of the built tools, building them if needed (and allowed); None if the native
    half must be skipped. ``args`` needs build_dir, no_build, llama_src and jobs."""
    version = llama_cpp_python_version()
    build_dir = (args.build_dir or default_build_root() / f"llama-cpp-python-{version}").expanduser()
    if have_tools(build_dir, tools):
        log(f"llama.cpp tools: using the build in {build_dir / 'build' / 'bin'}")
        return tool_paths(build_dir, tools)
    if args.no_build:
        log(f"NOTE: llama.cpp tools are not built in {build_dir / 'build' / 'bin'} and --no-build was given: "
            "skipping the llama.cpp half (run without --no-build once to build them)")
        return None
    src = find_source(args.llama_src, build_dir, version)
    build_tools(src, build_dir, args.jobs, tools)
    return tool_paths(build_dir, tools)


# ------------------------------------------------------------------------ llama.cpp runs

_NUM = r"([0-9]+(?:\.[0-9]+)?)"


def parse_speculative(text: str) -> dict:
    """Figures from llama-speculative-simple's output (stdout+stderr)."""
    out: dict = {}
    m = re.search(r"encoded\s+(\d+) tokens in\s+" + _NUM + r" seconds", text)
    if m:
        out["prompt_tokens"] = int(m.group(1))
    m = re.search(r"decoded\s+(\d+) tokens in\s+" + _NUM + r" seconds, speed:\s+" + _NUM + r" t/s", text)
    if not m:
        raise ValueError("no 'decoded N tokens in X seconds' line in llama-speculative-simple's output")
    out["tokens"], out["seconds"], out["tokens_per_s"] = int(m.group(1)), float(m.group(2)), float(m.group(3))
    for key in ("n_drafted", "n_accept"):
        m = re.search(rf"\b{key}\s*=\s*(\d+)", text)
        if not m:
            raise ValueError(f"no '{key} = N' line in llama-speculative-simple's output")
        out[key] = int(m.group(1))
    m = re.search(r"\baccept\s*=\s*" + _NUM + "%", text)
    out["accept_pct"] = float(m.group(1)) if m else None
    out["acceptance_rate"] = out["n_accept"] / out["n_drafted"] if out["n_drafted"] else 0.0
    return out


def parse_completion(text: str) -> dict:
    """Figures from llama-completion's perf print: tokens/s = eval runs / (eval + sampling)."""
    out: dict = {}
    m = re.search(r"prompt eval time =\s*" + _NUM + r" ms /\s*(\d+) tokens", text)
    if m:
        out["prompt_tokens"] = int(m.group(2))
    m = re.search(r"\beval time =\s*" + _NUM + r" ms /\s*(\d+) runs", text.replace("prompt eval time", "prompt_eval"))
    if not m:
        raise ValueError("no 'eval time = X ms / N runs' line in llama-completion's output")
    eval_ms, runs = float(m.group(1)), int(m.group(2))
    m = re.search(r"sampling time =\s*" + _NUM + r" ms", text)
    samp_ms = float(m.group(1)) if m else 0.0
    out.update(tokens=runs, eval_ms=eval_ms, sampling_ms=samp_ms,
               seconds=(eval_ms + samp_ms) / 1000.0,
               eval_tokens_per_s=1000.0 * runs / eval_ms if eval_ms > 0 else 0.0)
    out["tokens_per_s"] = runs / out["seconds"] if out["seconds"] > 0 else 0.0
    return out


def _common_flags(args, prompt_file: Path) -> list[str]:
    return ["-f", str(prompt_file), "-n", str(args.max_tokens), "--temp", "0", "--seed", "0",
            "-t", str(args.threads), "-tb", str(args.threads), "-c", str(args.ctx),
            "-fa", "on" if args.flash_attn else "off", *(["--no-repack"] if getattr(args, "no_repack", False) else [])]


def native_target_cmd(tools, args, prompt_file: Path) -> list[str]:
    return [str(tools["llama-completion"]), "-m", str(args.target), *_common_flags(args, prompt_file),
            "-no-cnv", "--no-display-prompt"]


def native_sd_cmd(tools, args, prompt_file: Path) -> list[str]:
    return [str(tools["llama-speculative-simple"]), "-m", str(args.target), "-md", str(args.draft),
            *_common_flags(args, prompt_file), "-td", str(args.threads), "-tbd", str(args.threads),
            "--spec-type", "draft-simple", "--spec-draft-n-max", str(args.gamma), "--spec-draft-n-min", "0",
            "--draft-p-min", "0"]


# llama.cpp's counterpart of each of our modes that has one: (command, parser of its output)
NATIVE = {"target": (native_target_cmd, parse_completion), "sd": (native_sd_cmd, parse_speculative)}
MODES_RUN = (*NATIVE, "easd")  # the modes this script runs (easd is compared with our sd)


def run_native(cmd: list[str], parse, timeout: float) -> dict:
    from easd_local.lifeline import preexec

    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                       timeout=timeout, preexec_fn=preexec())  # a killed bench leaves no llama.cpp tool running
    text = r.stdout + "\n" + r.stderr
    if r.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise RuntimeError(f"{Path(cmd[0]).name} exited {r.returncode}:\n{tail}")
    try:
        return parse(text)
    except ValueError as e:
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise RuntimeError(f"{e}; output tail:\n{tail}") from None


# ----------------------------------------------------------------------------- our runs


@dataclass
class Run:
    system: str  # "ours" | "llama.cpp"
    mode: str  # "target" | "sd" | "easd"
    prompt: int
    rep: int
    tokens: int
    seconds: float
    tokens_per_s: float
    prompt_tokens: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    acceptance_rate: float | None = None
    controller_s: float | None = None
    draft_s: float | None = None
    target_s: float | None = None
    extra: dict = field(default_factory=dict)

    def stats(self):
        """This run's counts as a ``Stats`` (generation seconds only), so that the summary's
        totals and rates come from the definitions every other report reads, for llama.cpp's
        runs as for ours."""
        from easd_local.engine.decoding import Stats

        return Stats(mode=self.mode, tokens=self.tokens, seconds_total=self.seconds,
                     drafted=self.drafted or 0, draft_accepted=self.accepted or 0,
                     easd_fires=int((self.extra or {}).get("easd_fires", 0)),
                     seconds_controller=self.controller_s or 0.0)


def run_ours(models, prompt_tokens: list[int], mode: str, args, cfg_base) -> Run:
    from easd_local.engine.decoding import generate_all

    cfg = cfg_base.replace(mode=mode)
    drafts = cfg.needs_draft_model
    fin, _events = generate_all(models.target, models.draft if drafts else None, prompt_tokens, cfg,
                              n_vocab=models.n_vocab)
    s = fin.stats
    gen_s = s.seconds_total - s.seconds_prompt
    return Run(system="ours", mode=mode, prompt=-1, rep=-1, tokens=s.tokens, seconds=gen_s,
               tokens_per_s=s.tokens_per_s, prompt_tokens=s.prompt_tokens,
               drafted=s.drafted if drafts else None,
               accepted=s.draft_accepted if drafts else None,
               acceptance_rate=s.acceptance_rate if drafts else None,
               controller_s=s.seconds_controller, draft_s=s.seconds_draft, target_s=s.seconds_target,
               extra={"easd_fires": s.easd_fires, "sd_accepted": s.accepted, "target_calls": s.target_calls,
                      "draft_calls": s.draft_calls, "seconds_total": s.seconds_total,
                      "seconds_prompt": s.seconds_prompt, "stop_reason": s.stop_reason})


# ------------------------------------------------------------------------------ summary


def _ratio_summary(xs: list[float]) -> dict | None:
    xs = [x for x in xs if x is not None and x == x]
    if not xs:
        return None
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def _total(runs: list[Run]):
    from easd_local.engine.decoding import Stats

    return sum((r.stats() for r in runs), Stats())


def summarize(runs: list[Run]) -> dict:
    from easd_local.engine.modes import MODE_TABLE

    by: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        by.setdefault((r.system, r.mode), []).append(r)
    key = {(r.system, r.mode, r.prompt, r.rep): r for r in runs}

    def ratios(a: tuple[str, str], b: tuple[str, str]) -> list[float]:
        out = []
        for (sy, mo, p, rep), ra in key.items():
            if (sy, mo) != a:
                continue
            rb = key.get((b[0], b[1], p, rep))
            if rb is not None and rb.tokens_per_s > 0:
                out.append(ra.tokens_per_s / rb.tokens_per_s)
        return out

    order = [("ours", "target"), ("llama.cpp", "target"), ("ours", "sd"), ("llama.cpp", "sd"), ("ours", "easd")]
    systems = {}
    for (sy, mo), rs in sorted(by.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99):
        t = _total(rs)
        # the controller's share is of the whole run, prompt included, as decoding's own figure
        tot = sum((r.extra or {}).get("seconds_total", 0.0) for r in rs)
        systems[f"{sy}:{mo}"] = {
            "runs": len(rs), "tokens": t.tokens, "seconds": t.seconds_generating,
            "tokens_per_s": t.tokens_per_s if t.seconds_generating > 0 else None,
            "acceptance_rate": t.acceptance_rate if t.drafted else None,
            "controller_share": (t.seconds_controller / tot) if (sy == "ours" and tot > 0) else None,
            "easd_fires_per_100": t.easd_fires_per_100 if MODE_TABLE[mo].gated else None,
        }
    comparisons = {
        "target": {"what": "ours target / llama.cpp target-only",
                   "ratio": _ratio_summary(ratios(("ours", "target"), ("llama.cpp", "target")))},
        "sd": {"what": "ours sd / llama-speculative-simple",
               "ratio": _ratio_summary(ratios(("ours", "sd"), ("llama.cpp", "sd")))},
        "easd": {"what": "ours easd / ours sd", "ratio": _ratio_summary(ratios(("ours", "easd"), ("ours", "sd")))},
    }
    for name, comp in comparisons.items():
        goal, desc = TARGET_SPEEDS[name]
        r = comp["ratio"]
        comp["goal"] = goal
        comp["goal_text"] = desc
        comp["met"] = None if r is None else bool(r["median"] >= goal)
    return {"systems": systems, "comparisons": comparisons}


def print_table(summary: dict, meta: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False)
    t = Table(title=f"decoding speed, {meta['pair']} · {meta['n_prompts']} prompts × {meta['reps']} reps · "
                    f"max {meta['max_tokens']} tokens · gamma {meta['gamma']} · {meta['threads']} threads")
    for col, just in (("system", "left"), ("mode", "left"), ("runs", "right"), ("tokens", "right"),
                      ("tok/s", "right"), ("accept", "right"), ("controller", "right"), ("EASD/100", "right")):
        t.add_column(col, justify=just)
    for name, s in summary["systems"].items():
        sy, mo = name.split(":")
        t.add_row(sy, mo, str(s["runs"]), str(s["tokens"]),
                  f"{s['tokens_per_s']:.2f}" if s["tokens_per_s"] else "-",
                  f"{100 * s['acceptance_rate']:.1f}%" if s["acceptance_rate"] is not None else "-",
                  f"{100 * s['controller_share']:.1f}%" if s["controller_share"] is not None else "-",
                  f"{s['easd_fires_per_100']:.1f}" if s["easd_fires_per_100"] is not None else "-")
    con.print(t)
    r = Table(title="ratios per (prompt, rep): min / median / max")
    for col, just in (("comparison", "left"), ("min", "right"), ("median", "right"), ("max", "right"),
                      ("goal", "right"), ("met", "left")):
        r.add_column(col, justify=just)
    for comp in summary["comparisons"].values():
        x = comp["ratio"]
        if x is None:
            r.add_row(comp["what"], "-", "-", "-", f"≥ {comp['goal']:.2f}", "not measured")
            continue
        r.add_row(comp["what"], f"{x['min']:.3f}", f"{x['median']:.3f}", f"{x['max']:.3f}",
                  f"≥ {comp['goal']:.2f}", "yes" if comp["met"] else "[red]NO[/]")
    con.print(r)
    for note in meta.get("notes", []):
        con.print(f"note: {note}")


# --------------------------------------------------------------------------------- main


def default_pair() -> tuple[Path | None, Path | None]:
    try:
        from easd_local.store.catalog import is_present, load_catalog, local_path

        p = load_catalog().default_pair
        if is_present(p.draft) and is_present(p.target):
            return local_path(p.draft), local_path(p.target)
    except Exception:
        pass
    return None, None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path, help="draft GGUF (default: the catalog default pair's, if pulled)")
    ap.add_argument("--target", type=Path, help="target GGUF (default: the catalog default pair's, if pulled)")
    ap.add_argument("--n-prompts", type=int, default=10, help="GSM8K test questions (default 10)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per generation (default 128)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of the whole set (default 2)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="CPU threads, both sides")
    ap.add_argument("--gamma", type=int, default=4, help="draft length, both sides (default 4)")
    ap.add_argument("--ctx", type=int, default=4096, help="context length, both sides (default 4096)")
    ap.add_argument("--flash-attn", action="store_true", help="flash attention on, both sides (default off)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (runs + summary) instead of tables")
    ap.add_argument("--modes", default="target,sd,easd",
                    help="comma-separated subset of target,sd,easd to run (default: all three)")
    ap.add_argument("--save", type=Path, help="also write the JSON object (runs + summary) to this file")
    ap.add_argument("--ours-only", action="store_true", help="run only easd-local (never builds or runs llama.cpp)")
    add_build_options(ap, "skip the llama.cpp half if its tools are not built")
    ap.add_argument("--build-only", action="store_true", help="build llama.cpp's tools (if needed) and exit")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per llama.cpp run")
    args = ap.parse_args(argv)
    for name in ("n_prompts", "max_tokens", "reps", "threads", "gamma", "jobs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES_RUN]
    if bad or not args.modes:
        ap.error(f"--modes takes a comma-separated subset of target,sd,easd, got {','.join(bad) or 'nothing'}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.build_only:
        ensure_tools(args)
        return 0
    if args.draft is None and args.target is None:
        args.draft, args.target = default_pair()
        if args.draft is None:
            log("error: no --draft/--target given and the catalog default pair is not pulled "
                "(run `easd-local pull` or give --draft and --target)")
            return 2
    if args.draft is None or args.target is None:
        log("error: give both --draft and --target")
        return 2

    from easd_local.bench.datasets import load_dataset
    from easd_local.engine.config import DecodeConfig
    from easd_local.engine.pair import load_pair
    from easd_local.llamacpp.runtime import LoadOptions

    notes: list[str] = []
    needs_native = any(m in NATIVE for m in args.modes)
    tools = None if (args.ours_only or not needs_native) else ensure_tools(args)
    if tools is None:
        why = "--ours-only" if args.ours_only else ("tools not built" if needs_native else "--modes easd only")
        notes.append(f"llama.cpp half skipped ({why})")

    opts = LoadOptions(n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=0, flash_attn=args.flash_attn)
    problems = load_dataset("gsm8k", limit=args.n_prompts)
    cfg_base = DecodeConfig(mode="sd", max_tokens=args.max_tokens, temperature=0.0, gamma=args.gamma,
                            draft_p_min=0.0)
    runs: list[Run] = []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    log(f"pair: draft {args.draft}, target {args.target}"
        + (f"; load average {load:.2f}" if load is not None else ""))
    with tempfile.TemporaryDirectory(prefix="easd-bench-speed-") as tmp, load_pair(args.draft, args.target, opts) as models:
        # easd thresholds: the pair's profile if it has one (as generate would), else the defaults
        from easd_local.store.resolve import PairFiles, resolve_config

        spec = PairFiles(draft=Path(args.draft), target=Path(args.target), label="bench")
        cfg_base, source = resolve_config(cfg_base, spec, {})
        notes.append(f"easd thresholds: tau_draft={cfg_base.tau_draft:g} tau_target={cfg_base.tau_target:g} "
                     f"({source})")
        # llama.cpp's own tools skip the loader's self-test: where it turned repacking off (an AMX
        # CPU whose kernels crash, llama.cpp #20824) they are told so too, and both sides run the
        # same kernels
        args.no_repack = not (models.target.repack.extra_bufts and models.draft.repack.extra_bufts)
        if args.no_repack:
            notes.append("llama.cpp's tools run with --no-repack, as ours: "
                         + (models.target.repack.note or models.draft.repack.note))
        prompts: list[tuple[Path, list[int]]] = []
        for i, pb in enumerate(problems):
            text = models.target.vocab.apply_chat_template([{"role": "user", "content": pb.question}])
            f = Path(tmp) / f"prompt_{i:02d}.txt"
            f.write_text(text + "\n", encoding="utf-8")  # llama.cpp's -f drops one trailing newline
            prompts.append((f, models.target.vocab.tokenize(text, add_special=True, parse_special=True)))

        def ours(mode, i, rep):
            r = run_ours(models, prompts[i][1], mode, args, cfg_base)
            r.prompt, r.rep = i, rep
            return r

        def native(mode, i, rep):
            make_cmd, parse = NATIVE[mode]
            d = run_native(make_cmd(tools, args, prompts[i][0]), parse, args.timeout)
            if d.get("prompt_tokens") is not None and d["prompt_tokens"] != len(prompts[i][1]):
                notes.append(f"prompt {i}: llama.cpp tokenized {d['prompt_tokens']} tokens, ours "
                             f"{len(prompts[i][1])}")
            return Run(system="llama.cpp", mode=mode, prompt=i, rep=rep, tokens=d["tokens"],
                       seconds=d["seconds"], tokens_per_s=d["tokens_per_s"], prompt_tokens=d.get("prompt_tokens"),
                       drafted=d.get("n_drafted"), accepted=d.get("n_accept"),
                       acceptance_rate=d.get("acceptance_rate"), extra=d)

        plan = [("ours", "target"), ("llama.cpp", "target"), ("ours", "sd"), ("llama.cpp", "sd"), ("ours", "easd")]
        if tools is None:
            plan = [p for p in plan if p[0] == "ours"]
        plan = [p for p in plan if p[1] in args.modes]
        t_start = time.perf_counter()
        for rep in range(args.reps):
            order = plan if rep % 2 == 0 else list(reversed(plan))
            for i in range(len(prompts)):
                for system, mode in order:
                    r = (ours if system == "ours" else native)(mode, i, rep)
                    runs.append(r)
                    log(f"rep {rep + 1}/{args.reps} prompt {i + 1}/{len(prompts)} {system:9s} {mode:6s} "
                        f"{r.tokens:4d} tok {r.tokens_per_s:7.2f} tok/s"
                        + (f"  accept {100 * r.acceptance_rate:.0f}%" if r.acceptance_rate is not None else ""))
        wall = time.perf_counter() - t_start
    summary = summarize(runs)
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    meta = {"pair": f"{Path(args.draft).name} -> {Path(args.target).name}", "draft": str(args.draft),
            "target": str(args.target), "n_prompts": len(problems), "reps": args.reps,
            "max_tokens": args.max_tokens, "gamma": args.gamma, "threads": args.threads, "ctx": args.ctx,
            "flash_attn": args.flash_attn, "wall_s": wall, "load_start": load, "load_end": load_end,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "llama_cpp_python": llama_cpp_python_version(),
            "notes": sorted(set(notes), key=notes.index)}
    result = {"meta": meta, "summary": summary, "runs": [asdict(r) for r in runs]}
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(summary, meta)
        print(f"wall {wall / 60:.1f} min; load average {load:.2f} at start, {load_end:.2f} at end"
              if load is not None else f"wall {wall / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
