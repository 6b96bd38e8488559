"""Runs one Session in the event loop: carries out its effects and feeds it what comes back.

The runner knows nothing of the transport: it takes client messages and a ``send`` coroutine for
server messages, so the WebSocket server and the WebRTC data channel share it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from contextlib import aclosing
from typing import Any, Protocol

import orjson

from gateway.audio import Float32Array
from gateway.core.responder import BackendError, Message, Responder, ResponseRequest, Transcriber, Transcripts
from gateway.realtime.effects import (
    CallMcp,
    ClearPlayout,
    Denoise,
    Effect,
    Fault,
    ListMcpTools,
    Mark,
    Play,
    PlayoutEnd,
    PrepareTranscript,
    RunSmartTurn,
    RunVad,
    SendEvent,
    StartResponse,
    StopResponse,
    Transcribe,
)
from gateway.realtime.session import Session
from gateway.responders.model_thread import current_session
from gateway.runtime.denoise import Denoiser
from gateway.runtime.mcp_client import McpClient, McpFailure
from gateway.runtime.silero import SileroVAD, VadBatcher
from gateway.runtime.smart_turn import SmartTurnBatcher
from gateway.runtime.trace import TurnTrace

log = logging.getLogger(__name__)

Send = Callable[[str], Awaitable[None]]

# The per-turn log line shows this much of what was heard and said.
LOGGED_CHARS = 80

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
        transcriber: Transcriber | None = None,
        smart_turn: SmartTurnBatcher | None = None,
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
        self.trace = trace or TurnTrace(session.settings.id)
        self.playout = playout
        # The running responses' tasks by response id: the conversation's and out-of-band ones.
        self._responses: dict[str, asyncio.Task[None]] = {}
        # For the per-turn log line: the user item each running response answers, and its response.done.
        self._answers: dict[str, Message | None] = {}
        self._done: dict[str, dict[str, Any]] = {}
        # Transcriptions by user item id: they outlive the responses that wait for them.
        self._transcripts: dict[str, asyncio.Task[str]] = {}
        # The early transcription of the turn in its closing pause: (what it transcribes, its pieces).
        self._prepared: tuple[PrepareTranscript, asyncio.Task[None], list[str]] | None = None
        # What the VAD's probabilities (they come back to _vad_result) made the session do, carried out in
        # order by one task at a time; and a client message waiting for the VAD to catch up.
        self._vad_effects: list[Effect] = []
        self._vad_task: asyncio.Task[None] | None = None
        self._vad_caught_up: asyncio.Future[None] | None = None
        # MCP listings (None) and calls (their response's id: cancelled with it) in flight.
        self.mcp = McpClient(session.config.mcp)
        self._mcp_tasks: dict[asyncio.Task[None], str | None] = {}
        self._smart_turn = smart_turn
        self._on_backend_error = on_backend_error
        self._checks: set[asyncio.Task[None]] = set()  # Smart Turn calls under way
        self._denoiser: Denoiser | None = None  # noise reduction's state, once it is on
        self._closed = False
        # The context of this session's tasks: shared local models queue their work by session.
        self._context = contextvars.copy_context()
        self._context.run(current_session.set, session.settings.id)
        session.transcription.available = transcriber is not None
        session.transcription.always = responder.reads_transcripts
        session.voices = responder.voices

    async def start(self) -> None:
        await self._apply(self.session.open())

    async def receive(self, message: str | bytes) -> None:
        """One client message; returns once its effects are carried out, except the VAD's."""
        await self._apply(self.session.handle(message))
        if self.vad is not None and self.vad.queued > MAX_VAD_BACKLOG_WINDOWS:
            self._vad_caught_up = asyncio.get_running_loop().create_future()
            await self._vad_caught_up

    async def send_event(self, event: dict[str, Any]) -> None:
        """A server event from outside the session (a draining gateway's notice), in order with its others."""
        await self._apply([SendEvent(event)])

    async def feed_audio(self, pcm: bytes) -> None:
        """Input audio from a media track (pcm16 24 kHz), the same path as input_audio_buffer.append."""
        await self._apply(self.session.input_audio(pcm))

    async def playout_started(self, response_id: str) -> None:
        await self._apply(self.session.playout_event("output_audio_buffer.started", response_id))

    async def playout_stopped(self, response_id: str) -> None:
        await self._apply(self.session.playout_event("output_audio_buffer.stopped", response_id))

    @property
    def responding(self) -> bool:
        """A response is running (its task has not finished)."""
        return any(not task.done() for task in self._responses.values())

    async def close(self) -> None:
        self._closed = True
        self._drop_prepared()
        tasks = [t for t in (*self._responses.values(), self._vad_task, *self._transcripts.values(), *self._mcp_tasks,
                             *self._checks) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # A task that failed or was cancelled keeps its frame, and so this runner, in its exception's traceback:
        # let go of the tasks, so that the session (its conversation's audio) is freed now, not by the collector.
        self._responses.clear()
        self._transcripts.clear()
        self._mcp_tasks.clear()
        self._checks.clear()

    async def _apply(self, effects: Iterable[Effect]) -> None:
        for effect in effects:
            match effect:
                case SendEvent(event):
                    await self._send_event(event)
                case Denoise(pcm, kind):
                    if self._denoiser is None or self._denoiser.kind != kind:
                        self._denoiser = Denoiser(kind)
                    await self._apply(self.session.denoised(self._denoiser.process(pcm)))
                case RunVad(pcm):
                    await self._run_vad_on(pcm)
                case RunSmartTurn():
                    task = asyncio.create_task(self._check_turn(effect))
                    self._checks.add(task)
                    task.add_done_callback(self._checks.discard)
                case StartResponse(request):
                    self._start_response(request)
                case StopResponse(response_id):
                    self._stop_response(response_id)
                case ListMcpTools():
                    self._start_mcp(self._list_mcp_tools(effect), None)
                case CallMcp():
                    self._start_mcp(self._call_mcp(effect), effect.response_id)
                case PrepareTranscript():
                    self._prepare_transcript(effect)
                case Transcribe():
                    self._start_transcription(effect)
                case Play(response_id, item_id, pcm):
                    if self.playout is not None:
                        self.playout.play(response_id, item_id, pcm)
                case PlayoutEnd(response_id):
                    if self.playout is not None:
                        self.playout.finished(response_id)
                case ClearPlayout():
                    heard = self.playout.clear() if self.playout is not None else None
                    if heard is not None:
                        await self._apply(self.session.playout_cleared(*heard))
                case Mark(name, response_id):
                    self.trace.mark(name, response_id)
                    if name == "response_done" and response_id is not None:
                        self._log_turn(response_id)
                case Fault():
                    log_fault(self.session.settings.id, effect)
                case _:
                    raise TypeError(f"not an effect: {effect!r}")

    async def _send_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "response.done":
            self._done[event["response"]["id"]] = event["response"]
        if not self._closed:
            self.trace.sent(event)
            await self._send(orjson.dumps(event).decode())

    async def _run_vad_on(self, pcm: bytes) -> None:
        if self._vad_batcher is None:
            await self._apply(self.session.vad_result(self.vad.process(pcm)))
            return
        # The batcher hands the probabilities to _vad_result; appends are not held up meanwhile.
        self._vad_batcher.feed(self.vad, pcm, self._vad_result)
        if not self.vad.queued:  # no window to wait for (the audio completes none): buffered now
            effects = self.session.vad_result(())
            if self._vad_task is None:
                await self._apply(effects)
            else:  # after the VAD's events still being carried out
                self._vad_effects += effects

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
        self._answers[request.response_id] = next((m for m in reversed(request.messages) if m.role == "user"), None)
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
        for task, running_for in list(self._mcp_tasks.items()):
            if running_for == response_id:
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

    def _start_mcp(self, work: Coroutine[Any, Any, None], response_id: str | None) -> None:
        task = asyncio.create_task(work)
        self._mcp_tasks[task] = response_id
        task.add_done_callback(self._mcp_tasks.pop)

    async def _list_mcp_tools(self, effect: ListMcpTools) -> None:
        try:
            tools = await self.mcp.list_tools(effect.server)
        except McpFailure as exc:
            log.warning("MCP server %s: %s", effect.server.server_label, exc)
            await self._apply(self.session.mcp_tools_listed(effect.item_id, None, str(exc)))
            return
        await self._apply(self.session.mcp_tools_listed(effect.item_id, tools))

    async def _call_mcp(self, effect: CallMcp) -> None:
        try:
            output = await self.mcp.call(effect.server, effect.name, effect.arguments)
        except McpFailure as exc:
            await self._apply(self.session.mcp_call_finished(effect.response_id, effect.item_id, None, exc.error))
            return
        await self._apply(self.session.mcp_call_finished(effect.response_id, effect.item_id, output))

    async def _check_turn(self, effect: RunSmartTurn) -> None:
        probability = None
        if self._smart_turn is not None:
            try:
                probability = await self._smart_turn.predict(effect.pcm)
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

    def _log_turn(self, response_id: str) -> None:
        """One INFO line per response: what it answered (as heard), what it said, how long its first audio took."""
        done = self._done.pop(response_id, None)
        answered = self._answers.pop(response_id, None)
        if done is None:
            return
        heard = "(nothing)" if answered is None else self._heard(answered)
        said = " ".join(part.get("transcript") or part.get("text") or "" for item in done["output"]
                        if item.get("type") == "message" for part in item.get("content", [])).strip()
        calls = [item.get("name") for item in done["output"] if item.get("type") in ("function_call", "mcp_call")]
        if calls:
            said = f"{said} [calls {', '.join(map(str, calls))}]".strip()
        said = said or "(no words)"
        record = self.trace.records[-1] if self.trace.records else {}
        first = record.get("first_delta_ms") if record.get("response_id") == response_id else None
        details = done.get("status_details") or {}
        status = done["status"] + (f" ({details['reason']})" if details.get("reason") else "")
        log.info("session %s %s: heard %s, said %s; %s%s", self.session.settings.id,
                 "turn" if done.get("conversation_id") else "out-of-band response", _quoted(heard), _quoted(said),
                 status, f", first audio {first:.0f} ms after the turn ended" if first is not None else "")

    def _heard(self, message: Message) -> str:
        if message.text:
            return message.text
        task = self._transcripts.get(message.item_id)
        if task is None:
            return "(audio, not transcribed)"
        if not task.done():
            return "(still transcribing)"
        if task.cancelled() or task.exception() is not None:
            return "(transcription failed)"
        return task.result()

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


def _quoted(text: str) -> str:
    """``text`` in quotes, cut to LOGGED_CHARS; a placeholder in parentheses as it is."""
    if text.startswith("(") and text.endswith(")"):
        return text
    return '"' + (text if len(text) <= LOGGED_CHARS else text[: LOGGED_CHARS - 1] + "…") + '"'
