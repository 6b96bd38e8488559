"""Noise reduction of input audio (``session.audio.input.noise_reduction``, beta
``input_audio_noise_reduction``): WebRTC's noise suppressor (the ``webrtc-noise-gain`` wheel, Apache-2.0),
run before VAD, turn detection and speech recognition see the audio.

The suppressor takes 10 ms frames of 16 kHz audio: a session's pcm16 24 kHz goes through a short-delay
resampler to 16 kHz and back (gateway.audio.RationalResampler), and up to 10 ms waits for its frame, so
the audio is delayed by at most ~12 ms. ``near_field`` (a handset, a headset) suppresses at the
suppressor's level 2 ("high", ~15 dB), ``far_field`` (a speakerphone, a room) at level 3 ("very high",
~20 dB) with its automatic gain on, since a far talker is quiet. ``strength`` is reported, not used.
It costs ~1 s of CPU per minute of audio (`python -m bench noise`), little enough to run inline in the runner.
"""

from __future__ import annotations

import numpy as np

from gateway.audio import RationalResampler

RATE = 16_000
FRAME = 160  # 10 ms at 16 kHz, the suppressor's frame
LEVELS = {"near_field": (0, 2), "far_field": (3, 3)}  # (automatic gain target in dBFS, 0 = off; suppression level)


class Denoiser:
    """One session's stream of input audio through the suppressor, for one kind at a time."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        # Imported by the first session that turns noise reduction on: the native library (9 MB) stays out of
        # the processes of a deployment that never uses it.
        from webrtc_noise_gain import AudioProcessor

        gain, level = LEVELS[kind]
        self._processor = AudioProcessor(gain, level)
        self._down = RationalResampler(2, 3)
        self._up = RationalResampler(3, 2)
        self._pending = np.zeros(0, dtype=np.int16)

    def process(self, pcm: bytes) -> bytes:
        """pcm16 24 kHz in, the same cleaned (delayed by up to ~12 ms: what is not a whole frame yet waits)."""
        narrow = np.concatenate([self._pending, self._down.process(np.frombuffer(pcm, dtype="<i2"))])
        whole = len(narrow) // FRAME * FRAME
        self._pending = narrow[whole:]
        if not whole:
            return b""
        cleaned = b"".join(self._processor.Process10ms(narrow[i:i + FRAME].tobytes()).audio
                           for i in range(0, whole, FRAME))
        return self._up.process(np.frombuffer(cleaned, dtype="<i2")).tobytes()
