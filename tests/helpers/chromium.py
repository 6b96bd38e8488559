"""Debian's Chromium, headless through Playwright for Python, as the page's tests start it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")  # None: not installed
WAIT_MS = 20_000  # upper bound per step; the whole test takes a few seconds


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
