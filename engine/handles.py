"""A stream as its caller holds it: its text input (TextInput, fed from any thread) and, for a reader in an
event loop, its output queue (QueuedStream). The in-process engine's streams and the engine client's are both."""

from __future__ import annotations

import asyncio
import threading

from engine.api import TTSChunk, TTSError


class TextInput:
    """A stream's text input, wherever it is fed (in the gateway's event loop, or in the engine process):
    text up to `max_chars` characters, then end() once; cancel() at any time. Thread-safe under `lock`."""

    def __init__(self, max_chars: int, lock: threading.Condition | None = None) -> None:
        self.max_chars = max_chars
        self.lock = lock or threading.Condition()
        self.chars = 0
        self.has_text = False
        self.ended = False
        self.cancelled = False

    def feed(self, text: str) -> bool:
        """Checks `text` in; False when the stream is cancelled (the text is dropped)."""
        with self.lock:
            if self.ended:
                raise TTSError("feed after end")
            if self.cancelled:
                return False
            if self.chars + len(text) > self.max_chars:
                raise TTSError(f"text longer than {self.max_chars} characters ([engine] max_text_chars)")
            self.chars += len(text)
            self.has_text = self.has_text or bool(text.strip())
            self._accept(text)
            self.lock.notify()
            return True

    def end(self) -> bool:
        """True when this ends a live stream. A stream that got no text is cancelled instead and raises
        TTSError("empty text"): there is nothing to say."""
        with self.lock:
            if self.ended or self.cancelled:
                return False
            self.ended = True
            self.cancelled = not self.has_text
            self.lock.notify()
        if self.cancelled:
            raise TTSError("empty text")
        return True

    def cancel(self) -> bool:
        """True when this cancels a live stream."""
        with self.lock:
            if self.cancelled:
                return False
            self.cancelled = True
            self.lock.notify()
            return True

    def _accept(self, text: str) -> None:
        """Where accepted text goes (called under the lock)."""


class QueuedStream(TextInput):
    """A stream read in an event loop (engine.api.TTSStream): `put` queues its packets, then None (the end)
    or an exception, from the loop's thread; iteration ends at once when the stream is cancelled."""

    def __init__(self, max_chars: int, lock: threading.Condition | None = None) -> None:
        super().__init__(max_chars, lock)
        self._queue: asyncio.Queue[TTSChunk | BaseException | None] = asyncio.Queue()
        self._finished = False  # the reader saw the end

    def put(self, item: TTSChunk | BaseException | None) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> QueuedStream:
        return self

    async def __anext__(self) -> TTSChunk:
        if self._finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None or self.cancelled:
            self._finished = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        return item
