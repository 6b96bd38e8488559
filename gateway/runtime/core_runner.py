"""What every protocol's runner does for its session core: the machinery both runners share.

A core (gateway/realtime/session.py, gateway/live/session.py) returns effects; ``CoreRunner`` carries out those of
gateway/core/effects.py (send an event, run the VAD in the shared batch, ask Smart Turn, transcribe, run and stop a
responder, mark the trace) and feeds the results back through the core's methods (``CoreSession``). A protocol's
runner (gateway/runtime/session_runner.py, live_runner.py) adds its own effects in ``_carry_out``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from typing import Any, Protocol

import orjson

from gateway.audio import Float32Array
from gateway.core.effects import (
    Fault,
    Mark,
    PrepareTranscript,
    ResetVad,
    RunSmartTurn,
    RunVad,
    SendEvent,
    StartResponse,
    StopResponse,
    Transcribe,
)
from gateway.core.responder import BackendError, Responder, ResponseOutput, ResponseRequest, Transcriber, Transcripts
from gateway.responders.model_thread import current_session
from gateway.runtime.silero import SileroVAD, VadBatcher
from gateway.runtime.smart_turn import SmartTurn
from gateway.runtime.trace import TurnTrace

log = logging.getLogger(__name__)

Send = Callable[[str], Awaitable[None]]

# Input audio waiting for the VAD beyond this (5 s in 32 ms windows) makes the next client message
# wait: back-pressure on a client that streams far faster than the VAD runs.
MAX_VAD_BACKLOG_WINDOWS = 5000 // 32


def log_fault(session_id: str, fault: Fault) -> None:
    """A session's bug, in full the first time (a client that repeats the event would fill the log)."""
    if fault.count == 1:
        log.error("session %s: handling a client event failed", session_id, exc_info=fault.error)
    else:
        log.debug("session %s: handling a client event failed again (%d)", session_id, fault.count,
                  exc_info=fault.error)


class CoreSession(Protocol):
    """What a core takes back from its runner (each returns more effects)."""

    def vad_result(self, probabilities: Any) -> Iterable[Any]: ...

    def smart_turn_result(self, seq: int, probability: float | None) -> Iterable[Any]: ...

    def input_transcript_delta(self, item_id: str, text: str) -> Iterable[Any]: ...

    def input_transcribed(self, item_id: str, text: str | None, error: str | None = None) -> Iterable[Any]: ...

    def response_output(self, response_id: str, out: ResponseOutput) -> Iterable[Any]: ...

    def response_finished(self, response_id: str, error: BaseException | None = None) -> Iterable[Any]: ...


