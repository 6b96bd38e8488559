"""A client's connection to a Realtime endpoint: one small interface over WebSocket and WebRTC.

The terminal client and the replay run their conversation logic on a ``Connection``: send an event,
send microphone audio (paced like a microphone), and iterate over what arrives — server events and
the reply's audio (``ReplyAudio``), in arrival order. Over WebSocket the reply audio comes in
``response.output_audio.delta`` events and the client plays it; over WebRTC (gateway.clients.webrtc_connection,
an optional extra) it arrives on the remote track at real time, because the server plays it out
(``server_playout``) and truncates the reply itself on barge-in.

This module holds the interface and the endpoint; gateway.clients.websocket_connection and
gateway.clients.webrtc_connection are the two transports, and gateway.clients.connect opens the one an endpoint
names.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

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


def auth_headers(endpoint: Endpoint) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    if endpoint.beta:
        headers["OpenAI-Beta"] = "realtime=v1"
    return headers


def add_arguments(parser: argparse.ArgumentParser, default_url: str) -> None:
    """The endpoint options both command lines share (each adds its own way to pick the transport)."""
    parser.add_argument("--url", default=default_url,
                        help=f"Realtime WebSocket endpoint (default {default_url}); over WebRTC the signalling URL "
                        "is derived from it")
    parser.add_argument("--signalling-url", metavar="URL",
                        help="WebRTC signalling endpoint (default: --url's host and port, path /v1/realtime/calls, "
                        "its query kept; e.g. https://api.openai.com/v1/realtime/calls?model=gpt-realtime)")
    parser.add_argument("--api-key", default=None,
                        help="sent as 'Authorization: Bearer KEY' on either transport (default: the "
                        "OPENAI_API_KEY environment variable; none when unset)")
    parser.add_argument("--beta", action="store_true", help="speak the beta protocol (OpenAI-Beta: realtime=v1)")
