"""GPT-Live through the unmodified ``openai`` SDK (``client.live``), every server event checked against the SDK's own
``ServerEvent`` union, and the protocol's rules the types cannot say (times on the 200 ms grid, no ``event_id`` on
audio deltas, session.started first and session.closed last)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from openai import AsyncOpenAI
from openai.types.live import ServerEvent
from pydantic import TypeAdapter

from gateway.server.serve import GatewayServer

SERVER_EVENTS = TypeAdapter(ServerEvent)
FRAME = 4800  # 100 ms of pcm16 24 kHz


def sdk(gateway: GatewayServer, key: str = "test-key") -> AsyncOpenAI:
    port = gateway.port
    return AsyncOpenAI(api_key=key, base_url=f"http://127.0.0.1:{port}/v1",
                       websocket_base_url=f"ws://127.0.0.1:{port}/v1")


def check_event(event: dict[str, Any], raw: bytes | str) -> None:
    SERVER_EVENTS.validate_json(raw)
    kind = event["type"]
    if kind == "session.output_audio.delta" or (kind == "session.input_audio.append"):
        assert "event_id" not in event
    else:
        assert event["event_id"].startswith("event_")
    for key in ("start_ms", "end_ms"):
        if key in event:
            assert isinstance(event[key], int)
    if "start_ms" in event and kind != "session.output_audio.delta":
        assert event["start_ms"] % 200 == 0 and event["end_ms"] % 200 == 0, event
        assert event["end_ms"] >= event["start_ms"]


class LiveClient:
    """A Live connection of the SDK (primary or sideband), strict on what it receives."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.received: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any]) -> None:
        await self.connection.send(event)

    async def send_raw(self, text: str) -> None:
        await self.connection.send_raw(text)

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.connection.recv_bytes(), timeout)
        event = orjson.loads(raw)
        check_event(event, raw)
        self.received.append(event)
        return event

    async def until(self, kind: str, timeout: float = 10.0, **match: Any) -> list[dict[str, Any]]:
        """Events up to and including the first of type ``kind`` whose fields equal ``match``."""
        events = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = await self.recv(max(0.01, deadline - loop.time()))
            events.append(event)
            if event["type"] == kind and all(event.get(k) == v for k, v in match.items()):
                return events

    async def start(self, **session: Any) -> dict[str, Any]:
        await self.send({"type": "session.start", "event_id": "start", "session": {"model": "gpt-live-1", **session}})
        started = await self.recv()
        assert started["type"] == "session.started", started
        return started


@asynccontextmanager
async def live(gateway: GatewayServer, **session: Any) -> AsyncIterator[LiveClient]:
    """A started session (``session``: session.start's fields besides the model)."""
    async with sdk(gateway).live.connect() as connection:
        client = LiveClient(connection)
        await client.start(**session)
        yield client


class Microphone:
    """Streams audio to a session in 100 ms appends at real-time pace (silence when nothing is queued), as
    Pipecat, LiveKit and OpenAI's docs do."""

    def __init__(self, client: LiveClient) -> None:
        self.client = client
        self.queued = bytearray()
        self.sent_ms = 0
        self._task: asyncio.Task[None] | None = None

    def say(self, pcm: bytes) -> None:
        self.queued += pcm

    async def __aenter__(self) -> Microphone:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            frame = bytes(self.queued[:FRAME]).ljust(FRAME, b"\0")
            del self.queued[:FRAME]
            await self.client.send({"type": "session.input_audio.append", "audio": base64.b64encode(frame).decode()})
            self.sent_ms += 100
            await asyncio.sleep(max(0.0, start + self.sent_ms / 1000 - loop.time()))


def audio_of(events: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "session.output_audio.delta")


def transcript(events: list[dict[str, Any]], kind: str = "session.output_transcript.delta") -> str:
    return "".join(e["delta"] for e in events if e["type"] == kind)
