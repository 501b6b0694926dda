"""Decoding configuration: one flat, frozen dataclass validated once at the edge.

Flat on purpose: chat's ``/set KEY VALUE``, bench's ``--sweep`` and ``--easd-config``
and calibration profiles all address fields by name (``tau-target`` == ``tau_target``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..errors import ConfigError
from .gate import Gate
from .modes import MODE_TABLE, MODES, Mode, mode_info, needs_draft_model, spec_kinds  # noqa: F401

# Modes whose output is the target's own (greedy: the target's tokens; sampling: its law).
LOSSLESS_MODES = tuple(m for m in MODES if MODE_TABLE[m].lossless)
LOSSLESS_HELP = "sd and target give the target's own output; easd and easd-tf are not lossless, nor is draft (the draft model alone)."


def not_lossless(mode: str, lost: str | None = None) -> str | None:
    """Why ``mode``'s output is not the target's, or None when it is; ``lost``: what a recorded
    comparison on the pair found against this EASD mode (``cli.options.easd_loss``), said with it."""
    info = MODE_TABLE.get(mode)
    if info is not None and info.gated:
        return f"{mode} is not lossless: the EASD gate replaces some of the target's tokens" + (
            f"; {lost}" if lost else "")
    if info is not None and not info.needs_target:
        return "draft mode is the draft model alone, not the target"
    return None

# Thresholds used when a pair has no calibration profile (nats, untempered softmax).
# Why not a round 2.0: on the default pair the target's entropy has a 90th percentile of
# 0.63 nats and a maximum of 2.18 over 2,681 greedy GSM8K-train positions, so 2.0 would
# never fire and EASD would silently equal SD.
DEFAULT_TAU_DRAFT = 0.75
DEFAULT_TAU_TARGET = 0.6
# As in llama.cpp, seed -1 asks for a random seed (fresh entropy for every generation).
RANDOM_SEED = -1
# A temperature far outside this range is refused rather than decoded: the logits are float32,
# so dividing them by 1e-40 overflows into NaN probabilities (a failed request) and by 1e308
# into a numpy warning and a uniform draw. Within it every temperature means what it says.
MIN_TEMPERATURE = 1e-6
MAX_TEMPERATURE = 1e6


@dataclass(frozen=True)
class DecodeConfig:
    mode: str = "easd"
    max_tokens: int = 512
    # sampling (temperature 0 = greedy); p and q are both built with these transforms
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0  # RANDOM_SEED (-1): a fresh random seed per generation
    # speculative decoding
    gamma: int = 4  # the draft model's most tokens per verify (llama.cpp: --draft-max)
    draft_p_min: float = 0.0  # stop drafting when the draft's top probability falls below
    spec_type: str = "draft"  # the drafters, tried in order (modes.DRAFTER_TABLE; llama.cpp: --spec-type)
    draft_min: int = 0  # a proposal shorter than this is dropped (llama.cpp: --draft-min)
    # prompt lookup (ngram-simple): the text's last spec_ngram_size_n tokens or more must have
    # occurred before; then up to spec_ngram_size_m of the tokens that followed are proposed
    spec_ngram_size_n: int = 2
    spec_ngram_size_m: int = 16
    spec_ngram_mod_n_match: int = 4  # ngram-mod: the key's length in tokens
    # EASD gate: H(z_d) >= tau_draft and H(z_t) >= tau_target and overlap >= overlap
    top_n: int = 5
    overlap: float = 0.6
    tau_draft: float = DEFAULT_TAU_DRAFT
    tau_target: float = DEFAULT_TAU_TARGET
    penalty: float = 0.0  # lambda: the gated token's probability is multiplied by this

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def mode_info(self) -> Mode:
        return mode_info(self.mode)

    @property
    def needs_draft_model(self) -> bool:
        """This mode with these drafters loads the draft model."""
        return needs_draft_model(self.mode, self.spec_type)

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters this mode uses, in the order they are tried (none without one)."""
        info = self.mode_info
        if not info.needs_drafter:
            return ()
        return ("draft",) if info.needs_dists else spec_kinds(self.spec_type)

    @property
    def gate_enabled(self) -> bool:
        """The mode is gated and its thresholds can fire (``gate.Gate.can_fire``)."""
        return Gate.of(self).can_fire

    @property
    def lossless(self) -> bool:
        """The output follows the target's distribution (greedy: its tokens): a mode that runs
        the target, with no gate that can fire (EASD with its gate off is SD)."""
        return mode_info(self.mode).needs_target and not self.gate_enabled

    def validate(self, n_vocab: int | None = None) -> "DecodeConfig":
        """Raise ConfigError with one clear line for the first bad value; return self."""
        mode_info(self.mode)
        if self.max_tokens < 1:
            raise ConfigError(f"max-tokens must be >= 1, got {self.max_tokens}")
        if not (self.temperature >= 0.0) or math.isinf(self.temperature):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature != 0.0 and not MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE:
            raise ConfigError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE:g} and "
                              f"{MAX_TEMPERATURE:g}, got {self.temperature:g}")
        if self.top_k < 0:
            raise ConfigError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.seed < RANDOM_SEED:
            raise ConfigError(f"seed must be >= 0, or -1 for a random seed, got {self.seed}")
        if self.gamma < 1:
            raise ConfigError(f"gamma must be >= 1, got {self.gamma}")
        if not (0.0 <= self.draft_p_min <= 1.0):
            raise ConfigError(f"draft-p-min must be in [0, 1], got {self.draft_p_min}")
        spec_kinds(self.spec_type)  # known drafter names (easd and easd-tf always use the draft model)
        if self.draft_min < 0:
            raise ConfigError(f"draft-min must be >= 0, got {self.draft_min}")
        if self.spec_ngram_size_n < 1:
            raise ConfigError(f"spec-ngram-size-n must be >= 1, got {self.spec_ngram_size_n}")
        if self.spec_ngram_size_m < 1:
            raise ConfigError(f"spec-ngram-size-m must be >= 1, got {self.spec_ngram_size_m}")
        if self.spec_ngram_mod_n_match < 1:
            raise ConfigError(f"spec-ngram-mod-n-match must be >= 1, got {self.spec_ngram_mod_n_match}")
        if self.top_n < 1:
            raise ConfigError(f"top-n must be >= 1, got {self.top_n}")
        if n_vocab is not None and self.top_n > n_vocab:
            raise ConfigError(f"top-n must be at most the vocabulary size {n_vocab}, got {self.top_n}")
        if not (0.0 <= self.overlap <= 1.0):
            raise ConfigError(f"overlap must be in [0, 1], got {self.overlap}")
        if not (0.0 <= self.penalty <= 1.0):
            raise ConfigError(f"penalty (lambda) must be in [0, 1], got {self.penalty}")
        for name in ("tau_draft", "tau_target"):
            v = getattr(self, name)
            if math.isnan(v) or v < 0.0:
                raise ConfigError(f"{name.replace('_', '-')} must be >= 0 (inf = gate off), got {v}")
        return self

    def replace(self, **changes) -> "DecodeConfig":
        return dataclasses.replace(self, **changes).validate()


FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(DecodeConfig)}


def field_name(key: str) -> str:
    """'tau-target' / 'tau_target' -> 'tau_target'; ConfigError for unknown keys."""
    name = key.strip().replace("-", "_").lower()
    aliases = {"lambda": "penalty", "lam": "penalty", "temp": "temperature", "n": "top_n"}
    name = aliases.get(name, name)
    if name not in FIELD_TYPES:
        known = ", ".join(sorted(k.replace("_", "-") for k in FIELD_TYPES))
        raise ConfigError(f"unknown setting {key!r}; known: {known}")
    return name


def parse_value(name: str, text: str):
    """Parse a string value for field ``name`` (as typed in /set, --sweep, profiles)."""
    kind = FIELD_TYPES[name]
    text = text.strip()
    try:
        if kind in ("int", int):
            return int(text)
        if kind in ("float", float):
            return float(text)
    except ValueError:
        raise ConfigError(f"{name.replace('_', '-')} needs a number, got {text!r}") from None
    return text


def apply_settings(cfg: DecodeConfig, settings: dict[str, str]) -> DecodeConfig:
    """Apply {'tau-target': '0.8', ...} string settings and validate the result."""
    changes = {}
    for key, value in settings.items():
        name = field_name(key)
        changes[name] = parse_value(name, value)
    return cfg.replace(**changes)
