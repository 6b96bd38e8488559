"""The speech API's share of the gateway: the TTS engine it speaks with, and how many requests run at once.

The engine is the one the realtime sessions use (the pipeline responder's), so speech requests and
sessions share the Qwen3-TTS engine's batches; a gateway whose responder speaks with no engine (echo)
builds the configured one for the speech API: the Qwen3-TTS engine at start (loading a checkpoint takes
a while), piper or the tone engine at the first request.

``[speech] max_streams`` requests of this process generate at once, and with the Qwen3-TTS engine only
while it has a free stream (a realtime response takes one first). A request beyond that waits, first come
first served, behind at most ``max_waiting`` others and for at most ``wait_timeout_s``; past either it is
refused with ``SpeechBusy`` (HTTP 503 and Retry-After), so a burst can neither grow a queue without bound
nor hold a client for long.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.api import TTSEngine
from gateway.config import Config
from gateway.responders.build import build_tts_engine, tts_kind

log = logging.getLogger(__name__)

# While a request waits and the engine's free streams are the reason, look again this often (streams
# that end in the engine, a realtime response's included, say nothing here).
ENGINE_POLL_S = 0.02
# Requests at once when the engine has no stream cap of its own (piper, tone).
DEFAULT_MAX_STREAMS = 8


def distinct_voices(engine: TTSEngine, config: Config, prepared: Collection[str] = ()) -> list[dict[str, Any]]:
    """The voices that sound different, one entry each: ``voice``, the name to ask for; ``names``, every name
    that selects it (the OpenAI names [engine.voices] maps to a speaker, and the speaker's own); ``speaker``,
    who speaks it. The voices prepared at start (``prepared``, [voices.NAME]) are one each. An engine that
    takes any name and speaks them all alike (piper, the tone engine) has one, whose ``names`` is None and
    whose ``voice`` is the sessions' default."""
    names = engine.voices
    if names is None:
        speaker = getattr(engine, "model_name", type(engine).__name__)
        return [{"voice": config.session.voice, "names": None, "speaker": speaker}]
    mapped = {name.lower(): speaker.lower() for name, speaker in config.engine.voices.items()}
    by_speaker: dict[str, list[str]] = {}
    for name in sorted(names):
        by_speaker.setdefault(mapped.get(name, name), []).append(name)
    voices = []
    for speaker, selecting in by_speaker.items():
        selecting.sort(key=lambda name: (name == speaker, name))  # the names mapped to it first, its own last
        voices.append({"voice": selecting[0], "names": selecting, "speaker": speaker})
    voices += [{"voice": name, "names": [name], "speaker": name} for name in sorted(prepared) if name not in names]
    return sorted(voices, key=lambda v: v["voice"])


class SpeechBusy(Exception):
    """No speech request can start now; the client should retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SpeechService:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._engine: TTSEngine | None = None
        self._owned = False  # built here: closed here
        self._building: asyncio.Lock | None = None
        self.running = 0
        self._queue: deque[object] = deque()
        self._wakers: set[asyncio.Future[None]] = set()
        self.max_streams = config.speech.max_streams
        # Encoding to mp3, aac, opus and flac costs 3-20 ms of CPU per second of audio: off the event loop.
        self.codec_pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="speech-codec")

    async def start(self, engine: TTSEngine | None) -> None:
        """Speak with `engine` (the responder's); without one, load the Qwen3-TTS engine now if it is the
        configured one (the others load at the first request)."""
        self._building = asyncio.Lock()
        if engine is not None:
            await self._set(engine, owned=False)
        elif tts_kind(self.config) == "qwen3":
            await self.engine()

    @property
    def loaded(self) -> TTSEngine | None:
        """The engine it speaks with, once there is one (the responder's, or the Qwen3-TTS engine it loaded)."""
        return self._engine

    async def engine(self) -> TTSEngine:
        if self._engine is None:
            assert self._building is not None, "start() first"
            async with self._building:
                if self._engine is None:
                    built = await asyncio.get_running_loop().run_in_executor(None, build_tts_engine, self.config)
                    await self._set(built, owned=True)
                    log.info("speech API: %s", getattr(built, "model_name", type(built).__name__))
        assert self._engine is not None
        return self._engine

    async def _set(self, engine: TTSEngine, owned: bool) -> None:
        self._engine, self._owned = engine, owned
        if (connect := getattr(engine, "connect", None)) is not None:
            await connect()  # engine processes: linked, and their load known, before the first request
        if not self.max_streams:
            rows = getattr(engine, "free_streams", None)
            # Half the engine's streams, shared by the processes that speak with it (serve --workers N): the
            # realtime sessions keep the other half.
            share = max(1, self.config.server.workers)
            self.max_streams = max(1, rows // 2 // share) if rows is not None else DEFAULT_MAX_STREAMS

    async def aclose(self) -> None:
        self.codec_pool.shutdown(wait=False, cancel_futures=True)
        engine, self._engine = self._engine, None
        if engine is None or not self._owned:
            return
        if (close := getattr(engine, "aclose", None)) is not None:
            await close()
        elif (close := getattr(engine, "close", None)) is not None:
            await asyncio.to_thread(close)

    # --- admission -------------------------------------------------------------------------------

    def _can_start(self) -> bool:
        if self.running >= self.max_streams:
            return False
        free: Any = getattr(self._engine, "free_streams", None)
        return free is None or free > 0

    async def acquire(self) -> None:
        """Take one of the running requests' places (give it back with ``release``); SpeechBusy when none
        comes in time."""
        speech = self.config.speech
        if not self._queue and self._can_start():
            self.running += 1
            return
        if len(self._queue) >= speech.max_waiting:
            raise SpeechBusy(f"{self.running} speech requests are generating and {len(self._queue)} waiting here, "
                             "as many as this gateway takes ([speech] max_streams, max_waiting); retry shortly.",
                             speech.retry_after_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + speech.wait_timeout_s
        ticket = object()
        self._queue.append(ticket)
        try:
            while not (self._queue[0] is ticket and self._can_start()):
                left = deadline - loop.time()
                if left <= 0:
                    raise SpeechBusy(f"no speech stream came free within {speech.wait_timeout_s:g} s ([speech] "
                                     "wait_timeout_s); retry shortly.", speech.retry_after_s)
                await self._sleep(min(left, ENGINE_POLL_S))
            self.running += 1
        finally:
            self._queue.remove(ticket)
            self._wake()  # the next in line may go now

    def release(self) -> None:
        self.running -= 1
        self._wake()

    async def _sleep(self, seconds: float) -> None:
        """Until a place may have come free (a release, the queue moving) or `seconds` have passed."""
        waker = asyncio.get_running_loop().create_future()
        self._wakers.add(waker)
        try:
            await asyncio.wait_for(waker, seconds)
        except TimeoutError:
            pass
        finally:
            self._wakers.discard(waker)

    def _wake(self) -> None:
        for waker in self._wakers:
            if not waker.done():
                waker.set_result(None)
