"""A client's connection to a Realtime endpoint: one small interface over WebSocket and WebRTC.

The terminal client and the replay run their conversation logic on a ``Connection``: send an event,
send microphone audio (paced like a microphone), and iterate over what arrives — server events and
the reply's audio (``ReplyAudio``), in arrival order. Over WebSocket the reply audio comes in
``response.output_audio.delta`` events and the client plays it; over WebRTC (gateway.webrtc_client,
an optional extra) it arrives on the remote track at real time, because the server plays it out
(``server_playout``) and truncates the reply itself on barge-in.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from gateway.audio import SAMPLE_RATE

TRANSPORTS = ("websocket", "webrtc")
# GA and beta event names: the clients accept both, whichever protocol they asked for.
AUDIO_DELTA = frozenset({"response.output_audio.delta", "response.audio.delta"})
INSTALL_WEBRTC = "WebRTC needs the webrtc extra: pip install 'voice-gateway[webrtc]' (aiortc and aiohttp)"


class CliError(Exception):
    """A problem the user can fix (bad path, bad format, server unreachable): message, exit code 2."""


class ConnectionLost(Exception):
    """The connection closed while the client was sending."""


@dataclass
class ReplyAudio:
    """Reply audio as it reached the client: pcm16 mono 24 kHz, and the response and item it belongs to."""

    pcm: bytes
    response_id: str | None
    item_id: str | None


Incoming = dict[str, Any] | ReplyAudio
OnSend = Callable[[dict[str, Any]], None]


class Connection(Protocol):
    transport: str
    server_playout: bool  # the server plays the reply out (WebRTC): the client neither paces nor truncates it

    async def send(self, event: dict[str, Any]) -> None: ...

    async def send_audio(self, pcm: bytes) -> None:
        """Microphone audio (pcm16 mono 24 kHz): returns when it is due, so audio goes out at its pace."""
        ...

    def sent_at(self, audio_ms: float) -> float | None:
        """The time.monotonic() at which input audio time ``audio_ms`` went out (None before it did)."""
        ...

    def __aiter__(self) -> AsyncIterator[Incoming]: ...

    async def close(self) -> None: ...


@dataclass
class Endpoint:
    """Where and how to connect: the command lines' --url, --webrtc/--transport, --signalling-url, --api-key."""

    url: str
    transport: str = "websocket"
    signalling_url: str | None = None  # WebRTC: None derives it from ``url``
    api_key: str | None = None
    beta: bool = False

    @property
    def address(self) -> str:
        """The URL actually connected to."""
        if self.transport == "webrtc":
            return self.signalling_url or signalling_url_for(self.url, self.beta)
        return self.url


def endpoint_from(args: Any, transport: str) -> Endpoint:
    """The endpoint that the options of ``add_arguments`` name."""
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or None
    return Endpoint(args.url, transport, args.signalling_url, api_key, args.beta)


def signalling_url_for(url: str, beta: bool = False) -> str:
    """The WebRTC signalling URL beside a Realtime WebSocket URL: same host, port and query.

    ws://h:p/v1/realtime?model=m → http://h:p/v1/realtime/calls?model=m (beta: .../v1/realtime?model=m,
    the beta route). A path ending in /realtime keeps its prefix (a proxy's /openai/v1/realtime).
    """
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    if not path.endswith("/realtime"):
        path = "/v1/realtime"
    return urlunsplit((scheme, parts.netloc, path if beta else path + "/calls", parts.query, ""))


def check_transport(transport: str) -> None:
    """Fail early, before any work, when the transport's optional packages are missing."""
    if transport == "webrtc":
        try:
            import gateway.webrtc_client  # noqa: F401, PLC0415 - aiortc is an optional extra
        except ImportError as exc:
            raise CliError(f"{INSTALL_WEBRTC}; {exc}") from None


async def open_connection(endpoint: Endpoint, speed: float = 1.0, on_send: OnSend | None = None) -> Connection:
    """Connect as ``endpoint`` says; failures become CliError with the reason in plain words.

    ``speed`` paces the microphone faster than real time (WebSocket only: WebRTC audio is real time);
    ``on_send`` sees every event sent, microphone appends included.
    """
    if endpoint.transport == "webrtc":
        check_transport("webrtc")
        from gateway.webrtc_client import open_webrtc  # noqa: PLC0415

        return await open_webrtc(endpoint, on_send)
    if endpoint.transport != "websocket":
        raise CliError(f"unknown transport {endpoint.transport!r} (expected one of {', '.join(TRANSPORTS)})")
    return WebSocketConnection(await _open_websocket(endpoint), speed, on_send)


def auth_headers(endpoint: Endpoint) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    if endpoint.beta:
        headers["OpenAI-Beta"] = "realtime=v1"
    return headers


async def _open_websocket(endpoint: Endpoint) -> ClientConnection:
    url = endpoint.url
    try:
        # No compression: PCM barely compresses and deflate costs CPU on both ends.
        return await connect(
            url, additional_headers=auth_headers(endpoint), compression=None, max_size=None, open_timeout=10
        )
    except InvalidURI:
        raise CliError(f"{url}: not a WebSocket URL (expected ws://HOST:PORT/v1/realtime)") from None
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


def add_arguments(parser: argparse.ArgumentParser, default_url: str) -> None:
    """The endpoint options both command lines share (each adds its own way to pick the transport)."""
    parser.add_argument("--url", default=default_url, help=f"Realtime WebSocket endpoint (default {default_url}); "
                        "over WebRTC the signalling URL is derived from it")
    parser.add_argument("--signalling-url", metavar="URL",
                        help="WebRTC signalling endpoint (default: --url's host and port, path /v1/realtime/calls, "
                        "its query kept; e.g. https://api.openai.com/v1/realtime/calls?model=gpt-realtime)")
    parser.add_argument("--api-key", default=None,
                        help="sent as 'Authorization: Bearer KEY' on either transport (default: the "
                        "OPENAI_API_KEY environment variable; none when unset)")
    parser.add_argument("--beta", action="store_true", help="speak the beta protocol (OpenAI-Beta: realtime=v1)")
