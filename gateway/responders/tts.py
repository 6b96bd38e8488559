"""The text side of a non-incremental TTS engine's stream (tone, piper): whole segments in, one at a time.

Every engine speaks engine.api's stream interface; an engine that speaks whole segments (the text bridge
cuts them from the LLM's text) keeps its input in a ``SegmentStream``. ``SegmentedStream`` speaks an
incremental engine's voice that way: each segment an utterance of its own.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from engine.api import TTSChunk, TTSEngine, TTSError, TTSStream


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


class SegmentedStream(SegmentStream):
    """An incremental engine's stream spoken segment by segment, each segment an utterance of its own: for a
    voice whose prompt holds its text from the start (an in-context clone's holds as much text as its
    reference has frames), so that speech starts once the first segment is written, not the whole reply.
    ``open_kw`` are the engine's open() arguments. A segment's first chunk carries its text."""

    def __init__(self, engine: TTSEngine, **open_kw: Any) -> None:
        super().__init__()
        self._engine, self._open_kw = engine, open_kw
        self._current: TTSStream | None = None

    def cancel(self) -> None:
        super().cancel()
        if self._current is not None:
            self._current.cancel()

    async def __aiter__(self) -> AsyncIterator[TTSChunk]:
        while (text := await self.next_segment()) is not None:
            self._current = stream = self._engine.open(**self._open_kw)
            stream.feed(text)
            stream.end()
            first = True
            async for chunk in stream:
                if self.cancelled:
                    return
                yield TTSChunk(chunk.pcm, text if first else "")
                first = False
            self._current = None
