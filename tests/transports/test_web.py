"""The web page in headless Chromium against the real gateway (echo responder, in-process).

Chromium's fake microphone plays tests/fixtures/one_sentence.wav in a loop: the sentence is a user
turn, the echo reply starts in the pause after it, and the next round of the sentence interrupts
that reply, so one run sees a turn, playback and a barge-in with its truncate. The user's side is
transcribed by the local whisper when the "local" extra is installed, else by the fake STT server.

Needs Debian's ``chromium`` package and Playwright for Python (``pip install playwright``; never
``playwright install``: the system Chromium is used). Skipped with the reason when either is absent.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import AsyncIterator

import orjson
import pytest

async_api = pytest.importorskip("playwright.async_api", reason="Playwright for Python is not installed")

from bench.launcher import free_port  # noqa: E402 - after the skip
from tests.helpers.chromium import ARTIFACTS, CHROMIUM, open_page, until  # noqa: E402 - after the skip
from tests.helpers.responders import realtime_pipeline  # noqa: E402

if CHROMIUM is None:
    pytest.skip("chromium is not installed (Debian: apt-get install chromium)", allow_module_level=True)

from bench.fake_openai import FakeOpenAI  # noqa: E402
from gateway.responders.build import LOCAL_STT, installed  # noqa: E402 - after the skips

pytestmark = pytest.mark.slow  # headless Chromium

@pytest.fixture
async def transcribing() -> AsyncIterator[dict[str, object]]:
    """Config overrides that give the gateway a speech-to-text: the local whisper, else the fake server."""
    if installed(LOCAL_STT):
        yield {"local__stt": True}
        return
    async with FakeOpenAI(transcript="The quick brown fox jumps over the lazy dog.") as fake:
        yield {"stt__base_url": fake.base_url, "stt__model": "whisper-test"}


RESAMPLER_CHECK = """async ([inRate, chunk]) => {
  const { StreamResampler } = await import("/resampler.js");
  const resampler = new StreamResampler(inRate, 24000);
  const tone = (i, rate) => 0.5 * Math.sin((2 * Math.PI * 1000 * i) / rate);
  const out = [];
  for (let start = 0; start < inRate; start += chunk) {
    const input = Float32Array.from({ length: Math.min(chunk, inRate - start) }, (_, k) => tone(start + k, inRate));
    out.push(...resampler.process(input));
  }
  let signal = 0, error = 0;
  for (let i = 1000; i < out.length - 1000; i++) {
    signal += tone(i, 24000) ** 2;
    error += (out[i] - tone(i, 24000)) ** 2;
  }
  return { samples: out.length, snrDb: 10 * Math.log10(signal / error) };
}"""


async def test_microphone_resampler_is_continuous_across_chunks(start_gateway) -> None:
    """The capture worklet's resampler carries state: odd chunk sizes give a clean tone, no clicks."""
    gateway = await start_gateway()
    async with open_page(gateway) as page:
        for rate, chunk in ((48000, 128), (44100, 100), (24000, 128)):
            result = await page.evaluate(RESAMPLER_CHECK, [rate, chunk])
            assert abs(result["samples"] - 24000) < 40  # one second in, one second out (less the delay)
            assert result["snrDb"] > 90


BARS = """() => [...document.querySelectorAll('#latency-chart rect.bar')]
  .map((r) => ({ stage: r.dataset.stage, width: r.getBBox().width }))"""


