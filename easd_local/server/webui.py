"""The browser chat page of `serve` (GET /) and what it asks the server (GET /props).

The page is static files shipped in the package (server/webui/: HTML, CSS, two small scripts,
an icon, and KaTeX from npm with its fonts under webui/katex/ for the maths in finished
replies), read once when the app is made: no build step, no CDN, so it works offline. Its
script talks to the same OpenAI endpoints as any client and reads the ``easd_tokens``
stream extension (server/spans.py) to colour each token by origin. ``props`` is what
the page needs to know before the first request: the pair, the server's defaults with
their source, the modes the loaded models can run (from engine/modes.py's table) and the
token origins (engine/rules.py's list).
"""

from __future__ import annotations

from importlib import resources
from typing import Mapping

from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

from ..engine.config import DecodeConfig, not_lossless
from ..engine.decoding import ORIGINS, json_number
from ..engine.modes import MODE_TABLE, MODES, needs_draft_model
from ..engine.pair import Pair

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".woff2": "font/woff2"}


def _served(folder, prefix: str = "") -> dict[str, str]:
    """Every file of ``folder`` (and its sub-folders) the page may ask for, by path: its media type."""
    out = {}
    for entry in folder.iterdir():
        if entry.is_dir():
            out.update(_served(entry, f"{prefix}{entry.name}/"))
        elif any(entry.name.endswith(ext) for ext in TYPES):
            out[prefix + entry.name] = next(t for ext, t in TYPES.items() if entry.name.endswith(ext))
    return out


FILES = _served(resources.files(__package__).joinpath("webui"))
# the page needs nothing from elsewhere: anything else it tried to load would be refused
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
}


def read_files() -> dict[str, bytes]:
    folder = resources.files(__package__).joinpath("webui")
    return {name: folder.joinpath(name).read_bytes() for name in FILES}


def page_routes() -> list[Route]:
    """GET / (the page) and GET /webui/{name} (its scripts, style sheets, icon and fonts)."""
    files = read_files()

    def send(name: str) -> Response:
        return Response(files[name], media_type=FILES[name], headers=HEADERS)

    async def index(request: HttpRequest) -> Response:
        return send("index.html")

    async def asset(request: HttpRequest) -> Response:
        name = request.path_params["name"]
        if name not in files or name == "index.html":
            raise HTTPException(404, "Not Found")
        return send(name)

    return [Route("/", index, methods=["GET"]), Route("/webui/{name:path}", asset, methods=["GET"])]


def props(model_name: str, base: DecodeConfig, thresholds_source: str, pair: Pair, webui: bool,
          draft_loadable: bool = False, losses: Mapping[str, str] | None = None) -> dict:
    """The server's settings as the page (or any client) needs them, in requests' terms
    (``losses``: an EASD mode's recorded loss on this pair, said in its note)."""
    modes = []
    for name in MODES:
        m = MODE_TABLE[name]
        no_draft = pair.draft is None and not draft_loadable  # else loaded by the first request that needs it
        if (needs_draft_model(name, base.spec_type) and no_draft) or (m.needs_target and pair.target is None):
            continue  # this server did not load the model the mode needs
        note = not_lossless(name, (losses or {}).get(name)) or "lossless: the output is the target's own"
        modes.append({"name": name, "lossless": m.lossless, "gated": m.gated, "speculative": m.speculative,
                      "note": note})
    defaults = {
        "mode": base.mode, "max_tokens": base.max_tokens, "temperature": base.temperature, "top_k": base.top_k,
        "top_p": base.top_p, "gamma": base.gamma, "tau_draft": json_number(base.tau_draft),
        "tau_target": json_number(base.tau_target), "top_n": base.top_n, "overlap": base.overlap,
        "penalty": base.penalty, "lossless": base.lossless, "thresholds_source": thresholds_source,
        "spec_type": base.spec_type,
    }
    return {"model": model_name, "defaults": defaults, "modes": modes, "origins": list(ORIGINS),
            "n_vocab": pair.n_vocab, "webui": webui}
