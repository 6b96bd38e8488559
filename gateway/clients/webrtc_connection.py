"""The client's WebRTC transport (aiortc): OpenAI's signalling, events on ``oai-events``, Opus both ways.

The offer goes out non-trickle: aiortc gathers every ICE candidate before setLocalDescription returns,
so the one POST carries them all. No STUN server is asked: the answerer learns the client's public
address from its connectivity checks (peer-reflexive), as with OpenAI's own browser clients.

The request is what OpenAI's endpoint takes: ``Authorization: Bearer KEY`` and the SDP offer as
``application/sdp``, or — when the URL names a model (``.../v1/realtime/calls?model=gpt-realtime``) or the
caller gives the session's configuration — ``multipart/form-data`` with the parts ``sdp`` and ``session``
(``{"type": "realtime", "model": ..., ...}``), which a standard API key needs. The beta route
(``/v1/realtime?model=...``) takes application/sdp only. The answer's Location names the call, which
``hang_up`` ends.

The server plays the reply out on its track at real time. What arrives on the remote track is reply
audio while the server says it is playing (between ``output_audio_buffer.started`` and ``.stopped`` or
``.cleared``); the receiver hands each packet over as it arrives (no jitter buffer), so the client's
marks are when the audio actually reached it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urljoin, urlsplit

import aiohttp
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from gateway.clients.connection import CliError, ConnectionLost, Endpoint, Incoming, OnSend, ReplyAudio, auth_headers
from gateway.transports.webrtc.media import InboundAudio, Microphone, audio_frames, set_jitter_prefetch

SIGNALLING_TIMEOUT_S = 15.0  # the POST of the offer, answer included
CONNECT_TIMEOUT_S = 15.0  # from the answer to an open data channel (ICE, DTLS, SCTP)
# The microphone starts at session.created; a server that sends none still gets audio after this long.
SESSION_CREATED_WAIT_S = 5.0
# Microphone audio handed to the track ahead of its clock: enough that it never runs dry between two
# sends, little enough that a barge-in's new speech is not queued behind stale audio.
LEAD_MS = 40


async def open_webrtc(endpoint: Endpoint, on_send: OnSend | None = None, session: dict[str, Any] | None = None,
                      jitter_prefetch: int = 0) -> WebRTCConnection:
    """A call to ``endpoint``; ``session``: the session's configuration, sent with the offer (GA);
    ``jitter_prefetch``: the reply track's jitter buffer in 20 ms packets (0: each packet as it arrives)."""
    url = endpoint.address
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"{url}: not an HTTP URL for WebRTC signalling (expected http://HOST:PORT/v1/realtime/calls)")
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number or out of range
    except ValueError as exc:
        raise CliError(f"{url}: {exc}") from None
    connection = WebRTCConnection(on_send, jitter_prefetch)
    try:
        await connection.connect(url, endpoint, session)
    except BaseException:
        await connection.close()
        raise
    return connection


class Answer(NamedTuple):
    """The signalling's answer: the SDP, the call's Location (None if it sent none), and the HTTP status and
    content type it came with."""

    sdp: str
    location: str | None
    status: int
    content_type: str


async def post_offer(url: str, offer: str, endpoint: Endpoint, session: dict[str, Any] | None = None) -> Answer:
    """POST the offer (with ``session``, the session's configuration, if given); the answer, or CliError
    saying why not."""
    headers = auth_headers(endpoint)
    model = parse_qs(urlsplit(url).query).get("model", [None])[0]
    body: aiohttp.FormData | str
    if (model or session is not None) and not endpoint.beta:
        body = aiohttp.FormData(default_to_multipart=True)
        body.add_field("sdp", offer)
        body.add_field("session", json.dumps({"type": "realtime", **({"model": model} if model else {}),
                                              **(session or {})}))
    else:
        body = offer
        headers["Content-Type"] = "application/sdp"
    timeout = aiohttp.ClientTimeout(total=SIGNALLING_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.post(url, data=body, headers=headers) as response,
        ):
            text = await response.text()
            if response.status not in (200, 201):
                raise CliError(f"{url} refused the offer: HTTP {response.status}{_error_detail(text)}")
            if not text.lstrip().startswith("v=0"):
                raise CliError(f"{url} did not answer with an SDP answer ({response.content_type}: {text[:80]!r})")
            return Answer(text, response.headers.get("Location"), response.status, response.content_type)
    except aiohttp.InvalidURL:
        raise CliError(f"{url}: not a valid URL") from None
    except aiohttp.ClientConnectorError as exc:
        reason = "connection refused" if isinstance(exc.os_error, ConnectionRefusedError) else exc.strerror
        raise CliError(f"cannot connect to {url}: {reason} (is the gateway's WebRTC signalling there?)") from None
    except TimeoutError:
        raise CliError(f"cannot connect to {url}: no answer within {SIGNALLING_TIMEOUT_S:.0f} s") from None
    except aiohttp.ClientError as exc:
        raise CliError(f"cannot connect to {url}: {exc}") from None