async def test_turn_playback_and_barge_in(start_gateway, transcribing) -> None:
    gateway = await start_gateway(**transcribing)
    problems: list[str] = []
    async with open_page(gateway, problems) as page:
        # The banner says what answers, before anything starts.
        await until(page, "window.__gateway.responder !== null")
        banner = await page.locator("#responder").inner_text()
        assert banner.startswith("Echo (repeats you)") and "whisper" in banner
        # The echo has no voice to choose: the menu says so instead of offering ten names.
        assert await page.is_disabled("#voice")
        assert await page.locator("#voice option").all_inner_texts() == ["your own voice (echo)"]
        # Settings chosen before starting go out in the first session.update.
        await page.fill("#silence", "450")
        await page.fill("#instructions", "Answer in one sentence.")
        await page.click("#connect")

        await until(page, "window.__gateway.state === 'connected'")
        assert await page.locator("#connect").inner_text() == "Stop"
        await until(page, "window.__gateway.events['session.updated'] >= 1")
        await page.click("#apply")
        await until(page, "window.__gateway.events['session.updated'] >= 2")
        await until(page, "window.__gateway.speechStopped >= 1")  # a user turn was detected
        await until(page, "window.__gateway.playedSamples > 0")  # its reply was heard
        await until(page, "window.__gateway.events['conversation.item.truncated'] >= 1")  # barge-in
        await until(page, "window.__gateway.turns.some((t) => t.server)")  # the gateway's own timings
        # The user's words, transcribed, in the row of that turn.
        await until(page, "window.__gateway.turns[0].marks.transcript !== undefined")
        stats = await page.evaluate("window.__gateway")

        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)

        assert stats["errors"] == [] and problems == []
        assert stats["sentAppends"] > 0 and stats["speechStarted"] >= 2
        assert stats["bargeIns"] >= 1
        truncate = stats["truncates"][0]
        assert truncate["item_id"].startswith("item_")
        assert 0 < truncate["audio_end_ms"] <= stats["receivedSamples"] / 24
        turn = stats["turns"][0]
        # Measured from when the page sent the speech's last sample: the VAD's 450 ms of silence included.
        assert turn["responseId"] and not turn["endEstimated"] and turn["heardMs"] >= 400
        marks = turn["marks"]
        assert 400 <= marks["stopped"] <= marks["audio"] <= marks["heard"] == turn["heardMs"]
        assert "first_delta_ms" in turn["server"]

        # Whisper tiny hears the fake microphone (echo-cancelled, resampled twice) only roughly: "the quick
        # round-fark stump over the lazy nard" is typical. Some of the sentence's words, then.
        user = set(re.findall(r"[a-z]+", (await page.locator("#transcript li.user .text").first.inner_text()).lower()))
        assert len(user & {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"}) >= 3, user
        assert "(audio)" in await page.locator("#transcript li.assistant").first.inner_text()  # echo: no text
        assert await page.locator("#transcript li.assistant.interrupted").count() >= 1
        assert "interrupted" in await page.locator("#transcript").inner_text()

        # The chart drew the turn: a bar per milestone it reached, as long as its time.
        bars = [b for b in await page.evaluate(BARS) if b["width"] > 1]
        assert {"stopped", "transcript", "audio", "heard"} <= {b["stage"] for b in bars}
        width = {b["stage"]: b["width"] for b in bars[:5]}
        assert width["stopped"] < width["heard"]
        chart = await page.locator("#latency-chart").inner_html()
        assert "first audio" in chart and "ms after the end of your speech" in chart

        # The microphone: the chosen device named, the meter moved with the speech.
        assert stats["levelPeak"] > 0.01
        assert await page.locator("#mic-name").inner_text() not in ("", "no microphone open")
        assert await page.locator("#mic option").count() >= 2  # listed with their names after permission

        # The form shows what the server confirmed in session.updated.
        assert await page.input_value("#silence") == "450"
        assert await page.input_value("#instructions") == "Answer in one sentence."

        # Without turn detection the user ends the turn with "Send turn".
        assert await page.is_disabled("#commit")
        updates = await page.evaluate("window.__gateway.events['session.updated']")
        await page.uncheck("#vad")
        await page.click("#apply")
        await until(page, f"window.__gateway.events['session.updated'] > {updates}")
        assert await page.is_enabled("#commit")
        appends = await page.evaluate("window.__gateway.sentAppends")
        await until(page, f"window.__gateway.sentAppends >= {appends + 10}")  # the server wants ≥ 100 ms
        responses = await page.evaluate("window.__gateway.events['response.done']")
        await page.click("#commit")
        await until(page, f"window.__gateway.events['response.done'] > {responses}")

        # A refused setting is shown, and the form goes back to what the server holds.
        await page.check("#vad")
        await page.fill("#silence", "20000")
        await page.click("#apply")
        await until(page, "window.__gateway.errors.length > 0")
        assert "invalid_value" in (await page.evaluate("window.__gateway.errors"))[0]
        assert await page.locator("#notice").is_visible()
        assert not await page.is_checked("#vad")  # turn detection stays off, as the server holds it

        # Stop is a normal end: idle, not an error.
        await page.click("#connect")
        await until(page, "window.__gateway.state === 'idle'")
        assert await page.locator("#connect").inner_text() == "Start"
        assert await page.locator("#status").inner_text() == "idle"
        assert len(await page.evaluate("window.__gateway.errors")) == 1

        # A connection failure is shown plainly.
        await gateway.stop()
        await page.click("#connect")
        await until(page, "window.__gateway.errors.length > 1")
        assert "could not connect" in await page.locator("#errors").inner_text()


LONG_REPLY = ("Sure. Here is a long answer about the weather, so that your next words cut it short while it "
              "still plays: sunny in the morning, clouds after noon, and a little rain in the evening.")


async def test_an_interrupted_reply_shows_what_was_heard(start_gateway) -> None:
    """The reply is cut by the next round of the fake microphone's sentence: the row shows the words the listener
    heard (the gateway's truncated transcript) and the rest greyed out; then back to listening."""
    async with FakeOpenAI(reply=LONG_REPLY, transcript="The quick brown fox jumps over the lazy dog.") as fake:
        gateway = await start_gateway(realtime_pipeline(fake.base_url), stt__base_url=fake.base_url,
                                      stt__model="whisper-test")
        problems: list[str] = []
        async with open_page(gateway, problems) as page:
            await until(page, "window.__gateway.health?.backends?.llm?.reachable === true")
            assert await page.locator("#backends li[data-role='llm']").inner_text() == "LLM llm-test"
            assert await page.is_disabled("#voice")  # the tone engine: one voice, whatever the name
            await page.click("#connect")
            await until(page, "document.querySelector('#transcript .unheard')?.textContent.length > 0")
            row = page.locator("#transcript li.assistant").first
            heard = await row.locator(".heard").inner_text()
            unheard = await row.locator(".unheard").inner_text()
            # What had come of the reply (the rest was never made: the barge-in cancelled it), divided.
            assert LONG_REPLY.startswith(heard + unheard) and heard and unheard.strip(), (heard, unheard)
            assert "interrupted: heard" in await row.inner_text()
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "page-interrupted.png"), full_page=True)
            await page.click("#connect")
            await until(page, "window.__gateway.state === 'idle'")
        assert problems == []


