"""A real headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by selenium: what the web
console's test (tests/integration/test_tenants.py) logs in with. scripts/setup.sh installs both; the test
skips, saying so, only where they are missing.

    with browser.chromium(tmp_path) as driver:
        driver.get(url)
"""

import contextlib
import shutil

import pytest

# selenium's locator strategies (By.ID, By.CSS_SELECTOR) by value: a test module imports without selenium
ID = "id"
CSS = "css selector"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# as root (--no-sandbox) on a closed network: without the background-networking flags Chromium keeps trying
# to reach Google's services and misbehaves
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,800",
]


def require():
    """Skip the calling test, with the reason, where Chromium, its driver or selenium is missing."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            pytest.skip(f"{path} is missing: apt-get install chromium chromium-driver (scripts/setup.sh does)")
    pytest.importorskip("selenium", reason="selenium is missing: pip install -r requirements-test.txt")


@contextlib.contextmanager
def chromium(workdir):
    """A fresh headless Chromium with its own profile in ``workdir`` (no cookie, storage or cache of another)."""
    require()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={workdir / 'chromium-profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver, condition, timeout=60, message=""):
    """Wait until ``condition(driver)`` is truthy (selenium's WebDriverWait: a condition, never a sleep)."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition, message)
