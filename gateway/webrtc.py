"""The WebRTC transport: SDP signalling over HTTP, Opus audio tracks, events on the ``oai-events`` channel.

websockets cannot read request bodies, so the signalling side (POST an SDP offer, get the answer) is
an aiohttp server on its own port, in the gateway's process and event loop. Each call is one Session
with ``server_playout``: the microphone track feeds the same session logic and VAD as the WebSocket
path, the data channel carries the same JSON events, and the agent's audio goes out on a paced
outbound track that knows how much of each item it has played, so barge-in truncates at the point
the listener actually reached.

Routes (CORS open, so the page served on the gateway's port may call them):
  POST   /v1/realtime/calls             offer as application/sdp, or multipart/form-data with parts
                                        ``sdp`` and ``session`` (JSON, applied as a session.update)
                                        → 201, answer SDP, Location: /v1/realtime/calls/{call_id}
  DELETE /v1/realtime/calls/{call_id}   hang up → 204
  POST   /v1/realtime?model=...         beta signalling (application/sdp) → 201; beta-shaped events
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson
from aiohttp import web
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)

from gateway.audio import Upsampler2x
from gateway.protocol import Dialect
from gateway.rtc_media import (
    AIORTC_JITTER_PREFETCH,
    FRAME_SAMPLES,
    RTC_RATE,
    InboundAudio,
    PacedTrack,
    audio_frames,
    set_jitter_prefetch,
)
from gateway.session import Session
from gateway.trace import ACTIVE_SESSIONS

if TYPE_CHECKING:
    from gateway.server import Gateway

log = logging.getLogger(__name__)

CALLS_PATHS = ("/v1/realtime/calls", "/realtime/calls")
BETA_PATHS = ("/v1/realtime", "/realtime")
# A call whose peer connection is not up by then is dropped: the client went away during ICE.
CONNECT_TIMEOUT_S = 30.0
# Audio a response queues before its playout starts (or resumes after running dry): one frame, so
# a producer at real-time pace whose chunks land just after a frame went out does not run dry at
# the next one; a first chunk of 20 ms or more still starts at once.
CUSHION_SAMPLES = FRAME_SAMPLES

Notify = Callable[[str, str], Awaitable[None]]


class WebRTCOptions(Protocol):
    """The ``[webrtc]`` config section (gateway.config.WebRtcConfig)."""

    host: str
    port: int
    ice_servers: str
    turn_username: str
    turn_credential_env: str
    jitter_prefetch: int


# --- outbound audio: the server-side playout buffer ---------------------------------------------


@dataclass
class _Chunk:
    response_id: str
    item_id: str
    samples: np.ndarray  # int16, 48 kHz mono


class OutboundAudio(PacedTrack):
    """The agent's voice: response audio queued by the session, sent in real-time 20 ms frames.

    It is the session's playout buffer (gateway.runner.Playout): it upsamples 24 → 48 kHz, sends
    silence when nothing is queued, counts how much of the current item has gone out (what the
    listener heard) and reports output_audio_buffer.started / .stopped through ``notify``.
    """

    def __init__(self, notify: Notify) -> None:
        super().__init__()
        self._notify = notify
        self._upsampler = Upsampler2x()
        self._queue: deque[_Chunk] = deque()
        self._queued = 0  # samples in self._queue
        self._filling = True  # holding audio back until the cushion is queued
        self._feeding: tuple[str, str] | None = None  # (response, item) the upsampler is working on
        self._playing: str | None = None  # response between its started and stopped events
        self._item: str | None = None  # item of the audio last sent
        self._item_samples = 0  # samples of self._item sent so far
        self._done: set[str] = set()  # responses whose response.done has been sent
        self.underruns = 0  # times a playing response ran dry: its audio came too late

    # Playout interface, called by the runner ---------------------------------------------------

    def play(self, response_id: str, item_id: str, pcm: bytes) -> None:
        if self._feeding != (response_id, item_id):
            self._flush_upsampler()
            self._feeding = (response_id, item_id)
        self._enqueue(response_id, item_id, self._upsampler.process(np.frombuffer(pcm, dtype="<i2")))

    def clear(self) -> tuple[str, float] | None:
        """Drop all queued audio; (item id, ms of it sent) for the item playing or about to play."""
        item = self._item if self._playing is not None else None
        heard = self._item_samples if item is not None else 0
        if item is None and self._queue:
            item = self._queue[0].item_id
        self._queue.clear()
        self._queued = 0
        self._filling = True
        self._upsampler.reset()
        self._feeding = None
        # Cleared, not stopped: the session answers with output_audio_buffer.cleared instead.
        self._playing = None
        self._item = None
        self._item_samples = 0
        self._done.clear()
        return (item, heard * 1000 / RTC_RATE) if item is not None else None

    def finished(self, response_id: str) -> None:
        """The response's response.done went out: once its queued audio has played, it has stopped."""
        if self._feeding is not None and self._feeding[0] == response_id:
            self._flush_upsampler()
            self._feeding = None
        if self._playing == response_id or any(c.response_id == response_id for c in self._queue):
            self._done.add(response_id)

    # MediaStreamTrack -----------------------------------------------------------------------------

    async def next_frame(self) -> np.ndarray:
        samples = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        events: list[tuple[str, str]] = []
        if self._filling and self._queue and (
            self._queued >= CUSHION_SAMPLES or self._queue[0].response_id in self._done
        ):
            self._filling = False
        if not self._filling:
            filled = self._fill(samples, events)
            if filled < FRAME_SAMPLES and self._playing is not None and self._playing not in self._done:
                self.underruns += 1
                self._filling = True
        if self._playing in self._done and not self._queue:
            events.append(("output_audio_buffer.stopped", self._playing))
            self._done.discard(self._playing)
            self._playing = None
            self._filling = True
        for kind, response_id in events:
            await self._notify(kind, response_id)
        return samples

    def _fill(self, samples: np.ndarray, events: list[tuple[str, str]]) -> int:
        """Move queued audio into ``samples``; returns how many were filled."""
        filled = 0
        while filled < len(samples) and self._queue:
            chunk = self._queue[0]
            n = min(len(samples) - filled, len(chunk.samples))
            samples[filled : filled + n] = chunk.samples[:n]
            filled += n
            self._queued -= n
            if n == len(chunk.samples):
                self._queue.popleft()
            else:
                chunk.samples = chunk.samples[n:]
            if chunk.response_id != self._playing:
                if self._playing is not None:
                    events.append(("output_audio_buffer.stopped", self._playing))
                    self._done.discard(self._playing)
                self._playing = chunk.response_id
                events.append(("output_audio_buffer.started", chunk.response_id))
            if chunk.item_id != self._item:
                self._item, self._item_samples = chunk.item_id, 0
            self._item_samples += n
        return filled

    def _enqueue(self, response_id: str, item_id: str, samples: np.ndarray) -> None:
        if len(samples):
            self._queue.append(_Chunk(response_id, item_id, samples))
            self._queued += len(samples)

    def _flush_upsampler(self) -> None:
        if self._feeding is not None:
            self._enqueue(*self._feeding, self._upsampler.flush())


