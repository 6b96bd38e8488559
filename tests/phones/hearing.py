"""What a phone heard: its recording, and what an independent speech recognizer (the local extra's Whisper)
hears in it."""

from __future__ import annotations

import re
import wave
from pathlib import Path

import numpy as np

from gateway.audio import RationalResampler


def heard(path: Path) -> np.ndarray:
    """What the phone recorded, as int16 at 8 kHz mono."""
    with wave.open(str(path)) as w:
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        rate, channels = w.getframerate(), w.getnchannels()
    data = data.reshape(-1, channels)[:, 0]
    assert rate == 8000, rate
    return data


def transcribe(samples_8k: np.ndarray) -> str:
    from gateway.responders.local_stt import LocalStt  # the local extra

    pcm = RationalResampler(3, 1).process(samples_8k).tobytes()
    stt = LocalStt.shared()
    return stt._transcribe_pcm(pcm, None, "en")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())
