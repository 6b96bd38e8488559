"""The page's Live tab in headless Chromium against the real gateway: Chromium's fake microphone speaks, the
transcript appears on the session's timeline, a client delegation shows as it happens and is answered from the
page with commentary, which the voice then says. Needs Debian's chromium and Playwright (as tests/transports)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

async_api = pytest.importorskip("playwright.async_api", reason="Playwright for Python is not installed")

from bench.fake_openai import FakeOpenAI  # noqa: E402
from gateway.audio import wav_bytes  # noqa: E402
from tests.conftest import load_pcm, silence  # noqa: E402
from tests.helpers.chromium import CHROMIUM, chromium_args, until  # noqa: E402
from tests.helpers.live import voice_model  # noqa: E402

if CHROMIUM is None:
    pytest.skip("chromium is not installed (Debian: apt-get install chromium)", allow_module_level=True)

pytestmark = pytest.mark.asyncio


@asynccontextmanager
async def open_page(gateway: Any, wav: Path, problems: list[str]) -> AsyncIterator[Any]:
    """The gateway's page, the fake microphone playing ``wav`` (in a loop)."""
    async with async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=chromium_args(wav))
        try:
            page = await browser.new_page()
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
            await page.goto(f"http://127.0.0.1:{gateway.port}/")
            yield page
        finally:
            await browser.close()


async def test_the_live_tab_shows_the_timeline_and_answers_a_delegation(start_pipeline: Any, tmp_path: Path) -> None:
    wav = tmp_path / "question.wav"  # one question, then a minute of quiet: the loop does not talk over the answer
    wav.write_bytes(wav_bytes(load_pcm("one_sentence.wav") + silence(60_000)))
    async with FakeOpenAI(reply=voice_model, transcript="Please check the staging status.") as fake:
        gateway = await start_pipeline(fake)
        problems: list[str] = []
        async with open_page(gateway, wav, problems) as page:
            await page.click("#tabs [data-tab='live']")
            assert await page.is_visible("#live-tab") and await page.is_hidden("#conversation-tab")
            await page.fill("#live-instructions", "Delegate checks to the client.")
            await page.click("#live-connect")
            await until(page, "document.getElementById('live-status').textContent.startsWith('live: live_')")
            await until(page, "document.querySelector('#live-timeline li.delegation form')")
            await until(page, "document.getElementById('live-timeline').textContent.includes('Okay, checking now.')")
            timeline = await page.text_content("#live-timeline")
            assert "You: Please check the staging status." in timeline
            await page.fill("#live-timeline li.delegation form input", "Staging is healthy.")
            await page.click("#live-timeline li.delegation form button")
            await until(page, "document.getElementById('live-timeline').textContent.includes("
                              "'Voice: Okay, checking now. Staging is healthy.')")
            await page.click("#live-connect")  # Stop: session.close, then session.closed
            await until(page, "document.getElementById('live-status').textContent.startsWith('closed (close_"
                              "requested)')")
        assert not [p for p in problems if "Live" in p or "page error" in p], problems
