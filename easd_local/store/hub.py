"""``hf:ORG/REPO[:QUANT]`` and ``hf:ORG/REPO/FILE`` (llama.cpp's ``-hf`` meaning) -> a
catalog entry carrying the hub's own size and sha256, so that ``pull.pull_model`` writes
it with the same atomic, verified write as the built-in models.

Needs ``huggingface_hub`` and a hub that answers (``$HF_ENDPOINT``, default
huggingface.co). Nothing here prints.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from .catalog import ModelEntry
from ..errors import ConfigError, PullError

PREFIX = "hf:"
DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's -hf default
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class HubRef:
    repo: str  # ORG/REPO
    quant: str | None = None  # e.g. Q8_0 (hf:ORG/REPO:Q8_0)
    filename: str | None = None  # a file in the repo (hf:ORG/REPO/FILE)

    def __str__(self) -> str:
        if self.filename:
            return f"{PREFIX}{self.repo}/{self.filename}"
        return f"{PREFIX}{self.repo}" + (f":{self.quant}" if self.quant else "")


def is_hub_ref(text: str) -> bool:
    return text.startswith(PREFIX)


def parse_hub_ref(text: str) -> HubRef:
    """'hf:Org/Repo-GGUF:Q8_0' -> HubRef('Org/Repo-GGUF', 'Q8_0'); 'hf:Org/Repo/x.gguf' -> a file."""
    body = text[len(PREFIX):] if is_hub_ref(text) else text
    parts = body.split("/")
    usage = "expected hf:ORG/REPO, hf:ORG/REPO:QUANT or hf:ORG/REPO/FILE.gguf"
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ConfigError(f"{text!r}: {usage}")
    if len(parts) > 2:
        filename = "/".join(parts[2:])
        if not filename or ":" in parts[1]:
            raise ConfigError(f"{text!r}: {usage}")
        return HubRef(f"{parts[0]}/{parts[1]}", filename=filename)
    name, _, quant = parts[1].partition(":")
    if not name:
        raise ConfigError(f"{text!r}: {usage}")
    return HubRef(f"{parts[0]}/{name}", quant=quant or None)


def _quant_of(filename: str) -> str:
    stem = PurePosixPath(filename).name[: -len(".gguf")]
    return re.split(r"[-.]", stem)[-1].upper() if stem else ""


def pick_file(ref: HubRef, files: list[str]) -> str:
    """The GGUF file ``ref`` means among the repo's ``files``, as llama.cpp's -hf picks it:
    the named file; else the file of the quantization (case-insensitive; default Q4_K_M,
    falling back to the first GGUF when the repo has no Q4_K_M and none was asked for)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if ref.filename:
        if ref.filename not in files:
            raise PullError(f"{ref.repo} has no file {ref.filename}; its GGUF files: {', '.join(ggufs) or 'none'}")
        chosen = ref.filename
    else:
        if not ggufs:
            raise PullError(f"{ref.repo} has no GGUF file")
        quant = (ref.quant or DEFAULT_QUANT).upper()
        pat = re.compile(rf"(^|[-._/]){re.escape(quant)}([-._]|$)")
        matches = [f for f in ggufs if pat.search(f.upper())]
        if not matches and ref.quant:
            have = sorted({_quant_of(f) for f in ggufs})
            raise PullError(f"{ref.repo} has no {quant} file; quantizations there: {', '.join(have)}")
        if not matches:
            matches = ggufs[:1]
        if len(matches) > 1 and not all(_SPLIT.search(f) for f in matches):
            raise PullError(f"several {quant} files in {ref.repo} ({', '.join(matches)}); "
                            f"name one: hf:{ref.repo}/FILE")
        chosen = matches[0]
    if _SPLIT.search(chosen):
        raise PullError(f"{ref.repo}/{chosen} is one part of a split GGUF; split files are not supported yet")
    return chosen


def _api():
    import huggingface_hub

    return huggingface_hub.HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)


def hub_entry(ref: HubRef, name: str | None = None) -> ModelEntry:
    """Ask the hub for the file ``ref`` means, with its size and sha256; the entry's source
    is pinned to the commit the hub answered with."""
    from .pull import _hub_unavailable_reason

    reason = _hub_unavailable_reason(ref.repo)
    if reason:
        raise PullError(f"cannot pull {ref}: the hub is not usable ({reason})")
    try:
        info = _api().model_info(ref.repo, files_metadata=True, timeout=30)
    except Exception as e:  # noqa: BLE001 - HTTP errors, timeouts, bad JSON: one line
        status = getattr(getattr(e, "response", None), "status_code", None)
        why = f"HTTP {status}" if status else (str(e).splitlines() or [type(e).__name__])[0]
        raise PullError(f"cannot pull {ref}: the hub did not list {ref.repo} ({why})") from None
    siblings = {s.rfilename: s for s in (info.siblings or [])}
    chosen = pick_file(ref, list(siblings))
    lfs = siblings[chosen].lfs
    sha = getattr(lfs, "sha256", None) if lfs is not None else None
    size = getattr(lfs, "size", None) if lfs is not None else None
    if not sha or not size:
        raise PullError(f"{ref.repo}/{chosen}: the hub publishes no sha256 for it (not an LFS file), so it "
                        "cannot be verified")
    file = PurePosixPath(chosen).name
    source = {"kind": "hf", "repo": ref.repo, "filename": chosen}
    if info.sha:
        source["revision"] = info.sha  # the commit listed: the bytes the sha256 above describes
    return ModelEntry(
        name=name or PurePosixPath(chosen).stem.lower(),
        file=file,
        size=int(size),
        sha256=str(sha).lower(),
        description=f"{ref.repo}/{chosen} (Hugging Face)",
        sources=(source,),
    )
