"""GPT-Live over WebRTC: one peer connection per Live session, on the same aiortc plumbing (call_base.py) and registry
as the Realtime calls (gateway/transports/webrtc/calls.py: pending calls, the session slot once connected).

The session started with its HTTP request (``POST /v1/live/sessions``); ``session.started`` goes out on the
``oai-events`` data channel once it opens, and the client's events come on it (``session.start`` and audio appends
are refused there). The microphone track is the timeline: its decoded frames, holes in its RTP timeline filled with
silence, are the session's input audio. Each 100 ms tick's output goes out on the outbound track, upsampled to
48 kHz in 20 ms frames at real time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.audio import Upsampler2x
from gateway.live.session import LiveSession
from gateway.transports.webrtc.call_base import Registry, WebRTCCall
from gateway.transports.webrtc.media import FRAME_SAMPLES, PacedTrack

if TYPE_CHECKING:
    from gateway.runtime.live_runner import LiveRunner

# Output queued beyond this (48 kHz samples: 2 s) is a track that stopped pulling; the oldest is dropped.
MAX_QUEUED = 2 * 48_000


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


class LiveCall(WebRTCCall):
    """A GPT-Live call: the session started with its HTTP request, and it ends the call when it closes."""

    label = "Live call"
    playout: LiveTrack
    runner: LiveRunner

    def __init__(self, registry: Registry, session: LiveSession, client: str, started: Iterable[Any]) -> None:
        # The call is the session: one id for the sideband and the client.
        super().__init__(session.id, registry, client)
        self.session = session
        self.playout = LiveTrack()
        self.runner = registry.gateway.new_live_runner(session, self._send)
        self.runner.media = self.playout.play
        self.runner.end_primary = self._hang_up
        self._started_effects = list(started)

    async def _start(self) -> None:
        await self.runner.start(self._started_effects)  # session.started first

    async def _closing(self) -> None:
        if not self.session.closed and self._started.is_set():
            await self.runner.lost()

    async def _hang_up(self, code: int) -> None:
        """session.closed is out: the call ends (the client's side did not end it)."""
        self.close_soon(client_gone=False)
