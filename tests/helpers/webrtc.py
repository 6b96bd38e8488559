"""The gateway's own WebRTC client (gateway.clients.webrtc_connection) as the tests drive it: every event it
receives checked against the openai package's types, and what arrived kept with its arrival time."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from gateway.clients.connection import Endpoint, ReplyAudio
from gateway.clients.webrtc_connection import WebRTCConnection, open_webrtc
from tests.conftest import BETA_EVENTS, GA_EVENTS, Served


class RtcClient:
    """One call to a gateway at ``base_url`` (``beta``: the beta protocol), its events and reply audio recorded."""

    def __init__(self, base_url: str, beta: bool = False, jitter_prefetch: int = 0) -> None:
        self.base_url = base_url
        self.beta = beta
        self.adapter = BETA_EVENTS if beta else GA_EVENTS
        self.jitter_prefetch = jitter_prefetch
        self.connection: WebRTCConnection | None = None
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.received: list[dict[str, Any]] = []
        self.timed: list[tuple[float, dict[str, Any]]] = []  # (loop time of arrival, event)
        self.invalid: list[str] = []  # events the SDK's types refuse
        # (loop time of arrival, int16 mono 24 kHz) of the reply audio the server played
        self.speaker: list[tuple[float, np.ndarray]] = []
        self._reader: asyncio.Task[None] | None = None

    async def connect(self, path: str = "/v1/realtime/calls", session: dict[str, Any] | None = None) -> None:
        """Call ``path``, with ``session`` (the session's configuration) in the offer's form if given."""
        url = self.base_url + path
        self.connection = await open_webrtc(Endpoint(url, "webrtc", url, beta=self.beta), session=session,
                                            jitter_prefetch=self.jitter_prefetch)
        answer = self.connection.answer
        assert answer is not None and (answer.status, answer.content_type) == (201, "application/sdp"), answer
        self._reader = asyncio.ensure_future(self._read(self.connection))

    @property
    def call(self) -> WebRTCConnection:
        assert self.connection is not None, "not connected"
        return self.connection

    @property
    def mic(self) -> Any:
        return self.call.mic

    @property
    def channel(self) -> Any:
        return self.call.channel

    @property
    def location(self) -> str | None:
        return self.call.call_location

    async def hang_up(self) -> int:
        return await self.call.hang_up()

    async def send(self, event: dict[str, Any]) -> None:
        await self.call.send(event)

    async def until(self, kind: str, timeout: float = 10.0, **match: Any) -> list[dict[str, Any]]:
        """Events up to and including the first of type ``kind`` whose fields equal ``match``."""
        events = []
        async with asyncio.timeout(timeout):
            while True:
                event = await self.events.get()
                events.append(event)
                if event["type"] == kind and all(event.get(k) == v for k, v in match.items()):
                    return events

    def heard(self, since: float, until: float) -> np.ndarray:
        """Reply audio that arrived between two loop times."""
        frames = [f for t, f in self.speaker if since <= t < until]
        return np.concatenate(frames) if frames else np.zeros(0, dtype=np.int16)

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self, connection: WebRTCConnection) -> None:
        loop = asyncio.get_running_loop()
        async for incoming in connection:
            if isinstance(incoming, ReplyAudio):
                self.speaker.append((loop.time(), np.frombuffer(incoming.pcm, dtype="<i2")))
                continue
            try:
                self.adapter.validate_python(incoming)
            except ValueError:
                self.invalid.append(str(incoming))
            self.received.append(incoming)
            self.timed.append((loop.time(), incoming))
            self.events.put_nowait(incoming)


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) if len(samples) else 0.0


async def session_count(gateway: Served, expected: int, timeout: float = 5.0) -> int:
    """The gateway's session count once it equals ``expected`` (or at the timeout)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(gateway.sessions) != expected and loop.time() < deadline:
        await asyncio.sleep(0.05)
    return len(gateway.sessions)
