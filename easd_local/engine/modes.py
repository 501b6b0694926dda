"""The decoding modes and what each one is: the one table every other module reads.

A place that needs to know whether a mode drafts, needs a draft model or has the EASD
gate asks ``MODE_TABLE[name]`` (or ``DecodeConfig.mode_info``) instead of comparing mode
strings, so adding a mode means adding a row here (and its step in ``steps``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Mode:
    name: str
    needs_target: bool
    # needs the draft model whatever the drafter: draft mode emits its tokens, EASD's gate reads
    # its distributions (easd-tf consults it). sd needs it only with the model drafter
    # (``needs_draft_model``)
    needs_draft: bool
    speculative: bool  # drafts tokens and verifies them on the target in one batch
    gated: bool  # has the EASD entropy gate (effective only while the gate's thresholds are finite)
    # the output follows the target's distribution (greedy: the target's tokens); a gated
    # mode is lossless only with its gate off
    lossless: bool

    @property
    def needs_drafter(self) -> bool:
        """Proposals or a second opinion come from a drafter (``drafters``): sd, easd, easd-tf."""
        return self.speculative or self.target_first

    @property
    def needs_dists(self) -> bool:
        """The drafter must give the draft's distributions, not only tokens: EASD's gate reads
        them. Greedy or sampled SD takes a drafter without them (a proposal is then a point
        mass, which keeps SD lossless: ``rules.verify``)."""
        return self.gated

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
        Mode("sd", needs_target=True, needs_draft=False, speculative=True, gated=False, lossless=True),
        Mode("easd", needs_target=True, needs_draft=True, speculative=True, gated=True, lossless=False),
        Mode("easd-tf", needs_target=True, needs_draft=True, speculative=False, gated=True, lossless=False),
    )
}
MODES = tuple(MODE_TABLE)


@dataclass(frozen=True)
class DrafterKind:
    """One way to draft (``--spec-type``, llama.cpp's names): what it needs and gives."""

    name: str
    uses_model: bool  # drafts with the draft model (loaded only when a chosen way uses it)
    has_dists: bool  # proposals come with the draft's distributions (EASD's gate can read them)
    learns: bool  # keeps what it saw across requests and slots
    summary: str


DRAFTER_TABLE: dict[str, DrafterKind] = {
    k.name: k
    for k in (
        DrafterKind("draft", uses_model=True, has_dists=True, learns=False,
                    summary="the draft model proposes up to --draft-max tokens"),
        DrafterKind("ngram-simple", uses_model=False, has_dists=False, learns=False,
                    summary="prompt lookup: the tokens that followed the last earlier match of the text's end"),
        DrafterKind("ngram-mod", uses_model=False, has_dists=False, learns=True,
                    summary="an n-gram table shared by every slot and kept across requests"),
    )
}
DRAFTER_KINDS = tuple(DRAFTER_TABLE)


def spec_kinds(spec_type: str) -> tuple[str, ...]:
    """``--spec-type``'s comma-separated drafters, in the order they are tried (a lookup before
    the draft model, as llama.cpp: the first that proposes something drafts the block)."""
    kinds = tuple(k.strip() for k in spec_type.split(",") if k.strip())
    if not kinds:
        raise ConfigError("spec-type must name at least one drafter: " + ", ".join(DRAFTER_KINDS))
    for k in kinds:
        if k not in DRAFTER_TABLE:
            raise ConfigError(f"spec-type: unknown drafter {k!r}; known: {', '.join(DRAFTER_KINDS)}")
    if len(set(kinds)) != len(kinds):
        raise ConfigError(f"spec-type names a drafter twice: {spec_type!r}")
    return kinds


def way_label(mode: str, drafters: tuple[str, ...]) -> str:
    """A mode with its drafters as the tool names it (bench's --modes, ``ways``, the banner):
    ``sd:ngram-simple``, ``sd:ngram-simple+draft``; ``sd`` alone drafts with the draft model."""
    if not drafters or drafters == ("draft",):
        return mode
    return f"{mode}:{'+'.join(drafters)}"


def parse_way_label(text: str) -> tuple[str, str | None]:
    """``way_label``'s inverse, as a user types it after seeing it (any case; drafters joined
    by '+' or ','): ``"sd:ngram-simple"`` -> ("sd", "ngram-simple"), ``"EASD"`` -> ("easd",
    None). The mode is checked where every mode is (``DecodeConfig``), the drafters here."""
    mode, sep, kinds = text.strip().lower().partition(":")
    if not sep:
        return mode, None
    return mode, ",".join(spec_kinds(kinds.replace("+", ",")))


def resolve_way_label(text: str, spec_type: str | None) -> tuple[str, str | None]:
    """(mode, drafters) of a mode given as ``text`` (``parse_way_label``) beside a separately
    given ``spec_type`` (None: not given): a label's drafters stand for it, and a label and a
    spec_type that name different drafters are one ConfigError."""
    mode, kinds = parse_way_label(text)
    if kinds is None:
        return mode, spec_type
    if spec_type is not None and spec_kinds(spec_type) != spec_kinds(kinds):
        raise ConfigError(f"mode {text!r} drafts with {kinds}, spec-type {spec_type!r} with others: give one")
    return mode, kinds


def needs_draft_model(mode: str, spec_type: str) -> bool:
    """Whether decoding ``mode`` with drafters ``spec_type`` loads the draft model."""
    info = mode_info(mode)
    if info.needs_draft:  # easd and easd-tf draft with the draft model whatever spec_type says
        return True
    return info.needs_drafter and any(DRAFTER_TABLE[k].uses_model for k in spec_kinds(spec_type))


def mode_info(name: str) -> Mode:
    """The row of mode ``name``; ConfigError with the known modes otherwise."""
    try:
        return MODE_TABLE[name]
    except KeyError:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {name!r}") from None


def models_needed(modes, spec_type: str = "draft") -> tuple[bool, bool]:
    """(needs the draft model, needs a target) for running all of ``modes`` (each a mode name,
    or a (mode, spec type) pair) with drafters ``spec_type``."""
    pairs = [m if isinstance(m, tuple) else (m, spec_type) for m in modes]
    return (any(needs_draft_model(m, st) for m, st in pairs),
            any(mode_info(m).needs_target for m, _ in pairs))
