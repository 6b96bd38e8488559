"""GPT-Live over WebRTC: the openai SDK's ``client.live.create`` with an aiortc peer (microphone track, ``oai-events``
data channel), against a real gateway on loopback; its events checked against the SDK's types."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson
import pytest
import websockets

pytest.importorskip("aiortc")

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription  # noqa: E402
from aiortc.mediastreams import MediaStreamTrack  # noqa: E402
from openai import BadRequestError  # noqa: E402

from gateway.responders.echo import EchoResponder  # noqa: E402
from gateway.transports.webrtc.media import Microphone, audio_frames, mono_s16  # noqa: E402
from tests.conftest import StartGateway, load_pcm, silence  # noqa: E402
from tests.live.conftest import LiveClient, check_event, sdk  # noqa: E402

pytestmark = pytest.mark.asyncio


class LivePeer:
    """A browser's side of a Live WebRTC session, made with aiortc."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Microphone()
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel("oai-events")  # before the offer, as OpenAI's guide says
        self.channel.on("message", self._on_message)
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.speaker: list[np.ndarray] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.pc.on("track", lambda track: self._tasks.append(asyncio.ensure_future(self._listen(track))))

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def accept(self, answer: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(orjson.dumps(event).decode())

    async def until(self, kind: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        events = []
        async with asyncio.timeout(timeout):
            while True:
                events.append(await self.events.get())
                if events[-1]["type"] == kind:
                    return events

    def _on_message(self, message: str | bytes) -> None:
        event = orjson.loads(message)
        check_event(event, message)
        if event["type"] == "session.started":
            self.mic.start()
        self.events.put_nowait(event)

    async def _listen(self, track: MediaStreamTrack) -> None:
        async for frame in audio_frames(track):
            self.speaker.append(mono_s16(frame))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pc.close()


async def test_a_live_call_through_the_sdk(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(EchoResponder(pace=1.0), webrtc__enabled=True)
    client = sdk(gateway)
    peer = LivePeer()
    try:
        created = await client.live.create(session={"model": "gpt-live-1", "audio": {"output": {"voice": "cedar"}}},
                                           transport={"type": "webrtc", "sdp": await peer.offer()})
        assert created.session.id.startswith("live_") and created.transport.type == "webrtc"
        await peer.accept(created.transport.sdp)
        started = (await peer.until("session.started"))[-1]
        assert started["session"]["id"] == created.session.id
        assert "format" not in started["session"]["audio"]  # negotiated in SDP
        with pytest.raises(websockets.InvalidStatus) as refused:  # a Realtime sideband is for Realtime calls
            async with client.realtime.connect(call_id=created.session.id):
                pass
        assert refused.value.response.status_code == 404
        assert orjson.loads(refused.value.response.body)["error"]["code"] == "call_not_found"
        async with client.live.sideband.connect(session_id=created.session.id) as connection:
            sideband = LiveClient(connection)
            assert (await sideband.recv())["type"] == "session.started"
            peer.mic.say(load_pcm("question_sky.wav") + silence(4000))
            for _ in range(200):  # the echo of the question, heard on the track
                await asyncio.sleep(0.1)
                if peer.speaker and np.abs(np.concatenate(peer.speaker)).max() > 1000:
                    break
            assert np.abs(np.concatenate(peer.speaker)).max() > 1000
            reflected = (await sideband.until("session.output_audio.delta"))[-1]
            assert reflected["start_ms"] % 100 == 0 and reflected["end_ms"] == reflected["start_ms"] + 100
            peer.send({"type": "session.input_audio.append", "event_id": "a", "audio": ""})
            error = (await peer.until("error"))[-1]["error"]
            assert error["client_event_id"] == "a"
            peer.send({"type": "session.close", "event_id": "bye"})
            closed = (await peer.until("session.closed"))[-1]
            assert closed["client_event_id"] == "bye" and closed["reason"] == "close_requested"
            assert (await sideband.until("session.closed"))[-1]["reason"] == "close_requested"
        for _ in range(50):
            if not gateway.sessions:
                break
            await asyncio.sleep(0.1)
        assert not gateway.sessions and not gateway.webrtc.calls
    finally:
        await peer.close()


async def test_the_data_channel_allow_lists(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(EchoResponder(pace=0), webrtc__enabled=True)
    client = sdk(gateway)
    peer = LivePeer()
    try:
        channel = {"allowed_client_events": ["session.close"],
                   "allowed_server_events": [{"type": "session.closed"}]}
        created = await client.live.create(
            session={"model": "gpt-live-1", "client": {"data_channel": channel}},
            transport={"type": "webrtc", "sdp": await peer.offer()})
        await peer.accept(created.transport.sdp)
        # session.started is not on the list: the info notice tells the front end what it may do.
        info = (await peer.until("info"))[-1]
        assert info["code"] == "data_channel_permissions" and "session.close" in info["message"]
        peer.send({"type": "session.instructions.append", "event_id": "no", "delegation_id": None, "content": "x"})
        error = (await peer.until("error"))[-1]["error"]
        assert (error["code"], error["client_event_id"]) == ("event_not_allowed", "no")
        await asyncio.sleep(1.0)
        peer.send({"type": "session.close"})
        events = await peer.until("session.closed")
        assert {e["type"] for e in events} == {"session.closed"}  # no audio deltas, no usage: not allowed
    finally:
        await peer.close()


async def test_a_refused_create(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(EchoResponder(pace=0), webrtc__enabled=True)
    peer = LivePeer()
    try:
        with pytest.raises(BadRequestError) as refused:
            await sdk(gateway).live.create(
                session={"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 24000}}},
                transport={"type": "webrtc", "sdp": await peer.offer()})
        assert refused.value.body["param"] == "session.audio.format"
        with pytest.raises(BadRequestError) as no_transport:
            await sdk(gateway).post("/live/sessions", body={"session": {"model": "gpt-live-1"}}, cast_to=object)
        assert (no_transport.value.code, no_transport.value.param) == ("missing_required_parameter", "transport")
        assert not gateway.webrtc.calls
    finally:
        await peer.close()
