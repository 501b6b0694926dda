"""The chat page of `easd-local serve` (GET /) in a real headless Chromium, against a real
server process on the tiny pair; and the ``easd_tokens`` stream extension it reads, through
the official `openai` client (which must go on working as before).

The browser tests skip, and say why, where no Chromium and chromedriver are installed
(scripts/install_browser.py installs Debian's).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from browser_helpers import (MATHS_TEXT, chrome, find_browser, serve_canned_reply, serve_reply_by_hand, sse_end,
                             sse_records, token_records, wait, write_reply)
from serve_helpers import ServerProc, http, metric_values, openai_client, start_tiny, stop_clean

from easd_local.engine.decoding import ORIGINS
from easd_local.engine.modes import MODES

# the server's defaults: easd with thresholds at which the gate fires at some positions of
# the tiny pair's output but not at all, so a reply mixes origins
SERVER_FLAGS = ["--mode", "easd", "--tau-draft", "0.5", "--tau-target", "0.5", "--overlap", "0.2",
                "--max-tokens", "40", "--ctx", "1024", "--threads", "1", "--parallel", "2"]
# which `timings` field counts the tokens of each origin (draft-only: draft mode's tokens)
COUNT_FIELD = {"draft": "draft_n_accepted", "target": "target_tokens", "resampled": "sd_rejections",
               "easd": "gate_fires", "bonus": "bonus"}
METRIC = {"draft": "easd_draft_accepted_tokens_total", "resampled": "easd_sd_rejections_total",
          "easd": "easd_gate_fires_total", "bonus": "easd_bonus_tokens_total"}
PROMPT = "Tell me a story"

BROWSER, DRIVER, NO_BROWSER = find_browser()
needs_browser = pytest.mark.skipif(bool(NO_BROWSER), reason=NO_BROWSER or "")


def start(tiny_draft, tiny_target, tmp, *extra, env=None) -> ServerProc:
    return start_tiny(tiny_draft, tiny_target, tmp, *SERVER_FLAGS, *extra, env=env)


@pytest.fixture(scope="module")
def server(tiny_draft, tiny_target, tmp_path_factory):
    srv = start(tiny_draft, tiny_target, tmp_path_factory.mktemp("webui"))
    yield srv
    stop_clean(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture
def browser():
    d = chrome(BROWSER, DRIVER)
    yield d
    d.quit()


def origin_counts(timings: dict) -> dict:
    """Tokens of each origin as decoding counted them (draft-only: the rest)."""
    counts = {o: timings[f] for o, f in COUNT_FIELD.items()}
    counts["draft-only"] = timings["predicted_n"] - sum(counts.values())
    return {o: n for o, n in counts.items() if n}


def page_tokens(d, selector: str) -> list[dict]:
    """The token spans under ``selector`` in document order: index, origin, text, figures."""
    return d.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(s => ({i: Number(s.dataset.i), "
        "origin: s.dataset.origin, text: s.textContent, h_draft: s.dataset.h_draft ?? null}))", selector)


def open_page(d, server) -> None:
    d.get(server.base + "/")
    wait(d, "document.body.dataset.ready", what="the page to load the server's settings")


def no_console_errors(d) -> None:
    no_console_errors_but(d)


def no_console_errors_but(d, *expected: str) -> None:
    """No error in the browser's log but those naming one of ``expected`` (the browser's own
    line for a refused request, say)."""
    severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"
              and not any(x in e["message"] for x in expected)]
    assert not severe, severe


# ------------------------------------------------------------------ HTTP, no browser
def test_page_files_ship_in_the_package():
    """A wheel carries the page: pyproject's package-data globs (setuptools' globs: ``*`` stays
    in its folder) cover every file the app serves, KaTeX's fonts in their sub-folder too."""
    from pathlib import Path

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    from easd_local.server import webui

    repo = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    pkg = repo / "easd_local" / "server"
    shipped = {p.relative_to(pkg).as_posix() for pat in patterns["easd_local.server"] for p in pkg.glob(pat)}
    assert {"webui/index.html", "webui/katex/katex.min.js", "webui/katex/fonts/KaTeX_Main-Regular.woff2"} <= set(
        f"webui/{n}" for n in webui.FILES)
    for name in webui.FILES:
        assert f"webui/{name}" in shipped, name


