"""aiortc audio shared by both ends of a call: the gateway's (gateway.transports.webrtc.calls) and the
client's (gateway.clients.webrtc_connection).

A paced outbound track (20 ms frames at real time, stereo so Opus keeps the level), the inbound side (a
remote track's frames to pcm16 24 kHz mono, holes in its timeline filled), and the receiver's jitter buffer.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections.abc import AsyncIterator

import numpy as np
from aiortc import MediaStreamTrack
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpreceiver import RTCRtpReceiver
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add
from av import AudioFrame

from gateway.audio import SAMPLE_RATE, Downsampler2x, StreamResampler, Upsampler2x

log = logging.getLogger(__name__)

RTC_RATE = 48_000  # Opus always runs at 48 kHz
FRAME_SAMPLES = 960  # 20 ms at 48 kHz: the Opus frame and RTP packet size browsers expect
TIME_BASE = fractions.Fraction(1, RTC_RATE)
# aiortc's audio jitter buffer: 16 packets, released once 4 later ones have arrived (~80 ms held).
AIORTC_JITTER_CAPACITY = 16
AIORTC_JITTER_PREFETCH = 4
# Longest hole in the input timeline filled with silence (a longer one is a clock jump, not a pause).
MAX_GAP_S = 2


# --- outbound ---------------------------------------------------------------------------------------


class PacedTrack(MediaStreamTrack):
    """An outbound audio track that sends one 20 ms frame per 20 ms of real time; ``next_frame`` fills each.

    aiortc pulls frames as fast as ``recv`` returns them, so the track keeps the clock itself: it sleeps
    to an absolute schedule (start + pts), so per-frame overhead does not accumulate into drift.
    """

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._start: float | None = None
        self._pts = 0

    async def next_frame(self) -> np.ndarray:
        """The next FRAME_SAMPLES of int16 mono 48 kHz audio."""
        raise NotImplementedError

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:
            self._pts += FRAME_SAMPLES
            # Sleep first, fill after: the frame then carries whatever arrived during the wait.
            await asyncio.sleep(self._start + self._pts / RTC_RATE - loop.time())
        samples = await self.next_frame()
        # Stereo, both channels the same: aiortc's Opus encoder takes stereo as it is, but upmixes mono
        # through FFmpeg at -3 dB.
        frame = AudioFrame.from_ndarray(np.repeat(samples, 2).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = RTC_RATE
        frame.pts = self._pts
        frame.time_base = TIME_BASE
        return frame


class Microphone(PacedTrack):
    """A client's microphone: speaks queued pcm16 24 kHz audio at real time, silence when none is queued.

    It sends nothing until ``start()``: the gateway reads a call's audio from session.created on, so a
    track started then has the same timeline as the server's input (``audio_end_ms`` and the like).
    """

    def __init__(self) -> None:
        super().__init__()
        self._upsampler = Upsampler2x()
        self._pending = np.zeros(0, dtype=np.int16)
        self._live = asyncio.Event()
        self._sent = asyncio.Event()
        self._started_at: float | None = None  # time.monotonic() of the first frame

    def start(self) -> None:
        self._live.set()

    def say(self, pcm: bytes) -> None:
        """Queue pcm16 24 kHz mono audio after what is already queued."""
        up = self._upsampler.process(np.frombuffer(pcm, dtype="<i2"))
        self._pending = np.concatenate([self._pending, up])

    @property
    def queued_ms(self) -> float:
        return len(self._pending) * 1000 / RTC_RATE

    @property
    def sent_ms(self) -> float:
        """Audio sent so far, silence included."""
        return self._pts * 1000 / RTC_RATE if self._started_at is not None else 0.0

    def sent_at(self, audio_ms: float) -> float | None:
        """The time.monotonic() at which audio time ``audio_ms`` of this track went out."""
        return None if self._started_at is None else self._started_at + audio_ms / 1000

    async def wait_queued(self, ms: float) -> None:
        """Return once no more than ``ms`` of audio is queued; MediaStreamError once the track has ended."""
        while self.queued_ms > ms:
            if self.readyState != "live":
                raise MediaStreamError
            self._sent.clear()
            await self._sent.wait()

    def stop(self) -> None:
        super().stop()
        self._live.set()  # recv and wait_queued see the end instead of waiting for ever
        self._sent.set()

    async def recv(self) -> AudioFrame:
        await self._live.wait()
        if self._started_at is None:
            self._started_at = time.monotonic()
        return await super().recv()

    async def next_frame(self) -> np.ndarray:
        samples = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        n = min(FRAME_SAMPLES, len(self._pending))
        samples[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        self._sent.set()
        return samples


# --- inbound --------------------------------------------------------------------------------------


async def audio_frames(track: MediaStreamTrack) -> AsyncIterator[AudioFrame]:
    """A remote audio track's decoded frames, until it ends (keep reading: its queue is unbounded)."""
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        assert isinstance(frame, AudioFrame)
        yield frame


