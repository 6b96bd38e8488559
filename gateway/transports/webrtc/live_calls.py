"""GPT-Live over WebRTC: one peer connection per Live session, on the same aiortc path and registry as the Realtime
calls (gateway/transports/webrtc/calls.py: pending calls, the connect timeout, the session slot once connected).

The session started with its HTTP request (``POST /v1/live/sessions``); ``session.started`` goes out on the
``oai-events`` data channel once it opens, and the client's events come on it (``session.start`` and audio appends
are refused there). The microphone track is the timeline: its decoded frames, holes in its RTP timeline filled with
silence, are the session's input audio. Each 100 ms tick's output goes out on the outbound track, upsampled to
48 kHz in 20 ms frames at real time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCSessionDescription

from gateway.audio import Upsampler2x
from gateway.live.session import LiveSession
from gateway.transports.webrtc.media import (
    AIORTC_JITTER_PREFETCH,
    FRAME_SAMPLES,
    InboundAudio,
    PacedTrack,
    audio_frames,
    set_jitter_prefetch,
)

if TYPE_CHECKING:
    from aiortc import RTCConfiguration

    from gateway.runtime.gateway import Gateway

log = logging.getLogger(__name__)

# Output queued beyond this (48 kHz samples: 2 s) is a track that stopped pulling; the oldest is dropped.
MAX_QUEUED = 2 * 48_000


class Registry(Protocol):
    """The calls' registry (gateway.transports.webrtc.calls.CallRegistry), as a Live call uses it."""

    gateway: Gateway
    options: Any  # [webrtc]
    rtc_configuration: RTCConfiguration
    calls: dict[str, Any]

    def connected(self, call: Any) -> None: ...

    def spawn(self, coro: Awaitable[None]) -> None: ...


class LiveTrack(PacedTrack):
    """The session's continuous output: what the ticks hand it, silence while none has come."""

    def __init__(self) -> None:
        super().__init__()
        self._upsampler = Upsampler2x()
        self._pending = np.zeros(0, dtype=np.int16)

    def play(self, pcm: bytes) -> None:
        """A tick's 100 ms of pcm16 24 kHz."""
        up = self._upsampler.process(np.frombuffer(pcm, dtype="<i2"))
        self._pending = np.concatenate([self._pending, up])[-MAX_QUEUED:]

    async def next_frame(self) -> np.ndarray:
        samples = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        n = min(FRAME_SAMPLES, len(self._pending))
        samples[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return samples


class LiveCall:
    """One peer connection and its Live session; ``close`` frees both, whichever side ends it."""

    def __init__(self, registry: Registry, session: LiveSession, client: str, started: Iterable[Any]) -> None:
        self.id = session.id  # the call is the session: one id for the sideband and the client
        self.registry = registry
        self.client = client
        self.created = time.monotonic()
        self.pc = RTCPeerConnection(registry.rtc_configuration)
        self.session = session
        self.playout = LiveTrack()
        self.runner = registry.gateway.new_live_runner(session, self._send)
        self.runner.media = self.playout.play
        self.runner.end_primary = self._hang_up
        self.connected = False
        self._started_effects = list(started)
        self._channel: RTCDataChannel | None = None
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue()
        self._inbox_bytes = 0
        self._started = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def answer(self, offer_sdp: str) -> str:
        pc = self.pc
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_connection_state)
        await pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        if "m=audio" in offer_sdp:
            pc.addTrack(self.playout)
        await pc.setLocalDescription(await pc.createAnswer())
        if "m=application" not in offer_sdp:
            self._spawn(self._run_events())  # no data channel: audio only
        self._spawn(self._watchdog())
        return pc.localDescription.sdp

    async def close(self, client_gone: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self.registry.calls.pop(self.id, None)
        if not self.session.closed and self._started.is_set():
            await self.runner.lost()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.registry.gateway.close_session(self.runner, client_gone)
        self.playout.stop()
        await self.pc.close()
        log.info("Live call %s closed", self.id)

    def close_soon(self, client_gone: bool = True) -> None:
        if not self._closed:
            self.registry.spawn(self.close(client_gone))

    async def _hang_up(self, code: int) -> None:
        """session.closed is out: the call ends (the client's side did not end it)."""
        self.close_soon(client_gone=False)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("Live call %s failed", self.id, exc_info=task.exception())
            self.close_soon(client_gone=False)

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if self._channel is not None:
            return
        self._channel = channel
        channel.on("message", self._on_message)
        channel.on("close", self.close_soon)
        self._spawn(self._run_events())

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        prefetch = self.registry.options.jitter_prefetch
        if prefetch != AIORTC_JITTER_PREFETCH:
            for transceiver in self.pc.getTransceivers():
                if transceiver.receiver.track is track:
                    set_jitter_prefetch(transceiver.receiver, prefetch)
        self._spawn(self._run_input(track))

    def _on_message(self, message: str | bytes) -> None:
        # A data channel has no back-pressure: past the per-connection allowance the client is cut off.
        self._inbox_bytes += len(message)
        if self._inbox_bytes > self.registry.gateway.config.server.inbound_free_bytes:
            log.info("Live call %s: %d bytes of events waiting to be handled, closing", self.id, self._inbox_bytes)
            self.close_soon(client_gone=False)
            return
        self._inbox.put_nowait(message)

    def _on_connection_state(self) -> None:
        if self.pc.connectionState == "connected" and not self.connected:
            self.registry.connected(self)
        elif self.pc.connectionState in ("failed", "closed"):
            self.close_soon()

    async def _watchdog(self) -> None:
        timeout = self.registry.options.connect_timeout_s
        await asyncio.sleep(timeout)
        if not self.connected:
            log.info("Live call %s: no connection after %g s ([webrtc] connect_timeout_s), closing", self.id, timeout)
            self.close_soon(client_gone=False)

    async def _run_events(self) -> None:
        await self.runner.start(self._started_effects)  # session.started first
        self._started.set()
        while True:
            message = await self._inbox.get()
            self._inbox_bytes -= len(message)
            await self.runner.receive(message)

    async def _run_input(self, track: MediaStreamTrack) -> None:
        inbound = InboundAudio()
        async for frame in audio_frames(track):
            if not self._started.is_set():
                continue  # the timeline starts with session.started
            pcm = inbound.convert(frame)
            if len(pcm):
                await self.runner.feed_audio(pcm.tobytes())

    async def _send(self, text: str) -> None:
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            channel.send(text)