# --- one call -------------------------------------------------------------------------------------


class Call:
    """One peer connection and its session; ``close`` frees both, whichever side ends the call."""

    def __init__(self, server: WebRTCServer, dialect: Dialect) -> None:
        gateway = server.gateway
        self.id = "rtc_" + secrets.token_hex(12)
        self.server = server
        self.pc = RTCPeerConnection(server.rtc_configuration)
        self.session = Session(gateway.config, dialect, server_playout=True)
        self.playout = OutboundAudio(self._on_playout)
        self.runner = gateway.new_runner(self.session, self._send, self.playout)
        self._channel: RTCDataChannel | None = None
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue()
        self._started = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def configure(self, session_config: dict[str, Any]) -> str | None:
        """Apply the ``session`` part of the offer before session.created; an error message if refused."""
        for effect in self.session.handle(orjson.dumps({"type": "session.update", "session": session_config})):
            if isinstance(effect, dict) and effect.get("type") == "error":
                return str(effect["error"]["message"])
        return None

    async def answer(self, offer_sdp: str) -> str:
        pc = self.pc
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_connection_state)
        await pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        if "m=audio" in offer_sdp:
            pc.addTrack(self.playout)
        else:
            # A text-only client (a data channel and no audio): replies in text, nothing to play.
            self.runner.playout = None
            self.session.settings.modalities = ["text"]
        # Non-trickle: setLocalDescription returns once ICE gathering is complete, so the
        # answer carries every candidate.
        await pc.setLocalDescription(await pc.createAnswer())
        if "m=application" not in offer_sdp:
            self._spawn(self._run_events())  # no data channel offered: audio only, events dropped
        self._spawn(self._watchdog())
        return pc.localDescription.sdp

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.server.calls.pop(self.id, None)
        self.server.gateway.sessions.discard(self.runner)
        ACTIVE_SESSIONS.set(len(self.server.gateway.sessions))
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.runner.close()
        self.playout.stop()
        await self.pc.close()
        log.info("call %s closed (%d playout underruns)", self.id, self.playout.underruns)

    def close_soon(self) -> None:
        """Close from an aiortc callback without cancelling the task the callback runs in."""
        if not self._closed:
            self.server.spawn(self.close())

    # --- callbacks and tasks ------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # A dead input or event task would leave the call up but deaf (and the track's queue
        # growing): end the call instead.
        if not task.cancelled() and task.exception() is not None:
            log.error("call %s failed", self.id, exc_info=task.exception())
            self.close_soon()

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        # The first channel carries the events; OpenAI's clients name it "oai-events", others may not.
        if self._channel is not None:
            return
        self._channel = channel
        channel.on("message", self._inbox.put_nowait)
        channel.on("close", self.close_soon)
        self._spawn(self._run_events())

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        prefetch = self.server.options.jitter_prefetch
        if prefetch != AIORTC_JITTER_PREFETCH:
            for transceiver in self.pc.getTransceivers():
                if transceiver.receiver.track is track:
                    set_jitter_prefetch(transceiver.receiver, prefetch)
        self._spawn(self._run_input(track))

    def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.close_soon()

    async def _watchdog(self) -> None:
        await asyncio.sleep(CONNECT_TIMEOUT_S)
        if self.pc.connectionState != "connected":
            log.info("call %s: no connection after %.0f s, closing", self.id, CONNECT_TIMEOUT_S)
            self.close_soon()

    async def _run_events(self) -> None:
        # session.created goes out first, then client events in the order they arrived.
        await self.runner.start()
        self._started.set()
        while True:
            await self.runner.receive(await self._inbox.get())

    async def _run_input(self, track: MediaStreamTrack) -> None:
        inbound = InboundAudio()
        async for frame in audio_frames(track):
            if not self._started.is_set():
                continue  # the session reads its audio from session.created on
            pcm = inbound.convert(frame)
            if len(pcm):
                await self.runner.feed_audio(pcm.tobytes())

    async def _on_playout(self, kind: str, response_id: str) -> None:
        if kind == "output_audio_buffer.started":
            await self.runner.playout_started(response_id)
        else:
            await self.runner.playout_stopped(response_id)

    async def _send(self, text: str) -> None:
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            channel.send(text)