def mono_s16(frame: AudioFrame) -> np.ndarray:
    """A decoded frame as int16 mono (aiortc's Opus decoder gives s16 stereo, interleaved)."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if data.dtype != np.int16:
        raise ValueError(f"unexpected audio sample format {frame.format.name}")
    if channels == 1:
        return data.reshape(-1)
    # Packed formats come as (1, samples × channels), planar ones as (channels, samples).
    per_channel = data.reshape(-1, channels) if not frame.format.is_planar else data.T
    return (per_channel.astype(np.int32).sum(axis=1) // channels).astype(np.int16)


class InboundAudio:
    """A remote audio track's decoded frames as pcm16 mono 24 kHz, in order, one call at a time."""

    def __init__(self) -> None:
        self._resampler: Downsampler2x | StreamResampler | None = None
        self._rate = 0
        self._next_pts: int | None = None

    def convert(self, frame: AudioFrame) -> np.ndarray:
        if self._resampler is None or self._rate != frame.sample_rate:
            self._rate = frame.sample_rate
            # Opus is always 48 kHz; G.711 (8 kHz) if that is all the peer offered.
            self._resampler = Downsampler2x() if self._rate == RTC_RATE else StreamResampler(self._rate, SAMPLE_RATE)
            self._next_pts = None
        samples = mono_s16(frame)
        if frame.pts is not None:
            # Lost packets, and senders using DTX (no packets while silent), leave holes in the RTP
            # timeline: fill them with silence so VAD sees the pause and input times stay true.
            if self._next_pts is not None and frame.pts > self._next_pts:
                gap = min(frame.pts - self._next_pts, MAX_GAP_S * frame.sample_rate)
                samples = np.concatenate([np.zeros(gap, dtype=np.int16), samples])
            self._next_pts = frame.pts + frame.samples
        return self._resampler.process(samples)


class PassThroughBuffer:
    """An audio "jitter buffer" that hands each packet to the decoder as it arrives.

    Opus puts one frame in each RTP packet, so no reassembly is needed; when the consumer is VAD, speech
    recognition or a recorder, not a loudspeaker, smoothing out arrival jitter buys nothing and costs
    latency (aiortc's buffer holds ~80 ms, and still 20 ms at prefetch 0). A packet arriving after a
    later one is dropped (its hole becomes silence); that is rare on a LAN.
    """

    capacity = AIORTC_JITTER_CAPACITY

    def __init__(self) -> None:
        self._last: int | None = None

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        if self._last is not None and not 0 < uint16_add(packet.sequence_number, -self._last) < 0x8000:
            return False, None  # late or duplicate
        self._last = packet.sequence_number
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)  # type: ignore[attr-defined]


def set_jitter_prefetch(receiver: RTCRtpReceiver, prefetch: int) -> None:
    """Swap the receiver's audio jitter buffer: aiortc fixes it at prefetch 4 and offers no setting.

    ``prefetch`` 0 passes packets through (PassThroughBuffer); n > 0 is aiortc's buffer releasing a
    frame once n later ones have arrived (~n × 20 ms held).
    """
    name = "_RTCRtpReceiver__jitter_buffer"
    if not hasattr(receiver, name):
        log.warning("this aiortc version has no %s; the jitter prefetch setting is ignored", name)
        return
    buffer = PassThroughBuffer() if prefetch <= 0 else JitterBuffer(AIORTC_JITTER_CAPACITY, prefetch=prefetch)
    setattr(receiver, name, buffer)
