"""A real headless Chromium driven by Selenium, for the chat page's tests (and the README's
screenshot, scripts/webui_screenshot.py).

The browser is the system's (Debian's ``chromium`` and ``chromium-driver``: ``.ci/run`` installs
them where it can, through scripts/install_browser.py); nothing is downloaded. ``find_browser``
says why not when there is none, so that the tests skip with that reason.
"""

from __future__ import annotations

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
    """A headless Chromium of this window size; its console log is kept (``get_log``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-extensions", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(driver))


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