# --- HTTP signalling ------------------------------------------------------------------------------


class OfferError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _error(status: int, code: str, message: str) -> web.Response:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": None}}
    return web.json_response(body, status=status, dumps=lambda o: orjson.dumps(o).decode())


async def _read_offer(request: web.Request) -> tuple[str, dict[str, Any] | None]:
    """(offer SDP, session config or None) from an application/sdp or form body (parts sdp, session)."""
    if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.post()
        sdp, session_text = _form_text(form.get("sdp")), _form_text(form.get("session"))
        if sdp is None:
            raise OfferError(400, "missing_required_parameter", "The form has no 'sdp' part.")
        if session_text is None:
            return sdp, None
        try:
            session = orjson.loads(session_text)
        except orjson.JSONDecodeError as exc:
            raise OfferError(400, "invalid_json", f"The 'session' part is not valid JSON: {exc}.") from None
        if not isinstance(session, dict):
            raise OfferError(400, "invalid_value", "The 'session' part must be a JSON object.")
        return sdp, session
    if request.content_type in ("application/sdp", "text/plain"):
        return await request.text(), None
    raise OfferError(
        415, "unsupported_content_type", "Send the SDP offer as application/sdp or multipart/form-data."
    )


def _offer_problem(sdp: str) -> str | None:
    """What makes a body unusable as an SDP offer, in words (aiortc's own errors are cryptic)."""
    if not sdp.strip():
        return "The body is empty: send the SDP offer (application/sdp)."
    if not sdp.lstrip().startswith("v=0"):
        return "The body is not an SDP offer (it should start with 'v=0')."
    if "m=audio" not in sdp and "m=application" not in sdp:
        return "The offer has no media: it needs an audio track (m=audio) and/or a data channel (m=application)."
    return None


