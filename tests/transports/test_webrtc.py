"""The WebRTC path end to end: the gateway's own aiortc client against the running gateway over loopback.

The client (gateway.clients.webrtc_connection, driven through tests/helpers/webrtc.py) POSTs its offer over
real HTTP, speaks fixture WAVs through a microphone track paced at real time, records the reply from the
remote track and checks every data-channel event against the openai package's own types.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import pytest

pytest.importorskip("aiortc")

import aiohttp  # noqa: E402
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription  # noqa: E402
from aiortc.rtp import RtpPacket  # noqa: E402
from av import AudioFrame  # noqa: E402

from gateway.audio import Downsampler2x, Upsampler2x  # noqa: E402
from gateway.responders.echo import EchoResponder  # noqa: E402
from gateway.transports.webrtc.calls import CallRegistry, OutboundAudio  # noqa: E402
from gateway.transports.webrtc.media import Microphone, PassThroughBuffer, mono_s16  # noqa: E402
from tests.conftest import FIXTURES, GA_EVENTS, Served, StartGateway, load_pcm  # noqa: E402
from tests.helpers.webrtc import RtcClient, rms, session_count  # noqa: E402


@pytest.fixture
async def rtc(start_gateway: StartGateway) -> tuple[Served, CallRegistry]:
    # Faster than real time, like a TTS engine: the playout then holds audio not yet heard, and a
    # barge-in has something to truncate. The signalling is on the gateway's own port.
    gateway = await start_gateway(EchoResponder(pace=1.5), webrtc__enabled=True)
    assert gateway.webrtc is not None
    return gateway, gateway.webrtc


@pytest.fixture
async def client(rtc: tuple[Served, CallRegistry]) -> AsyncIterator[RtcClient]:
    peer = RtcClient(f"http://127.0.0.1:{rtc[0].port}")
    yield peer
    await peer.close()


async def test_turn_reply_barge_in_and_hang_up(rtc, client):
    gateway, server = rtc
    speech = load_pcm("one_sentence.wav")  # speech from 500 to 3148 ms
    await client.connect(session={"type": "realtime", "instructions": "Be brief."})
    created = (await client.until("session.created"))[-1]
    assert created["session"]["instructions"] == "Be brief."
    assert len(gateway.sessions) == 1 and client.location.startswith("/v1/realtime/calls/rtc_")

    client.mic.say(speech)
    events = await client.until("output_audio_buffer.started")
    started_at = asyncio.get_running_loop().time()
    names = [e["type"] for e in events]
    assert "response.output_audio.delta" not in names  # the audio goes on the track instead
    speech_started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    speech_stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    response_id = events[-1]["response_id"]
    reply_ms = speech_stopped["audio_end_ms"] - speech_started["audio_start_ms"]

    # Let ~0.5 s of the ~2.9 s echo play, then speak over it (speech starts 500 ms into the WAV):
    # the barge-in lands ~1 s into the reply, before the echo (1.9 s to make) is complete.
    await asyncio.sleep(0.5)
    client.mic.say(speech[: 48 * 1500])
    events = await client.until("response.done")
    interrupted_at = asyncio.get_running_loop().time()
    names = [e["type"] for e in events]
    assert names.index("input_audio_buffer.speech_started") < names.index("output_audio_buffer.cleared")
    cleared = next(e for e in events if e["type"] == "output_audio_buffer.cleared")
    truncated = next(e for e in events if e["type"] == "conversation.item.truncated")
    done = events[-1]["response"]
    assert cleared["response_id"] == response_id
    assert done["id"] == response_id and done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "turn_detected"
    assert truncated["item_id"] == done["output"][0]["id"]
    # Truncated at what was played: some of the reply, not all of it.
    assert 0 < truncated["audio_end_ms"] < reply_ms
    assert "output_audio_buffer.stopped" not in names

    # The reply's speech (after its ~300 ms of prefix padding) reached the client's speaker.
    assert rms(client.heard(started_at, interrupted_at)) > 300

    assert await client.hang_up() == 204
    assert await session_count(gateway, 0) == 0
    assert not server.calls
    assert client.invalid == []


async def test_completed_reply_plays_then_stops(rtc, client):
    await client.connect()
    await client.until("session.created")
    client.mic.say(load_pcm("one_sentence.wav")[: 48 * 1800])  # ~1.1 s of speech, ~1.4 s reply
    started = (await client.until("output_audio_buffer.started"))[-1]
    events = await client.until("output_audio_buffer.stopped", response_id=started["response_id"])
    names = [e["type"] for e in events]
    # stopped comes after response.done, once the last frame has gone out.
    assert names.index("response.done") < names.index("output_audio_buffer.stopped")
    assert events[names.index("response.done")]["response"]["status"] == "completed"
    assert client.invalid == []


async def test_beta_route_and_client_clear(rtc):
    gateway, server = rtc
    client = RtcClient(f"http://127.0.0.1:{gateway.port}", beta=True)
    try:
        await client.connect("/v1/realtime?model=gpt-realtime")
        created = await client.until("session.created")
        assert created[-1]["session"]["object"] == "realtime.session"
        client.mic.say(load_pcm("one_sentence.wav")[: 48 * 1800])
        started = (await client.until("output_audio_buffer.started"))[-1]
        await asyncio.sleep(0.5)
        await client.send({"type": "output_audio_buffer.clear"})
        events = await client.until("response.done")
        names = [e["type"] for e in events]
        assert "output_audio_buffer.cleared" in names and "conversation.item.truncated" in names
        assert events[-1]["response"]["id"] == started["response_id"]
        assert events[-1]["response"]["status"] == "cancelled"
        assert "response.audio.delta" not in [e["type"] for e in client.received]
        assert client.invalid == []
    finally:
        await client.close()
    # Closing the peer connection (no DELETE) frees the session too.
    assert await session_count(gateway, 0) == 0
    assert not server.calls


async def test_closing_the_data_channel_ends_the_call(rtc, client):
    gateway, server = rtc
    await client.connect()
    await client.until("session.created")
    client.channel.close()
    assert await session_count(gateway, 0) == 0
    assert not server.calls


async def test_signalling_errors_and_cors(rtc):
    gateway, server = rtc
    base = f"http://127.0.0.1:{gateway.port}"
    async with aiohttp.ClientSession() as http:
        async with http.options(base + "/v1/realtime/calls", headers={
            "Origin": "http://127.0.0.1:8000", "Access-Control-Request-Method": "POST",
        }) as response:
            assert response.status == 204
            assert response.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8000"
            assert "Location" in response.headers["Access-Control-Expose-Headers"]
        async with http.post(base + "/v1/realtime/calls", data=b"{}",
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == 415
            assert (await response.json())["error"]["code"] == "unsupported_content_type"
        for body, message in (("", "The body is empty"), ("not sdp", "not an SDP offer"),
                              ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n", "no media"),
                              ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111"
                               "\r\nc=IN IP4 0.0.0.0\r\na=end-of-candidates\r\n", "no candidates")):
            async with http.post(base + "/v1/realtime/calls", data=body,
                                 headers={"Content-Type": "application/sdp"}) as response:
                assert response.status == 400
                error = (await response.json())["error"]
                assert error["code"] == "invalid_offer" and message in error["message"]
        offer = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        offer.addTransceiver("audio")
        await offer.setLocalDescription(await offer.createOffer())
        form = aiohttp.FormData()
        form.add_field("sdp", offer.localDescription.sdp)
        form.add_field("session", '{"type": "translation"}')
        async with http.post(base + "/v1/realtime/calls", data=form) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "invalid_session"
        await offer.close()
        async with http.delete(base + "/v1/realtime/calls/rtc_nope") as response:
            assert response.status == 404
    assert await session_count(gateway, 0) == 0


async def call(gateway: Served, pc: RTCPeerConnection) -> None:
    """``pc``'s offer POSTed to the gateway as OpenAI's WebRTC clients do, and its answer taken."""
    await pc.setLocalDescription(await pc.createOffer())
    async with aiohttp.ClientSession() as http, http.post(
        f"http://127.0.0.1:{gateway.port}/v1/realtime/calls", data=pc.localDescription.sdp,
        headers={"Content-Type": "application/sdp"},
    ) as response:
        assert response.status == 201, await response.text()
        await pc.setRemoteDescription(RTCSessionDescription(await response.text(), "answer"))


async def test_a_text_only_client_talks_over_the_data_channel(rtc):
    """An offer with a data channel and no audio (a text client): events flow, replies come as text."""
    gateway, server = rtc
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("events")  # not "oai-events": the first channel carries the events
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    channel.on("message", lambda message: events.put_nowait(orjson.loads(message)))
    await call(gateway, pc)

    async def until(kind: str) -> dict[str, Any]:
        async with asyncio.timeout(10):
            while (event := await events.get())["type"] != kind:
                GA_EVENTS.validate_python(event)
            return event

    created = await until("session.created")
    assert created["session"]["output_modalities"] == ["text"]
    while channel.readyState != "open":
        await asyncio.sleep(0.01)
    channel.send(orjson.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}}).decode())
    channel.send('{"type": "response.create"}')
    done = (await until("response.done"))["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == "Hello there"
    # It has no audio track: audio output is refused, not made and thrown away.
    channel.send('{"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}}')
    assert (await until("error"))["error"]["param"] == "session.output_modalities"
    channel.send('{"type": "response.create", "response": {"output_modalities": ["audio"]}}')
    assert (await until("error"))["error"]["param"] == "response.output_modalities"
    await pc.close()
    assert await session_count(gateway, 0) == 0


async def test_one_microphone_feeds_the_session_and_events_take_the_oai_events_channel(rtc):
    """A client with a channel of its own opened first, and two audio tracks: the events travel on "oai-events",
    and only the first track is heard (two on one clock would interleave: time would run twice as fast)."""
    gateway, server = rtc
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    received: dict[str, asyncio.Queue[dict[str, Any]]] = {"my-app": asyncio.Queue(), "oai-events": asyncio.Queue()}
    for label, queue in received.items():
        pc.createDataChannel(label).on("message", lambda m, q=queue: q.put_nowait(orjson.loads(m)))
    mics = [Microphone(), Microphone()]
    for mic in mics:
        pc.addTrack(mic)
    await call(gateway, pc)
    events = received["oai-events"]
    assert (await asyncio.wait_for(events.get(), 10))["type"] == "session.created"
    loop = asyncio.get_running_loop()
    started = loop.time()
    for mic in mics:
        mic.start()
    mics[0].say(load_pcm("one_sentence.wav"))  # speech from 500 to 3148 ms; the second track is silent
    async with asyncio.timeout(15):
        while (event := await events.get())["type"] != "input_audio_buffer.speech_stopped":
            pass
    assert event["audio_end_ms"] <= (loop.time() - started) * 1000 + 300  # the session's time is real time
    assert received["my-app"].empty()
    await pc.close()
    assert await session_count(gateway, 0) == 0


BROWSER_CALL = """async ([url, session]) => {
  const { connectWebRTC } = await import("/webrtc.js");
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { echoCancellation: true } });
  window.rtc = { events: [], closed: null };
  window.rtc.call = await connectWebRTC({
    url, stream, session,
    onEvent: (e) => window.rtc.events.push(e),
    onClose: (reason) => { window.rtc.closed = reason; },
  });
  return window.rtc.call.callUrl.pathname;
}"""


@pytest.mark.slow  # headless Chromium
async def test_browser_page_module(rtc):
    """web/webrtc.js in headless Chromium, loaded from the gateway's port and calling it (same origin).

    Chromium's fake microphone loops one_sentence.wav: the first round is a turn, the second
    interrupts the echo, so one call sees a reply, a barge-in and the server's truncate.
    """
    async_api = pytest.importorskip("playwright.async_api", reason="Playwright for Python is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    gateway, server = rtc
    args = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={FIXTURES / 'one_sentence.wav'}"]
    async with async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium, args=args)
        try:
            page = await browser.new_page()
            await page.goto(f"http://127.0.0.1:{gateway.port}/")
            path = await page.evaluate(BROWSER_CALL, [f"http://127.0.0.1:{gateway.port}", {"instructions": "Hi."}])
            assert path.startswith("/v1/realtime/calls/rtc_")
            await page.wait_for_function(
                "() => window.rtc.events.some(e => e.type === 'conversation.item.truncated')",
                polling=50, timeout=20_000,
            )
            events = await page.evaluate("window.rtc.events")
            assert len(gateway.sessions) == 1
            await page.evaluate("window.rtc.call.close()")
            assert await page.evaluate("window.rtc.closed") == "closed"
        finally:
            await browser.close()
    assert await session_count(gateway, 0) == 0
    for event in events:
        GA_EVENTS.validate_python(event)
    names = [e["type"] for e in events]
    assert events[0]["session"]["instructions"] == "Hi."
    assert names.index("output_audio_buffer.started") < names.index("output_audio_buffer.cleared")
    assert names.index("output_audio_buffer.cleared") < names.index("conversation.item.truncated")
    assert next(e for e in reversed(events) if e["type"] == "response.done")["response"]["status"] == "cancelled"


# --- the pieces on their own ----------------------------------------------------------------------


def tone(ms: int) -> bytes:
    """A 440 Hz tone, pcm16 24 kHz."""
    t = np.arange(24 * ms) / 24_000
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()


class Notes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, kind: str, response_id: str) -> None:
        self.seen.append((kind.removeprefix("output_audio_buffer."), response_id))


async def test_playout_counts_what_went_out_and_clears():
    notes = Notes()
    track = OutboundAudio(notes)
    track.play("resp_1", "item_1", tone(200))
    frames = [await track.recv() for _ in range(4)]
    assert [(f.samples, f.sample_rate, f.pts) for f in frames] == [(960, 48_000, 960 * i) for i in range(4)]
    assert all(rms(f.to_ndarray()) > 1000 for f in frames)
    assert notes.seen == [("started", "resp_1")]
    # Four 20 ms frames went out: that is what was heard, whatever was still queued.
    assert track.clear() == ("item_1", 80.0)
    assert rms((await track.recv()).to_ndarray()) == 0
    assert track.clear() is None  # nothing playing: nothing to clear
    assert notes.seen == [("started", "resp_1")]  # cleared, never stopped
    track.stop()


async def test_playout_keeps_the_agent_level_through_opus():
    """The outbound frames reach a listener at the level the agent spoke (aiortc's Opus encoder
    would take 3 dB off a mono frame when it upmixes it)."""
    from aiortc.codecs.opus import OpusDecoder, OpusEncoder
    from aiortc.jitterbuffer import JitterFrame

    track = OutboundAudio(Notes())
    track.play("resp_1", "item_1", tone(1000))
    encoder, decoder = OpusEncoder(), OpusDecoder()
    heard = []
    for _ in range(50):
        payloads, timestamp = encoder.encode(await track.recv())
        for payload in payloads:
            for frame in decoder.decode(JitterFrame(data=payload, timestamp=timestamp)):
                heard.append(frame.to_ndarray().reshape(-1, 2)[:, 0])
    track.stop()
    level = rms(np.concatenate(heard)[4800:-4800])  # the steady middle of the tone
    assert abs(20 * np.log10(level / (8000 / np.sqrt(2)))) < 0.5


async def test_playout_clear_before_the_first_frame_hears_nothing():
    track = OutboundAudio(Notes())
    track.play("resp_1", "item_1", tone(100))
    assert track.clear() == ("item_1", 0.0)
    track.stop()


async def test_playout_stops_after_the_response_is_done_and_drained():
    notes = Notes()
    track = OutboundAudio(notes)
    await track.recv()  # idle: silence
    track.play("resp_1", "item_1", tone(100))
    for _ in range(6):  # 120 ms: the queue ran dry
        await track.recv()
    # ... but the response may still send audio: no stopped yet
    assert notes.seen == [("started", "resp_1")]
    track.finished("resp_1")  # response.done: the upsampler's last 1.3 ms is queued too
    while len(notes.seen) < 2:
        await track.recv()
    assert notes.seen == [("started", "resp_1"), ("stopped", "resp_1")]
    assert track.clear() is None
    track.stop()


def test_upsampler_is_clean_and_chunking_does_not_matter():
    x = np.frombuffer(tone(1000), dtype="<i2")
    whole = Upsampler2x().process(x)
    up = Upsampler2x()
    bounds = [0, 1, 480, 481, 1440, 9000, len(x)]
    pieces = np.concatenate([up.process(x[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)])
    assert len(whole) == 2 * len(x) and np.array_equal(whole, pieces)
    # The same 440 Hz tone at 48 kHz, 63.5 samples (the filter's delay) later.
    t = (np.arange(len(whole)) - 63.5) / 48_000
    ideal = np.sin(2 * np.pi * 440 * t) * 8000
    error = whole[200:].astype(np.float64) - ideal[200:]
    assert 10 * np.log10(np.sum(ideal[200:] ** 2) / np.sum(error**2)) > 60


def test_downsampler_keeps_speech_band_and_rejects_aliases():
    t = np.arange(48_000) / 48_000

    def level_db(freq: float, chunk: int) -> float:
        x = (np.sin(2 * np.pi * freq * t) * 16000).astype(np.int16)
        down = Downsampler2x()
        y = np.concatenate([down.process(x[i : i + chunk]) for i in range(0, len(x), chunk)])
        assert len(y) == len(x) // 2
        return 20 * np.log10(rms(y[2000:]) / (16000 / np.sqrt(2)))

    assert abs(level_db(1000, 960)) < 0.1 and abs(level_db(10_000, 333)) < 0.1
    assert level_db(20_000, 960) < -90  # would fold onto 4 kHz
    x = (np.sin(2 * np.pi * 440 * t) * 16000).astype(np.int16)
    down = Downsampler2x()
    odd_chunks = np.concatenate([down.process(x[a:b]) for a, b in [(0, 7), (7, 960), (960, 4001), (4001, 48_000)]])
    assert np.array_equal(odd_chunks, Downsampler2x().process(x))


def test_pass_through_buffer_drops_late_and_duplicate_packets():
    buffer = PassThroughBuffer()
    released = []
    for seq in (65534, 65535, 65535, 0, 65533, 2, 1):
        packet = RtpPacket(payload_type=111, sequence_number=seq, timestamp=seq * 960)
        packet._data = bytes([seq % 256])  # type: ignore[attr-defined]
        _, frame = buffer.add(packet)
        if frame is not None:
            released.append(frame.timestamp // 960)
    assert released == [65534, 65535, 0, 2]


def test_stereo_frames_are_mixed_to_mono():
    frame = AudioFrame.from_ndarray(np.array([[100, 300, -100, -301]], dtype=np.int16), format="s16", layout="stereo")
    assert mono_s16(frame).tolist() == [200, -201]


async def test_playout_plays_responses_running_at_once_one_after_the_other():
    """An out-of-band response speaking beside the conversation's: their audio, produced interleaved, goes
    out whole and in turn (the one playing first), each with its own started and stopped."""
    notes = Notes()
    track = OutboundAudio(notes)
    first, second = tone(100), tone(60)
    for k in range(0, len(first), 960):  # 20 ms pieces of each, interleaved as two producers make them
        track.play("resp_1", "item_1", first[k:k + 960])
        if k < len(second):
            track.play("resp_2", "item_2", second[k:k + 960])
    track.finished("resp_2")  # the shorter one is done first: it still waits its turn
    track.finished("resp_1")
    heard = np.concatenate([(await track.recv()).to_ndarray()[0][::2] for _ in range(12)])  # left of L, R
    assert notes.seen == [("started", "resp_1"), ("stopped", "resp_1"), ("started", "resp_2"), ("stopped", "resp_2")]
    # Each came whole through its own filter: the same samples as that response upsampled alone.
    at = 0
    for pcm in (first, second):
        up = Upsampler2x()
        alone = np.concatenate([up.process(np.frombuffer(pcm, "<i2")), up.flush()])
        assert np.array_equal(heard[at : at + len(alone)], alone)
        at += len(alone)
    assert not heard[at:].any()
    track.stop()


async def test_a_sideband_watches_and_steers_a_webrtc_call_and_hangup_ends_it(rtc, client):
    """The unmodified SDK attaches to a WebRTC call by its id (realtime.connect(call_id=...)), sees its events,
    steers it (a session.update), and ends it with calls.hangup."""
    from openai import AsyncOpenAI

    gateway, server = rtc
    await client.connect()
    await client.until("session.created")
    call_id = client.location.rsplit("/", 1)[-1]
    sdk = AsyncOpenAI(api_key="k", base_url=f"http://127.0.0.1:{gateway.port}/v1",
                      websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1")
    async with sdk.realtime.connect(call_id=call_id) as sideband:
        created = await asyncio.wait_for(sideband.recv(), 5)
        assert created.type == "session.created"
        await sideband.session.update(session={"type": "realtime", "instructions": "From the sideband."})
        updated = await asyncio.wait_for(sideband.recv(), 5)
        assert updated.type == "session.updated" and updated.session.instructions == "From the sideband."
        seen = await client.until("session.updated")  # the call's own channel sees it too
        assert seen[-1]["session"]["instructions"] == "From the sideband."
        await sdk.realtime.calls.hangup(call_id)
    assert await session_count(gateway, 0) == 0 and not server.calls


async def test_offers_of_one_secret_at_once_make_no_more_sessions_than_it_may_hold(start_gateway: StartGateway,
                                                                                   monkeypatch: pytest.MonkeyPatch):
    """Offers posted together all pass the check at their answer (none is connected yet): the calls past the
    secret's [server] max_sessions_per_secret are closed as they connect, and a later offer gets 429."""
    key = "sk-webrtc-secret-0123456789"
    monkeypatch.setenv("GATEWAY_API_KEYS", key)
    gateway = await start_gateway(EchoResponder(), webrtc__enabled=True, server__max_sessions_per_secret=2,
                                  webrtc__max_pending_calls_per_client=8)
    base = f"http://127.0.0.1:{gateway.port}"
    async with aiohttp.ClientSession() as http:
        async with http.post(base + "/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {key}"},
                             json={}) as answer:
            secret = (await answer.json())["value"]

        async def call() -> tuple[RTCPeerConnection, int]:
            pc = RTCPeerConnection()
            pc.addTransceiver("audio")
            pc.createDataChannel("oai-events")
            await pc.setLocalDescription(await pc.createOffer())
            async with http.post(base + "/v1/realtime/calls", data=pc.localDescription.sdp,
                                 headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/sdp"}) as r:
                if r.status == 201:
                    await pc.setRemoteDescription(RTCSessionDescription(await r.text(), "answer"))
                return pc, r.status

        calls = await asyncio.gather(*(call() for _ in range(4)))
        try:
            assert [status for _, status in calls] == [201] * 4
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while gateway.webrtc.pending and loop.time() < deadline:  # each connects, or is closed as it does
                await asyncio.sleep(0.05)
            assert not gateway.webrtc.pending and len(gateway.sessions) == 2
            extra, status = await call()
            await extra.close()
            assert status == 429
        finally:
            for pc, _ in calls:
                await pc.close()
