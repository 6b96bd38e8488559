"""The text-to-speech engine interface the pipeline speaks through.

An engine opens one stream per response. Text goes in with ``feed`` (fragments as an LLM streams them
when ``incremental`` is true, else whole segments cut by the text bridge) and ``end``; audio comes out
as ``TTSChunk``s of pcm16 mono 24 kHz. ``cancel`` stops the stream inside the engine at its next step
and frees it; iteration then ends. A chunk's ``text`` is the text whose speech starts in that chunk,
so the session can cut the transcript at the point the listener stopped hearing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


class TTSError(Exception):
    """Bad input to the engine (empty text, unknown voice or language, text too long)."""


@dataclass
class TTSChunk:
    pcm: bytes
    text: str = ""


class TTSStream(Protocol):
    def feed(self, text: str) -> None: ...

    def end(self) -> None: ...

    def cancel(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[TTSChunk]: ...


class TTSEngine(Protocol):
    incremental: bool
    voices: frozenset[str] | None  # the voice names open() takes, lower case (None: any)

    def open(self, voice: str, language: str | None = None) -> TTSStream: ...


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
