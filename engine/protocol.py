"""The engine process's wire protocol (ZeroMQ multipart messages), and what a TTS stream is on either side
of it: its text input (TextInput) and, for a reader in an event loop, its output queue (QueuedStream).

An engine process (engine.process) binds one ROUTER socket; each gateway process connects one DEALER
socket to it. A message is a list of frames, the first naming its kind; stream ids are chosen by the
client, 8 bytes, unique per connection. Text is UTF-8, audio pcm16 mono 24 kHz, control payloads JSON.

client -> engine                                 engine -> client
  HELLO  json {pid}                                HELLO  json {instance, voices, languages, max_text_chars, ...}
  PING                                             PONG   instance, load (streams held, ASCII)
  OPEN   sid, voice, language ("" = auto)          PACKET sid, text, pcm
  FEED   sid, text                                 DONE   sid
  END    sid                                       ERROR  sid, INPUT | ENGINE, message
  CANCEL sid                                       STATS  token, json
  STATS  token                                     RESET  reason (this client's streams here are gone)
  BYE

Liveness runs both ways on the heartbeat. A client pings every heartbeat; the engine frees the streams
of a client it has not heard from for MISSED_HEARTBEATS heartbeats (or one it can no longer send to), and
answers RESET if that client speaks again. A client takes an engine it has not heard from for as long, or
whose connection dropped, as gone, and one whose PONG names a new instance as restarted. This module
imports neither torch nor zmq: the gateway's side uses it too.
"""

from __future__ import annotations

import asyncio
import threading

from gateway.tts import TTSChunk, TTSError

HELLO, PING, PONG, OPEN, FEED, END, CANCEL, STATS, BYE = (b"hello", b"ping", b"pong", b"open", b"feed", b"end",
                                                          b"cancel", b"stats", b"bye")
PACKET, DONE, ERROR, RESET = b"packet", b"done", b"error", b"reset"
INPUT, ENGINE = b"input", b"engine"  # an ERROR's cause: bad input (TTSError), or the engine failed
MISSED_HEARTBEATS = 4
# Messages queued towards one peer before it counts as not keeping up (ZeroMQ's high-water mark): about
# 4 minutes of audio packets of 320 ms for 100 streams; bounds what a stuck peer can hold.
QUEUE_LIMIT = 10_000


class EngineGone(RuntimeError):
    """The engine process stopped or cannot be reached; its streams fail with this."""


def sid_bytes(n: int) -> bytes:
    return n.to_bytes(8, "big")


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
                raise TTSError(f"text longer than {self.max_chars} characters")
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
    """A stream read in an event loop (gateway.tts.TTSStream): `put` queues its packets, then None (the end)
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
