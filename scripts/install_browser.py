"""Install the headless browser that tests/test_webui.py drives: Debian's chromium and
chromium-driver, through apt-get, where that is possible (root on a Debian-like system).

Prints what it did, or why it did nothing; exits 1 when no browser could be had, and the
browser tests then skip with the reason (the README's test command runs this with ``|| true``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

PACKAGES = ["chromium", "chromium-driver", "fonts-liberation"]  # fonts: a bare system has none to draw text with


def have_browser() -> bool:
    return shutil.which("chromedriver") is not None and any(
        shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome"))


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    if have_browser():
        print("install_browser: chromium and chromedriver are installed")
        return 0
    if shutil.which("apt-get") is None:
        print("install_browser: no apt-get here: install chromium and chromedriver yourself; "
              "the browser tests skip until then", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("install_browser: not root: run  sudo apt-get install chromium chromium-driver ; "
              "the browser tests skip until then", file=sys.stderr)
        return 1
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]):
        print("install_browser:", " ".join(cmd), flush=True)
        r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["no message"])[-1]
            print(f"install_browser: {cmd[1]} failed ({last}); the browser tests skip", file=sys.stderr)
            return 1
    if not have_browser():
        print("install_browser: installed, but no chromium/chromedriver on PATH; the browser tests skip",
              file=sys.stderr)
        return 1
    print("install_browser: chromium and chromedriver installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