def _error_detail(body: str) -> str:
    """': message' from an OpenAI-style JSON error body, else the start of the body."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.strip()[:200]
    return f": {message}" if message else ""


class WebRTCConnection:
    """One call: a microphone track out, the agent's track in, JSON events on the ``oai-events`` channel."""

    transport = "webrtc"
    server_playout = True

    def __init__(self, on_send: OnSend | None = None, jitter_prefetch: int = 0) -> None:
        self.on_send = on_send
        self.jitter_prefetch = jitter_prefetch
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Microphone()
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel("oai-events")
        self.url = ""  # the signalling URL, and the endpoint, once connecting
        self.endpoint: Endpoint | None = None
        self.answer: Answer | None = None
        self._incoming: asyncio.Queue[Incoming | None] = asyncio.Queue()
        self._open = asyncio.Event()
        self._ended = asyncio.Event()
        self._playing: str | None = None  # the response the server is playing out
        self._item_of: dict[str, str] = {}  # response → its audio item
        self._listener: asyncio.Task[None] | None = None
        self.channel.on("open", self._open.set)
        self.channel.on("message", self._on_message)
        self.channel.on("close", self._end)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_connection_state)

    async def connect(self, url: str, endpoint: Endpoint, session: dict[str, Any] | None = None) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        self.url = url
        self.endpoint = endpoint
        self.answer = await post_offer(url, self.pc.localDescription.sdp, endpoint, session)
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(self.answer.sdp, "answer"))
        except Exception as exc:  # aiortc raises ValueError and others on answers it cannot use
            raise CliError(f"{url}: the SDP answer cannot be used: {exc}") from None
        opened = asyncio.ensure_future(self._open.wait())
        ended = asyncio.ensure_future(self._ended.wait())
        await asyncio.wait([opened, ended], timeout=CONNECT_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        opened.cancel()
        ended.cancel()
        if not self._open.is_set() or self._ended.is_set():
            raise CliError(f"{url} answered, but the WebRTC connection did not open (ICE or DTLS failed)")
        asyncio.get_running_loop().call_later(SESSION_CREATED_WAIT_S, self.mic.start)

    async def send(self, event: dict[str, Any]) -> None:
        if self.channel.readyState != "open":
            raise ConnectionLost("the data channel is closed")
        if self.on_send is not None:
            self.on_send(event)
        self.channel.send(json.dumps(event))

    async def send_audio(self, pcm: bytes) -> None:
        # The track is the clock: this waits while it has enough queued.
        self.mic.say(pcm)
        try:
            await self.mic.wait_queued(LEAD_MS)
        except MediaStreamError:
            raise ConnectionLost("the call ended") from None

    def sent_at(self, audio_ms: float) -> float | None:
        return self.mic.sent_at(audio_ms)

    async def __aiter__(self) -> AsyncIterator[Incoming]:
        while (item := await self._incoming.get()) is not None:
            yield item

    @property
    def call_location(self) -> str | None:
        """Where the call lives (the answer's Location), which ``hang_up`` ends."""
        return self.answer.location if self.answer is not None else None

    async def hang_up(self) -> int:
        """End the call at the server (DELETE on its Location); the HTTP status."""
        if self.call_location is None or self.endpoint is None:
            raise CliError(f"{self.url} named no call location to hang up")
        url = urljoin(self.url, self.call_location)
        timeout = aiohttp.ClientTimeout(total=SIGNALLING_TIMEOUT_S)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.delete(url, headers=auth_headers(self.endpoint)) as response,
            ):
                return response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CliError(f"cannot hang up {url}: {exc or type(exc).__name__}") from None

    async def close(self) -> None:
        self._end()
        if self._listener is not None:
            self._listener.cancel()
        await self.pc.close()

    # --- callbacks ------------------------------------------------------------------------------

    def _on_message(self, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            return  # not an event: nothing to act on
        kind = event.get("type")
        response_id = event.get("response_id")
        if kind == "session.created":
            self.mic.start()  # the server reads the call's audio from now on: one timeline for both
        elif kind == "response.output_item.added" and (event.get("item") or {}).get("type") == "message":
            self._item_of[response_id] = event["item"].get("id")
        elif kind == "output_audio_buffer.started":
            self._playing = response_id
        elif kind == "output_audio_buffer.cleared" or (
            kind == "output_audio_buffer.stopped" and response_id == self._playing
        ):
            self._item_of.pop(self._playing or "", None)
            self._playing = None
        self._incoming.put_nowait(event)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        for transceiver in self.pc.getTransceivers():
            if transceiver.receiver.track is track:
                set_jitter_prefetch(transceiver.receiver, self.jitter_prefetch)
        self._listener = asyncio.ensure_future(self._listen(track))

    async def _listen(self, track: MediaStreamTrack) -> None:
        inbound = InboundAudio()
        async for frame in audio_frames(track):
            pcm = inbound.convert(frame)  # every frame, silence too: the resampler's state stays continuous
            if self._playing is not None and len(pcm):
                self._incoming.put_nowait(ReplyAudio(pcm.tobytes(), self._playing, self._item_of.get(self._playing)))

    def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self._end()

    def _end(self) -> None:
        if not self._ended.is_set():
            self._ended.set()
            self._incoming.put_nowait(None)
            self.mic.stop()
