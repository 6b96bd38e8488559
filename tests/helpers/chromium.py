"""Debian's Chromium, headless through Playwright for Python, as the page's tests start it."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.paths import FIXTURES, ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")  # None: not installed
WAIT_MS = 20_000  # upper bound per step; the whole test takes a few seconds
SPEECH = FIXTURES / "one_sentence.wav"  # what the fake microphone says
ARTIFACTS = ROOT / "artifacts"  # screenshots for a person to look at


def chromium_args(wav: Path) -> list[str]:
    """Chromium's flags: headless on a server, and a fake microphone speaking ``wav`` in a loop."""
    return [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
    ]


async def until(page: Any, condition: str) -> None:
    # As a function, not an expression: Playwright evaluates a bare expression with eval(), which the
    # page's Content-Security-Policy forbids.
    await page.wait_for_function(f"() => ({condition})", polling=50, timeout=WAIT_MS)


@asynccontextmanager
async def open_page(gateway: Any, problems: list[str] | None = None) -> AsyncIterator[Any]:
    """The gateway's page in headless Chromium, its fake microphone speaking SPEECH; page errors go to problems."""
    from playwright import async_api  # the dev extra's; the tests that call this skip without it

    async with async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=chromium_args(SPEECH))
        try:
            page = await browser.new_page()
            if problems is not None:
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
            await page.goto(f"http://127.0.0.1:{gateway.port}/")
            yield page
        finally:
            await browser.close()
