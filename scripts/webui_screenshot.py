"""The README's screenshots of the chat page: `easd-local serve` on a pair (default: the
default pair, greedy easd-tf), a real headless Chromium driven as tests/test_webui.py drives
it, one question typed and sent, the reply's first gate fire clicked so that its figures show;
then the side-by-side view of the same question (sd against the gated mode).

Prints the reply's statistics and the machine's load. Exits 1 when the reply has no gate fire
(the screenshot is meant to show some: try another --prompt or more --max-tokens).

    python scripts/webui_screenshot.py --out docs/webui.png --side-by-side docs/webui-side-by-side.png

``--maths PNG`` instead shows how a finished reply is drawn as Markdown and maths over its coloured
tokens: the page is given the tests' canned reply (tests/browser_helpers.py: MATHS_TEXT, an origin
of every kind in a fixed cycle) in place of the server's stream, so any pair will do (the tests'
tiny one: --draft/--target), and its first gate fire is clicked:

    python scripts/webui_screenshot.py --draft D --target T --maths docs/webui-maths.png
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' server and browser drivers

DEFAULT_PROMPT = ("A farmer has 17 rows of apple trees with 23 trees in each row. He sells the apples "
                  "of 40 trees. How many trees are left? Explain briefly.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/webui.png", help="the chat view's PNG")
    ap.add_argument("--side-by-side", default=None, help="also the side-by-side view's PNG")
    ap.add_argument("--pair", default="default")
    ap.add_argument("--draft", default=None, help="a draft file instead of --pair (with --target)")
    ap.add_argument("--target", default=None)
    ap.add_argument("--maths", default=None, help="only the canned Markdown-and-maths reply, to this PNG")
    ap.add_argument("--mode", default="easd-tf")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--width", type=int, default=1280)
    args = ap.parse_args()

    from browser_helpers import find_browser

    browser, driver, why = find_browser()
    if why:
        print(f"no browser: {why}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="webui-shot-") as tmp:
        return shots(args, Path(tmp), browser, driver)


def shots(args, tmp: Path, browser: str, driver: str) -> int:
    from browser_helpers import chrome, wait
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from serve_helpers import ServerProc

    which = ["--draft", args.draft, "--target", args.target] if args.draft else ["--pair", args.pair]
    srv = ServerProc([*which, "--mode", args.mode, "--max-tokens", str(args.max_tokens),
                      "--threads", str(args.threads), "--parallel", "2"], tmp / "server.log", timeout=600)
    d = None
    try:
        srv.wait_ready(timeout=600)
        d = chrome(browser, driver, args.width, 1000)
        d.get(srv.base + "/")
        wait(d, "document.body.dataset.ready", 60)
        if args.maths:
            return maths_shot(d, args)
        d.find_element(By.ID, "input").send_keys(args.prompt)
        d.find_element(By.ID, "send").click()
        wait(d, "document.querySelector('.msg.assistant')?.dataset.state === 'done'", 900, "the reply")
        t = json.loads(d.find_element(By.CSS_SELECTOR, ".msg.assistant").get_attribute("data-timings"))
        origins = Counter(d.execute_script(
            "return [...document.querySelectorAll('.msg.assistant .tok')].map(s => s.dataset.origin)"))
        print(f"reply: {t['predicted_n']} tokens, {t['predicted_per_second']:.1f} tok/s, gate fires {t['gate_fires']}, "
              f"draft consults {t['draft_consults']}, mode {t['mode']}, thresholds {t['tau_draft']}/{t['tau_target']} "
              f"({t['thresholds_source']}); tokens on the page by origin: {dict(origins)}")
        fires = d.find_elements(By.CSS_SELECTOR, ".msg.assistant .tok.o-easd")
        if not fires:
            print("the reply has no gate fire: nothing to show; try another --prompt", file=sys.stderr)
            return 1
        fires[0].click()
        shoot(d, args.out, args.width)
        if args.side_by_side:
            d.find_element(By.ID, "tab-compare").click()
            d.find_element(By.ID, "compare-input").send_keys(args.prompt)
            Select(d.find_element(By.ID, "mode-a")).select_by_value("sd")
            Select(d.find_element(By.ID, "mode-b")).select_by_value(args.mode)
            d.find_element(By.ID, "compare").click()
            wait(d, "document.getElementById('compare-out').dataset.state", 1800, "both replies")
            print("side by side:", d.find_element(By.ID, "compare-summary").text)
            shoot(d, args.side_by_side, args.width)
        print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    finally:
        if d is not None:
            d.quit()
        srv.stop()
    return 0


def maths_shot(d, args) -> int:
    from browser_helpers import MATHS_TEXT, serve_canned_reply, token_records, wait
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    Select(d.find_element(By.ID, "set-mode")).select_by_value(args.mode)  # the mode the canned timings name
    serve_canned_reply(d, token_records(MATHS_TEXT), mode=args.mode)
    d.find_element(By.ID, "input").send_keys(args.prompt)
    d.find_element(By.ID, "send").click()
    wait(d, "document.querySelector('.msg.assistant')?.dataset.rendered", 60, "the rendered reply")
    wait(d, "document.fonts.status === 'loaded'", 60, "KaTeX's fonts")
    d.find_element(By.CSS_SELECTOR, ".msg.assistant .tok.o-easd").click()
    shoot(d, args.maths, args.width)
    return 0


def shoot(d, out: str, width: int) -> None:
    """The whole page in one PNG: the window made as tall as the page first."""
    height = d.execute_script("return Math.max(document.documentElement.scrollHeight, 600)")
    d.set_window_size(width, min(height + 140, 4000))  # + the window's own bars
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    d.save_screenshot(out)
    print("wrote", out)


if __name__ == "__main__":
    sys.exit(main())
