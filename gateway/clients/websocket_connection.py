"""The WebSocket transport of the clients: events as JSON text frames, the reply's audio in its deltas."""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from gateway.audio import SAMPLE_RATE
from gateway.clients.connection import (
    AUDIO_DELTA,
    CliError,
    ConnectionLost,
    Endpoint,
    Incoming,
    OnSend,
    ReplyAudio,
    auth_headers,
)


async def open_websocket(endpoint: Endpoint, speed: float = 1.0, on_send: OnSend | None = None) -> WebSocketConnection:
    """A WebSocket connection to ``endpoint``; failures become CliError with the reason in plain words."""
    return WebSocketConnection(await _open_websocket(endpoint), speed, on_send)


async def _open_websocket(endpoint: Endpoint) -> ClientConnection:
    url = endpoint.url
    try:
        # No compression: PCM barely compresses and deflate costs CPU on both ends.
        return await connect(
            url, additional_headers=auth_headers(endpoint), compression=None, max_size=None, open_timeout=10
        )
    except InvalidURI:
        raise CliError(f"{url}: not a WebSocket URL (expected ws://HOST:PORT/v1/realtime)") from None
    except ValueError as exc:  # a port out of range
        raise CliError(f"{url}: {exc}") from None
    except ConnectionRefusedError:
        raise CliError(f"cannot connect to {url}: connection refused (is the gateway running?)") from None
    except TimeoutError:
        raise CliError(f"cannot connect to {url}: timed out") from None
    except InvalidHandshake as exc:
        raise CliError(f"cannot connect to {url}: {exc}") from None
    except OSError as exc:
        raise CliError(f"cannot connect to {url}: {exc.strerror or exc}") from None


class WebSocketConnection:
    """Events as JSON text frames; microphone audio as input_audio_buffer.append; reply audio in deltas."""

    transport = "websocket"
    server_playout = False

    def __init__(self, ws: ClientConnection, speed: float = 1.0, on_send: OnSend | None = None) -> None:
        self.ws = ws
        self.speed = speed
        self.on_send = on_send
        self._next_at: float | None = None  # when the next microphone chunk is due
        self._returned_at = 0.0  # when send_audio last returned
        self._sent_ms: list[float] = []  # input-audio time at the end of each append sent...
        self._sent_at: list[float] = []  # ...and when it was sent (time.monotonic())

    async def send(self, event: dict[str, Any]) -> None:
        if self.on_send is not None:
            self.on_send(event)
        try:
            await self.ws.send(json.dumps(event))
        except ConnectionClosed as exc:
            raise ConnectionLost(str(exc)) from None

    async def send_audio(self, pcm: bytes) -> None:
        # An absolute schedule, so per-send overhead does not accumulate into drift. A caller that took
        # longer than a chunk to come back had paused (between turns, or a live microphone): a fresh one.
        ms = len(pcm) / 2 * 1000 / SAMPLE_RATE
        now = time.monotonic()
        if self._next_at is None or now - self._returned_at > ms / 1000 / self.speed:
            self._next_at = now
        await asyncio.sleep(max(0.0, self._next_at - now))
        await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
        self._sent_ms.append((self._sent_ms[-1] if self._sent_ms else 0.0) + ms)
        self._sent_at.append(time.monotonic())
        self._next_at += ms / 1000 / self.speed
        self._returned_at = time.monotonic()

    def sent_at(self, audio_ms: float) -> float | None:
        # The append that carried that moment (input time is the audio sent so far).
        sent = bisect.bisect_left(self._sent_ms, audio_ms)
        return self._sent_at[sent] if sent < len(self._sent_at) else None

    async def __aiter__(self) -> AsyncIterator[Incoming]:
        try:
            async for message in self.ws:
                event = json.loads(message)
                yield event
                if event.get("type") in AUDIO_DELTA:
                    pcm = base64.b64decode(event.get("delta") or "")
                    yield ReplyAudio(pcm, event.get("response_id"), event.get("item_id"))
        except ConnectionClosed:
            return

    async def close(self) -> None:
        await self.ws.close()