async def test_a_failed_reply_is_told_once_and_the_page_listens_again(start_gateway) -> None:
    """With the LLM server down: the banner says so before anyone speaks, a turn's failure is one notice (not
    the error event and the failed response.done each), and the page goes back to listening."""
    async with FakeOpenAI(transcript="The quick brown fox jumps over the lazy dog.") as stt:
        llm = realtime_pipeline(f"http://127.0.0.1:{free_port()}/v1")
        gateway = await start_gateway(llm, stt__base_url=stt.base_url, stt__model="whisper-test")
        problems: list[str] = []
        async with open_page(gateway, problems) as page:
            await until(page, "window.__gateway.health?.status === 'degraded'")
            llm = await page.locator("#backends li[data-role='llm']").inner_text()
            assert llm == "LLM llm-test: unreachable (connection refused)"
            assert await page.locator("#responder").get_attribute("data-kind") == "degraded"
            await page.click("#connect")
            await until(page, "window.__gateway.events['response.done'] >= 1")
            await until(page, "window.__gateway.activity === 'listening'")
            assert await page.locator("#errors li").count() == 1
            notice = await page.locator("#errors li").inner_text()
            assert "llm_backend_error" in notice and "connection refused" in notice
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "page-failed.png"), full_page=True)
        assert problems == []


DRAIN_NOTICE = {"type": "error", "event_id": "event_drain", "error": {
    "type": "server_error", "code": "server_shutting_down", "param": None, "event_id": None,
    "message": "This server is shutting down: the session closes in 5 s. Start a new session to continue."}}


async def test_the_drain_notice_and_the_servers_close_are_shown(start_gateway) -> None:
    """A draining gateway's last words (the server_shutting_down error, then close 1001), added by a route
    on the page's real WebSocket to the gateway: the page shows both as notices, not as faults."""
    gateway = await start_gateway()
    problems: list[str] = []
    async with open_page(gateway, problems) as page:
        routes = []

        def relay(route) -> None:
            route.connect_to_server()  # everything else passes through both ways
            routes.append(route)

        await page.route_web_socket("**/v1/realtime", relay)
        await page.click("#connect")
        await until(page, "window.__gateway.events['session.updated'] >= 1")
        routes[0].send(orjson.dumps(DRAIN_NOTICE).decode())
        await until(page, "window.__gateway.errors.length >= 1")
        await routes[0].close(code=1001, reason="Going away")
        await until(page, "window.__gateway.state === 'closed'")
        notices = await page.locator("#errors li.warn").all_inner_texts()
        assert await page.locator("#notice").is_visible() and len(notices) == 2
        assert "server closed the session" in notices[0] and "shutting down" in notices[1]
        assert await page.locator("#errors li.error").count() == 0 and problems == []


