"""The lossless ways to decode a pair and which one is the default: the fastest of them as
measured on this machine (``easd-local pair costs``), never a guess and never EASD (not
lossless; the project's own study found it worse on the default pair). Pure: the
measurements come in, a choice and its reason go out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .modes import DRAFTER_TABLE, needs_draft_model, spec_kinds


@dataclass(frozen=True)
class Way:
    name: str  # as bench's --modes names it
    mode: str
    spec_type: str
    words: str  # for a reason line

    @property
    def uses_draft_model(self) -> bool:
        return needs_draft_model(self.mode, self.spec_type)

    @property
    def learns(self) -> bool:
        return any(DRAFTER_TABLE[k].learns for k in spec_kinds(self.spec_type))


WAYS: tuple[Way, ...] = (
    Way("target", "target", "draft", "the target alone"),
    Way("sd:ngram-simple", "sd", "ngram-simple", "sd with prompt lookup"),
    Way("sd", "sd", "draft", "sd with the draft model"),
    Way("sd:ngram-simple+draft", "sd", "ngram-simple,draft", "sd with prompt lookup, else the draft model"),
)
WAY_TABLE = {w.name: w for w in WAYS}
TARGET = WAYS[0]
# a way must beat the simpler one by this much to be chosen over it: measured speeds on a
# shared machine move by a few percent from run to run
MARGIN = 0.03
MEASURE_HINT = "`easd-local pair costs` measures the lossless ways on this machine once (about 3 minutes)"


def choose(ratios: Mapping[str, float] | None, have_draft: bool, on_gpu: bool = False) -> tuple[Way, str]:
    """The default way and why. ``ratios``: each measured way's decode speed over the target
    alone's on this machine (None: none recorded). Without a measurement: the target alone
    on a CPU (what plain llama.cpp does), sd with the draft model with layers on a GPU (a
    verify batch there costs about one decode)."""
    if not ratios:
        if on_gpu and have_draft:
            return WAY_TABLE["sd"], f"GPU offload, no speeds measured on this machine: {MEASURE_HINT}"
        return TARGET, f"no speeds measured on this machine: {MEASURE_HINT}"
    best, best_r = TARGET, 1.0
    for w in WAYS[1:]:  # in order of what they cost to load: a later way must beat an earlier one by MARGIN
        r = ratios.get(w.name)
        if r is None or (w.uses_draft_model and not have_draft):
            continue
        if r > best_r * (1 + MARGIN):
            best, best_r = w, r
    others = ", ".join(f"{w.name} {ratios[w.name]:.2f}×" for w in WAYS[1:] if w is not best and w.name in ratios)
    if best is TARGET:
        return best, f"no lossless way beat the target alone on this machine ({others})"
    return best, f"{best.words}: {best_r:.2f}× the target alone on this machine" + (f" ({others})" if others else "")


@dataclass(frozen=True)
class Choice:
    """The mode and drafters ``chat``, ``generate`` and ``serve`` use when no --mode is given,
    and the one line that says why (banner, generate's note, serve's load line, --json)."""

    mode: str
    spec_type: str
    why: str
    way: str = ""  # its name in ``WAYS`` (as bench's --modes names it)


def auto_mode(on_gpu: bool, have_draft: bool, measured: Mapping[str, Any] | None = None) -> Choice:
    """``choose`` as a Choice (EASD is never the default: it is not lossless; ``--mode easd``
    or ``easd-tf`` asks for it by name). ``measured``: what `easd-local pair costs` recorded
    for the pair here (``store.costs.find``), or None; its date is said in the reason: a
    machine's speeds drift (a VM's with its host), and an old measurement is one to renew."""
    ratios = measured.get("ratios") if measured else None
    way, why = choose(ratios, have_draft, on_gpu)
    if ratios and measured.get("date"):
        why = f"{why}, measured {measured['date']}"
    return Choice(way.mode, way.spec_type, why, way.name)
