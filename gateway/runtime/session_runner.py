"""Runs one Realtime Session in the event loop: carries out its effects and feeds it what comes back (the machinery
every protocol's runner has is gateway/runtime/core_runner.py's; this adds server-side playout, MCP and the per-turn
log line).

The runner knows nothing of the transport: it takes client messages and a ``send`` coroutine for
server messages, so the WebSocket server and the WebRTC data channel share it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from gateway.core.responder import Message, Responder, ResponseRequest, Transcriber
from gateway.realtime.effects import (
    CallMcp,
    ClearPlayout,
    Denoise,
    ListMcpTools,
    Play,
    PlayoutEnd,
    RunVad,
    SendEvent,
)
from gateway.realtime.session import Session
from gateway.runtime.core_runner import CoreRunner, Send
from gateway.runtime.denoise import Denoiser
from gateway.runtime.mcp_client import McpClient, McpFailure
from gateway.runtime.silero import SileroVAD, VadBatcher
from gateway.runtime.smart_turn import SmartTurn
from gateway.runtime.trace import TurnTrace

log = logging.getLogger(__name__)

# The per-turn log line shows this much of what was heard and said.
LOGGED_CHARS = 80


class Playout(Protocol):
    """Server-side playout of response audio (the WebRTC outbound track)."""

    def play(self, response_id: str, item_id: str, pcm: bytes) -> None: ...

    def finished(self, response_id: str) -> None:
        """No more audio of this response is coming."""

    def clear(self) -> tuple[str, float] | None:
        """Drop everything queued; return (item id, ms of it played) if an item was playing."""


class SessionRunner(CoreRunner):
    session: Session

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
        smart_turn: SmartTurn | None = None,
        on_backend_error: Callable[[str], None] | None = None,
    ) -> None:
        """See CoreRunner; ``playout``: server-side playout (WebRTC)."""
        super().__init__(session, session.settings.id, responder, vad, send, vad_batcher, trace, transcriber,
                         smart_turn, on_backend_error)
        self.playout = playout
        # For the per-turn log line: the user item each running response answers, and its response.done.
        self._answers: dict[str, Message | None] = {}
        self._done: dict[str, dict[str, Any]] = {}
        # MCP listings (None) and calls (their response's id: cancelled with it) in flight.
        self.mcp = McpClient(session.config.mcp)
        self._mcp_tasks: dict[asyncio.Task[None], str | None] = {}
        self._denoiser: Denoiser | None = None  # noise reduction's state, once it is on
        self._receiving = 0  # receive calls under way
        self._pending: asyncio.Task[None] | None = None  # carrying out what a receive_now left to wait for
        session.transcription.available = transcriber is not None
        session.transcription.always = responder.reads_transcripts
        session.voices = responder.voices

    @property
    def shape(self) -> str:
        return f"{self.session.dialect.value} shape"

    async def start(self) -> None:
        await self._apply(self.session.open())

    async def receive(self, message: str | bytes) -> None:
        """One client message; returns once its effects are carried out, except the VAD's."""
        self._receiving += 1
        try:
            if self._pending is not None:  # a message receive_now took comes first
                await self._pending
            await self._apply(self.session.handle(message))
            await self._wait_vad()
        finally:
            self._receiving -= 1

    def receive_now(self, message: str | bytes) -> bool:
        """``receive``, called by a transport as the message arrives instead of through its app's queue and
        task (the Realtime WebSocket's: gateway/transports/realtime_websocket.py RECEIVE_NOW): an audio append
        needs nothing awaited, and that hand-over cost it more CPU than the rest of its handling. Effects that
        need waiting are carried out by a task that the next message waits for. False, with nothing done,
        while another message is being handled or carried out, or the VAD's backlog is long: the message
        then comes through ``receive``, in its order."""
        if self._receiving or self._pending is not None or self._closed or self._vad_backlogged:
            return False
        effects = list(self.session.handle(message))
        while effects and isinstance(effects[0], RunVad):
            effects[:1] = self._feed_vad(effects[0].pcm)
        if effects:
            self._pending = asyncio.create_task(self._finish(effects), context=self._context)
        return True

    async def _finish(self, effects: list[Any]) -> None:
        try:
            await self._apply(effects)
        except Exception:  # as a receive's failure would, it ends nothing else
            log.exception("carrying out a client event's effects failed")
        finally:
            self._pending = None

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

    def _tasks(self) -> list[asyncio.Task[Any] | None]:
        return [*super()._tasks(), *self._mcp_tasks, self._pending]

    def _forget_tasks(self) -> None:
        super()._forget_tasks()
        self._mcp_tasks.clear()
        self._pending = None  # one cancelled before it started never cleared itself

    async def _carry_out(self, effect: Any) -> None:
        match effect:
            case Denoise(pcm, kind):
                if self._denoiser is None or self._denoiser.kind != kind:
                    self._denoiser = Denoiser(kind)
                await self._apply(self.session.denoised(self._denoiser.process(pcm)))
            case ListMcpTools():
                self._start_mcp(self._list_mcp_tools(effect), None)
            case CallMcp():
                self._start_mcp(self._call_mcp(effect), effect.response_id)
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
            case _:
                raise TypeError(f"not an effect: {effect!r}")

    def _mark(self, name: str, response_id: str | None) -> None:
        super()._mark(name, response_id)
        if name == "response_done" and response_id is not None:
            self._log_turn(response_id)

    async def _send_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "response.done":
            self._done[event["response"]["id"]] = event["response"]
        await super()._send_event(event)

    def _start_response(self, request: ResponseRequest) -> None:
        self._answers[request.response_id] = next((m for m in reversed(request.messages) if m.role == "user"), None)
        super()._start_response(request)

    def _stop_response(self, response_id: str) -> None:
        super()._stop_response(response_id)
        for task, running_for in list(self._mcp_tasks.items()):
            if running_for == response_id:
                task.cancel()

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
            await self._apply(self.session.mcp_call_finished(effect.item_id, None, exc.error))
            return
        await self._apply(self.session.mcp_call_finished(effect.item_id, output))

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


def _quoted(text: str) -> str:
    """``text`` in quotes, cut to LOGGED_CHARS; a placeholder in parentheses as it is."""
    if text.startswith("(") and text.endswith(")"):
        return text
    return '"' + (text if len(text) <= LOGGED_CHARS else text[: LOGGED_CHARS - 1] + "…") + '"'
