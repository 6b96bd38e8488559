"""Twilio Media Streams, with a client that follows Twilio's documented protocol (the remote side we cannot
run): the voice webhook signed as Twilio signs it, the TwiML it gets back, then the bidirectional stream of
a recorded call in mu-law at real time."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
import websockets
from openai import AsyncOpenAI

from bench.launcher import free_port
from gateway.audio import RationalResampler, ulaw_encode
from gateway.responders.echo import EchoResponder
from tests.conftest import load_pcm
from tests.phones.twilio import TOKEN, TwilioSide


def mulaw_frames(fixture: str, silence_s: float = 0.0) -> list[str]:
    pcm = np.frombuffer(load_pcm(fixture), dtype="<i2")
    narrow = RationalResampler(1, 3).process(pcm)
    narrow = np.concatenate([narrow, np.zeros(int(silence_s * 8000), dtype=np.int16)])
    return [base64.b64encode(ulaw_encode(narrow[i:i + 160])).decode() for i in range(0, len(narrow) - 159, 160)]


@pytest.fixture
async def twilio_gateway(start_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", TOKEN)

    async def start(**overrides: Any) -> Any:
        port = free_port()  # Twilio signs the public URL it calls: known before the start
        return await start_gateway(EchoResponder(pace=1), server__port=port, twilio__enabled=True,
                                   twilio__public_url=f"http://127.0.0.1:{port}", calls__noise_reduction="",
                                   **overrides)
    return start


async def test_a_recorded_call_is_answered_marks_are_sent_and_barge_in_clears(twilio_gateway: Any) -> None:
    gateway = await twilio_gateway()
    twilio = TwilioSide(gateway)
    stream = await twilio.ring()
    assert {p.get("name"): p.get("value") for p in stream.findall("Parameter")}["From"] == "+15550001111"
    await twilio.open(parameters={"From": "+15550001111", "To": "+15550002222"})
    await twilio.say(mulaw_frames("question_sky.wav", silence_s=2.5))  # the echo answers with the question
    assert twilio.of("media"), "no audio came back"
    assert twilio.marks_echoed, "no mark after the answer"
    answered = len(twilio.of("media"))
    # Barge-in: the caller asks again and talks over the second answer.
    await twilio.say(mulaw_frames("question_spider.wav", silence_s=0.6) + mulaw_frames("question_tea.wav", 1.0))
    assert twilio.of("clear"), "no clear on barge-in"
    assert len(twilio.of("media")) > answered
    (call,) = gateway.app.state.phones.calls.calls.values()
    assert call.line.kind == "twilio" and call.state == "answered"
    sdk = AsyncOpenAI(api_key="k", base_url=f"{twilio.base}/v1", websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1")
    async with sdk.realtime.connect(call_id=call.id) as sideband:
        await asyncio.wait_for(sideband.recv(), 5)  # session.created
        await twilio.socket.send(orjson.dumps({"event": "dtmf", "streamSid": "MZ1", "sequenceNumber": "900",
                                               "dtmf": {"track": "inbound_track", "digit": "5"}}).decode())
        async with asyncio.timeout(5):
            while (event := await sideband.recv()).type != "input_audio_buffer.dtmf_event_received":
                pass
        assert event.event == "5"  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{twilio.base}/v1/realtime/calls/{call.id}/refer",
                             json={"target_uri": "tel:+15550003333"}) as answer:
            assert answer.status == 200
    await asyncio.wait_for(twilio.socket.wait_closed(), 5)  # the stream ends; Twilio asks the <Connect> action
    status, twiml = await twilio.webhook(twilio.action.removeprefix(twilio.base), {"CallSid": "CA0001"})
    assert status == 200 and "<Dial><Number>+15550003333</Number></Dial>" in twiml
    assert not gateway.sessions and not gateway.app.state.phones.calls.calls


async def test_wrong_tokens_and_signatures_are_refused(twilio_gateway: Any) -> None:
    gateway = await twilio_gateway()
    twilio = TwilioSide(gateway)
    status, _ = await twilio.webhook("/twilio/voice", {"CallSid": "CA9"}, signature="bm90IGl0")
    assert status == 403
    await twilio.ring("CA0002")
    good = twilio.stream_url
    for url in (good[:-2] + ("00" if not good.endswith("00") else "11"), good.rsplit("/", 1)[0] + "/nonsense"):
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url)
        assert refused.value.response.status_code == 403
    socket = await websockets.connect(good)
    await socket.close()
    with pytest.raises(websockets.InvalidStatus):
        await websockets.connect(good)  # one stream per token
    assert not gateway.app.state.phones.calls.calls


@pytest.mark.parametrize("wrong", [
    {"event": "start", "start": "CA0001"},
    {"event": "start", "start": {"callSid": "CA0001", "customParameters": ["From", "+1555"]}},
])
async def test_a_start_of_the_wrong_shape_ends_the_stream_quietly(twilio_gateway: Any, caplog: Any, wrong: Any) -> None:
    gateway = await twilio_gateway()
    twilio = TwilioSide(gateway)
    await twilio.ring()
    async with websockets.connect(twilio.stream_url) as socket:
        await socket.send(orjson.dumps(wrong).decode())
        if isinstance(wrong["start"], dict):  # a call that reads its parameters as none: it goes on
            await socket.send(orjson.dumps({"event": "stop"}).decode())
        await asyncio.wait_for(socket.wait_closed(), 5)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert not gateway.sessions and not gateway.app.state.phones.calls.calls


async def test_media_and_dtmf_of_the_wrong_shape_are_ignored(twilio_gateway: Any, caplog: Any) -> None:
    gateway = await twilio_gateway()
    twilio = TwilioSide(gateway)
    await twilio.ring()
    await twilio.open()
    for wrong in ({"event": "media", "media": "AAAA"}, {"event": "media", "media": ["AAAA"]},
                  {"event": "dtmf", "dtmf": "5"}, {"event": "dtmf", "dtmf": 5}):
        await twilio.socket.send(orjson.dumps(wrong).decode())
    await twilio.say(mulaw_frames("question_sky.wav", silence_s=2.5))  # the call goes on: the echo answers
    assert twilio.of("media")
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
