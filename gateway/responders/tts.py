"""The text side of a non-incremental TTS engine's stream (tone, piper): whole segments in, one at a time.

Every engine speaks engine.api's stream interface; an engine that speaks whole segments (the text bridge
cuts them from the LLM's text) keeps its input in a ``SegmentStream``.
"""

from __future__ import annotations

import asyncio
from collections import deque

from engine.api import TTSError


class SegmentStream:
    """The text side of a non-incremental engine's stream: whole segments in, taken one at a time."""

    def __init__(self) -> None:
        self._segments: deque[str] = deque()
        self._ended = False
        self._input = asyncio.Event()  # set on feed, end and cancel
        self._cancel = asyncio.Event()

    def feed(self, text: str) -> None:
        if self._ended:
            raise TTSError("feed after end")
        if not text.strip():
            raise TTSError("empty text")
        self._segments.append(text)
        self._input.set()

    def end(self) -> None:
        self._ended = True
        self._input.set()

    def cancel(self) -> None:
        self._cancel.set()
        self._segments.clear()
        self._input.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    async def next_segment(self) -> str | None:
        """The next segment, once fed; None when the stream is cancelled, or ended and all taken."""
        while not self.cancelled:
            if self._segments:
                return self._segments.popleft()
            if self._ended:
                return None
            self._input.clear()
            await self._input.wait()
        return None
