"""Rendering shared by generate, chat and bench: the status line and origin colours."""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator

from ..engine.decoding import BONUS, DRAFT, EASD, RESAMPLED, TRACE_NAMES, Stats, TokenEvent, acceptance_text
from ..engine.events import LOOKUP
from ..jsonsafe import json_number
from ..engine.modes import mode_info
from ..errors import EasdError
from ..llamacpp.devices import backends, system_info
from ..units import human_size
from .once import first_time

# the target's own choices (target mode, easd-tf) and draft mode's tokens stay plain
ORIGIN_STYLE = {DRAFT: "green", RESAMPLED: "yellow", EASD: "bold magenta", BONUS: "cyan", LOOKUP: "blue"}
LEGEND = (
    "[green]draft-accepted[/]  [blue]lookup-accepted[/]  [yellow]target-resampled[/]  "
    "[bold magenta]EASD-resampled[/]  [cyan]bonus[/]  target"
)


class OutputError(EasdError):
    """Standard output cannot be written (a full disk behind ``>``, a closed descriptor): the
    reply cannot reach the user, so the command ends rather than decode on unseen."""


@contextmanager
def stdout_guard() -> Iterator[None]:
    """Turn a failed write to standard output inside the block into ``OutputError``. A closed
    pipe (``| head``) stays a BrokenPipeError, which ends the command quietly (``friendly``)."""
    try:
        if sys.stdout is None:  # started with stdout closed (``>&-``)
            raise OSError(0, "it is closed")
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        # the failed text stays in the stream's buffer, and the flush at exit would
        # report it again as "Exception ignored"
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        raise OutputError(f"cannot write to standard output: {e.strerror or e}") from None


def status_line(s: Stats, where: str = "", busy: str = "") -> str:
    parts = [f"{s.mode}", f"{s.tokens} tokens", f"{s.tokens_per_s:.1f} tok/s", f"ttft {s.ttft_s:.2f}s"]
    info = mode_info(s.mode)
    if info.speculative:
        parts.append(acceptance_text(s.drafted, s.drafts_emitted, s.mean_accepted_len))
    if info.gated:
        parts.append(f"EASD fires {s.easd_fires}")
        if info.target_first:
            parts.append(f"draft consulted {s.draft_consults}")
        parts.append(f"τd={s.tau_draft:g} τt={s.tau_target:g} from {s.thresholds_source}")
    if s.stop_reason and s.stop_reason != "eos":
        parts.append(f"stop: {s.stop_reason}")
    if where:
        parts.append(where)
    if busy:  # last, where the eye lands after a slow reply
        parts.append(busy)
    return " · ".join(parts)


def _num(x):
    return json_number(round(x, 5) if isinstance(x, float) and math.isfinite(x) else x)


def trace_rows(events: Iterable[TokenEvent]) -> Iterable[dict]:
    for i, ev in enumerate(events):
        yield {
            "i": i,
            "token": ev.token,
            "text": ev.text,
            "origin": TRACE_NAMES.get(ev.origin, ev.origin),
            "h_draft": _num(ev.h_draft),
            "h_target": _num(ev.h_target),
            "overlap": _num(ev.overlap),
        }


def backend() -> str:
    """The build's compute backend as users name it: CUDA, Metal, Vulkan... or CPU."""
    return "+".join(b for b in backends(system_info()) if b != "CPU") or "CPU"


def _on_gpu(device: str) -> bool:
    return not device.upper().startswith("CPU")


def placement(models) -> dict:
    """Backend and, per loaded model, its layers by device and its memory (for --json and
    `models check --json`); sizes in bytes."""
    out: dict = {"backend": backend()}
    for role in ("target", "draft"):
        m = getattr(models, role, None)
        if m is None:
            continue
        layers = dict(getattr(m, "placement", None) or {})
        mem = getattr(m, "memory", None)
        out[role] = {
            "layers": layers,
            "layers_total": sum(layers.values()),
            "layers_gpu": sum(n for dev, n in layers.items() if _on_gpu(dev)),
            "model_bytes": mem.model_bytes if mem else None,
            "kv_bytes": mem.kv_bytes if mem else None,
            "compute_bytes": mem.compute_bytes if mem else None,
            "repack": m.repack.to_dict() if getattr(m, "repack", None) else None,
        }
    out["repack_note"] = repack_note(models) or None
    return out


