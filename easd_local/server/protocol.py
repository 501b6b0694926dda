"""OpenAI request bodies -> a validated ``ApiRequest``; every problem -> ``ApiError``.

Pure: no HTTP, no models. The standard fields of /v1/chat/completions and /v1/completions
are read with their OpenAI meaning; the extension fields (``mode``, ``gamma``, ``tau_draft``,
``tau_target``, ``top_n``, ``overlap``, ``penalty``, ``top_k``, ``draft_p_min``) override the
server's decoding defaults for one request; ``cache_prompt`` (llama-server's) false makes the
request evaluate its whole prompt instead of reusing a slot's cached prefix. Fields this server cannot honour (``n`` > 1,
tools, logprobs, a JSON response format, ``logit_bias``, non-zero ``frequency_penalty`` or
``presence_penalty``, ``best_of`` > 1, ``suffix``) are refused rather than silently ignored;
other unknown fields are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..engine.config import DecodeConfig
from ..engine.modes import resolve_way_label
from ..errors import ConfigError

MAX_STOP_STRINGS = 16
DEFAULT_MAX_BODY = 4 * 1024 * 1024  # bytes (serve --max-body)
DEFAULT_BODY_TIMEOUT_S = 600.0  # seconds a request body may stall (serve --timeout: llama-server's flag and default)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

# extension field -> (DecodeConfig field, kind)
EXTENSIONS = {
    "mode": ("mode", str),
    "gamma": ("gamma", int),
    "tau_draft": ("tau_draft", float),
    "tau_target": ("tau_target", float),
    "top_n": ("top_n", int),
    "overlap": ("overlap", float),
    "penalty": ("penalty", float),
    "top_k": ("top_k", int),
    "draft_p_min": ("draft_p_min", float),
    "spec_type": ("spec_type", str),  # the drafters (llama-server: --spec-type, a server flag there)
    "draft_min": ("draft_min", int),
}
STANDARD = {"temperature": ("temperature", float), "top_p": ("top_p", float), "seed": ("seed", int)}
NO_OP_VALUES = {"frequency_penalty": 0, "presence_penalty": 0, "best_of": 1}  # OpenAI's defaults
THRESHOLD_FIELDS = ("tau_draft", "tau_target", "top_n", "overlap", "penalty")
INT_LIMIT = 2**63  # integer fields are 64-bit (OpenAI's seed is); 1e308 would be a 309-digit int


class ApiError(Exception):
    """An error answered with the OpenAI error shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class ApiRequest:
    kind: str  # "chat" | "completion"
    model: str | None
    messages: tuple[dict, ...] = ()  # chat: [{"role", "content"}] with plain-text content
    prompt: str = ""  # completion
    overrides: dict = field(default_factory=dict)  # DecodeConfig field -> value, only those given
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    cache_prompt: bool = True  # llama-server's field: False evaluates the whole prompt afresh


# --------------------------------------------------------------------------- field readers
def _number(body: Mapping, name: str, kind: type) -> Any:
    """The value of ``name`` as ``kind`` (int or float), None when absent or null."""
    v = body.get(name)
    if v is None:
        return None
    if kind is str:
        if not isinstance(v, str):
            raise bad(f"'{name}' must be a string", name)
        return v
    if kind is float and isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
        return math.inf  # JSON has no infinity; "inf" turns the EASD gate off, as on the command line
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(f"'{name}' must be a number", name)
    if kind is int:
        if isinstance(v, float) and not v.is_integer():
            raise bad(f"'{name}' must be an integer", name)
        if not -INT_LIMIT <= v < INT_LIMIT:
            raise bad(f"'{name}' is out of range (a 64-bit integer), got {float(v):.3g}", name)
        return int(v)
    return float(v)