async def test_healthz_names_a_remote_llm_but_not_where_it_is(start_pipeline) -> None:
    """What the banner reads on a pipeline gateway: model names, no backend URL (/healthz is public)."""
    async with FakeOpenAI() as fake:
        gateway = await start_pipeline(fake)
        url = f"http://127.0.0.1:{gateway.port}/healthz"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
    assert orjson.loads(body)["responder"] == {"kind": "pipeline", "models": {
        "stt": "whisper-test", "llm": "llm-test", "tts": "tone (a test signal, no speech)"}, "voices": None}
    assert fake.base_url.encode() not in body and b"127.0.0.1" not in body


async def test_an_api_key_mints_the_session_secret(start_gateway, monkeypatch) -> None:
    """With GATEWAY_API_KEYS the page says a key is needed; given one, it connects with a minted secret."""
    key = "sk-page-" + "k" * 24
    monkeypatch.setenv("GATEWAY_API_KEYS", key)
    monkeypatch.delenv("GATEWAY_SIGNING_KEY", raising=False)
    gateway = await start_gateway()
    problems: list[str] = []
    async with open_page(gateway, problems) as page:
        await until(page, "window.__gateway.authRequired")
        await page.click("#connect")
        await until(page, "window.__gateway.errors.length > 0")
        assert "needs an API key" in await page.locator("#errors").inner_text()

        await page.fill("#api-key", "sk-wrong-" + "k" * 24)
        await page.click("#connect")
        await until(page, "window.__gateway.errors.length > 1")
        assert "API key was refused (401)" in await page.locator("#errors").inner_text()

        await page.fill("#api-key", key)
        await page.click("#connect")
        await until(page, "window.__gateway.events['session.updated'] >= 1")
        # The key stays in the page unless the user asks to keep it.
        assert await page.evaluate("localStorage.length") == 0
        await page.check("#remember-key")
        assert await page.evaluate("localStorage.getItem('voice-gateway.api-key')") == key
        await page.uncheck("#remember-key")
        assert await page.evaluate("localStorage.length") == 0
    # The browser's console reports the refused handshakes; nothing else went wrong.
    assert all("WebSocket" in p or "401" in p for p in problems), problems


async def test_the_page_over_webrtc(start_gateway) -> None:
    """The WebRTC transport: the browser's media stack carries the audio, the gateway owns the playout."""
    from gateway.responders.echo import EchoResponder

    pytest.importorskip("aiortc")
    # Echo a little faster than real time, as a TTS engine produces: unheard audio is left to cut.
    gateway = await start_gateway(EchoResponder(pace=1.5), webrtc__enabled=True)
    problems: list[str] = []
    async with open_page(gateway, problems) as page:
        await page.select_option("#transport", "webrtc")
        await page.click("#connect")
        await until(page, "window.__gateway.state === 'connected'")
        await until(page, "window.__gateway.events['input_audio_buffer.speech_stopped'] >= 1")
        await until(page, "window.__gateway.events['output_audio_buffer.started'] >= 1")  # the reply plays
        await until(page, "window.__gateway.events['conversation.item.truncated'] >= 1")  # cut by the server
        stats = await page.evaluate("window.__gateway")
        assert len(gateway.sessions) == 1
        # Closing the tab hangs up (pagehide), not the ICE timeout half a minute later.
        await page.close(run_before_unload=True)
        for _ in range(60):
            if not gateway.sessions:
                break
            await asyncio.sleep(0.05)
        assert not gateway.sessions
    assert stats["errors"] == [] and problems == []
    assert stats["sentAppends"] == 0 and stats["events"].get("response.output_audio.delta") is None
    assert stats["events"]["output_audio_buffer.cleared"] >= 1
    assert stats["turns"][0]["endEstimated"]  # over WebRTC the page cannot see when samples left
