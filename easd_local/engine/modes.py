"""The decoding modes and what each one is: the one table every other module reads.

A place that needs to know whether a mode drafts, needs a draft model or has the EASD
gate asks ``MODE_TABLE[name]`` (or ``DecodeConfig.mode_info``) instead of comparing mode
strings, so adding a mode means adding a row here (and its step in ``steps``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..errors import ConfigError


class Loss(Protocol):
    """What ``auto_mode`` reads of a recorded verdict (``verdict.Verdict``, which reads this
    module's table) that shows an EASD mode losing."""

    method: str

    def summary(self) -> str: ...


@dataclass(frozen=True)
class Mode:
    name: str
    needs_target: bool
    needs_draft: bool
    speculative: bool  # drafts gamma tokens and verifies them on the target in one batch
    gated: bool  # has the EASD entropy gate (effective only while the gate's thresholds are finite)
    # the output follows the target's distribution (greedy: the target's tokens); a gated
    # mode is lossless only with its gate off
    lossless: bool

    @property
    def target_first(self) -> bool:
        """The target picks every token and consults the draft only where the gate may
        fire (easd-tf): draft consults are this mode's figure."""
        return self.gated and not self.speculative

    @property
    def decider(self) -> str:
        """The model whose choice each token is: "target", or "draft" in draft-only mode."""
        return "target" if self.needs_target else "draft"


MODE_TABLE: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("target", needs_target=True, needs_draft=False, speculative=False, gated=False, lossless=True),
        Mode("draft", needs_target=False, needs_draft=True, speculative=False, gated=False, lossless=False),
        Mode("sd", needs_target=True, needs_draft=True, speculative=True, gated=False, lossless=True),
        Mode("easd", needs_target=True, needs_draft=True, speculative=True, gated=True, lossless=False),
        Mode("easd-tf", needs_target=True, needs_draft=True, speculative=False, gated=True, lossless=False),
    )
}
MODES = tuple(MODE_TABLE)


def mode_info(name: str) -> Mode:
    """The row of mode ``name``; ConfigError with the known modes otherwise."""
    try:
        return MODE_TABLE[name]
    except KeyError:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {name!r}") from None


def models_needed(modes) -> tuple[bool, bool]:
    """(needs a draft, needs a target) for running all of ``modes``."""
    rows = [mode_info(m) for m in modes]
    return any(r.needs_draft for r in rows), any(r.needs_target for r in rows)


MEASURE_HINT = ("no measurement of EASD on this pair yet: `easd-local bench --modes target,easd-tf ...` then "
                "`easd-local bench report RESULTS --record-verdict`")


def auto_mode(gpu_offload: bool, n_gpu_layers: int, have_draft: bool, losing: Loss | None = None,
              measured: bool = False) -> tuple[str, str]:
    """The mode chat, generate and serve pick when none is given, and why (shown in chat's
    banner, serve's load line and generate's note).

    EASD is not lossless, so a pair whose recorded verdict (``losing``) shows an EASD mode
    significantly worse than a lossless one gets the faster lossless mode: the target alone
    on a CPU, SD with layers on a GPU. Otherwise: on a CPU a verify batch of gamma+1 tokens
    costs several one-token decodes, so SD and EASD built on it run slower than the target
    alone there (scripts/bench_modes.py); target-first EASD keeps EASD's gate at close to the
    target's speed. With layers on a GPU, batched verification is nearly free and the SD
    path is the fast one. ``measured``: the pair has verdicts (none of them a loss)."""
    on_gpu = gpu_offload and n_gpu_layers != 0
    if not have_draft:
        return "target", "only a target was given"
    if losing is not None:
        mode = "sd" if on_gpu else "target"
        return mode, f"{losing.summary()}; --mode {losing.method} to use it"
    hint = "" if measured else f"; {MEASURE_HINT}"
    if on_gpu:
        return "easd", "GPU offload: EASD on speculative decoding" + hint
    return "easd-tf", "CPU-only: target-first EASD is the faster path here (/mode easd for the SD path)" + hint