def _bool(body: Mapping, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be true or false", name)
    return v


def _content(value: Any, i: int) -> str:
    param = f"messages[{i}].content"
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad("only text content parts are supported ({'type': 'text', 'text': ...})", param)
            parts.append(part["text"])
        return "".join(parts)
    raise bad("message content must be a string or a list of text parts", param)


def _messages(body: Mapping) -> tuple[dict, ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", f"messages[{i}].role")
        out.append({"role": ROLES[role], "content": _content(m.get("content"), i)})
    return tuple(out)


def _prompt(body: Mapping) -> str:
    p = body.get("prompt")
    if p is None:
        raise bad("'prompt' is required" + (" (a chat request goes to /v1/chat/completions)" if "messages" in body
                                            else ""), "prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        raise bad("one prompt per request (a list of several prompts is not supported)", "prompt")
    if not isinstance(p, str):
        raise bad("'prompt' must be a string (token-id prompts are not supported)", "prompt")
    if not p:
        raise bad("'prompt' is empty", "prompt")
    return p


def _stop(body: Mapping) -> tuple[str, ...]:
    s = body.get("stop")
    if s is None:
        return ()
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or not all(isinstance(x, str) for x in s):
        raise bad("'stop' must be a string or a list of strings", "stop")
    if len(s) > MAX_STOP_STRINGS:
        raise bad(f"at most {MAX_STOP_STRINGS} stop strings", "stop")
    return tuple(x for x in s if x)


def _refuse_unsupported(body: Mapping) -> None:
    n = body.get("n")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise bad("'n' must be an integer", "n")
        if n != 1:
            raise bad(f"n={n} is not supported: this server returns one choice per request", "n")
    for name in ("tools", "functions"):
        if body.get(name):
            raise bad(f"'{name}' (function calling) is not supported", name)
    if body.get("logprobs") not in (None, False):
        raise bad("'logprobs' is not supported", "logprobs")
    if body.get("echo") not in (None, False):
        raise bad("'echo' is not supported", "echo")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad("only response_format {'type': 'text'} is supported", "response_format")
    # clients send these at their defaults with every request: only another value asks for
    # something this server would otherwise leave undone without a word
    for name, default in NO_OP_VALUES.items():
        v = body.get(name)
        if v is not None and v != default:
            raise bad(f"'{name}' is not supported (only {default!r} is accepted), got {v!r}", name)
    for name in ("logit_bias", "suffix"):
        if body.get(name):
            raise bad(f"'{name}' is not supported", name)


def parse_request(kind: str, body: Any) -> ApiRequest:
    """Validate a decoded JSON body of kind "chat" or "completion"."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    _refuse_unsupported(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("'model' must be a string", "model")
    overrides: dict = {}
    for name, (fld, typ) in {**STANDARD, **EXTENSIONS}.items():
        v = _number(body, name, typ)
        if v is not None:
            overrides[fld] = v
    if "mode" in overrides:
        _split_way_label(overrides)
    # max_completion_tokens is the newer name; it wins when both are given
    for name in ("max_tokens", "max_completion_tokens"):
        v = _number(body, name, int)
        if v is not None:
            if v < 1:
                raise bad(f"'{name}' must be >= 1, got {v}", name)
            overrides["max_tokens"] = v
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    stream = _bool(body, "stream")
    include_usage = _bool(opts or {}, "include_usage") if stream else False
    common = dict(model=model, overrides=overrides, stop=_stop(body), stream=stream, include_usage=include_usage,
                  cache_prompt=_bool(body, "cache_prompt", True))
    if kind == "chat":
        return ApiRequest(kind="chat", messages=_messages(body), **common)
    return ApiRequest(kind="completion", prompt=_prompt(body), **common)


def _split_way_label(overrides: dict) -> None:
    """``mode`` as the server's load line and /props name a way (``sd:ngram-simple``): its
    drafters become ``spec_type``."""
    try:
        mode, kinds = resolve_way_label(overrides["mode"], overrides.get("spec_type"))
    except ConfigError as e:
        raise bad(str(e), "mode", code="invalid_value") from None
    overrides["mode"] = mode
    if kinds is not None:
        overrides["spec_type"] = kinds


def request_config(base: DecodeConfig, source: str, overrides: Mapping[str, Any],
                   n_vocab: int | None = None) -> tuple[DecodeConfig, str]:
    """The decoding settings for one request: the server's defaults with the request's
    overrides, validated; and the thresholds' source ("request" when the request set any)."""
    try:
        cfg = base.replace(**overrides).validate(n_vocab)
    except ConfigError as e:
        raise bad(str(e), param_of(str(e), overrides), code="invalid_value") from None
    if any(k in overrides for k in THRESHOLD_FIELDS):
        source = "request"
    return cfg, source


def param_of(message: str, overrides: Mapping[str, Any]) -> str | None:
    """The request field a DecodeConfig message is about (its messages start with the
    dashed field name); None when it names none of the given fields."""
    head = message.split(" ", 1)[0]
    for fld in overrides:
        if head == fld.replace("_", "-"):
            return fld
    return None
