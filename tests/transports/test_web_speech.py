"""The page's Speech tab in headless Chromium against the real gateway: a text spoken through
/v1/audio/speech into the page's player with its first-byte time shown; and a voice made in the browser,
its consent and sample recorded from the (fake) microphone, then spoken.

Needs Debian's ``chromium`` and Playwright for Python (as tests/transports/test_web.py); the voice test
also the local extra (piper's voice reads the consent phrase into the fake microphone; whisper hears it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

async_api = pytest.importorskip("playwright.async_api", reason="Playwright for Python is not installed")

from bench.fake_openai import FakeOpenAI  # noqa: E402
from gateway.audio import wav_bytes  # noqa: E402 - after the skip
from gateway.runtime.voices.library import BASE_CHECKPOINT, DESIGN_CHECKPOINT  # noqa: E402
from tests import speakers  # noqa: E402
from tests.helpers.chromium import CHROMIUM, chromium_args, until  # noqa: E402
from tests.helpers.responders import realtime_pipeline  # noqa: E402
from tests.paths import DATA, TINY_CHECKPOINT  # noqa: E402

if CHROMIUM is None:
    pytest.skip("chromium is not installed (Debian: apt-get install chromium)", allow_module_level=True)

pytestmark = pytest.mark.slow  # headless Chromium


async def open_speech_tab(browser, gateway, problems: list[str]):
    page = await browser.new_page()
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    await page.goto(f"http://127.0.0.1:{gateway.port}/")
    await page.click("#tabs [data-tab='speech']")
    await until(page, "window.__speech.capabilities !== null && document.querySelector('#speech-voice').options.length")
    assert await page.is_hidden("#conversation-tab") and await page.is_visible("#speech-tab")
    return page


async def test_the_speech_tab_streams_into_the_player(start_gateway) -> None:
    gateway = await start_gateway(tts__engine="tone")
    problems: list[str] = []
    async with async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM,
                                                   args=chromium_args(speakers_wav(None)))
        try:
            page = await open_speech_tab(browser, gateway, problems)
            assert await page.is_hidden("#speech-instructions-label")  # the tone engine follows none
            await page.fill("#speech-text", "Hello from the page.")
            await page.click("#speech-speak")
            await until(page, "window.__speech.spoken === 1 && window.__speech.played > 0")
            stats = await page.evaluate("() => window.__speech")
            timing = await page.text_content("#speech-timing")
        finally:
            await browser.close()
    assert problems == [] and stats["errors"] == []
    assert stats["bytes"] == len("Hello from the page.") * 2 * 24000 * 60 // 1000  # the tone engine's 60 ms a character
    assert 0 < stats["firstByteMs"] <= stats["totalMs"]
    shown = re.search(r"first byte after (\d+) ms", timing)  # the page's toFixed(0), not Python's round
    assert shown and abs(int(shown[1]) - stats["firstByteMs"]) <= 0.5, timing


MENU = "(id) => [...document.getElementById(id).options].map((o) => o.text)"
MAKING = ["#voice-name", "#consent-language", "#record-consent", "#record-sample", "#create-voice"]


async def test_the_page_offers_the_voices_there_are_and_says_what_making_one_lacks(start_gateway) -> None:
    """The demo's case: speech-to-text, an engine that speaks every name alike, no Qwen3-TTS checkpoint. Both
    tabs offer its one voice (not OpenAI's ten names, spoken alike), in full; the Speech tab names what
    making a voice lacks, and only that, and turns off what needs it."""
    async with FakeOpenAI() as fake:
        gateway = await start_gateway(realtime_pipeline(fake.base_url), stt__base_url=fake.base_url,
                                      stt__model="whisper-test")
        problems: list[str] = []
        async with async_api.async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=chromium_args(speakers_wav(None)))
            try:
                page = await open_speech_tab(browser, gateway, problems)
                await until(page, "document.querySelector('#voice').options[0].value === 'alloy'")
                menus = [await page.evaluate(MENU, menu) for menu in ("voice", "speech-voice")]
                disabled = [await page.is_disabled(f"#{menu}") for menu in ("voice", "speech-voice")]
                note = await page.text_content("#speech-make-note")
                making = [await page.is_disabled(control) for control in MAKING]
            finally:
                await browser.close()
    assert menus == [["tone (a test signal, no speech)"]] * 2 and disabled == [True, True]
    assert note == (f"This gateway cannot clone a voice: it lacks {BASE_CHECKPOINT}. "
                    f"Nor design one from a description: it lacks {DESIGN_CHECKPOINT}.")
    assert all(making) and problems == []


@pytest.mark.skipif(speakers.missing() is not None, reason=speakers.missing() or "")
async def test_a_voice_recorded_in_the_browser(start_gateway, tmp_path: Path) -> None:
    """The fake microphone reads the consent phrase (a pause, then piper's joe, in a loop); the page records
    it as the consent and again as the sample, creates the voice, and speaks in it."""
    checkpoints = ",".join(str(p) for p in (TINY_CHECKPOINT, DATA / "qwen3_tts_tiny_base"))
    gateway = await start_gateway(tts__engine="qwen3", engine__checkpoint=checkpoints, engine__device="cpu",
                                  engine__voices={"alloy": "vivian"}, engine__max_frames=40, local__stt=True,
                                  voices__dir=str(tmp_path / "voices"), voices__similarity_threshold=0.998)
    microphone = speakers_wav(tmp_path)
    loop_ms = (len(microphone.read_bytes()) - 44) // 48
    problems: list[str] = []
    async with async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=chromium_args(microphone))
        try:
            page = await open_speech_tab(browser, gateway, problems)
            assert await page.text_content("#consent-phrase") == speakers.CONSENT_PHRASES["en"]
            # The tiny checkpoint's five speakers, alloy the name [engine.voices] gives vivian; all of it on.
            assert await page.evaluate(MENU, "speech-voice") == ["alloy (vivian)", "dylan", "eric", "ryan", "serena"]
            assert not any([await page.is_disabled(control) for control in MAKING if control != "#create-voice"])
            assert (await page.text_content("#speech-make-note")).startswith("Record the speaker reading")
            for what in ("consent", "sample"):
                await page.click(f"#record-{what}")
                # Each recording opens the microphone afresh, and Chromium's fake one starts its file over: one
                # loop is the pause (room for the recorder to start) and the phrase whole.
                await page.wait_for_timeout(loop_ms + 500)
                await page.click(f"#record-{what}")
                await until(page, f"document.querySelector('#{what}-status').textContent.includes('recorded')")
            await page.click("#create-voice")
            await until(page, "window.__speech.created.length === 1 || window.__speech.errors.length > 0")
            stats = await page.evaluate("() => window.__speech")
            assert stats["errors"] == [], stats["errors"]
            (voice,) = stats["created"]
            assert await page.input_value("#speech-voice") == voice
            await page.fill("#speech-text", "Hello.")
            await page.click("#speech-speak")
            await until(page, "window.__speech.spoken === 1 || window.__speech.errors.length > 0")
            stats = await page.evaluate("() => window.__speech")
        finally:
            await browser.close()
    assert problems == [] and stats["errors"] == [] and stats["bytes"] > 0
    assert [v["id"] for v in stats["voices"]] == [voice]


def speakers_wav(folder: Path | None) -> Path:
    """The fake microphone's file: 1.5 s of silence, then piper's joe reading the consent phrase; without a
    folder, the repository's fixture sentence (the speaking test records nothing)."""
    if folder is None:
        return DATA.parent / "fixtures" / "one_sentence.wav"
    path = folder / "consent-phrase.wav"
    path.write_bytes(wav_bytes(bytes(48 * 1500) + speakers.joe_consent()[44:]))
    return path