def test_page_assets_and_props(server, tiny_draft, tiny_target):
    status, headers, body = http("GET", server.base + "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in headers["content-security-policy"]  # nothing from elsewhere
    assert '<script src="/webui/app.js"' in body and "http" not in body.replace("http-equiv", "")
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css"), ("icon.svg", "image/svg+xml")):
        status, headers, _ = http("GET", f"{server.base}/webui/{name}")
        assert status == 200 and headers["content-type"].startswith(kind), name
    status, _, err = http("GET", server.base + "/webui/nope.js")
    assert status == 404 and err["error"]["type"] == "not_found_error"
    status, _, props = http("GET", server.base + "/props")
    assert status == 200 and props["model"] == f"{tiny_draft.stem}+{tiny_target.stem}"
    d = props["defaults"]
    assert d["mode"] == "easd" and d["tau_draft"] == 0.5 and d["overlap"] == 0.2 and d["max_tokens"] == 40
    assert d["thresholds_source"] == "flags" and d["lossless"] is False
    assert [m["name"] for m in props["modes"]] == list(MODES) and props["origins"] == list(ORIGINS)
    assert {m["name"]: m["lossless"] for m in props["modes"]}["sd"] is True and props["webui"] is True


def test_stream_extension_through_the_official_client(client, server):
    """The official client parses the extended chunks as before and keeps the extension in
    model_extra; its records are the reply's tokens, counted as decoding counted them."""
    name = client.models.list().data[0].id
    msgs = [{"role": "user", "content": PROMPT}]
    full = client.chat.completions.create(model=name, messages=msgs)
    chunks = list(client.chat.completions.create(model=name, messages=msgs, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    recs = [r for c in chunks for r in (c.model_extra.get("easd_tokens") or [])]
    for c in chunks:  # a chunk's records are that chunk's text
        if c.choices and c.choices[0].delta.content:
            assert "".join(r["text"] for r in c.model_extra["easd_tokens"]) == c.choices[0].delta.content
    t = chunks[-1].model_extra["timings"]
    assert [r["i"] for r in recs] == list(range(t["predicted_n"])) == list(range(chunks[-1].usage.completion_tokens))
    assert "".join(r["text"] for r in recs) == text
    assert dict(Counter(r["origin"] for r in recs)) == origin_counts(t)
    assert len(set(r["origin"] for r in recs)) >= 2, recs  # the thresholds give a mix
    fired = [r for r in recs if r["origin"] == "easd"]
    assert fired and all(r["h_draft"] >= 0.5 and r["h_target"] >= 0.5 and r["overlap"] >= 0.2 for r in fired)

    # a stop string: the records cover exactly the text returned, one index per token counted
    stop = text[4:6]
    chunks = list(client.chat.completions.create(model=name, messages=msgs, stream=True, stop=[stop],
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content[: full.choices[0].message.content.find(stop)]
    recs = [r for c in chunks for r in (c.model_extra.get("easd_tokens") or [])]
    assert "".join(r["text"] for r in recs) == text
    assert sorted(set(r["i"] for r in recs)) == list(range(chunks[-1].usage.completion_tokens))


def test_no_webui(tiny_draft, tiny_target, tmp_path):
    srv = start(tiny_draft, tiny_target, tmp_path, "--no-webui")
    try:
        assert "chat page" not in srv.output()
        status, _, err = http("GET", srv.base + "/")
        assert status == 404 and err["error"]["type"] == "not_found_error"
        assert http("GET", srv.base + "/webui/app.js")[0] == 404
        status, _, props = http("GET", srv.base + "/props")
        assert status == 200 and props["webui"] is False
        assert http("GET", srv.base + "/v1/models")[0] == 200
    finally:
        out = srv.stop()
    assert "Traceback" not in out, out


# ------------------------------------------------------------------ in the browser
@needs_browser
def test_chat_page_colours_tokens_by_origin(server, client, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    d = browser
    open_page(d, server)
    assert "easd (not lossless)" in d.find_element(By.ID, "server-line").text
    assert "flags" in d.find_element(By.ID, "source-note").text
    d.find_element(By.ID, "render-md").click()  # the tokens as they came, not drawn as Markdown
    before = metric_values(http("GET", server.base + "/metrics")[2])

    d.find_element(By.ID, "input").send_keys(PROMPT)
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelector('.msg.assistant')?.dataset.state === 'done'", what="the reply")
    toks = page_tokens(d, ".msg.assistant .tok")
    t = json.loads(d.find_element(By.CSS_SELECTOR, ".msg.assistant").get_attribute("data-timings"))
    assert [x["i"] for x in toks] == list(range(t["predicted_n"]))
    # one span per token, its class the origin that decoding counted
    classes = d.execute_script("return [...document.querySelectorAll('.msg.assistant .tok')].map(s => s.className)")
    assert classes == [f"tok o-{x['origin']}" for x in toks]
    assert dict(Counter(x["origin"] for x in toks)) == origin_counts(t)
    assert t["gate_fires"] > 0 and len(set(x["origin"] for x in toks)) >= 2
    # ... and as the server's own counters moved for this one request
    after = metric_values(http("GET", server.base + "/metrics")[2])
    for origin, metric in METRIC.items():
        key = (metric, frozenset({("mode", "easd")}))
        assert after.get(key, 0) - before.get(key, 0) == sum(x["origin"] == origin for x in toks), origin
    # the page shows the text the API gives for the same request
    same = client.chat.completions.create(model=client.models.list().data[0].id, messages=[{"role": "user", "content": PROMPT}])
    assert "".join(x["text"] for x in toks) == same.choices[0].message.content
    stats = d.find_element(By.CSS_SELECTOR, ".msg.assistant .stats").text
    for part in (f"{t['predicted_n']} tokens", f"n_drafted {t['draft_n']}", f"n_accept {t['draft_n_accepted']}",
                 f"gate fires {t['gate_fires']}", "tok/verify", "easd: not lossless"):
        assert part in stats, (part, stats)
    legend = d.find_element(By.CSS_SELECTOR, "#legend-list li[data-origin='easd']").text
    assert f"{t['gate_fires']} in the last reply" in legend

    # a gate fire's details: its origin and the entropies it fired on (click = tap)
    fire = d.find_element(By.CSS_SELECTOR, ".msg.assistant .tok.o-easd")
    fire.click()
    info = d.find_element(By.ID, "token-info").text
    assert "gate fire" in info and f"{float(fire.get_attribute('data-h_draft')):.3f} nats" in info
    # keyboard: focus the reply, arrows move between its tokens
    reply = d.find_element(By.CSS_SELECTOR, ".msg.assistant .reply")
    reply.send_keys(Keys.HOME)
    reply.send_keys(Keys.ARROW_RIGHT)
    assert d.execute_script("return document.querySelector('.msg.assistant .tok.active').dataset.i") == "1"
    assert "token 2: " in d.find_element(By.ID, "token-info").text
    d.save_screenshot(str(tmp_path / "chat.png"))
    assert (tmp_path / "chat.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a second turn sends the conversation so far; Enter sends
    d.find_element(By.ID, "input").send_keys("And then?", Keys.ENTER)
    wait(d, "document.querySelectorAll('.msg.assistant')[1]?.dataset.state === 'done'", what="the second reply")
    t2 = json.loads(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1].get_attribute("data-timings"))
    # the whole prompt is what the prompt cache reused plus what was evaluated (llama-server's cache_n, prompt_n)
    assert t2["prompt_n"] + t2["cache_n"] > t["prompt_n"] + t["cache_n"] + t["predicted_n"] - 1
    d.find_element(By.ID, "new-chat").click()
    assert d.find_elements(By.CSS_SELECTOR, "#messages li") == []
    no_console_errors(d)


@needs_browser
def test_the_header_follows_the_mode_chosen(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    d = browser
    open_page(d, server)
    line = lambda: d.find_element(By.ID, "server-line").text  # noqa: E731
    assert "mode easd (not lossless)" in line() and "server default" not in line()
    Select(d.find_element(By.ID, "set-mode")).select_by_value("sd")
    assert "mode sd (lossless) · drafts: draft (server default easd)" in line(), line()
    Select(d.find_element(By.ID, "set-mode")).select_by_value("easd-tf")
    assert "mode easd-tf (not lossless)" in line(), line()
    d.find_element(By.ID, "reset-settings").click()
    assert "mode easd (not lossless)" in line() and "server default" not in line()


@needs_browser
def test_a_finished_reply_renders_markdown_and_maths_over_its_tokens(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    d = browser
    open_page(d, server)
    # a maths reply, then markup that must stay text whatever the model writes
    table = "\n\n| rows | trees |\n|---|--:|\n| 17 | $17 \\cdot 23$ |\n\n"
    evil = " <img src=x onerror=\"document.body.dataset.owned=1\"> <b>no</b> **<i>x</i>**"
    records = token_records(MATHS_TEXT + table + evil)
    serve_canned_reply(d, records)
    d.find_element(By.ID, "input").send_keys("17 rows of 23 trees, 40 sold: how many left?")
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelector('.msg.assistant')?.dataset.rendered", what="the rendered reply")
    reply = ".msg.assistant .reply"
    # KaTeX drew the formulas (HTML and MathML), display and inline, with its own fonts
    assert len(d.find_elements(By.CSS_SELECTOR, f"{reply} .math .katex math")) == 4
    assert len(d.find_elements(By.CSS_SELECTOR, f"{reply} .math-display .katex-display")) == 1
    assert "\\boxed{351}" in d.execute_script(
        f"return [...document.querySelectorAll('{reply} annotation')].map(a => a.textContent).join(' ')")
    wait(d, "document.fonts.status === 'loaded' && [...document.fonts].some(f => f.family.includes('KaTeX') "
            "&& f.status === 'loaded')", what="KaTeX's fonts from the package")
    # Markdown: strong, a list; every piece of text is a token's, with its origin and figures
    by_i = {r["i"]: r for r in records}
    strong = d.execute_script(f"return [...document.querySelector('{reply} strong').querySelectorAll('.tok')].map("
                              "s => [Number(s.dataset.i), s.className, s.textContent])")
    assert "".join(t for _, _, t in strong) == "40 trees" and len(strong) == 2
    for i, cls, text in strong:
        assert cls == f"tok o-{by_i[i]['origin']}" and text in by_i[i]["text"]
    assert d.execute_script(f"return [...document.querySelectorAll('{reply} li')].map(li => li.textContent)") == [
        "rows: 17", "trees in a row: 23"]
    cells = d.execute_script(f"return [...document.querySelectorAll('{reply} tr')].map(r => [...r.cells].map("
                             "c => [c.tagName, c.textContent.trim()]))")
    assert [[t for t, _ in r] for r in cells] == [["TH", "TH"], ["TD", "TD"]]
    assert [x for _, x in cells[0]] == ["rows", "trees"] and cells[1][0][1] == "17"
    assert d.execute_script(f"return document.querySelector('{reply} td:last-child .katex') !== null")
    # the boxed answer's tokens: the marks under its formula, in order, with their origins
    box = next(r["i"] for r in records if r["text"].strip() == "\\boxed")
    strip = d.execute_script(f"const m = [...document.querySelectorAll('{reply} .math')].find(x => "
                             "x.querySelector('annotation').textContent.includes('boxed')); return "
                             "[...m.querySelectorAll('.math-tokens .tok')].map(s => [Number(s.dataset.i), "
                             "s.dataset.origin, s.dataset.text])")
    assert box in [i for i, _, _ in strip] and all(o == by_i[i]["origin"] and t == by_i[i]["text"]
                                                   for i, o, t in strip)
    # every token is on the page in order (a formula's as its marks) but those that are only
    # markup: emphasis, a list's dash, a table's pipes and its |---| line
    shown = d.execute_script(f"return [...document.querySelectorAll('{reply} .tok')].map(s => Number(s.dataset.i))")
    missing = set(by_i) - set(shown)
    assert shown == sorted(shown) and missing and all(set(by_i[i]["text"].strip()) <= set("*-|:") for i in missing), [
        by_i[i]["text"] for i in missing]
    # a gate fire among them keeps its details
    d.find_element(By.CSS_SELECTOR, f"{reply} .tok.o-easd").click()
    assert "gate fire" in d.find_element(By.ID, "token-info").text and "1.357 nats" in d.find_element(
        By.ID, "token-info").text
    # the model's markup stayed text
    assert not d.find_elements(By.CSS_SELECTOR, f"{reply} img, {reply} b, {reply} i")
    assert '<img src=x onerror="document.body.dataset.owned=1">' in d.find_element(By.CSS_SELECTOR, reply).text
    assert d.execute_script("return document.body.dataset.owned") is None
    assert [e.text for e in d.find_elements(By.CSS_SELECTOR, f"{reply} strong")] == ["40 trees", "<i>x</i>"]
    d.save_screenshot(str(tmp_path / "maths.png"))
    d.set_window_size(400, 860)  # a phone: nothing scrolls sideways
    assert d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth"), "scrolls sideways"
    d.set_window_size(1280, 900)
    # the switch: the tokens as they came, one span each, then drawn again
    d.find_element(By.ID, "render-md").click()
    raw = page_tokens(d, f"{reply} .tok")
    assert [(t["i"], t["origin"], t["text"]) for t in raw] == [(r["i"], r["origin"], r["text"]) for r in records]
    assert not d.find_elements(By.CSS_SELECTOR, f"{reply} .katex")
    d.find_element(By.ID, "render-md").click()
    assert len(d.find_elements(By.CSS_SELECTOR, f"{reply} .katex")) == 4
    no_console_errors(d)  # a style or font the CSP refused would be here


@needs_browser
def test_settings_go_with_the_request(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    d = browser
    open_page(d, server)
    Select(d.find_element(By.ID, "set-mode")).select_by_value("sd")
    assert "lossless" in d.find_element(By.ID, "mode-note").text
    mt = d.find_element(By.ID, "set-max_tokens")
    mt.clear()
    mt.send_keys("7")
    d.find_element(By.ID, "input").send_keys("hello there")
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelector('.msg.assistant')?.dataset.state === 'done'")
    t = json.loads(d.find_element(By.CSS_SELECTOR, ".msg.assistant").get_attribute("data-timings"))
    assert t["mode"] == "sd" and t["lossless"] is True and t["predicted_n"] <= 7
    assert t["thresholds_source"] == "flags"  # thresholds untouched: the server's
    assert "sd: lossless" in d.find_element(By.CSS_SELECTOR, ".msg.assistant .stats").text
    tau = d.find_element(By.ID, "set-tau_target")
    tau.clear()
    tau.send_keys("nope")
    assert "set here for this request" in d.find_element(By.ID, "source-note").text
    d.find_element(By.ID, "input").send_keys("hi")
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelectorAll('.msg.assistant')[1]?.dataset.state === 'error'")
    err = d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1].find_element(By.CSS_SELECTOR, ".error").text
    assert "tau_target" in err  # the server's 400, shown as it said it
    # stop: a request aborted at once ends as stopped, and the page goes on
    d.find_element(By.ID, "reset-settings").click()
    d.find_element(By.ID, "input").send_keys("Count: one two")
    d.execute_script("document.getElementById('send').click(); document.getElementById('stop').click();")
    wait(d, "document.querySelectorAll('.msg.assistant')[2]?.dataset.state === 'stopped'")
    assert d.find_element(By.ID, "send").is_enabled() and not d.find_element(By.ID, "stop").is_enabled()
    d.find_element(By.ID, "input").send_keys("ok")
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelectorAll('.msg.assistant')[3]?.dataset.state === 'done'")


@needs_browser
def test_a_failed_request_keeps_the_question_and_the_focus(server, browser):
    """Clicking Send leaves the keyboard in the message box (the button is disabled while the
    reply streams, so the focus fell to the page), and a question the server refused (here: over
    the context) is back in the box to edit and send again, not lost."""
    from selenium.webdriver.common.by import By

    d = browser
    open_page(d, server)
    d.find_element(By.ID, "input").send_keys("hello there")
    d.find_element(By.ID, "send").click()
    assert d.execute_script("return document.activeElement.id") == "input"
    wait(d, "document.querySelector('.msg.assistant')?.dataset.state === 'done'")
    assert d.execute_script("return document.activeElement.id") == "input"
    long = "word " * 1500  # over the server's --ctx 1024
    d.execute_script("document.getElementById('input').value = arguments[0]", long)
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelectorAll('.msg.assistant')[1]?.dataset.state === 'error'")
    err = d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1].find_element(By.CSS_SELECTOR, ".error").text
    assert "context" in err, err
    assert d.find_element(By.ID, "input").get_attribute("value") == long
    d.execute_script("document.getElementById('input').value = 'shorter'")
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelectorAll('.msg.assistant')[2]?.dataset.state === 'done'")
    no_console_errors_but(d, "status of 400")


@needs_browser
def test_the_page_follows_a_long_reply_until_the_reader_scrolls_up(server, browser):
    """As llama-server's and LM Studio's pages do: while the reader is at the end, the newest
    text stays in view (the reader scrolled by hand); a wheel turned up stops that, and back at
    the end it follows again."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    d = browser
    open_page(d, server)
    d.find_element(By.ID, "render-md").click()  # the tokens as they came: the same height when it ends
    serve_reply_by_hand(d)
    d.find_element(By.ID, "input").send_keys(PROMPT)
    d.find_element(By.ID, "send").click()
    records = token_records("".join(f"line {k} of a long reply\n" for k in range(240)))
    size = -(-len(records) // 6)
    parts = [records[k:k + size] for k in range(0, len(records), size)]
    # the end of the chat (its last line, the message box under it) at the window's bottom, or above it
    below = "document.getElementById('view-chat').getBoundingClientRect().bottom - window.innerHeight"
    shown = lambda n: f"document.querySelectorAll('.msg.assistant .tok').length === {n}"  # noqa: E731

    def write(k):
        write_reply(d, sse_records(parts[k]))
        wait(d, shown(sum(len(p) for p in parts[:k + 1])), what=f"part {k} of the reply")

    def settled():  # where a wheel's smooth scroll ends
        last = None
        for _ in range(100):
            y = d.execute_script("return new Promise(r => requestAnimationFrame(() => r(window.scrollY)))")
            if y == last:
                return y
            last = y
        raise AssertionError("the page kept scrolling")

    write(0)
    write(1)
    assert d.execute_script(f"return {below}") <= 1 and d.execute_script("return window.scrollY") > 1000
    ActionChains(d).scroll_by_amount(0, -600).perform()
    y = settled()
    assert d.execute_script(f"return {below}") > 500
    write(2)
    write(3)
    assert settled() == y  # what the reader scrolled back to read stays put
    ActionChains(d).scroll_by_amount(0, 100_000).perform()
    settled()
    write(4)
    assert d.execute_script(f"return {below}") <= 1
    write_reply(d, sse_records(parts[5]) + sse_end(records))
    wait(d, "document.querySelector('.msg.assistant')?.dataset.state === 'done'")
    assert d.execute_script(f"return {below}") <= 1
    no_console_errors(d)


@needs_browser
def test_a_server_that_goes_away_is_named_as_such(tiny_draft, tiny_target, browser, tmp_path):
    """A server killed mid-reply: the reply says the connection was lost (the browser's own
    words were only "network error"), keeps what came, and the question is back in the box; a
    request to the dead server says it cannot reach it (not "Failed to fetch" alone)."""
    from selenium.webdriver.common.by import By

    srv = start_tiny(tiny_draft, tiny_target, tmp_path, "--mode", "target", "--max-tokens", "30000",
                     "--ctx", "32768", "--threads", "1")
    try:
        d = browser
        open_page(d, srv)
        d.find_element(By.ID, "input").send_keys(PROMPT)
        d.find_element(By.ID, "send").click()
        wait(d, "document.querySelectorAll('.msg.assistant .tok').length > 50", what="part of the reply")
        srv.proc.kill()
        wait(d, "document.querySelector('.msg.assistant').dataset.state === 'error'", 30)
        reply = d.find_element(By.CSS_SELECTOR, ".msg.assistant")
        assert "connection to the server was lost before the reply ended" in reply.find_element(
            By.CSS_SELECTOR, ".error").text
        assert len(reply.find_elements(By.CSS_SELECTOR, ".tok")) > 50
        assert d.find_element(By.ID, "input").get_attribute("value") == PROMPT
        d.find_element(By.ID, "send").click()
        wait(d, "document.querySelectorAll('.msg.assistant')[1]?.dataset.state === 'error'", 30)
        err = d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1].find_element(By.CSS_SELECTOR, ".error").text
        assert err.startswith("cannot reach the server"), err
    finally:
        srv.stop()


@needs_browser
def test_model_maths_cannot_link_run_or_blow_up_the_page(server, browser):
    """KaTeX keeps its trust off (\\href, \\url, \\html*, \\includegraphics are drawn as
    errors, not links or attributes), a size the model wrote is capped (a 9999em \\rule made the page
    160,000 px tall), maths in code stays code, a formula KaTeX cannot parse is its source marked as
    an error (KaTeX's own error element set a style attribute: a CSP error on the console, and no
    colour), and the console stays quiet."""
    from selenium.webdriver.common.by import By

    d = browser
    open_page(d, server)
    text = ("[a](javascript:document.body.dataset.owned=1) $\\href{javascript:document.body.dataset.owned=2}{x}$ "
            "\\(\\url{javascript:alert(1)}\\) $\\htmlData{owned=3}{y}$ $\\includegraphics{x.png}$\n\n"
            "`$a$` and\n\n```\n$$ b $$\n```\n\n$$\\rule{9999em}{9999em}$$\n\n$\\kern{9999em}z$ 😀 $α^2$ $\\frac{1}$")
    serve_canned_reply(d, token_records(text))
    d.find_element(By.ID, "input").send_keys("go")
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelector('.msg.assistant')?.dataset.rendered", what="the rendered reply")
    reply = ".msg.assistant .reply"
    assert len(d.find_elements(By.CSS_SELECTOR, f"{reply} .katex")) == 7
    assert not d.find_elements(By.CSS_SELECTOR, f"{reply} a, {reply} img, {reply} [data-owned], {reply} script")
    assert d.execute_script("return document.body.dataset.owned") is None
    assert not d.find_elements(By.CSS_SELECTOR, f"{reply} code .katex")
    assert [e.text for e in d.find_elements(By.CSS_SELECTOR, f"{reply} code")] == ["$a$", "$$ b $$"]
    sizes = d.execute_script(f"return [...document.querySelectorAll('{reply} .math')].map(m => "
                             "[m.getBoundingClientRect().width, m.getBoundingClientRect().height])")
    assert max(h for _, h in sizes) < 600 and max(w for w, _ in sizes) <= 1280, sizes
    assert d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth"), "scrolls sideways"
    bad = d.find_element(By.CSS_SELECTOR, f"{reply} .math .math-error")
    assert bad.text == "$\\frac{1}$" and "KaTeX parse error" in bad.get_attribute("title")
    assert d.get_log("browser") == []  # KaTeX's strict mode warned, its error element broke the CSP


@needs_browser
def test_side_by_side(server, client, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    d = browser
    open_page(d, server)
    d.find_element(By.ID, "tab-compare").click()
    assert d.find_element(By.ID, "view-chat").get_attribute("hidden") is not None
    d.find_element(By.ID, "compare-input").send_keys(PROMPT)
    Select(d.find_element(By.ID, "mode-a")).select_by_value("sd")
    Select(d.find_element(By.ID, "mode-b")).select_by_value("easd")
    d.find_element(By.ID, "compare").click()
    # Compare is disabled while the replies stream: the keyboard stays in the prompt's box (it fell to the page)
    assert d.execute_script("return document.activeElement.id") == "compare-input"
    wait(d, "document.getElementById('compare-out').dataset.state", what="both replies")
    assert d.execute_script("return document.activeElement.id") == "compare-input"
    out = d.find_element(By.ID, "compare-out")
    assert out.get_attribute("data-state") == "done"
    name = client.models.list().data[0].id
    texts = []
    for k, mode in enumerate(("sd", "easd")):
        t = json.loads(out.get_attribute(f"data-timings{k}"))
        assert t["mode"] == mode
        side = "left" if k == 0 else "right"
        toks = sorted(page_tokens(d, f"#compare-out .cell[data-side^='{side}'] .tok"), key=lambda x: x["i"])
        assert [x["i"] for x in toks] == list(range(t["predicted_n"]))
        assert dict(Counter(x["origin"] for x in toks)) == origin_counts(t)
        texts.append("".join(x["text"] for x in toks))
        api = client.chat.completions.create(model=name, messages=[{"role": "user", "content": PROMPT}],
                                             extra_body={"mode": mode})
        assert texts[-1] == api.choices[0].message.content
    stats = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#compare-out .foot .stats")]
    assert len(stats) == 2 and "sd: lossless" in stats[0] and "easd: not lossless" in stats[1]
    a, b = texts
    assert a != b  # the gate changed this answer
    first = next(k for k in range(min(len(a), len(b)) + 1) if k == min(len(a), len(b)) or a[k] != b[k])
    assert int(out.get_attribute("data-first-part")) == first
    marks = d.find_elements(By.CSS_SELECTOR, "#compare-out .parts-here")
    assert len(marks) == 2 * int(out.get_attribute("data-parts")) >= 2
    # rows line up: each row's left and right cells are both shared text or both where they part
    rows = d.execute_script("const c = [...document.querySelectorAll('#compare-out .cell.same, #compare-out .cell.differ')];"
                            "return c.map(e => [e.dataset.side.split(' ')[0], e.classList.contains('same'), e.textContent]);")
    assert [r[0] for r in rows] == ["left", "right"] * (len(rows) // 2)
    for left, right in zip(rows[::2], rows[1::2]):
        assert left[1] == right[1] and (not left[1] or left[2] == right[2])
    assert "part at character" in d.find_element(By.ID, "compare-summary").text
    d.save_screenshot(str(tmp_path / "side-by-side.png"))
    assert (tmp_path / "side-by-side.png").stat().st_size > 10_000
    no_console_errors(d)


@needs_browser
def test_origins_readable_without_colour_and_on_a_phone(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    d = browser
    d.set_window_size(400, 860)
    open_page(d, server)
    # every origin in the legend, each with a line style of its own (not colour alone)
    styles = d.execute_script(
        "return [...document.querySelectorAll('#legend-list li')].map(li => { const s = getComputedStyle("
        "li.querySelector('.tok')); return [li.dataset.origin, s.textDecorationLine + ' ' + s.textDecorationStyle]; })")
    assert [o for o, _ in styles] == list(ORIGINS)
    assert len({s for _, s in styles}) == len(ORIGINS), styles
    d.find_element(By.ID, "input").send_keys(PROMPT)
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelector('.msg.assistant')?.dataset.state === 'done'")
    assert d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth"), "scrolls sideways"
    d.save_screenshot(str(tmp_path / "phone.png"))


@needs_browser
def test_the_page_asks_for_the_api_key(tiny_draft, tiny_target, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    srv = start(tiny_draft, tiny_target, tmp_path, "--api-key", "sesame")
    try:
        d = browser
        d.get(srv.base + "/")  # the page itself needs no key
        wait(d, "document.getElementById('key-dialog').open", what="the key dialog")
        # Esc closes the dialog: the page says what it needs and asks again (it waited forever)
        d.find_element(By.ID, "key-input").send_keys(Keys.ESCAPE)
        wait(d, "document.getElementById('server-line').textContent.includes('needs its API key')", 10,
             what="the page to say it needs the key")
        wait(d, "document.getElementById('key-dialog').open", 10, what="the key dialog again")
        d.find_element(By.ID, "key-input").send_keys("wrong")
        d.find_element(By.ID, "key-submit").click()
        wait(d, "document.getElementById('key-error').textContent", what="the refusal")
        assert "refused" in d.find_element(By.ID, "key-error").text
        assert d.execute_script("return document.getElementById('key-dialog').open")
        d.find_element(By.ID, "key-input").send_keys("sesame")
        d.find_element(By.ID, "key-submit").click()
        wait(d, "document.body.dataset.ready", what="the page with the key")
        d.find_element(By.ID, "input").send_keys(PROMPT)
        d.find_element(By.ID, "send").click()
        wait(d, "document.querySelector('.msg.assistant')?.dataset.state === 'done'")
        assert d.find_elements(By.CSS_SELECTOR, ".msg.assistant .tok")
    finally:
        out = srv.stop()
    assert "Traceback" not in out, out


@needs_browser
def test_side_by_side_asks_once_when_both_requests_are_refused(tiny_draft, tiny_target, browser, tmp_path):
    """The server restarted with another key: side by side's two requests are refused together
    and wait for one prompt; with the new key both replies come (a second prompt took the first's
    place, and the first request never ended)."""
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    for sub in ("old", "new"):
        (tmp_path / sub).mkdir()
    srv = start(tiny_draft, tiny_target, tmp_path / "old", "--api-key", "sesame")
    try:
        d = browser
        d.get(srv.base + "/")
        wait(d, "document.getElementById('key-dialog').open", what="the key dialog")
        d.find_element(By.ID, "key-input").send_keys("sesame")
        d.find_element(By.ID, "key-submit").click()
        wait(d, "document.body.dataset.ready", what="the page with the key")
        d.find_element(By.ID, "tab-compare").click()
        d.find_element(By.ID, "compare-input").send_keys(PROMPT)
    finally:
        stop_clean(srv)
    d.get_log("browser")  # the first refusal's line
    srv = start(tiny_draft, tiny_target, tmp_path / "new", "--api-key", "opensesame", "--port", str(srv.port))
    try:
        d.find_element(By.ID, "compare").click()
        refused, t_end = [], time.monotonic() + 30
        while len(refused) < 2 and time.monotonic() < t_end:  # both requests refused before the key is given
            refused += [e for e in d.get_log("browser") if "status of 401" in e["message"]]
        assert len(refused) == 2, refused
        assert d.execute_script("return document.getElementById('key-dialog').open")
        assert "refused" in d.find_element(By.ID, "key-error").text
        # Esc: both requests end (one of them waited forever)
        d.find_element(By.ID, "key-input").send_keys(Keys.ESCAPE)
        wait(d, "document.getElementById('compare-out').dataset.state", 30, what="both requests to end")
        # Esc answered the dialog: each request says the key is missing (not "stopped", as the
        # page's Esc elsewhere would have it)
        ends = d.execute_script("return [...document.querySelectorAll('#compare-out .stream')].map(s => "
                                "[s.dataset.state, s.textContent])")
        assert [e[0] for e in ends] == ["error", "error"] and all("needs its API key" in e[1] for e in ends), ends
        d.find_element(By.ID, "compare").click()
        wait(d, "document.getElementById('key-dialog').open", 30, what="the key dialog again")
        d.find_element(By.ID, "key-input").send_keys("opensesame")
        d.find_element(By.ID, "key-submit").click()
        wait(d, "document.getElementById('compare-out').dataset.state", 60, what="both replies")
        out = d.find_element(By.ID, "compare-out")
        assert out.get_attribute("data-state") == "done" and out.get_attribute("data-timings1")
        assert not d.execute_script("return document.getElementById('key-dialog').open")
        no_console_errors_but(d, "status of 401")
    finally:
        stop_clean(srv)


def test_a_recorded_easd_loss_is_said_where_the_mode_is_picked(tiny_draft, tiny_target, tmp_path, monkeypatch):
    """A pair whose recorded comparison found easd-tf significantly worse: serve's load line says
    it, and /props gives it in easd-tf's note (the page's mode note), not in easd's."""
    from easd_local.engine.verdict import Verdict
    from easd_local.store.profiles import file_id, record_verdict

    v = Verdict(dataset="gsm8k", problems=1319, method="easd-tf", against="target", accuracy=0.588,
                against_accuracy=0.637, wins=124, losses=189, p=0.0003, temperature=0.0)
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))  # the server's home (``start_tiny``)
    record_verdict(file_id(tiny_draft), file_id(tiny_target), v)
    srv = start_tiny(tiny_draft, tiny_target, tmp_path, "--mode", "easd-tf", "--threads", "1")
    try:
        status, _, props = http("GET", srv.base + "/props")
        notes = {m["name"]: m["note"] for m in props["modes"]}
        assert status == 200 and v.summary() in notes["easd-tf"] and "not lossless" in notes["easd-tf"]
        assert "points" not in notes["easd"] and "points" not in notes["sd"]
    finally:
        out = stop_clean(srv)
    assert v.summary() in " ".join(out.split()), out  # the load line (wrapped or not)


@needs_browser
def test_the_page_says_the_recorded_loss_where_an_easd_mode_is_picked(tiny_draft, tiny_target, browser, tmp_path,
                                                                      monkeypatch):
    """The mode note in the settings, and under side by side's two pickers (which said only "not
    lossless"), give the recorded loss of the EASD mode picked; lossless picks have no note."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    from easd_local.engine.verdict import Verdict
    from easd_local.store.profiles import file_id, record_verdict

    v = Verdict(dataset="gsm8k", problems=1319, method="easd-tf", against="target", accuracy=0.588,
                against_accuracy=0.637, wins=124, losses=189, p=0.0003, temperature=0.0)
    monkeypatch.setenv("EASD_LOCAL_HOME", str(tmp_path / "home"))
    record_verdict(file_id(tiny_draft), file_id(tiny_target), v)
    srv = start_tiny(tiny_draft, tiny_target, tmp_path, "--mode", "sd", "--threads", "1")
    try:
        d = browser
        open_page(d, srv)
        Select(d.find_element(By.ID, "set-mode")).select_by_value("easd-tf")
        note = d.find_element(By.ID, "mode-note").text
        assert "not lossless" in note and v.summary() in note, note
        d.find_element(By.ID, "tab-compare").click()
        compare_note = lambda: d.find_element(By.ID, "compare-note").text  # noqa: E731
        Select(d.find_element(By.ID, "mode-a")).select_by_value("sd")
        Select(d.find_element(By.ID, "mode-b")).select_by_value("target")
        assert compare_note() == ""
        Select(d.find_element(By.ID, "mode-b")).select_by_value("easd-tf")
        assert "easd-tf is not lossless" in compare_note() and v.summary() in compare_note(), compare_note()
        Select(d.find_element(By.ID, "mode-a")).select_by_value("easd")
        assert "easd is not lossless" in compare_note() and compare_note().count(v.summary()) == 1
    finally:
        stop_clean(srv)