class CoreRunner:
    def __init__(
        self,
        session: CoreSession,
        session_id: str,
        responder: Responder,
        vad: SileroVAD,
        send: Send,
        vad_batcher: VadBatcher | None = None,
        trace: TurnTrace | None = None,
        transcriber: Transcriber | None = None,
        smart_turn: SmartTurn | None = None,
        on_backend_error: Callable[[str], None] | None = None,
    ) -> None:
        """``smart_turn``: the Smart Turn model for semantic_vad; without it every check is answered "no
        verdict", so a semantic_vad turn ends after its eagerness's longest wait. ``on_backend_error``: told
        the backend ("stt", "llm", "tts") a response or a transcription failed on."""
        self.session = session
        self.responder = responder
        self.transcriber = transcriber
        self.vad = vad
        self._send = send
        self._vad_batcher = vad_batcher
        self.trace = trace or TurnTrace(session_id)
        # The client secret's id that opened the session (Credential.owner; None: an API key, or no credential).
        self.owner: str | None = None
        # The running responses' tasks by response id.
        self._responses: dict[str, asyncio.Task[None]] = {}
        # Transcriptions by user item id: they outlive the responses that wait for them.
        self._transcripts: dict[str, asyncio.Task[str]] = {}
        # The early transcription of the turn in its closing pause: (what it transcribes, its pieces).
        self._prepared: tuple[PrepareTranscript, asyncio.Task[None], list[str]] | None = None
        # What the VAD's probabilities (they come back to _vad_result) made the session do, carried out in
        # order by one task at a time; and a client message waiting for the VAD to catch up.
        self._vad_effects: list[Any] = []
        self._vad_task: asyncio.Task[None] | None = None
        self._vad_caught_up: asyncio.Future[None] | None = None
        self._smart_turn = smart_turn
        self._on_backend_error = on_backend_error
        self._checks: set[asyncio.Task[None]] = set()  # Smart Turn calls under way
        self._closed = False
        # The context of this session's tasks: shared local models queue their work by session.
        self._context = contextvars.copy_context()
        self._context.run(current_session.set, session_id)

    @property
    def responding(self) -> bool:
        """A response is running (its task has not finished)."""
        return any(not task.done() for task in self._responses.values())

    def _tasks(self) -> list[asyncio.Task[Any] | None]:
        """Every task the runner may have running (a subclass adds its own)."""
        return [*self._responses.values(), self._vad_task, *self._transcripts.values(), *self._checks]

    async def close(self) -> None:
        self._closed = True
        self._drop_prepared()
        tasks = [t for t in self._tasks() if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # A task that failed or was cancelled keeps its frame, and so this runner, in its exception's traceback:
        # let go of the tasks, so that the session (its conversation's audio) is freed now, not by the collector.
        self._forget_tasks()

    def _forget_tasks(self) -> None:
        """Let go of every finished task (a subclass adds its own)."""
        self._responses.clear()
        self._transcripts.clear()
        self._checks.clear()

    @property
    def _vad_backlogged(self) -> bool:
        """The VAD's backlog is long (see MAX_VAD_BACKLOG_WINDOWS)."""
        return self.vad is not None and self.vad.queued > MAX_VAD_BACKLOG_WINDOWS

    async def _wait_vad(self) -> None:
        """Back-pressure: wait while the VAD's backlog is long."""
        if self._vad_backlogged:
            self._vad_caught_up = asyncio.get_running_loop().create_future()
            await self._vad_caught_up

    async def _apply(self, effects: Iterable[Any]) -> None:
        for effect in effects:
            match effect:
                case SendEvent(event):
                    await self._send_event(event)
                case RunVad(pcm):
                    await self._run_vad_on(pcm)
                case ResetVad():
                    self.vad.forget()
                case RunSmartTurn():
                    task = asyncio.create_task(self._check_turn(effect))
                    self._checks.add(task)
                    task.add_done_callback(self._checks.discard)
                case StartResponse(request):
                    self._start_response(request)
                case StopResponse(response_id):
                    self._stop_response(response_id)
                case PrepareTranscript():
                    self._prepare_transcript(effect)
                case Transcribe():
                    self._start_transcription(effect)
                case Mark(name, response_id):
                    self._mark(name, response_id)
                case Fault():
                    log_fault(self.trace.session_id, effect)
                case _:
                    await self._carry_out(effect)

    async def _carry_out(self, effect: Any) -> None:
        """An effect of the protocol's own (gateway/realtime/effects.py, gateway/live/effects.py)."""
        raise TypeError(f"not an effect: {effect!r}")

    def _mark(self, name: str, response_id: str | None) -> None:
        self.trace.mark(name, response_id)

    async def _send_event(self, event: dict[str, Any]) -> None:
        if not self._closed:
            self.trace.sent(event)
            await self._send(orjson.dumps(event).decode())

    async def _run_vad_on(self, pcm: bytes) -> None:
        await self._apply(self._feed_vad(pcm))

    def _feed_vad(self, pcm: bytes) -> list[Any]:
        """Input audio to the VAD, without waiting; the effects to carry out next."""
        if self._vad_batcher is None:
            return list(self.session.vad_result(self.vad.process(pcm)))
        # The batcher hands the probabilities to _vad_result; appends are not held up meanwhile.
        self._vad_batcher.feed(self.vad, pcm, self._vad_result)
        if self.vad.queued:
            return []
        effects = self.session.vad_result(())  # no window to wait for (the audio completes none): buffered now
        if self._vad_task is None:
            return list(effects)
        self._vad_effects += effects  # after the VAD's events still being carried out
        return []

    def _vad_result(self, probabilities: Float32Array) -> None:
        """The batched VAD's probabilities for this session's audio, in order, on the loop."""
        if self._vad_caught_up is not None and self.vad.queued <= MAX_VAD_BACKLOG_WINDOWS:
            self._vad_caught_up.set_result(None)
            self._vad_caught_up = None
        if self._closed:
            return
        self._vad_effects += self.session.vad_result(probabilities)
        if self._vad_effects and self._vad_task is None:
            self._vad_task = asyncio.create_task(self._apply_vad_effects())

    async def _apply_vad_effects(self) -> None:
        try:
            while self._vad_effects:
                effects, self._vad_effects = self._vad_effects, []
                await self._apply(effects)
        except Exception:  # a broken VAD must not take the session with it
            log.exception("carrying out the VAD's events failed")
            self._vad_effects.clear()
        finally:
            self._vad_task = None

    def _start_response(self, request: ResponseRequest) -> None:
        transcripts = {m.item_id: self._transcripts[m.item_id] for m in request.messages
                       if m.role == "user" and not m.text and m.item_id in self._transcripts}
        task = asyncio.create_task(self._respond(request, transcripts), context=self._context)
        self._responses[request.response_id] = task
        task.add_done_callback(lambda _, rid=request.response_id: self._responses.pop(rid, None))

    def _stop_response(self, response_id: str) -> None:
        self.trace.cancelled(response_id)
        # A response that failed stops itself: its own task is the one sending its last events.
        task = self._responses.get(response_id)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _prepare_transcript(self, effect: PrepareTranscript) -> None:
        self._drop_prepared()
        if effect.pcm is not None and self.transcriber is not None:
            got: list[str] = []
            task = asyncio.create_task(self._pieces(effect, got), context=self._context)
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # Transcribe reports it
            self._prepared = effect, task, got

    def _start_transcription(self, effect: Transcribe) -> None:
        # The early result is taken now: a PrepareTranscript later in this batch drops what is left.
        early = self._take_prepared(effect)
        task = asyncio.create_task(self._transcribe(effect, early), context=self._context)
        # A failure is reported to the client at once; a response may await it or not.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._transcripts[effect.item_id] = task

    async def _check_turn(self, effect: RunSmartTurn) -> None:
        probability = None
        if self._smart_turn is not None:
            try:
                probability = await self._smart_turn.predict(effect.pcm)
            except BackendError as exc:  # the engine processes are down or busy: the longest wait decides
                log.warning("Smart Turn: %s; the turn ends after its eagerness's longest wait", exc)
            except Exception:  # a broken model must not take the session with it: the longest wait decides
                log.exception("Smart Turn failed; the turn ends after its eagerness's longest wait")
        if not self._closed:
            await self._apply(self.session.smart_turn_result(effect.seq, probability))

    def _drop_prepared(self) -> None:
        if self._prepared is not None:
            self._prepared[1].cancel()
            self._prepared = None

    async def _pieces(self, effect: PrepareTranscript, got: list[str]) -> None:
        """The early transcription, each piece kept in ``got`` as it comes (a failure keeps those before it)."""
        assert self.transcriber is not None and effect.pcm is not None
        async with aclosing(self.transcriber.transcribe(effect.pcm, effect.language, effect.prompt)) as pieces:
            async for piece in pieces:
                got.append(piece)

    def _take_prepared(self, effect: Transcribe) -> AsyncIterator[str] | None:
        """The early transcription's pieces if it transcribed exactly this item's audio."""
        prepared, self._prepared = self._prepared, None
        if prepared is None:
            return None
        early, task, got = prepared
        if (early.pcm, early.language, early.prompt) != (effect.pcm, effect.language, effect.prompt):
            task.cancel()
            return None
        return _pieces_of(task, got)

    async def _transcribe(self, effect: Transcribe, early: AsyncIterator[str] | None = None) -> str:
        """Streams the item's transcript to the client as it comes (``early``: the pieces its early
        transcription found); returns it whole (responses await it)."""
        assert self.transcriber is not None
        text = ""
        pieces = early or self.transcriber.transcribe(effect.pcm, effect.language, effect.prompt)
        try:
            async with aclosing(pieces):
                async for piece in pieces:
                    piece = piece if text else piece.lstrip()  # a transcript starts at its first word
                    if piece:
                        text += piece
                        await self._apply(self.session.input_transcript_delta(effect.item_id, piece))
        except Exception as exc:  # any transcriber's failure is an STT failure, for the responses awaiting it
            error = exc if isinstance(exc, BackendError) else BackendError("stt", f"{type(exc).__name__}: {exc}")
            try:
                log.warning("transcription of %s failed: %s", effect.item_id, error)
                self._backend_failed(error)
                await self._apply(self.session.input_transcribed(effect.item_id, None, str(error)))
                if error is exc:
                    raise
                raise error from exc
            finally:
                del error  # raised, it holds this frame in its traceback: kept here as well, the two make a cycle
        text = text.strip()
        await self._apply(self.session.input_transcribed(effect.item_id, text))
        return text

    def _backend_failed(self, error: BaseException) -> None:
        if isinstance(error, BackendError) and self._on_backend_error is not None:
            self._on_backend_error(error.backend)

    async def _respond(self, request: ResponseRequest, transcripts: Transcripts) -> None:
        rid = request.response_id
        error: BaseException | None = None
        stream = self.responder.respond(request, transcripts)
        try:
            async for out in stream:
                await self._apply(self.session.response_output(rid, out))
        except Exception as exc:  # a responder failure ends this response, never the session
            log.warning("response %s failed: %s", rid, exc)
            self._backend_failed(exc)
            error = exc
        finally:
            # Also on cancellation (barge-in, response.cancel): closes the responder's HTTP streams
            # and TTS stream; the session has already sent this response's response.done.
            await stream.aclose()
        try:
            await self._apply(self.session.response_finished(rid, error))
        finally:
            del error  # its traceback holds this frame: kept here as well, the two make a cycle


async def _pieces_of(task: asyncio.Task[None], got: list[str]) -> AsyncIterator[str]:
    """The pieces an early transcription found (kept in ``got`` as they came), then its failure if it failed: what
    came before a failure is streamed first, as without the early start. The failure, raised here, holds this frame
    in its traceback: the frame lets go of it and of the task that holds it, or they would make a cycle."""
    failure: BaseException | None = None
    try:
        await task
    except Exception as exc:
        failure = exc
    finally:
        del task
    for piece in got:
        yield piece
    if failure is not None:
        try:
            raise failure
        finally:
            failure = None
