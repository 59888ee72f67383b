"""A real headless Chromium (Debian's package) driven by Playwright, for the browser tests."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

import host_names

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def require_chromium():
    """Playwright's sync API, where Playwright and Chromium are installed; else skips,
    except with $CI set, where that fails."""
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    if CHROMIUM is None:
        reason = "no chromium on PATH (scripts/setup --test installs it as root)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return playwright


@contextlib.contextmanager
def chromium_page(failure_dir, width: int = 1400, height: int = 1000):
    """A fresh page; on a failing test, a full-page screenshot goes to ``failure_dir``.

    Skips without Chromium, except with $CI set, where that fails.
    """
    playwright = require_chromium()
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + host_names.chromium_rules())
        page = browser.new_context(viewport={"width": width, "height": height}).new_page()
        try:
            yield page
        except BaseException:
            page.screenshot(path=str(failure_dir / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
