"""A real headless Chromium driven by Selenium, for the chat page's tests (and the README's
screenshot, scripts/webui_screenshot.py).

The browser is the system's (Debian's ``chromium`` and ``chromium-driver``: ``.ci/run`` installs
them where it can, through scripts/install_browser.py); nothing is downloaded. ``find_browser``
says why not when there is none, so that the tests skip with that reason.
"""

from __future__ import annotations

import json
import os
import shutil

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver",)


def _first(env: str, names: tuple[str, ...]) -> str | None:
    given = os.environ.get(env)
    if given:
        return given if os.path.isfile(given) else None
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    return None


def find_browser() -> tuple[str | None, str | None, str]:
    """(browser, driver, why not): paths of a Chromium and its chromedriver, or a reason."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None, None, "selenium is not installed (pip install -e '.[test]')"
    browser = _first("EASD_LOCAL_CHROMIUM", BROWSERS)
    driver = _first("EASD_LOCAL_CHROMEDRIVER", DRIVERS)
    if browser is None or driver is None:
        missing = " and ".join(n for n, p in (("chromium", browser), ("chromedriver", driver)) if p is None)
        return browser, driver, (f"no {missing} found (apt-get install chromium chromium-driver, "
                                 "or python scripts/install_browser.py)")
    return browser, driver, ""


def chrome(browser: str, driver: str, width: int = 1280, height: int = 900):
    """A headless Chromium of this window size; its console log is kept (``get_log``).

    Both processes die with this one, however it ends (issue 45): chromedriver is tied to it,
    and Chromium, which chromedriver starts, is tied to chromedriver by ``tied_browser``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from easd_local.lifeline import preexec

    opts = webdriver.ChromeOptions()
    opts.binary_location = tied_browser(browser)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-extensions", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(driver, popen_kw={"preexec_fn": preexec()}))


_TIE = """#!{python}
# Chromium, tied to the chromedriver that starts it: a killed test run leaves no browser
import os, sys
sys.path.insert(0, {root!r})
from easd_local.lifeline import die_with_parent
die_with_parent(os.getppid())
os.execv({browser!r}, [{browser!r}, *sys.argv[1:]])
"""


def tied_browser(browser: str) -> str:
    """An executable that runs ``browser`` after tying it to its parent (chromedriver has no
    option for that, and a Chromium whose chromedriver was killed runs on)."""
    import atexit
    import sys
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(prefix="easd-local-browser-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "chromium"
    path.write_text(_TIE.format(python=sys.executable, root=str(Path(__file__).resolve().parents[1]),
                                browser=browser))
    path.chmod(0o755)
    return str(path)


def wait(d, js: str, timeout: float = 60.0, what: str = ""):
    """Poll ``return <js>`` in the page until it is truthy; its value."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(d, timeout, poll_frequency=0.05).until(lambda d: d.execute_script("return " + js))
    except TimeoutException:
        raise AssertionError(f"timed out waiting for {what or js}") from None


def set_field(d, element_id: str, value: str) -> None:
    """Set an input or select as a user does: its value, then an input event."""
    d.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                     "e.dispatchEvent(new Event('input', {bubbles: true}));", element_id, value)


# A finished reply with Markdown and maths, as the default pair writes them (issue 44), for the
# page's rendering: no model at hand writes maths (the tests' tiny pair has random weights), so
# the page is given this reply in place of the server's stream, one easd_tokens record a token
# with an origin of every kind. The tests add markup that must stay text.
MATHS_TEXT = ("To find the trees left, first multiply:\n\n\\[ 17 \\times 23 = 391 \\]\n\n"
              "Then take away the **40 trees** whose apples were sold: $391 - 40 = 351$.\n\n"
              "- rows: 17\n- trees in a row: 23\n\nSo \\(\\boxed{351}\\) trees are left.")
_ORIGIN_CYCLE = ("draft", "draft", "draft", "bonus", "target", "draft", "resampled", "draft", "easd", "target",
                 "draft", "draft")


def token_records(text: str, start: int = 0) -> list[dict]:
    """``text`` cut as a tokenizer might (words, numbers, LaTeX commands, single marks), each
    piece a record of the stream extension with an origin from a fixed cycle."""
    import re

    pieces = re.findall(r"\s*\\[A-Za-z]+|\s*[A-Za-z]+|\s*\d{1,3}|\s*\S|\s+", text)
    assert "".join(pieces) == text
    out = []
    for k, p in enumerate(pieces):
        o = _ORIGIN_CYCLE[(start + k) % len(_ORIGIN_CYCLE)]
        gated = o in ("easd", "draft", "resampled")
        out.append({"i": start + k, "text": p, "origin": o, "h_draft": 1.357 if gated else None,
                    "h_target": 0.839 if gated else None, "overlap": 0.8 if gated else None})
    return out


def serve_canned_reply(d, records: list[dict], mode: str = "easd-tf") -> None:
    """Make the page's next chat request get ``records`` as its stream (the page's own fetch,
    replaced for /v1/chat/completions only), with timings that count them and no speed (none
    was measured: the page shows a dash)."""
    sse = sse_records(records) + sse_end(records, mode)
    d.execute_script("""
        const sse = arguments[0], real = window.fetch;
        window.fetch = (url, init) => String(url).endsWith('/v1/chat/completions')
          ? Promise.resolve(new Response(sse, {headers: {'Content-Type': 'text/event-stream'}}))
          : real(url, init);""", sse)


def serve_reply_by_hand(d) -> None:
    """Make the page's next chat request a stream that the test writes as it goes:
    ``write_reply(d, sse_records(...))``, then ``write_reply(d, sse_end(...))`` (a stream whose
    pace the test sets, which a server's is not)."""
    d.execute_script("""
        const real = window.fetch, enc = new TextEncoder();
        window.fetch = (url, init) => {
          if (!String(url).endsWith('/v1/chat/completions')) return real(url, init);
          const body = new ReadableStream({start(c) {
            window.easdTestWrite = (text) => { c.enqueue(enc.encode(text)); if (text.includes('[DONE]')) c.close(); };
          }});
          return Promise.resolve(new Response(body, {headers: {'Content-Type': 'text/event-stream'}}));
        };""")


def write_reply(d, sse: str) -> None:
    d.execute_script("window.easdTestWrite(arguments[0])", sse)


def sse_records(records: list[dict]) -> str:
    """The stream's chunks for ``records``, one a token."""
    chunks = [{"choices": [{"index": 0, "delta": {"content": r["text"]}}], "easd_tokens": [r]} for r in records]
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)


def sse_end(records: list[dict], mode: str = "easd-tf") -> str:
    """The stream's last chunk, with timings that count all of ``records``, and [DONE]."""
    from collections import Counter

    n = Counter(r["origin"] for r in records)
    timings = {"predicted_n": len(records), "predicted_per_second": None, "prompt_n": 40, "cache_n": 0,
               "draft_n": n["draft"] + n["resampled"] + n["easd"], "draft_n_accepted": n["draft"],
               "acceptance_rate": n["draft"] / max(1, n["draft"] + n["resampled"] + n["easd"]),
               "mean_accepted_len": 2.0, "gate_fires": n["easd"], "draft_consults": n["easd"] + 3,
               "target_tokens": n["target"], "sd_rejections": n["resampled"], "bonus": n["bonus"],
               "ttft_ms": None, "mode": mode, "lossless": False, "tau_draft": 0.8899, "tau_target": 0.7017,
               "thresholds_source": "catalog"}
    end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": timings}
    return f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n"
