"""GPT-Live sessions through the openai SDK: a spoken question answered aloud (local whisper hears the user and
our answer, piper speaks it), barge-in, mute, and a sideband that watches the audio and steers the session."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp
import pytest
from websockets.exceptions import InvalidStatus

from bench.fake_openai import FakeOpenAI
from gateway.core.responder import transcript_of
from gateway.responders.build import LOCAL_STT, LOCAL_TTS, installed
from gateway.responders.echo import EchoResponder
from tests.conftest import StartGateway, load_pcm, silence
from tests.live.conftest import LiveClient, Microphone, audio_of, live, sdk, transcript

pytestmark = pytest.mark.asyncio

ANSWER = "The sky is blue because the air scatters blue sunlight the most."


@pytest.mark.skipif(not (installed(LOCAL_STT) and installed(LOCAL_TTS)), reason="needs the local extra")
async def test_a_spoken_question_is_answered_aloud(start_gateway: StartGateway) -> None:
    from gateway.responders.local_stt import LocalStt
    from gateway.responders.pipeline import BridgeSettings, PipelineResponder
    from gateway.responders.piper_tts import PiperEngine
    from gateway.responders.remote import LlmClient

    async with FakeOpenAI(reply=ANSWER) as fake:
        responder = PipelineResponder(LlmClient(fake.base_url, "llm-test", timeout_s=5), PiperEngine.shared(),
                                      BridgeSettings(starter_chars=10, max_segment_chars=80))
        gateway = await start_gateway(responder, local__stt=True)
        try:
            async with live(gateway) as client, Microphone(client) as mic:
                mic.say(load_pcm("question_sky.wav"))
                events: list[dict[str, Any]] = []
                while "most." not in transcript(events):
                    events += await client.until("session.output_transcript.delta", timeout=30)
                await asyncio.sleep(1.0)  # the answer's last audio
                await client.send({"type": "session.close"})
                events += await client.until("session.closed", timeout=10)
        finally:
            await responder.aclose()
    heard = transcript(events, "session.input_transcript.delta").lower()
    assert "sky" in heard and "blue" in heard
    assert "sky" in fake.chat_requests[0].messages[-1]["content"].lower()
    assert transcript(events) == ANSWER
    said = await transcript_of(LocalStt.shared(2), audio_of(events))  # what a listener hears of our output
    assert "blue" in said.lower() and "sky" in said.lower(), said


async def test_barge_in_cuts_our_speech_within_a_tick(start_gateway: StartGateway) -> None:
    """The echo responder says the turn back; speaking over it stops it at the next tick, and no event says so."""
    gateway = await start_gateway(EchoResponder(pace=1.0))
    async with live(gateway) as client, Microphone(client) as mic:
        mic.say(load_pcm("two_turns.wav")[: 48 * 3200])  # the first question
        events: list[dict[str, Any]] = []
        while not any(audio_of([e]).strip(b"\0") for e in events if e["type"] == "session.output_audio.delta"):
            events += [await client.recv(timeout=10)]
        mic.say(load_pcm("one_sentence.wav"))  # talking over the echo
        speaking = 0
        async with asyncio.timeout(10):
            while True:
                event = await client.recv()
                assert event["type"] in ("session.output_audio.delta", "session.output_transcript.delta",
                                         "session.input_transcript.delta")
                if event["type"] == "session.output_audio.delta":
                    if audio_of([event]).strip(b"\0"):
                        speaking += 1
                    elif mic.sent_ms and speaking:
                        break
        # The echo of the first turn is 3 s long: it stopped well before its end (the VAD's 64 ms and a tick).
        assert speaking < 25


async def test_a_sideband_watches_and_steers(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(EchoResponder(pace=0))
    async with live(gateway) as client, Microphone(client) as mic:
        session_id = client.received[0]["session"]["id"]
        async with sdk(gateway).live.sideband.connect(session_id=session_id) as connection:
            sideband = LiveClient(connection)
            started = await sideband.recv()
            assert started["type"] == "session.started" and started["session"]["id"] == session_id
            await client.send({"type": "session.input_audio.mute", "event_id": "m"})
            assert (await client.until("session.input_audio.muted"))[-1]["client_event_id"] == "m"
            speech = load_pcm("question_sky.wav")
            mic.say(speech + silence(3000))
            reflected, outputs = bytearray(), []
            while len(reflected) < len(speech) + 48 * 2500:
                event = await sideband.recv()
                if event["type"] == "session.input_audio.append":
                    reflected += base64.b64decode(event["audio"])
                elif event["type"] == "session.output_audio.delta":
                    outputs.append(event)
            assert speech in bytes(reflected)  # reflected before muting
            assert outputs and all(e["end_ms"] - e["start_ms"] == 100 for e in outputs)
            assert [e["start_ms"] for e in outputs] == list(range(outputs[0]["start_ms"], outputs[-1]["end_ms"], 100))
            assert not any(audio_of(outputs).strip(b"\0"))  # muted: the model heard nothing, said nothing
            await sideband.send({"type": "session.input_audio.append", "event_id": "no", "audio": ""})
            error = (await sideband.until("error"))[-1]
            assert error["client_event_id"] == "no" and "'session.close'" in error["error"]["message"]
            await sideband.send({"type": "session.instructions.append", "event_id": "steer", "delegation_id": None,
                                 "content": "Wrap up."})
            for side in (sideband, client):
                ack = (await side.until("session.instructions.appended", timeout=5))[-1]
                assert ack["client_event_id"] == "steer"
            assert not [e for e in client.received if e["type"] == "error"]  # the sideband's error was its own
            await client.send({"type": "session.close"})
            closed = (await sideband.until("session.closed", timeout=5))[-1]
            assert closed["reason"] == "close_requested"
    with pytest.raises(InvalidStatus) as refused:  # the session is gone
        async with sdk(gateway).live.sideband.connect(session_id=session_id):
            pass
    assert refused.value.response.status_code == 404


async def test_keys_and_our_client_secrets_open_a_live_session(start_gateway: StartGateway, monkeypatch: Any) -> None:
    """OpenAI defines no client secret for Live; ours (minted with a key) open one too, as an extra."""
    monkeypatch.setenv("GATEWAY_API_KEYS", "sk-live-test-" + "x" * 20)
    gateway = await start_gateway()
    secret = (await sdk(gateway, "sk-live-test-" + "x" * 20).realtime.client_secrets.create(
        session={"type": "realtime"})).value
    assert secret.startswith("ek_")
    async with sdk(gateway, secret).live.connect() as connection:
        session_id = (await LiveClient(connection).start())["session"]["id"]
        other = (await sdk(gateway, "sk-live-test-" + "x" * 20).realtime.client_secrets.create()).value
        # A secret is a browser's: it steers no session through a sideband, its own or another's.
        for token in (secret, other):
            with pytest.raises(InvalidStatus) as not_a_key:
                async with sdk(gateway, token).live.sideband.connect(session_id=session_id):
                    pass
            assert not_a_key.value.response.status_code == 401
        # It reads the trace of the session it opened, no other secret does; a key reads any.
        async with aiohttp.ClientSession() as http:
            for token, status in ((secret, 200), (other, 404), ("sk-live-test-" + "x" * 20, 200)):
                async with http.get(f"http://127.0.0.1:{gateway.port}/v1/realtime/sessions/{session_id}/turns",
                                    headers={"Authorization": f"Bearer {token}"}) as response:
                    assert response.status == status, token
    with pytest.raises(InvalidStatus) as refused:
        async with sdk(gateway, "sk-wrong").live.connect():
            pass
    assert refused.value.response.status_code == 401


async def test_a_draining_gateway_tells_and_ends_a_live_session(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(server__drain_seconds=1.0, server__drain_notice_seconds=0.5)
    async with live(gateway) as client:
        drain = asyncio.create_task(gateway.gateway.drain(1.0, 0.5))
        notice = (await client.until("error", timeout=5))[-1]["error"]
        assert notice["code"] == "server_shutting_down" and notice["type"] == "server_error"
        with pytest.raises(Exception) as closed:  # noqa: B017 - the SDK raises its connection-closed error
            await client.recv(timeout=5)
        assert "1001" in str(closed.value)
        await drain
    assert not gateway.sessions


async def test_a_sideband_hears_when_the_primary_connection_is_lost(start_gateway: StartGateway) -> None:
    gateway = await start_gateway()
    async with sdk(gateway).live.connect() as connection:
        session_id = (await LiveClient(connection).start())["session"]["id"]
        sideband_connection = await sdk(gateway).live.sideband.connect(session_id=session_id).enter()
        sideband = LiveClient(sideband_connection)
        await sideband.recv()
    # The primary went without session.close.
    closed = (await sideband.until("session.closed", timeout=5))[-1]
    assert closed["reason"] == "connection_lost"
    await sideband_connection.close()
    assert not gateway.sessions
