"""One Realtime session as a sans-I/O state machine: events in, events and effects out.

No sockets, tasks or clocks live here. The runner (gateway/runtime/session_runner.py) feeds it client events,
VAD probabilities and responder outputs, sends the server events it returns and carries out its
effects (gateway/realtime/effects.py: run VAD on appended audio, start or stop a response, ...). Everything
that changes the session happens in these calls, in the one event loop, so barge-in is a
synchronous state change: the cancelled response's response.done is produced in the same call as
the speech_started that caused it, and anything the responder yields afterwards is dropped.

This module is the duplex controller: it decides what follows from what (speech ends → commit →
respond; speech starts → cancel). The parts it drives, beside it in gateway/realtime/, each hold one
concern: the input audio and its turn detector (turns.py), the conversation's items (conversation.py),
the active response and its output items (responses.py, outputs.py), the tools (tools.py), the MCP
servers' listings (listings.py) and input transcription (transcription.py).

A session is of one of two types: "realtime" (a conversation that responds) or "transcription"
(turns are detected and transcribed, no response is ever created). The transport may open it as
either (?intent=transcription); its configuration may set it, also before session.created (a
configuration handed over by the transport is applied as a client event before ``open``).

Every handler validates its whole input before it changes anything, so a refused event (an
``error`` back to the client) leaves the session exactly as it was. An unexpected exception in a
handler becomes a server_error event, and the session goes on.
"""

from __future__ import annotations

import binascii
import math
import weakref
from collections.abc import Collection
from dataclasses import replace
from enum import Enum
from functools import partial
from typing import Any

import orjson
import pybase64

from gateway.config import Config
from gateway.core.responder import BackendError, ResponseOutput
from gateway.core.semantic_vad import CheckTurn
from gateway.core.vad import SpeechStarted, SpeechStopped, TurnEvent
from gateway.core.values import field_of, non_empty, parse_json
from gateway.realtime.conversation import BYTES_PER_MS, Conversation, Item, item_from_client
from gateway.realtime.effects import (
    ClearPlayout,
    Denoise,
    Effect,
    Fault,
    Mark,
    ResetVad,
    RunSmartTurn,
    RunVad,
    SendEvent,
)
from gateway.realtime.events import (
    BETA_TRANSCRIPTION_SESSION_EVENTS,
    CLIENT_EVENTS,
    Dialect,
    ProtocolError,
    error_event,
    new_id,
    to_wire,
)
from gateway.realtime.listings import McpListings
from gateway.realtime.outputs import McpError
from gateway.realtime.response_params import FIELDS
from gateway.realtime.responses import Response, Responses
from gateway.realtime.settings import SessionSettings, TurnDetection, parse_session, session_wire
from gateway.realtime.tools import McpPolicy, McpTool, parse_tool_choice, parse_tools
from gateway.realtime.transcription import InputTranscription
from gateway.realtime.turns import InputAudio

MIN_COMMIT_MS = 100


def wire_event(dialect: Dialect, kind: str, **fields: Any) -> list[Effect]:
    """The effect that sends a new server event as ``dialect`` has it; none for an event the dialect lacks."""
    return wire_effects({"type": kind, "event_id": new_id("event"), **fields}, dialect)


def wire_effects(event: dict[str, Any], dialect: Dialect) -> list[Effect]:
    """The effect that sends this (GA-shaped) event in the client's dialect; none if the dialect lacks it."""
    wire = to_wire(event, dialect)
    return [] if wire is None else [SendEvent(wire)]


class Phase(Enum):
    """The duplex controller's state."""

    LISTENING = "listening"  # no response; waiting for the user
    THINKING = "thinking"  # a response runs, no audio out yet
    SPEAKING = "speaking"  # response audio is going out
    INTERRUPTED = "interrupted"  # the user barged in; their turn is still open


