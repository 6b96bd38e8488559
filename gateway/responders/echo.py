"""The echo responder: each user turn answered with the user's own audio (tests, benchmarks, a first try)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gateway.audio import SAMPLE_RATE
from gateway.core.responder import AudioOut, ResponseOutput, ResponseRequest, SpeechText, TextOut, Transcripts


class EchoResponder:
    """Answers each user turn with the user's own last committed audio, paced like speech.

    pace 1.0 sends audio at real time, 2.0 at twice real time, 0 as fast as possible.
    """

    reads_transcripts = False
    voices = None

    def __init__(self, pace: float = 1.0, chunk_ms: int = 40) -> None:
        self.pace = pace
        self.chunk_bytes = SAMPLE_RATE * 2 * chunk_ms // 1000

    async def respond(self, request: ResponseRequest, transcripts: Transcripts) -> AsyncIterator[ResponseOutput]:
        audio = next((m.audio for m in reversed(request.messages) if m.role == "user" and m.audio), None)
        if audio is None:
            text = next((m.text for m in reversed(request.messages) if m.role == "user" and m.text), "")
            if text:
                yield SpeechText(text) if "audio" in request.modalities else TextOut(text)
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        for offset in range(0, len(audio), self.chunk_bytes):
            if self.pace > 0:
                due = start + offset / (2 * SAMPLE_RATE) / self.pace
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            yield AudioOut(audio[offset : offset + self.chunk_bytes])
