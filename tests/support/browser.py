"""Debian's Chromium driven by Playwright's sync API, for the browser tests: where it is,
its flags, and a page that records the errors the page itself reports."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.programs import require_program

#: where Debian's chromium package puts it (``.ci/system-packages`` installs it)
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
BROWSER_TIMEOUT = 120.0


def require_chromium() -> None:
    """Skips the calling test where Debian's chromium is missing (see support.programs)."""
    if not CHROMIUM.exists():
        require_program("chromium", "the browser tests drive Debian's chromium through Playwright")


@contextmanager
def chromium_page(**options: Any) -> Iterator[tuple[Any, list[str]]]:
    """A new page in Chromium and the list its uncaught exceptions and console errors go
    to. Run in a worker thread: Playwright's sync API needs a thread with no running
    event loop, and trio-asyncio's loop policy is replaced by the default one meanwhile."""
    from playwright.sync_api import sync_playwright

    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
            try:
                page = browser.new_page(**options)
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
                yield page, errors
            finally:
                browser.close()
    finally:
        asyncio.set_event_loop_policy(None)
