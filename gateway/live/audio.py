"""A Live session's audio format, one for both directions: pcm16 at 24 or 16 kHz, G.711 μ-law or A-law at 8 kHz.

The core works in pcm16 24 kHz (the VAD's, the STT's and the TTS's rate); ``SessionAudio`` converts the client's
audio to it and the output back, streaming (the resamplers carry their state), and counts the input's samples:
they are the session's media clock.
"""

from __future__ import annotations

import base64
from functools import cache

import numpy as np

from gateway.audio import SAMPLE_RATE, InputDecoder, OutputEncoder, StreamResampler, bytes_to_int16

_G711 = {"audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}


class SessionAudio:
    def __init__(self, fmt: dict[str, object] | None) -> None:
        """``fmt``: the session's ``audio.format`` (None: pcm16 24 kHz, as WebRTC's media path delivers it)."""
        kind = str(fmt["type"]) if fmt else "audio/pcm"
        self.rate = int(fmt["rate"]) if fmt else SAMPLE_RATE  # type: ignore[call-overload]
        self.bytes_per_sample = 1 if kind in _G711 else 2
        self._decoder = InputDecoder(_G711[kind]) if kind in _G711 else None
        self._encoder = OutputEncoder(_G711[kind]) if kind in _G711 else None
        resampled = kind == "audio/pcm" and self.rate != SAMPLE_RATE
        self._up = StreamResampler(self.rate, SAMPLE_RATE) if resampled else None
        self._down = StreamResampler(SAMPLE_RATE, self.rate) if resampled else None
        self._out = bytearray()  # encoded output not sent yet (the resamplers' delay)

    def decode(self, data: bytes) -> bytes:
        """The client's audio (whole samples) as pcm16 24 kHz (what a resampler holds back comes with the next
        call)."""
        if self._decoder is not None:
            return self._decoder.decode(data)
        if self._up is None:
            return data
        return self._up.process(bytes_to_int16(data)).tobytes()

    def frame_bytes(self, ms: int) -> int:
        return self.rate * ms // 1000 * self.bytes_per_sample

    def encode_delta(self, pcm: bytes, ms: int, silent: bool = False) -> str:
        """``encode_frame`` as a delta's base64. ``silent``: ``pcm`` is all zeros, and in pcm16 24 kHz, which
        most ticks of most sessions are, its delta is one string made once."""
        if silent and self._encoder is None and self._down is None:
            return _silent_delta(len(pcm))
        return base64.b64encode(self.encode_frame(pcm, ms)).decode()

    def encode_frame(self, pcm: bytes, ms: int) -> bytes:
        """``ms`` of output in the session's format from ``ms`` of pcm16 24 kHz, exactly as long: a resampler's
        held-back start is made up with silence, once."""
        if self._encoder is not None:
            self._out += self._encoder.encode(pcm)
        elif self._down is not None:
            self._out += self._down.process(np.frombuffer(pcm, dtype="<i2")).tobytes()
        else:
            return pcm
        size = self.frame_bytes(ms)
        if len(self._out) < size:
            silence = b"\xff" if self._encoder is not None and self._encoder.format == "g711_ulaw" else \
                b"\xd5" if self._encoder is not None else b"\x00"
            self._out[:0] = silence * (size - len(self._out))
        frame = bytes(self._out[:size])
        del self._out[:size]
        return frame


@cache
def _silent_delta(size: int) -> str:
    return base64.b64encode(bytes(size)).decode()