def repack_note(models) -> str:
    """'weight repacking off: ...' when a loaded model runs without llama.cpp's repacked
    weights, naming which when only one of the loaded two does; empty otherwise."""
    notes = {}
    loaded = 0
    for role in ("target", "draft"):
        rp = getattr(getattr(models, role, None), "repack", None)
        loaded += rp is not None
        if rp is not None and rp.note:
            notes.setdefault(rp.note, []).append(role)
    if loaded > 1 and len(notes) == 1 and sum(len(r) for r in notes.values()) == 1:
        (note, (role,)), = notes.items()
        return f"{role}: {note}"
    return " · ".join(notes)


def repack_news(models, always: bool = False) -> bool:
    """Whether to show the repacking note now: ``always`` (doctor, ``models check --load``,
    --verbose), else only the first time these models load on this machine with that note."""
    note = repack_note(models)
    if not note or always:
        return bool(note)
    names = sorted(m.path.name for m in (getattr(models, r, None) for r in ("target", "draft"))
                   if m is not None and getattr(m, "path", None) is not None)
    return first_time(f"{note} · {' '.join(names)}")


def _layers(r: dict) -> str:
    """One model's layers by device, e.g. ``CPU 20/28 + CUDA0 8/28``."""
    total = r["layers_total"]
    return " + ".join(f"{dev} {n}/{total}" for dev, n in r["layers"].items()) or "layers unknown"


def placement_line(models, form: str = "banner", repack: bool = True) -> str:
    """Where each model's layers live and its memory, rendered from ``placement``: the one
    rendering, in three forms.

    - ``banner`` (chat, serve): one line: backend, each model's layers by device, its memory;
    - ``status`` (generate's status line): only what is unusual, layers off the local CPU
      (``layers: target RPC0 (10.0.0.2:50052) 25/25 · draft CPU 25/25``) and weights not
      repacked; empty when there is nothing to say;
    - ``check`` (``models check --load``): the backend and memory, then one line per model's
      layers (``target layers: 20/28 on CPU, 8/28 on CUDA0``).

    The repacking note, when there is one and ``repack`` asks for it (``repack_news``), ends
    every form."""
    p = placement(models)
    roles = [r for r in ("target", "draft") if p.get(r)]
    note = [p["repack_note"]] if repack and p.get("repack_note") else []
    if form == "status":
        roles = [r for r in roles if p[r]["layers"]]
        off_cpu = {dev for r in roles for dev in p[r]["layers"]} - {"CPU"}
        return " · ".join((["layers: " + " · ".join(f"{r} {_layers(p[r])}" for r in roles)] if off_cpu else []) + note)
    mem = {r: f"model {human_size(p[r]['model_bytes'])}, KV {human_size(p[r]['kv_bytes'])}"
           if p[r]["model_bytes"] is not None else "" for r in roles}
    if form == "banner":
        parts = [f"{r} layers {_layers(p[r])}" + (f", {mem[r]}" if mem[r] else "") for r in roles]
        return " · ".join([f"backend {p['backend']}", *parts, *note])
    lines = [" · ".join([f"backend {p['backend']}", *(f"{r}: {mem[r]}" for r in roles if mem[r])])]
    for r in roles:
        total = p[r]["layers_total"]
        lines.append(f"{r} layers: " + (", ".join(f"{n}/{total} on {dev}" for dev, n in p[r]["layers"].items())
                                        or "unknown"))
    return "\n".join(lines + note)


def run_settings(cfg, spec) -> dict:
    """What a --json reader needs to repeat the run beyond the Stats' own settings."""
    return {"top_k": cfg.top_k, "top_p": cfg.top_p, "seed": cfg.seed, "max_tokens": cfg.max_tokens,
            "draft_p_min": cfg.draft_p_min, "spec_type": cfg.spec_type,
            "draft_path": str(spec.draft) if spec.draft is not None else None,
            "target_path": str(spec.target) if spec.target is not None else None}
