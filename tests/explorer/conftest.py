"""A real broker per module (the root conftest's ``broker``) and one headless Chromium per module, driven with
Playwright: Debian's /usr/bin/chromium (scripts/test.sh installs it when missing), never a downloaded browser."""

from __future__ import annotations

import itertools
import os
import shutil

import pytest

CHROMIUM = os.environ.get("SHARDBUS_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
_names = itertools.count()


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"no Chromium at {CHROMIUM}: scripts/test.sh installs Debian's chromium")
        pytest.skip(f"no Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def context(browser):
    """A fresh browser profile (no cookies) per test."""
    c = browser.new_context()
    c.set_default_timeout(15_000)
    yield c
    c.close()


@pytest.fixture(scope="module")
def base(broker) -> str:
    return f"http://127.0.0.1:{broker.server.port}/explorer"


@pytest.fixture
def name():
    def make(prefix: str = "e") -> str:
        return f"{prefix}{next(_names)}"

    return make