class Session:
    def __init__(self, config: Config, dialect: Dialect = Dialect.GA, server_playout: bool = False,
                 model: str | None = None, session_type: str = "realtime") -> None:
        """``server_playout``: the server plays the audio out itself (WebRTC), so it sends no audio deltas,
        knows what was heard, and truncates the assistant item itself on barge-in. ``model``: the model the
        client asked for (the ?model= query), reported back; the gateway's own models answer.
        ``session_type``: "realtime", or "transcription" (the ?intent=transcription of the connection)."""
        self.config = config
        self.dialect = dialect
        self.server_playout = server_playout
        vad = config.vad
        # What turn detection starts from, at the start and when a session.update switches it back on.
        self._vad_defaults = TurnDetection(
            threshold=vad.threshold,
            prefix_padding_ms=vad.prefix_padding_ms,
            silence_duration_ms=vad.silence_duration_ms,
            create_response=vad.create_response,
            interrupt_response=vad.interrupt_response,
            idle_timeout_ms=vad.idle_timeout_ms or None,
        )
        self.settings = SessionSettings(
            id=new_id("sess"),
            model=model or config.session.model,
            instructions=config.session.instructions,
            voice=config.session.voice,
            turn_detection=self._vad_defaults if vad.enabled else None,
            type=session_type,
        )
        self.input = InputAudio(config, self.settings.input_format)
        # The parts hold nothing that leads back to the session (no bound method of it): a closed session is
        # freed at once by reference counting, its conversation's audio with it, not at the next full collection.
        event = partial(wire_event, dialect)
        ended = weakref.WeakMethod(self._response_ended)
        self.conversation = Conversation(event, config.session)
        self.conversation.reserved_text_bytes = self._settings_size(self.settings)
        self.mcp_policy = McpPolicy(config.mcp.enabled, config.mcp.allowed_hosts, config.mcp.max_servers)
        self.listings = McpListings(event, self.conversation, config.mcp.max_servers)
        self.responses = Responses(event, self.conversation, self.listings, dialect, server_playout,
                                   self.mcp_policy, config.session.max_out_of_band_responses,
                                   lambda resp: ended()(resp))  # type: ignore[misc]  # alive while it drives them
        # The runner says whether it can transcribe and whether its responder reads transcripts.
        self.transcription = InputTranscription(event, self.conversation, config)
        self._interrupted = False  # the user barged in and is still speaking
        # A turn ended while the conversation's response ran and was left alone (interrupt_response false):
        # it is answered when that response ends.
        self._turn_unanswered = False
        # Set by the runner from its speech engine: the voices it has (None: any name will do).
        self.voices: Collection[str] | None = None
        # Set by a transport with no way to play audio (a WebRTC call offered no audio track): output is text.
        self.text_only = False
        self._failures = 0  # unexpected exceptions in handlers (Fault)

    @property
    def phase(self) -> Phase:
        resp = self.responses.active
        if resp is not None:
            return Phase.SPEAKING if resp.audio_ms else Phase.THINKING
        return Phase.INTERRUPTED if self._interrupted else Phase.LISTENING

    # --- client events --------------------------------------------------------------------------

    @property
    def responds(self) -> bool:
        """A realtime session creates responses; a transcription session never does."""
        return self.settings.type == "realtime"

    def open(self) -> list[Effect]:
        """The events a new connection starts with."""
        events: list[Effect] = [self._session_event("session.created")]
        if self.dialect is Dialect.BETA and self.responds:
            events.append(SendEvent({
                "type": "conversation.created",
                "event_id": new_id("event"),
                "conversation": {"id": self.conversation.id, "object": "realtime.conversation"},
            }))
        return events

    def handle(self, text: str | bytes) -> list[Effect]:
        """One client message (a JSON text frame)."""
        event_id = None
        try:
            event = parse_json(text)
            if not isinstance(event, dict):
                raise ProtocolError("invalid_json", "A client event must be a JSON object.")
            raw_id = event.get("event_id")
            event_id = raw_id if isinstance(raw_id, str) else None
            if event_id is None:
                field_of(event, "event_id", str, "event_id")
            kind = field_of(event, "type", str, "type", required=True)
            if kind not in CLIENT_EVENTS:
                raise ProtocolError("invalid_event_type", f"Unknown event type: '{kind}'.", "type")
            handler = getattr(self, "_on_" + kind.replace(".", "_"))
            return handler(event)
        except ProtocolError as exc:
            return self._wire(error_event(exc.code, exc.message, exc.param, event_id))
        except Exception as exc:  # a bug must cost the client this event, never the session
            self._failures += 1
            message = f"The server failed to handle this event ({type(exc).__name__}); the session goes on."
            return [Fault(exc, self._failures),
                    *self._wire(error_event("server_error", message, None, event_id, "server_error"))]

    def _on_session_update(self, event: dict[str, Any]) -> list[Effect]:
        return self._update(event, transcription_update=False)

    def _on_transcription_session_update(self, event: dict[str, Any]) -> list[Effect]:
        if self.dialect is Dialect.GA:  # not a GA event: there it would turn a voice session into transcription
            raise ProtocolError("invalid_event_type", "Unknown event type: 'transcription_session.update' (beta "
                                "only; GA sends session.update with session.type 'transcription').", "type")
        return self._update(event, transcription_update=True)

    def _update(self, event: dict[str, Any], transcription_update: bool) -> list[Effect]:
        new = parse_session(event.get("session"), self.settings, self.dialect, self.responses.voice_locked,
                            self._vad_defaults, self.voices, transcription_update)
        body = event["session"]
        if body.get("tools") is not None:
            new = replace(new, tools=parse_tools(body["tools"], "session.tools", self.dialect, self.mcp_policy))
        if body.get("tool_choice") is not None:  # "", {}, [] and 0 are values to check, not absences
            choice = parse_tool_choice(body["tool_choice"], new.tools, "session.tool_choice", self.dialect)
            new = replace(new, tool_choice=choice)
        elif new.tools is not self.settings.tools and isinstance(new.tool_choice, dict):
            # A named tool must be among the tools, also when only the tools change.
            choice = parse_tool_choice(new.tool_choice, new.tools, "session.tool_choice", self.dialect)
            new = replace(new, tool_choice=choice)
        if new.type != self.settings.type and (running := self.responses.all_running()):
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Cannot make this a {new.type} session while response {running[0].id} is active; "
                "cancel it first.", "session.type",
            )
        self._check_output(new.modalities, "session")
        self.listings.check(new.tools, "session.tools")
        self.conversation.reserve_text(self._settings_size(new), "session")
        tail: list[Effect] = []
        if new.input_format != self.settings.input_format:
            # The old decoder holds back a few ms of resampled audio: keep them before switching.
            tail = self.input_audio(self.input.set_format(new.input_format))
        td, old = new.turn_detection, self.settings.turn_detection
        if self.input.speech is not None and (td is None or old is None or td.type != old.type):
            self._end_speech()  # the speech in progress was found by the other detector: not a turn
        self.input.tune(td)
        self.settings = new
        return [self._session_event("session.updated"), *tail, *self.listings.refresh(new.tools)]

    def _on_input_audio_buffer_append(self, event: dict[str, Any]) -> list[Effect]:
        audio = field_of(event, "audio", str, "audio", required=True)
        limit = self.config.session.max_append_bytes
        if len(audio) // 4 * 3 > limit:
            raise ProtocolError(
                "audio_too_large", f"An append may carry at most {limit} bytes of audio ([session] max_append_bytes).",
                "audio",
            )
        try:
            raw = pybase64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("invalid_base64", "'audio' is not valid base64.", "audio") from None
        return self.input_audio(self.input.decoder.decode(raw))

    def input_audio(self, pcm: bytes) -> list[Effect]:
        """Input audio, pcm16 24 kHz: from an append, or from a media track; through noise reduction when on."""
        if self.settings.noise_reduction is not None and pcm:
            return [Denoise(pcm, self.settings.noise_reduction["type"])]
        return self.denoised(pcm)

    def denoised(self, pcm: bytes) -> list[Effect]:
        """Input audio as the session keeps it (see Denoise)."""
        dropped = self.input.add(pcm, self.settings.turn_detection)
        effects: list[Effect] = [RunVad(pcm)] if pcm else []
        if dropped is not None:
            start, end = dropped
            limit = self.config.session.max_buffer_seconds
            effects.extend(self._wire(error_event(
                "input_audio_buffer_overflow",
                f"The input audio buffer holds at most {limit:g} s ([session] max_buffer_seconds): "
                f"{end - start:.0f} ms of uncommitted audio were dropped from its start (input audio "
                f"{start:.0f}-{end:.0f} ms). Commit or clear the buffer sooner.",
            )))
        return effects

    def _on_input_audio_buffer_commit(self, event: dict[str, Any]) -> list[Effect]:
        buffered = self.input.buffered_ms
        if buffered < MIN_COMMIT_MS:
            raise ProtocolError(
                "input_audio_buffer_commit_empty",
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms "
                f"of audio, but buffer only has {buffered:.2f}ms of audio.",
            )
        item_id = self.input.speech[0] if self.input.speech else new_id("item")
        self._end_speech()
        # A G.711 decoder holds back a few ms of resampled audio: they belong to this commit (and go
        # through VAD like all input, which keeps its clock on the input's).
        tail = self.input_audio(self.input.decoder.flush())
        return [*self._commit(item_id, self.input.start_ms, self.input.received_ms), *tail, ResetVad()]

    def _on_input_audio_buffer_clear(self, event: dict[str, Any]) -> list[Effect]:
        self.input.clear()
        self._interrupted = False
        return [*self._event("input_audio_buffer.cleared"), ResetVad()]

    def _on_conversation_item_create(self, event: dict[str, Any]) -> list[Effect]:
        item = item_from_client(event.get("item"), self.settings.input_format, self.config.session.max_append_bytes)
        if item.data["type"] == "mcp_approval_response":
            self._check_approval(item.data)
        # "" places it at the end, as no previous_item_id does (peers' conformance tests send it so).
        previous = non_empty(event, "previous_item_id", "previous_item_id")
        if previous is not None and previous != "root" and previous not in self.conversation:
            raise ProtocolError("item_not_found", f"Item with id '{previous}' not found.", "previous_item_id")
        if item.id in self.conversation:
            # OpenAI's code: LiveKit takes it as "already there" when it re-creates items.
            raise ProtocolError("item_create_duplicate_item_id",
                                f"Error adding item: an item with id '{item.id}' already exists.", "item.id")
        self.conversation.check_room(item)
        effects = self.conversation.insert(item, self.conversation.index_after(previous))
        if item.data.get("role") == "user" and item.audio and not any(
            p.get("transcript") for p in item.data["content"] if p["type"] == "input_audio"
        ):
            effects += self.transcription.start(item, self.settings)
        if item.data["type"] == "mcp_approval_response" and self.responses.active is None and \
                self.responses.approved(self.settings.tools):
            # An approved call runs at once, in a response of its own (OpenAI's clients send no response.create
            # after an approval); one added while a response runs waits for the next.
            effects += self.responses.start({}, self.settings, self.voices)
        return effects

    def _on_conversation_item_retrieve(self, event: dict[str, Any]) -> list[Effect]:
        item = self.conversation.find(event, "retrieve")
        return self.conversation.retrieved(item, self.settings.input_format, self.settings.output_format)

    def _on_conversation_item_delete(self, event: dict[str, Any]) -> list[Effect]:
        item = self.conversation.find(event, "delete")
        active = self.responses.active
        if active is not None and active.producing(item):
            raise ProtocolError(
                "item_in_progress", "The item is being produced by the active response; cancel it first.",
                "item_id",
            )
        return self.conversation.delete(item.id)

    def _on_conversation_item_truncate(self, event: dict[str, Any]) -> list[Effect]:
        item = self.conversation.find(event, "truncate")
        content_index = field_of(event, "content_index", int, "content_index", required=True)
        end_ms = field_of(event, "audio_end_ms", int, "audio_end_ms", required=True)
        content = item.data.get("content") or []
        if (
            item.data.get("role") != "assistant"
            or not 0 <= content_index < len(content)
            or content[content_index]["type"] != "output_audio"
        ):
            raise ProtocolError(
                "unsupported_content_type", "Only model output audio messages can be truncated.", "item_id"
            )
        # The active response may still add audio to this item: count what it has sent so far.
        held_ms = len(item.audio) / BYTES_PER_MS
        if end_ms < 0:
            raise ProtocolError("invalid_value", "audio_end_ms must not be negative.", "audio_end_ms")
        if end_ms > math.ceil(held_ms):  # a client may round what it got up to the next whole ms
            raise ProtocolError(
                "invalid_value", f"Audio content of {held_ms:.0f}ms is already shorter than {end_ms}ms.",
                "audio_end_ms",
            )
        # Only truncates: a response still producing this item goes on (the SDKs send response.cancel
        # next, and expect it to find the response active); see gateway/realtime/responses.py for its audio.
        if self.responses.active is not None and self.responses.active.holds(item):
            self.responses.sync_transcript()
        return self.conversation.truncate(item, content_index, end_ms)

    def _on_response_create(self, event: dict[str, Any]) -> list[Effect]:
        if not self.responds:
            raise ProtocolError(
                "unsupported_event",
                "This is a transcription session: it transcribes input audio and never creates responses.",
                "type",
            )
        params = field_of(event, "response", dict, "response") or {}
        name = FIELDS[self.dialect].modalities
        self._check_output(field_of(params, name, list, f"response.{name}") or [], "response")
        return self.responses.start(params, self.settings, self.voices)

    def _check_output(self, modalities: list[str], where: str) -> None:
        """Audio output asked of a session that has no way to play it (``text_only``) is refused."""
        if self.text_only and "audio" in modalities:
            raise ProtocolError("invalid_value", "This call has no audio track: its output is text only.",
                                f"{where}.{FIELDS[self.dialect].modalities}")

    def _on_response_cancel(self, event: dict[str, Any]) -> list[Effect]:
        # Without an id, the conversation's response (as OpenAI documents); an out-of-band one by its id.
        response_id = non_empty(event, "response_id", "response_id")
        if response_id is None:
            if self.responses.active is None:
                raise ProtocolError("response_cancel_not_active", "Cancellation failed: no active response found.")
            return self._finish_response(self.responses.active, "cancelled", reason="client_cancelled")
        resp = self.responses.running(response_id)
        if resp is None:
            raise ProtocolError(
                "response_cancel_not_active", f"Cancellation failed: response '{response_id}' is not active.",
                "response_id",
            )
        return self._finish_response(resp, "cancelled", reason="client_cancelled")

    def _on_output_audio_buffer_clear(self, event: dict[str, Any]) -> list[Effect]:
        if not self.server_playout:
            raise ProtocolError(
                "unsupported_event",
                "output_audio_buffer.clear applies to WebRTC connections; over WebSocket the client owns playback.",
                "type",
            )
        effects: list[Effect] = [ClearPlayout()]
        if self.responses.active is not None:
            effects += self._finish_response(self.responses.active, "cancelled", reason="client_cancelled")
        return effects

    # --- server-side playout (WebRTC) -----------------------------------------------------------

    def playout_cleared(self, item_id: str, heard_ms: float) -> list[Effect]:
        """The playout dropped its queue; ``heard_ms`` of ``item_id`` had been played."""
        item = self.conversation.get(item_id)
        effects: list[Effect] = [
            *self._event("output_audio_buffer.cleared", response_id=(item.response_id if item else None) or "")
        ]
        if item is not None:
            # Also when everything made so far was heard: the transcript may run ahead of the audio.
            effects += self.conversation.truncate(item, 0, min(int(heard_ms), int(len(item.audio) / BYTES_PER_MS)))
        return effects

    def playout_event(self, kind: str, response_id: str) -> list[Effect]:
        """output_audio_buffer.started / .stopped, as the playout reaches them."""
        return self._event(kind, response_id=response_id)

    # --- turns ------------------------------------------------------------------------------------

    def vad_result(self, probabilities: Any) -> list[Effect]:
        """Speech probabilities for the audio of earlier RunVad effects, in order."""
        events = self.input.feed(probabilities)
        td = self.settings.turn_detection
        if td is None:
            return []
        effects = self._turn_events(events, td) + self.transcription.early(self.settings, self.input)
        idle = self.input.speech is None and self.responses.active is None
        if td.type == "server_vad" and td.idle_timeout_ms and idle:  # semantic_vad has no idle timeout
            heard_ms = self.input.heard_ms
            if heard_ms - self.input.idle_since_ms >= td.idle_timeout_ms:
                effects += self._idle_timeout(heard_ms)
        return effects

    def smart_turn_result(self, seq: int, probability: float | None) -> list[Effect]:
        """The Smart Turn model's P(complete) for RunSmartTurn ``seq`` (None: the model failed)."""
        td = self.settings.turn_detection
        events = self.input.verdict(seq, probability)
        return self._turn_events(events, td) if td is not None else []

    def _turn_events(self, events: list[TurnEvent | CheckTurn], td: TurnDetection) -> list[Effect]:
        effects: list[Effect] = []
        for ev in events:
            if isinstance(ev, SpeechStarted):
                effects += self._speech_started(ev.audio_start_ms, td)
            elif isinstance(ev, SpeechStopped) and self.input.speech is not None:
                effects += self._speech_stopped(ev.audio_end_ms, td)
            elif isinstance(ev, CheckTurn):
                effects.append(RunSmartTurn(ev.seq, self.input.check_audio(ev)))
        return effects

    def _end_speech(self) -> None:
        self.input.end_speech()
        self._interrupted = False

    def _speech_started(self, start_ms: float, td: TurnDetection) -> list[Effect]:
        # The detector's start already includes prefix_padding_ms; audio before the buffer is gone.
        start = max(self.input.start_ms, start_ms)
        item_id = new_id("item")
        self.input.speech = (item_id, start)
        effects: list[Effect] = [
            *self._event("input_audio_buffer.speech_started", audio_start_ms=round(start), item_id=item_id)
        ]
        if self.server_playout and td.interrupt_response:
            # The reply may still be playing after its response.done: stop it where the user cut in.
            effects.append(ClearPlayout())
        # Only the conversation's response: out-of-band ones are not the user's to interrupt.
        if self.responses.active is not None and td.interrupt_response:
            effects += self._finish_response(self.responses.active, "cancelled", reason="turn_detected")
            self._interrupted = True
        return effects

    def _speech_stopped(self, end_ms: float, td: TurnDetection) -> list[Effect]:
        assert self.input.speech is not None
        item_id, start = self.input.speech
        self.input.speech = None
        self.input.idle_since_ms = end_ms
        self._interrupted = False
        effects: list[Effect] = [
            Mark("speech_stopped"),
            *self._event("input_audio_buffer.speech_stopped", audio_end_ms=round(end_ms), item_id=item_id),
        ]
        effects += self._commit(item_id, start, end_ms)
        if td.create_response and self.responds:
            if self.responses.active is None:
                effects += self.responses.start({}, self.settings, self.voices)
            else:  # the running response was left alone (interrupt_response false): this turn's answer follows it
                self._turn_unanswered = True
        return effects

    def _idle_timeout(self, end: float) -> list[Effect]:
        item_id = new_id("item")
        start = max(self.input.idle_since_ms, self.input.start_ms)
        self.input.idle_since_ms = end
        effects: list[Effect] = [*self._event(
            "input_audio_buffer.timeout_triggered", audio_start_ms=round(start), audio_end_ms=round(end),
            item_id=item_id,
        )]
        effects += self._commit(item_id, start, end)
        return effects + (self.responses.start({}, self.settings, self.voices) if self.responds else [])

    def _commit(self, item_id: str, start_ms: float, end_ms: float) -> list[Effect]:
        item = Item({
            "id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_audio", "transcript": None}],
        }, bytearray(self.input.take(start_ms, end_ms)))
        effects: list[Effect] = [
            Mark("committed"),
            *self._event("input_audio_buffer.committed", item_id=item_id, previous_item_id=self.conversation.last_id),
        ]
        effects += self.conversation.insert(item) + self.conversation.make_room(keep=item)
        return effects + self.transcription.start(item, self.settings)

    def input_transcript_delta(self, item_id: str, text: str) -> list[Effect]:
        """More of the transcription of user audio item ``item_id`` (see Transcribe)."""
        return self.transcription.delta(item_id, text)

    def input_transcribed(self, item_id: str, text: str | None, error: str | None = None) -> list[Effect]:
        """The transcription of user audio item ``item_id``: its whole text, or why it failed."""
        if text is None:
            return self.transcription.failed(item_id, error or "transcription failed")
        return self.transcription.completed(item_id, text)

    # --- responses --------------------------------------------------------------------------------

    def response_output(self, response_id: str, out: ResponseOutput) -> list[Effect]:
        """Something the responder of ``response_id`` produced; dropped if that response has ended."""
        return self.responses.output(response_id, out)

    def response_finished(self, response_id: str, error: BaseException | None = None) -> list[Effect]:
        """The responder of ``response_id`` ended, normally (the response may go on: see Responses) or with
        ``error``."""
        resp = self.responses.running(response_id)
        if resp is None:
            return []
        if error is None:
            return self.responses.round_finished(response_id)
        if isinstance(error, BackendError):
            code, message = f"{error.backend}_backend_error", str(error)
        else:
            code, message = "server_error", f"The response failed: {type(error).__name__}: {error}"
        return self._wire(error_event(code, message, error_type="server_error")) + self._finish_response(
            resp, "failed", error={"type": "server_error", "code": code, "message": message}
        )

    def _finish_response(
        self, resp: Response, status: str, reason: str | None = None, error: dict[str, Any] | None = None
    ) -> list[Effect]:
        return self.responses.finish(resp, status, reason, error)

    def _response_ended(self, resp: Response) -> list[Effect]:
        """What follows a response's end: the answer to a turn that ended while it ran, if one waits."""
        if not resp.in_conversation:
            return []
        self.input.idle_since_ms = self.input.received_ms + resp.audio_ms  # idle counts from the end of playback
        if self._turn_unanswered and self.responds:
            self._turn_unanswered = False
            return self.responses.start({}, self.settings, self.voices)
        return []

    # --- tools --------------------------------------------------------------------------------------

    def _check_approval(self, data: dict[str, Any]) -> None:
        if self.dialect is Dialect.BETA:
            raise ProtocolError("invalid_value", "mcp_approval_response items are part of the GA interface.",
                                "item.type")
        request = self.conversation.get(data["approval_request_id"])
        if request is None or request.data["type"] != "mcp_approval_request":
            raise ProtocolError("item_not_found", f"No mcp_approval_request item with id "
                                f"'{data['approval_request_id']}'.", "item.approval_request_id")

    def mcp_tools_listed(self, item_id: str, tools: list[McpTool] | None, error: str | None = None) -> list[Effect]:
        """The tools an MCP server listed for the mcp_list_tools item ``item_id`` (see ListMcpTools), or why
        listing failed."""
        return self.listings.finished(item_id, tools, error) + self.responses.listed(item_id)

    def mcp_call_finished(self, item_id: str, output: str | None, error: McpError | None = None) -> list[Effect]:
        """An MCP call's output or error (see CallMcp); dropped if it was cancelled with its response."""
        return self.responses.mcp_call_finished(item_id, output, error)

    # --- event building ---------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> list[Effect]:
        return wire_event(self.dialect, kind, **fields)

    def _wire(self, event: dict[str, Any]) -> list[Effect]:
        return wire_effects(event, self.dialect)

    def _session_event(self, kind: str) -> SendEvent:
        if self.dialect is Dialect.BETA and not self.responds:
            kind = BETA_TRANSCRIPTION_SESSION_EVENTS[kind]
        session = session_wire(self.settings, self.dialect)
        return SendEvent({"type": kind, "event_id": new_id("event"), "session": session})

    def _settings_size(self, settings: SessionSettings) -> int:
        """What the session's configuration takes of its text budget: its JSON as a realtime session
        reports it (a transcription session keeps the realtime settings it had, too)."""
        return len(orjson.dumps(session_wire(replace(settings, type="realtime"), self.dialect)))