def _form_text(value: str | bytes | web.FileField | None) -> str | None:
    """A form part as text; browsers send a Blob part as a file."""
    if isinstance(value, web.FileField):
        return value.file.read().decode()
    if isinstance(value, bytes):
        return value.decode()
    return value


@web.middleware
async def _cors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Let the page on the gateway's (other) port POST offers and read the Location header."""
    if request.method == "OPTIONS":
        response: web.StreamResponse = web.Response(status=204)
    else:
        response = await handler(request)
    response.headers["Access-Control-Allow-Origin"] = request.headers.get("Origin", "*")
    response.headers["Access-Control-Allow-Methods"] = "POST, DELETE, OPTIONS"
    response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type, OpenAI-Beta"
    response.headers["Access-Control-Expose-Headers"] = "Location"
    response.headers["Access-Control-Max-Age"] = "600"
    response.headers["Vary"] = "Origin"
    return response


def ice_configuration(options: WebRTCOptions) -> RTCConfiguration:
    """No ICE server unless configured: aiortc's default (Google STUN) is unreachable offline, and host
    candidates are enough on loopback and a LAN."""
    urls = [u.strip() for u in options.ice_servers.split(",") if u.strip()]
    credential = os.environ.get(options.turn_credential_env, "") if options.turn_credential_env else ""
    servers = [
        RTCIceServer(urls=url, username=options.turn_username or None, credential=credential or None)
        if url.startswith(("turn:", "turns:"))
        else RTCIceServer(urls=url)
        for url in urls
    ]
    return RTCConfiguration(iceServers=servers)


class WebRTCServer:
    """The signalling HTTP server and the calls it made."""

    def __init__(self, gateway: Gateway, options: WebRTCOptions) -> None:
        self.gateway = gateway
        self.options = options
        self.rtc_configuration = ice_configuration(options)
        self.calls: dict[str, Call] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        app = web.Application(middlewares=[_cors])
        for path in CALLS_PATHS:
            app.router.add_post(path, self._post_call)
            app.router.add_delete(path + "/{call_id}", self._delete_call)
        for path in BETA_PATHS:
            app.router.add_post(path, self._post_beta)
        self.app = app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.options.host, self.options.port).start()
        log.info("WebRTC signalling on http://%s:%d/v1/realtime/calls", self.options.host, self.port)

    @property
    def port(self) -> int:
        assert self._runner is not None
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        await asyncio.gather(*(call.close() for call in list(self.calls.values())))
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _post_call(self, request: web.Request) -> web.Response:
        return await self._create(request, Dialect.GA)

    async def _post_beta(self, request: web.Request) -> web.Response:
        return await self._create(request, Dialect.BETA)

    async def _create(self, request: web.Request, dialect: Dialect) -> web.Response:
        gateway = self.gateway
        if not gateway.ready:
            return _error(503, "not_ready", "The gateway is starting.")
        if len(gateway.sessions) >= gateway.config.server.max_sessions:
            return _error(503, "too_many_sessions", "Too many sessions.")
        try:
            offer, session_config = await _read_offer(request)
        except OfferError as exc:
            return _error(exc.status, exc.code, str(exc))
        if (problem := _offer_problem(offer)) is not None:
            return _error(400, "invalid_offer", problem)
        call = Call(self, dialect)
        if session_config is not None and (message := call.configure(session_config)) is not None:
            await call.close()
            return _error(400, "invalid_session", message)
        self.calls[call.id] = call
        gateway.sessions.add(call.runner)
        ACTIVE_SESSIONS.set(len(gateway.sessions))
        try:
            answer = await call.answer(offer)
        except Exception as exc:  # aiortc raises ValueError and others on offers it cannot use
            await call.close()
            return _error(400, "invalid_offer", f"The SDP offer cannot be used: {exc}")
        log.info("call %s (%s) answered", call.id, dialect.name)
        return web.Response(
            status=201, text=answer, content_type="application/sdp",
            headers={"Location": f"/v1/realtime/calls/{call.id}"},
        )

    async def _delete_call(self, request: web.Request) -> web.Response:
        call = self.calls.get(request.match_info["call_id"])
        if call is None:
            return _error(404, "call_not_found", "No such call.")
        await call.close()
        return web.Response(status=204)


async def start_webrtc(gateway: Gateway) -> WebRTCServer:
    """Start the signalling server for ``gateway``, as its config's [webrtc] section says."""
    server = WebRTCServer(gateway, gateway.config.webrtc)
    await server.start()
    return server
