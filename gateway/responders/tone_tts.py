"""A TTS engine with no model, for tests, benchmarks and demos without a GPU.

Each character becomes a short tone (its pitch derived from the character, silence for spaces),
so the audio is deterministic and as long as speech of that text would be. Each segment's first
chunk comes ``first_audio_ms`` after the engine starts on it, like a real engine's time to first
audio; ``realtime`` paces the chunks at real time (an engine just fast enough), else they come as
fast as they are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator

import numpy as np

from engine.api import Sampling, TTSChunk
from engine.voices import VoicePrompt
from gateway.audio import SAMPLE_RATE
from gateway.responders.tts import SegmentStream


def tone_pcm(text: str, char_ms: int = 60) -> bytes:
    """pcm16 24 kHz of ``text``: char_ms of tone per character, silence for whitespace."""
    return b"".join(_char_pcm(ch, char_ms) for ch in text)


@functools.lru_cache(maxsize=4096)
def _char_pcm(ch: str, char_ms: int) -> bytes:
    # Cached: the engine runs on the event loop, and computing a tone costs ~40 µs per character.
    n = SAMPLE_RATE * char_ms // 1000
    if ch.isspace():
        return bytes(2 * n)
    t = np.arange(n) / SAMPLE_RATE
    # A 5 ms ramp at both ends of each tone avoids clicks between characters.
    ramp = np.minimum(1.0, np.minimum(np.arange(n), np.arange(n)[::-1]) / (SAMPLE_RATE * 0.005))
    freq = 220.0 + (ord(ch) % 48) * 12.5
    return (0.3 * np.sin(2 * np.pi * freq * t) * ramp * 32767).astype("<i2").tobytes()


class ToneStream(SegmentStream):
    def __init__(self, engine: ToneEngine) -> None:
        super().__init__()
        self._engine = engine

    async def _pause(self, seconds: float) -> None:
        """Sleep, or return at once when the stream is cancelled."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._cancel.wait()

    async def __aiter__(self) -> AsyncIterator[TTSChunk]:
        engine = self._engine
        chunk_bytes = SAMPLE_RATE * 2 * engine.chunk_ms // 1000
        while (text := await self.next_segment()) is not None:
            await self._pause(engine.first_audio_ms / 1000)
            pcm = tone_pcm(text, engine.char_ms)
            for offset in range(0, len(pcm), chunk_bytes):
                if self.cancelled:
                    return
                yield TTSChunk(pcm[offset : offset + chunk_bytes], text if offset == 0 else "")
                if engine.realtime:
                    await self._pause(engine.chunk_ms / 1000)
                else:
                    await asyncio.sleep(0)  # let cancel() and other tasks in between chunks


class ToneEngine:
    """A test signal: no voice, so any name, prepared voice, instruction or sampling will do (all are
    ignored)."""

    incremental = False
    voices = None  # a tone has no voice: any name will do
    model_name = "tone (a test signal, no speech)"

    def __init__(
        self, first_audio_ms: float = 25.0, chunk_ms: int = 40, realtime: bool = False, char_ms: int = 60
    ) -> None:
        self.first_audio_ms = first_audio_ms
        self.chunk_ms = chunk_ms
        self.realtime = realtime
        self.char_ms = char_ms

    def open(self, voice: str, language: str | None = None, *, prompt: VoicePrompt | None = None,
             instructions: str | None = None, sampling: Sampling | None = None) -> ToneStream:
        return ToneStream(self)
