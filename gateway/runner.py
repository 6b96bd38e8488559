"""Runs one Session in the event loop: carries out its effects and feeds it what comes back.

The runner knows nothing of the transport: it takes client messages and a ``send`` coroutine for
server messages, so the WebSocket server and the WebRTC data channel share it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import orjson

from gateway.responder import Responder, ResponseRequest
from gateway.session import (
    ClearPlayout,
    Effect,
    Mark,
    Play,
    PlayoutEnd,
    RunVad,
    Session,
    StartResponse,
    StopResponse,
)
from gateway.trace import TurnTrace
from gateway.vad import SileroVAD, VadBatcher

log = logging.getLogger(__name__)

Send = Callable[[str], Awaitable[None]]


class Playout(Protocol):
    """Server-side playout of response audio (the WebRTC outbound track)."""

    def play(self, response_id: str, item_id: str, pcm: bytes) -> None: ...

    def finished(self, response_id: str) -> None:
        """No more audio of this response is coming."""

    def clear(self) -> tuple[str, float] | None:
        """Drop everything queued; return (item id, ms of it played) if an item was playing."""


class SessionRunner:
    def __init__(
        self,
        session: Session,
        responder: Responder,
        vad: SileroVAD,
        send: Send,
        vad_batcher: VadBatcher | None = None,
        trace: TurnTrace | None = None,
        playout: Playout | None = None,
    ) -> None:
        self.session = session
        self.responder = responder
        self.vad = vad
        self._send = send
        self._vad_batcher = vad_batcher
        self.trace = trace or TurnTrace(session.settings.id)
        self.playout = playout
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        await self._apply(self.session.open())

    async def receive(self, message: str | bytes) -> None:
        """One client message; returns once its effects (VAD included) are carried out, so order holds."""
        await self._apply(self.session.handle(message))

    async def feed_audio(self, pcm: bytes) -> None:
        """Input audio from a media track (pcm16 24 kHz), the same path as input_audio_buffer.append."""
        await self._apply(self.session.input_audio(pcm))

    async def playout_started(self, response_id: str) -> None:
        await self._apply(self.session.playout_event("output_audio_buffer.started", response_id))

    async def playout_stopped(self, response_id: str) -> None:
        await self._apply(self.session.playout_event("output_audio_buffer.stopped", response_id))

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _apply(self, effects: Iterable[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, dict):
                if effect and not self._closed:
                    self.trace.sent(effect)
                    await self._send(orjson.dumps(effect).decode())
            elif isinstance(effect, RunVad):
                await self._apply(self.session.vad_result(await self._vad(effect.pcm)))
            elif isinstance(effect, StartResponse):
                self._task = asyncio.create_task(self._respond(effect.request))
            elif isinstance(effect, StopResponse):
                self.trace.cancelled(effect.response_id)
                if self._task is not None:
                    self._task.cancel()
            elif isinstance(effect, Play):
                if self.playout is not None:
                    self.playout.play(effect.response_id, effect.item_id, effect.pcm)
            elif isinstance(effect, PlayoutEnd):
                if self.playout is not None:
                    self.playout.finished(effect.response_id)
            elif isinstance(effect, ClearPlayout):
                heard = self.playout.clear() if self.playout is not None else None
                if heard is not None:
                    await self._apply(self.session.playout_cleared(*heard))
            elif isinstance(effect, Mark):
                self.trace.mark(effect.name, effect.response_id)

    async def _vad(self, pcm: bytes):
        # Sessions' windows are batched into shared model calls (big batches off the loop); an append
        # that completes no window only buffers. The caller awaits either way, so order holds.
        if self._vad_batcher is None or self.vad.windows_pending(len(pcm)) == 0:
            return self.vad.process(pcm)
        return await self._vad_batcher.process(self.vad, pcm)

    async def _respond(self, request: ResponseRequest) -> None:
        rid = request.response_id
        error: BaseException | None = None
        stream = self.responder.respond(request)
        try:
            async for out in stream:
                await self._apply(self.session.response_output(rid, out))
        except Exception as exc:  # a responder failure ends this response, never the session
            log.warning("response %s failed: %s", rid, exc)
            error = exc
        finally:
            # Also on cancellation (barge-in, response.cancel): closes the responder's HTTP streams
            # and TTS stream; the session has already sent this response's response.done.
            await stream.aclose()
        await self._apply(self.session.response_finished(rid, error))
