"""User-facing errors.

Every failure a user can cause (bad file, bad pair, bad parameter, prompt too long,
failed download) is raised as an ``EasdError`` whose message is one complete line.
The CLI prints that line and exits with ``exit_code``; nothing else is shown.
"""

from __future__ import annotations


class EasdError(Exception):
    """A problem the user can act on; ``str(err)`` is the whole message."""

    exit_code = 2


class ModelLoadError(EasdError):
    """A model file is missing, not GGUF, truncated, or llama.cpp refused it."""


class PairError(EasdError):
    """Draft and target cannot be used together (different vocabularies...)."""


class ConfigError(EasdError):
    """A parameter value is out of range; raised before any model loads."""


class ChatTemplateError(ConfigError):
    """A model's chat template is missing, does not compile or fails to render; the
    message says which, and each command adds what the user can do about it."""


class ContextOverflowError(EasdError):
    """The prompt (or a chat message) does not fit in the context window."""


class InvalidTextError(ConfigError):
    """Text (a prompt, a chat line, a dataset question) that is not valid Unicode: bytes
    that are not UTF-8, or lone surrogates from a JSON escape."""


class RuntimeFailure(EasdError):
    """llama.cpp failed mid-run (decode error, KV rollback refused)."""


class NonFiniteLogitsError(RuntimeFailure):
    """A model produced NaN or infinite logits (corrupt weights, a broken quantization):
    nothing sampled from them would mean anything."""


class PullError(EasdError):
    """A model could not be fetched or failed verification."""


class RpcError(EasdError):
    """An RPC server cannot be used: no RPC backend, unreachable, wrong version, or lost."""
