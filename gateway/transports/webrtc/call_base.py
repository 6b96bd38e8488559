"""What a Realtime call (calls.py) and a GPT-Live call (live_calls.py) share: one aiortc peer connection, its first
data channel for the events and its microphone track for the audio, the tasks that serve them, the connect
timeout, and a ``close`` that frees it all whichever side ends the call. Each kind starts its session its own way
(``_start``) and adds its own steps to ``close``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCSessionDescription

from gateway.transports.webrtc.media import (
    AIORTC_JITTER_PREFETCH,
    InboundAudio,
    PacedTrack,
    audio_frames,
    set_jitter_prefetch,
)
from gateway.transports.webrtc.offers import has_media

if TYPE_CHECKING:
    from aiortc import RTCConfiguration

    from gateway.runtime.gateway import Gateway
    from gateway.runtime.live_runner import LiveRunner
    from gateway.runtime.session_runner import SessionRunner

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"
EVENTS_CHANNEL_WAIT_S = 0.25


class Registry(Protocol):
    """The calls' registry (gateway.transports.webrtc.calls.CallRegistry, which imports this module), as a call
    uses it."""

    gateway: Gateway
    options: Any  # [webrtc]
    rtc_configuration: RTCConfiguration
    calls: dict[str, Any]

    def connected(self, call: WebRTCCall) -> None: ...

    def spawn(self, coro: Awaitable[None]) -> None: ...


class WebRTCCall:
    """One peer connection and its session; ``close`` frees both, whichever side ends the call. A subclass sets
    ``session``, ``playout`` and ``runner`` and starts its runner in ``_start``."""

    label = "call"  # what the log calls it
    playout: PacedTrack
    runner: SessionRunner | LiveRunner

    def __init__(self, call_id: str, registry: Registry, client: str) -> None:
        self.id = call_id
        self.registry = registry
        self.client = client  # the address that made the offer (its pending calls are counted)
        self.created = time.monotonic()
        self.pc = RTCPeerConnection(registry.rtc_configuration)
        self.connected = False  # the peer connection came up: the call counts as a session
        self._channel: RTCDataChannel | None = None
        self._waiting = False  # a channel of another label came first: "oai-events" may still follow it
        self._heard = False  # an audio track feeds the session
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
        if has_media(offer_sdp, "audio"):
            pc.addTrack(self.playout)
        # Non-trickle: setLocalDescription returns once ICE gathering is complete, so the
        # answer carries every candidate.
        await pc.setLocalDescription(await pc.createAnswer())
        if not has_media(offer_sdp, "application"):
            self._spawn(self._run_events())  # no data channel offered: audio only, events dropped
        self._spawn(self._watchdog())
        return pc.localDescription.sdp

    async def close(self, client_gone: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self.registry.calls.pop(self.id, None)
        await self._closing()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await self.registry.gateway.close_session(self.runner, client_gone)
        except Exception:
            log.exception("%s %s: closing its session failed", self.label, self.id)
        await self._session_closed()
        self.playout.stop()
        try:
            await self.pc.close()
        except Exception as exc:  # aiortc's teardown of what it set up from the peer's offer
            log.warning("%s %s: closing its peer connection failed (%s: %s)", self.label, self.id,
                        type(exc).__name__, exc)
        # Its listeners hold the call: without them a call that ends is freed at once by reference counting,
        # not by the collector.
        self.pc.remove_all_listeners()
        if self._channel is not None:
            self._channel.remove_all_listeners()
        self._log_closed()

    def close_soon(self, client_gone: bool = True) -> None:
        """Close from an aiortc callback without cancelling the task the callback runs in."""
        if not self._closed:
            self.registry.spawn(self.close(client_gone))

    # --- what each kind of call does its own way ------------------------------------------------------

    async def _start(self) -> None:
        """Start the runner: the session's first event goes out."""
        raise NotImplementedError

    async def _closing(self) -> None:
        """A last word to the session as the call ends, while its tasks still run."""

    async def _session_closed(self) -> None:
        """The session is closed; the peer connection is not yet."""

    def _log_closed(self) -> None:
        log.info("%s %s closed", self.label, self.id)

    async def _send(self, text: str) -> None:
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            channel.send(text)

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
            log.error("%s %s failed", self.label, self.id, exc_info=task.exception())
            self.close_soon(client_gone=False)

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        # The events travel on "oai-events"; a client that names its channel otherwise has its first one, once
        # no "oai-events" followed it within EVENTS_CHANNEL_WAIT_S (channels a client opens together come so).
        if self._channel is not None:
            return
        if channel.label != EVENTS_CHANNEL:
            if not self._waiting:
                self._waiting = True
                asyncio.get_running_loop().call_later(EVENTS_CHANNEL_WAIT_S, self._take_channel, channel)
            return
        self._take_channel(channel)

    def _take_channel(self, channel: RTCDataChannel) -> None:
        if self._channel is not None or self._closed:
            return
        self._channel = channel
        channel.on("message", self._on_message)
        channel.on("close", self.close_soon)
        self._spawn(self._run_events())

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self._heard:
            return  # one microphone: a second track on the same clock would interleave with the first
        self._heard = True
        prefetch = self.registry.options.jitter_prefetch
        if prefetch != AIORTC_JITTER_PREFETCH:
            for transceiver in self.pc.getTransceivers():
                if transceiver.receiver.track is track:
                    set_jitter_prefetch(transceiver.receiver, prefetch)
        self._spawn(self._run_input(track))

    def _on_message(self, message: str | bytes) -> None:
        # A data channel has no back-pressure: a client whose events pile up unhandled past the
        # per-connection allowance is cut off rather than allowed to fill the server's memory.
        self._inbox_bytes += len(message)
        if self._inbox_bytes > self.registry.gateway.config.server.inbound_free_bytes:
            log.info("%s %s: %d bytes of events waiting to be handled, closing", self.label, self.id,
                     self._inbox_bytes)
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
            log.info("%s %s: no connection after %g s ([webrtc] connect_timeout_s), closing", self.label, self.id,
                     timeout)
            self.close_soon(client_gone=False)

    async def _run_events(self) -> None:
        # The session's first event goes out first, then client events in the order they arrived.
        await self._start()
        self._started.set()
        while True:
            message = await self._inbox.get()
            self._inbox_bytes -= len(message)
            await self.runner.receive(message)

    async def _run_input(self, track: MediaStreamTrack) -> None:
        inbound = InboundAudio()
        async for frame in audio_frames(track):
            if not self._started.is_set():
                continue  # the session takes audio from its first event on
            pcm = inbound.convert(frame)
            if len(pcm):
                await self.runner.feed_audio(pcm.tobytes())
