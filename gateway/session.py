"""One Realtime session as a sans-I/O state machine: events in, events and effects out.

No sockets, tasks or clocks live here. The runner (gateway/runner.py) feeds it client events,
VAD probabilities and responder outputs, sends the server events it returns and carries out its
effects (run VAD on appended audio, start or stop a response). Everything that changes the session
happens in these calls, in the one event loop, so barge-in is a synchronous state change: the
cancelled response's response.done is produced in the same call as the speech_started that caused
it, and anything the responder yields afterwards is dropped here.

Every handler validates its whole input before it changes anything, so a refused event (an
``error`` back to the client) leaves the session exactly as it was.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import orjson

from gateway.audio import InputDecoder, OutputEncoder
from gateway.config import Config
from gateway.protocol import (
    CLIENT_EVENTS,
    Dialect,
    ProtocolError,
    SessionSettings,
    TurnDetection,
    check_voice,
    error_event,
    field_of,
    format_wire,
    new_id,
    parse_item,
    parse_session,
    response_format,
    session_wire,
    to_wire,
)
from gateway.responder import (
    AudioOut,
    BackendError,
    Message,
    ResponseOutput,
    ResponseRequest,
    SpeechText,
    TextOut,
    TraceMark,
)
from gateway.vad import SpeechStarted, SpeechStopped, TurnDetector

BYTES_PER_MS = 48  # pcm16 mono at 24 kHz, the session's internal format
MIN_COMMIT_MS = 100
TRIM_BYTES = 1000 * BYTES_PER_MS


class Phase(Enum):
    """The duplex controller's state."""

    LISTENING = "listening"  # no response; waiting for the user
    THINKING = "thinking"  # a response runs, no audio out yet
    SPEAKING = "speaking"  # response audio is going out
    INTERRUPTED = "interrupted"  # the user barged in; their turn is still open


@dataclass
class RunVad:
    """Compute VAD probabilities for this pcm16 24 kHz audio and pass them to ``vad_result``, in order.

    Later client events need not wait for the result: turn events carry input-audio times, and a
    commit or clear tells the detector which audio it took (``TurnDetector.reset``)."""

    pcm: bytes


@dataclass
class StartResponse:
    request: ResponseRequest


@dataclass
class StopResponse:
    """Stop the response's producer: close its LLM stream, cancel its TTS, drop its queued audio."""

    response_id: str


@dataclass
class Play:
    """Server-side playout (WebRTC): queue this response audio on the outbound track."""

    response_id: str
    item_id: str
    pcm: bytes


@dataclass
class PlayoutEnd:
    """Server-side playout: this response sends no more audio; once its queue has played, it has stopped."""

    response_id: str


@dataclass
class ClearPlayout:
    """Server-side playout: drop queued audio at once, then call ``playout_cleared`` with what was heard."""


@dataclass
class Transcribe:
    """Transcribe this committed user audio item and pass the result to ``input_transcribed``."""

    item_id: str
    pcm: bytes
    language: str | None = None  # the session's transcription language and prompt, if it set them
    prompt: str | None = None


@dataclass
class Mark:
    """A latency checkpoint of the current turn (for the trace)."""

    name: str
    response_id: str | None = None


Effect = (dict[str, Any] | RunVad | StartResponse | StopResponse | Play | PlayoutEnd | ClearPlayout | Mark
          | Transcribe)


@dataclass
class _Stored:
    """A conversation item: its GA-shaped data (audio payloads left out) and its audio."""

    data: dict[str, Any]
    audio: bytearray = field(default_factory=bytearray)
    # (audio bytes, transcript chars) at each SpeechText: which text the audio after it speaks.
    marks: list[tuple[int, int]] = field(default_factory=list)
    response_id: str | None = None


@dataclass
class _Response:
    id: str
    item_id: str
    modalities: list[str]
    voice: str
    output_format: str
    in_conversation: bool
    max_output_tokens: int | str
    metadata: dict[str, Any] | None
    encoder: OutputEncoder
    stored: _Stored
    transcript: list[str] = field(default_factory=list)
    audio_ms: float = 0.0


class Session:
    def __init__(self, config: Config, dialect: Dialect = Dialect.GA, server_playout: bool = False,
                 model: str | None = None) -> None:
        """``server_playout``: the server plays the audio out itself (WebRTC), so it sends no audio deltas,
        knows what was heard, and truncates the assistant item itself on barge-in. ``model``: the model the
        client asked for (the ?model= query), reported back; the gateway's own models answer."""
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
            turn_detection=replace(self._vad_defaults) if vad.enabled else None,
            temperature=config.llm.temperature,
        )
        self.conversation_id = new_id("conv")
        self.phase = Phase.LISTENING
        self._items: dict[str, _Stored] = {}
        self._order: list[str] = []
        self._decoder = InputDecoder(self.settings.input_format)
        self._detector = TurnDetector(
            threshold=vad.threshold,
            prefix_padding_ms=vad.prefix_padding_ms,
            silence_duration_ms=vad.silence_duration_ms,
            min_speech_ms=vad.min_speech_ms,
        )
        self._buffer = bytearray()  # uncommitted input, pcm16 24 kHz
        self._buffer_start_ms = 0.0  # input-audio time of self._buffer[0]
        self._input_ms = 0.0  # input audio received so far
        self._speech: tuple[str, float] | None = None  # (item id, audio_start_ms) while the user speaks
        self._idle_since_ms = 0.0
        self._response: _Response | None = None
        self._voice_locked = False
        # Set by the runner when its responder reads transcripts: each user audio item is then
        # transcribed as it is committed, whatever becomes of the response to it.
        self.transcribes = False
        # Set by the runner from its speech engine: the voices it has (None: any name will do).
        self.voices: frozenset[str] | None = None

    # --- client events --------------------------------------------------------------------------

    def open(self) -> list[Effect]:
        """The events a new connection starts with."""
        events: list[Effect] = [self._session_event("session.created")]
        if self.dialect is Dialect.BETA:
            events.append({
                "type": "conversation.created",
                "event_id": new_id("event"),
                "conversation": {"id": self.conversation_id, "object": "realtime.conversation"},
            })
        return events

    def handle(self, text: str | bytes) -> list[Effect]:
        """One client message (a JSON text frame)."""
        event_id = None
        try:
            try:
                event = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise ProtocolError("invalid_json", f"The message is not valid JSON: {exc}.") from None
            if not isinstance(event, dict):
                raise ProtocolError("invalid_json", "A client event must be a JSON object.")
            raw_id = event.get("event_id")
            event_id = raw_id if isinstance(raw_id, str) else None
            field_of(event, "event_id", str, "event_id")
            kind = field_of(event, "type", str, "type", required=True)
            if kind not in CLIENT_EVENTS:
                raise ProtocolError("invalid_event_type", f"Unknown event type: '{kind}'.", "type")
            handler = getattr(self, "_on_" + kind.replace(".", "_"))
            return handler(event)
        except ProtocolError as exc:
            return [self._wire(error_event(exc.code, exc.message, exc.param, event_id))]

    def _on_session_update(self, event: dict[str, Any]) -> list[Effect]:
        new = parse_session(event.get("session"), self.settings, self.dialect, self._voice_locked,
                            self._vad_defaults, self.voices)
        tail: list[Effect] = []
        if new.input_format != self.settings.input_format:
            # The old decoder holds back a few ms of resampled audio: keep them before switching.
            tail = self.input_audio(self._decoder.flush())
            self._decoder = InputDecoder(new.input_format)
        td = new.turn_detection
        if td is not None:
            self._detector.threshold = td.threshold
            self._detector.prefix_padding_ms = td.prefix_padding_ms
            self._detector.silence_duration_ms = td.silence_duration_ms
        elif self._speech is not None:
            self._end_speech()
        self.settings = new
        return [self._session_event("session.updated"), *tail]

    def _on_input_audio_buffer_append(self, event: dict[str, Any]) -> list[Effect]:
        audio = field_of(event, "audio", str, "audio", required=True)
        limit = self.config.session.max_append_bytes
        if len(audio) // 4 * 3 > limit:
            raise ProtocolError(
                "audio_too_large", f"An append may carry at most {limit} bytes of audio.", "audio"
            )
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("invalid_base64", "'audio' is not valid base64.", "audio") from None
        return self.input_audio(self._decoder.decode(raw))

    def input_audio(self, pcm: bytes) -> list[Effect]:
        """Input audio, pcm16 24 kHz: from an append, or from a media track."""
        self._buffer += pcm
        self._input_ms += len(pcm) / BYTES_PER_MS
        self._trim_buffer()
        return [RunVad(pcm)] if pcm else []

    def _on_input_audio_buffer_commit(self, event: dict[str, Any]) -> list[Effect]:
        if len(self._buffer) < MIN_COMMIT_MS * BYTES_PER_MS:
            raise ProtocolError(
                "input_audio_buffer_commit_empty",
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms "
                f"of audio, but buffer only has {len(self._buffer) / BYTES_PER_MS:.2f}ms of audio.",
            )
        item_id = self._speech[0] if self._speech else new_id("item")
        self._end_speech()
        # A G.711 decoder holds back a few ms of resampled audio: they belong to this commit (and go
        # through VAD like all input, which keeps its clock on the input's).
        tail = self.input_audio(self._decoder.flush())
        return self._commit(item_id, self._buffer_start_ms, self._input_ms) + tail

    def _on_input_audio_buffer_clear(self, event: dict[str, Any]) -> list[Effect]:
        self._decoder.reset()
        self._buffer.clear()
        self._buffer_start_ms = self._input_ms
        self._end_speech()
        return [self._event("input_audio_buffer.cleared")]

    def _on_conversation_item_create(self, event: dict[str, Any]) -> list[Effect]:
        item = parse_item(event.get("item"))
        previous = field_of(event, "previous_item_id", str, "previous_item_id")
        if previous is not None and previous != "root" and previous not in self._items:
            raise ProtocolError("item_not_found", f"Item with id '{previous}' not found.", "previous_item_id")
        if item["id"] in self._items:
            raise ProtocolError("duplicate_item_id", f"Item with id '{item['id']}' already exists.", "item.id")
        stored = _Stored(item)
        for i, part in enumerate(item.get("content", [])):
            if part["type"] == "input_audio" and part.get("audio"):
                try:
                    raw = base64.b64decode(part.pop("audio"), validate=True)
                except (binascii.Error, ValueError):
                    raise ProtocolError(
                        "invalid_base64", "Audio is not valid base64.", f"item.content[{i}].audio"
                    ) from None
                decoder = InputDecoder(self.settings.input_format)
                stored.audio += decoder.decode(raw) + decoder.flush()
            part.pop("audio", None)
        index = 0 if previous == "root" else (
            self._order.index(previous) + 1 if previous else len(self._order)
        )
        effects = self._insert(stored, index)
        if item.get("role") == "user" and stored.audio and not any(
            p.get("transcript") for p in item["content"] if p["type"] == "input_audio"
        ):
            effects += self._transcribe(stored)
        return effects

    def _on_conversation_item_retrieve(self, event: dict[str, Any]) -> list[Effect]:
        stored = self._item(event)
        item = _copy(stored.data)
        for part in item.get("content", []):
            if part["type"] in ("input_audio", "output_audio"):
                part["audio"] = base64.b64encode(stored.audio).decode()
        return [self._event("conversation.item.retrieved", item=item)]

    def _on_conversation_item_delete(self, event: dict[str, Any]) -> list[Effect]:
        stored = self._item(event)
        if self._response and stored.data["id"] == self._response.item_id:
            raise ProtocolError(
                "item_in_progress", "The item is being produced by the active response; cancel it first.",
                "item_id",
            )
        item_id = stored.data["id"]
        del self._items[item_id]
        self._order.remove(item_id)
        return [self._event("conversation.item.deleted", item_id=item_id)]

    def _on_conversation_item_truncate(self, event: dict[str, Any]) -> list[Effect]:
        stored = self._item(event)
        content_index = field_of(event, "content_index", int, "content_index", required=True)
        end_ms = field_of(event, "audio_end_ms", int, "audio_end_ms", required=True)
        content = stored.data.get("content") or []
        if (
            stored.data.get("role") != "assistant"
            or not 0 <= content_index < len(content)
            or content[content_index]["type"] != "output_audio"
        ):
            raise ProtocolError(
                "unsupported_content_type", "Only model output audio messages can be truncated.", "item_id"
            )
        # The active response may still add audio to this item: count what it has sent so far.
        held_ms = len(stored.audio) / BYTES_PER_MS
        if end_ms < 0 or end_ms > held_ms + 0.5:
            raise ProtocolError(
                "invalid_value",
                f"audio_end_ms {end_ms} is outside the item's audio, which is {held_ms:.0f} ms long.",
                "audio_end_ms",
            )
        effects: list[Effect] = []
        if self._response and self._response.item_id == stored.data["id"]:
            # The listener stopped hearing it: nothing more of this response is wanted.
            effects += self._finish_response("cancelled", reason="client_cancelled")
        return effects + self._truncate(stored, content_index, end_ms)

    def _truncate(self, stored: _Stored, content_index: int, end_ms: int) -> list[Effect]:
        """Keep what was heard: the first ``end_ms`` of the audio and the words it speaks."""
        content = stored.data["content"]
        cut = min(len(stored.audio), end_ms * BYTES_PER_MS)
        part = content[content_index]
        part["transcript"] = _heard_text(part.get("transcript") or "", stored.marks, len(stored.audio), cut)
        del stored.audio[cut:]
        stored.marks = [m for m in stored.marks if m[0] < cut]
        return [self._event(
            "conversation.item.truncated", item_id=stored.data["id"], content_index=content_index,
            audio_end_ms=end_ms,
        )]

    def _on_response_create(self, event: dict[str, Any]) -> list[Effect]:
        params = field_of(event, "response", dict, "response") or {}
        return self._start_response(params)

    def _on_response_cancel(self, event: dict[str, Any]) -> list[Effect]:
        response_id = field_of(event, "response_id", str, "response_id")
        if self._response is None:
            raise ProtocolError(
                "response_cancel_not_active", "Cancellation failed: no active response found.", "response_id"
            )
        if response_id is not None and response_id != self._response.id:
            raise ProtocolError(
                "response_cancel_not_active", f"Cancellation failed: response '{response_id}' is not active.",
                "response_id",
            )
        return self._finish_response("cancelled", reason="client_cancelled")

    def _on_output_audio_buffer_clear(self, event: dict[str, Any]) -> list[Effect]:
        if not self.server_playout:
            raise ProtocolError(
                "unsupported_event",
                "output_audio_buffer.clear applies to WebRTC connections; over WebSocket the client owns playback.",
                "type",
            )
        effects: list[Effect] = [ClearPlayout()]
        if self._response is not None:
            effects += self._finish_response("cancelled", reason="client_cancelled")
        return effects

    def playout_cleared(self, item_id: str, heard_ms: float) -> list[Effect]:
        """The playout dropped its queue; ``heard_ms`` of ``item_id`` had been played."""
        effects: list[Effect] = [self._event("output_audio_buffer.cleared", response_id=self._response_of(item_id))]
        stored = self._items.get(item_id)
        if stored is not None:
            # Also when everything made so far was heard: the transcript may run ahead of the audio.
            effects += self._truncate(stored, 0, min(int(heard_ms), int(len(stored.audio) / BYTES_PER_MS)))
        return effects

    def playout_event(self, kind: str, response_id: str) -> list[Effect]:
        """output_audio_buffer.started / .stopped, as the playout reaches them."""
        return [self._event(kind, response_id=response_id)]

    def _response_of(self, item_id: str) -> str:
        stored = self._items.get(item_id)
        return (stored.response_id if stored else None) or ""

    # --- VAD --------------------------------------------------------------------------------------

    def vad_result(self, probabilities: Any) -> list[Effect]:
        """Speech probabilities for the audio of earlier RunVad effects, in order."""
        events = self._detector.feed(probabilities)
        td = self.settings.turn_detection
        if td is None:
            return []
        effects: list[Effect] = []
        for ev in events:
            if isinstance(ev, SpeechStarted):
                effects += self._speech_started(ev.audio_start_ms, td)
            elif isinstance(ev, SpeechStopped) and self._speech is not None:
                effects += self._speech_stopped(ev.audio_end_ms, td)
        if td.idle_timeout_ms and self._speech is None and self._response is None:
            heard_ms = min(self._detector.position_ms, self._input_ms)  # the VAD may trail the input
            if heard_ms - self._idle_since_ms >= td.idle_timeout_ms:
                effects += self._idle_timeout(td, heard_ms)
        return effects

    def _end_speech(self) -> None:
        """The client took the turn (commit, clear, VAD off): the speech in progress is not a turn."""
        self._speech = None
        self._detector.reset(until_ms=self._input_ms)

    def _speech_started(self, start_ms: float, td: TurnDetection) -> list[Effect]:
        # The detector's start already includes prefix_padding_ms; audio before the buffer is gone.
        start = max(self._buffer_start_ms, start_ms)
        item_id = new_id("item")
        self._speech = (item_id, start)
        effects: list[Effect] = [
            self._event("input_audio_buffer.speech_started", audio_start_ms=round(start), item_id=item_id)
        ]
        if self.server_playout and td.interrupt_response:
            # The reply may still be playing after its response.done: stop it where the user cut in.
            effects.append(ClearPlayout())
        if self._response is not None and td.interrupt_response:
            effects += self._finish_response("cancelled", reason="turn_detected")
            self.phase = Phase.INTERRUPTED
        return effects

    def _speech_stopped(self, end_ms: float, td: TurnDetection) -> list[Effect]:
        assert self._speech is not None
        item_id, start = self._speech
        self._speech = None
        self._idle_since_ms = end_ms
        effects: list[Effect] = [
            Mark("speech_stopped"),
            self._event("input_audio_buffer.speech_stopped", audio_end_ms=round(end_ms), item_id=item_id),
        ]
        effects += self._commit(item_id, start, end_ms)
        if self.phase is Phase.INTERRUPTED:
            self.phase = Phase.LISTENING
        if td.create_response and self._response is None:
            effects += self._start_response({})
        return effects

    def _idle_timeout(self, td: TurnDetection, end: float) -> list[Effect]:
        item_id = new_id("item")
        start = max(self._idle_since_ms, self._buffer_start_ms)
        self._idle_since_ms = end
        effects: list[Effect] = [self._event(
            "input_audio_buffer.timeout_triggered", audio_start_ms=round(start), audio_end_ms=round(end),
            item_id=item_id,
        )]
        effects += self._commit(item_id, start, end)
        return effects + self._start_response({})

    def _trim_buffer(self) -> None:
        """Bound the uncommitted buffer. With VAD on and no speech, a VAD turn needs only the prefix
        padding, but a manual commit or an idle timeout commits what is there: keep idle_buffer_seconds."""
        cfg = self.config.session
        td = self.settings.turn_detection
        if td is not None and self._speech is None:
            keep_ms = max(td.prefix_padding_ms + 1000, cfg.idle_buffer_seconds * 1000)
        else:
            keep_ms = cfg.max_buffer_seconds * 1000
        keep = int(keep_ms) * BYTES_PER_MS
        # Trimmed a second at a time, not per append: cutting the front of a long buffer moves all of it.
        if len(self._buffer) >= keep + TRIM_BYTES:
            excess = len(self._buffer) - keep
            del self._buffer[:excess]
            self._buffer_start_ms += excess / BYTES_PER_MS

    # --- responses --------------------------------------------------------------------------------

    def response_output(self, response_id: str, out: ResponseOutput) -> list[Effect]:
        """Something the responder of ``response_id`` produced; dropped if that response has ended."""
        resp = self._response
        if resp is None or resp.id != response_id:
            return []
        stored = resp.stored
        if isinstance(out, TraceMark):
            return [Mark(out.name, response_id)]
        audio_mode = "audio" in resp.modalities
        if isinstance(out, AudioOut):
            if not audio_mode or not out.pcm:
                return []
            effects: list[Effect] = []
            if self.phase is not Phase.SPEAKING:
                self.phase = Phase.SPEAKING
                effects.append(Mark("first_delta", response_id))
            self._voice_locked = True
            stored.audio += out.pcm
            resp.audio_ms += len(out.pcm) / BYTES_PER_MS
            if self.server_playout:
                effects.append(Play(resp.id, resp.item_id, out.pcm))
                return effects
            encoded = resp.encoder.encode(out.pcm)
            if encoded:  # a G.711 resampler may hold all of a short chunk back
                effects.append(self._delta("response.output_audio.delta", resp, base64.b64encode(encoded).decode()))
            return effects
        if isinstance(out, SpeechText | TextOut) and out.text:
            if audio_mode:
                stored.marks.append((len(stored.audio), sum(map(len, resp.transcript))))
            resp.transcript.append(out.text)
            kind = "response.output_audio_transcript.delta" if audio_mode else "response.output_text.delta"
            return [self._delta(kind, resp, out.text)]
        return []

    def response_finished(self, response_id: str, error: BaseException | None = None) -> list[Effect]:
        """The responder of ``response_id`` ended, normally or with ``error``."""
        if self._response is None or self._response.id != response_id:
            return []
        if error is None:
            return self._finish_response("completed")
        if isinstance(error, BackendError):
            code, message = f"{error.backend}_backend_error", str(error)
        else:
            code, message = "server_error", f"The response failed: {type(error).__name__}: {error}"
        return [self._wire(error_event(code, message, error_type="server_error"))] + self._finish_response(
            "failed", error={"type": "server_error", "code": code, "message": message}
        )

    def _start_response(self, params: dict[str, Any]) -> list[Effect]:
        if self._response is not None:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self._response.id}. "
                "Wait until the response is finished before creating a new one.",
            )
        s = self.settings
        if self.dialect is Dialect.GA:
            mods = field_of(params, "output_modalities", list, "response.output_modalities")
            audio = field_of(params, "audio", dict, "response.audio") or {}
            out = field_of(audio, "output", dict, "response.audio.output") or {}
            voice_param = "response.audio.output.voice"
            max_tokens = params.get("max_output_tokens")
            max_param = "response.max_output_tokens"
        else:
            mods = field_of(params, "modalities", list, "response.modalities")
            out = params
            voice_param = "response.voice"
            max_tokens = params.get("max_response_output_tokens")
            max_param = "response.max_response_output_tokens"
        voice = field_of(out, "voice", str, voice_param)
        if voice is not None:
            check_voice(voice, self.voices, voice_param)
        if mods is not None:
            for i, m in enumerate(mods):
                if m not in ("text", "audio"):
                    raise ProtocolError("invalid_value", f"Invalid modality {m!r}.", f"response.modalities[{i}]")
        modalities = (["audio"] if "audio" in mods else ["text"]) if mods else s.modalities
        if max_tokens is not None and max_tokens != "inf" and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 4096
        ):
            raise ProtocolError("invalid_value", "max output tokens must be 1..4096 or \"inf\".", max_param)
        conversation = field_of(params, "conversation", str, "response.conversation") or "auto"
        if conversation not in ("auto", "none"):
            raise ProtocolError("invalid_value", "'response.conversation' must be 'auto' or 'none'.",
                                "response.conversation")
        instructions = field_of(params, "instructions", str, "response.instructions")
        metadata = field_of(params, "metadata", dict, "response.metadata")
        output_format = response_format(params, self.dialect) or s.output_format
        # An out-of-band context replaces the conversation for this response ("input": items or references).
        context = self._response_input(params["input"]) if params.get("input") is not None else None

        item_id = new_id("item")
        part = {"type": "output_audio", "transcript": ""} if "audio" in modalities else {"type": "output_text",
                                                                                         "text": ""}
        stored = _Stored({
            "id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
            "status": "in_progress", "content": [part],
        })
        resp = _Response(
            id=new_id("resp"),
            item_id=item_id,
            modalities=modalities,
            voice=voice or s.voice,
            output_format=output_format,
            in_conversation=conversation == "auto",
            max_output_tokens=max_tokens if max_tokens is not None else s.max_output_tokens,
            metadata=metadata,
            encoder=OutputEncoder(output_format),
            stored=stored,
        )
        stored.response_id = resp.id
        request = ResponseRequest(
            response_id=resp.id,
            item_id=resp.item_id,
            instructions=instructions if instructions is not None else s.instructions,
            messages=self._messages(context),
            voice=resp.voice,
            modalities=modalities,
            max_output_tokens=resp.max_output_tokens if isinstance(resp.max_output_tokens, int) else None,
            temperature=s.temperature,
        )
        self._response = resp
        self.phase = Phase.THINKING
        added = {**_copy(stored.data), "content": []}
        effects: list[Effect] = [
            Mark("response_created", resp.id),
            self._event("response.created", response=self._response_wire(resp, "in_progress", [])),
            self._event("rate_limits.updated", rate_limits=[]),
            self._event("response.output_item.added", response_id=resp.id, output_index=0, item=added),
        ]
        if resp.in_conversation:
            effects += self._insert(stored, len(self._order), done=False)
        effects.append(self._event(
            "response.content_part.added", response_id=resp.id, item_id=resp.item_id, output_index=0,
            content_index=0, part=self._part(resp, ""),
        ))
        effects.append(StartResponse(request))
        return effects

    def _finish_response(
        self, status: str, reason: str | None = None, error: dict[str, Any] | None = None
    ) -> list[Effect]:
        resp = self._response
        assert resp is not None
        self._response = None
        self.phase = Phase.LISTENING
        self._idle_since_ms = self._input_ms + resp.audio_ms  # idle counts from the end of playback
        text = "".join(resp.transcript)
        item = resp.stored.data
        item["status"] = "completed" if status == "completed" else "incomplete"
        content = item["content"][0]
        content["transcript" if "audio" in resp.modalities else "text"] = text
        effects: list[Effect] = []
        if status != "completed":
            effects.append(StopResponse(resp.id))
        if self.server_playout and resp.audio_ms:
            effects.append(PlayoutEnd(resp.id))
        common = {"response_id": resp.id, "item_id": resp.item_id, "output_index": 0, "content_index": 0}
        # The encoder's resampler holds back its last few ms: they belong to a completed reply only.
        tail = resp.encoder.flush() if status == "completed" and not self.server_playout else b""
        if tail:
            effects.append(self._delta("response.output_audio.delta", resp, base64.b64encode(tail).decode()))
        if "audio" in resp.modalities:
            effects.append(self._event("response.output_audio.done", **common))
            effects.append(self._event("response.output_audio_transcript.done", **common, transcript=text))
        else:
            effects.append(self._event("response.output_text.done", **common, text=text))
        effects.append(self._event("response.content_part.done", **common, part=self._part(resp, text)))
        effects.append(self._event("response.output_item.done", response_id=resp.id, output_index=0,
                                   item=_copy(item)))
        if resp.in_conversation and item["id"] in self._items:
            effects.append(self._event("conversation.item.done", item=_copy(item),
                                       previous_item_id=self._previous(item)))
        details: dict[str, Any] | None = None
        if status != "completed":
            details = {"type": status, "reason": reason, "error": error}
        effects.append(self._event("response.done", response=self._response_wire(resp, status, [_copy(item)],
                                                                                  details)))
        effects.append(Mark("response_done", resp.id))
        return effects

    def _response_wire(
        self, resp: _Response, status: str, output: list[dict[str, Any]], details: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return {
            "id": resp.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output,
            "conversation_id": self.conversation_id if resp.in_conversation else None,
            "output_modalities": resp.modalities,
            "max_output_tokens": resp.max_output_tokens,
            "metadata": resp.metadata,
            "audio": {"output": {"format": format_wire(resp.output_format), "voice": resp.voice}},
            "usage": None,
        }

    def _part(self, resp: _Response, text: str) -> dict[str, Any]:
        if "audio" in resp.modalities:
            return {"type": "audio", "transcript": text}
        return {"type": "text", "text": text}

    def _delta(self, kind: str, resp: _Response, delta: str) -> dict[str, Any]:
        return self._event(kind, response_id=resp.id, item_id=resp.item_id, output_index=0, content_index=0,
                           delta=delta)

    # --- conversation -----------------------------------------------------------------------------

    def _commit(self, item_id: str, start_ms: float, end_ms: float) -> list[Effect]:
        begin = max(0, int((start_ms - self._buffer_start_ms) * BYTES_PER_MS) & ~1)
        stop = max(begin, int((end_ms - self._buffer_start_ms) * BYTES_PER_MS) & ~1)
        audio = bytes(self._buffer[begin:stop])
        del self._buffer[:stop]
        self._buffer_start_ms += stop / BYTES_PER_MS
        item = {
            "id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        previous = self._order[-1] if self._order else None
        stored = _Stored(item, bytearray(audio))
        effects: list[Effect] = [
            Mark("committed"),
            self._event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous),
        ]
        return effects + self._insert(stored, len(self._order)) + self._transcribe(stored)

    def _transcribe(self, stored: _Stored) -> list[Effect]:
        if not self.transcribes:
            return []
        tr = self.settings.transcription
        return [Transcribe(stored.data["id"], bytes(stored.audio), tr and tr.language, tr and tr.prompt)]

    def _insert(self, stored: _Stored, index: int, done: bool = True) -> list[Effect]:
        item_id = stored.data["id"]
        self._items[item_id] = stored
        self._order.insert(index, item_id)
        previous = self._order[index - 1] if index > 0 else None
        effects: list[Effect] = [
            self._event("conversation.item.added", item=_copy(stored.data), previous_item_id=previous)
        ]
        if done:
            effects.append(self._event("conversation.item.done", item=_copy(stored.data), previous_item_id=previous))
        return effects

    def _previous(self, item: dict[str, Any]) -> str | None:
        index = self._order.index(item["id"])
        return self._order[index - 1] if index > 0 else None

    def _item(self, event: dict[str, Any]) -> _Stored:
        item_id = field_of(event, "item_id", str, "item_id", required=True)
        stored = self._items.get(item_id)
        if stored is None:
            raise ProtocolError("item_not_found", f"Item with id '{item_id}' not found.", "item_id")
        return stored

    def input_transcribed(self, item_id: str, text: str | None, error: str | None = None) -> list[Effect]:
        """The transcription of user audio item ``item_id`` (see Transcribe): its text, or why it failed."""
        stored = self._items.get(item_id)
        if stored is None:
            return []  # deleted meanwhile
        if text is None:
            return [self._event(
                "conversation.item.input_audio_transcription.failed", item_id=item_id, content_index=0,
                error={"type": "transcription_error", "code": "stt_backend_error", "message": error,
                       "param": None},
            )]
        for part in stored.data.get("content", []):
            if part["type"] == "input_audio":
                part["transcript"] = text
        return [self._event(
            "conversation.item.input_audio_transcription.completed", item_id=item_id, content_index=0,
            transcript=text, usage={"type": "duration", "seconds": round(len(stored.audio) / 48000, 3)},
        )]

    def _response_input(self, value: Any) -> list[_Stored]:
        """response.input: the items a response sees instead of the conversation."""
        entries = field_of({"input": value}, "input", list, "response.input")
        context = []
        for i, entry in enumerate(entries):
            param = f"response.input[{i}]"
            body = field_of({"e": entry}, "e", dict, param, required=True)
            if body.get("type") == "item_reference":
                ref = field_of(body, "id", str, f"{param}.id", required=True)
                if ref not in self._items:
                    raise ProtocolError("item_not_found", f"Item with id '{ref}' not found.", f"{param}.id")
                context.append(self._items[ref])
            else:
                item = parse_item(body, param)
                stored = _Stored(item)
                for j, part in enumerate(item.get("content", [])):
                    if part.pop("audio", None):
                        raise ProtocolError("unsupported_content", "Audio in response.input is not supported; "
                                            "create the item first and reference it.", f"{param}.content[{j}]")
                context.append(stored)
        return context

    def _messages(self, context: list[_Stored] | None = None) -> list[Message]:
        """The conversation as the responder sees it (or ``context``, a response's own input)."""
        messages = []
        for stored in context if context is not None else (self._items[i] for i in self._order):
            item_id = stored.data["id"]
            data = stored.data
            if data["type"] != "message":
                continue
            texts = []
            for part in data["content"]:
                value = part.get("text") if "text" in part["type"] else part.get("transcript")
                if value:
                    texts.append(value)
            messages.append(Message(
                item_id=item_id,
                role=data["role"],
                text=" ".join(texts) or None,
                audio=bytes(stored.audio) if data["role"] == "user" and stored.audio else None,
            ))
        return messages

    # --- event building ---------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return self._wire({"type": kind, "event_id": new_id("event"), **fields})

    def _wire(self, event: dict[str, Any]) -> dict[str, Any]:
        # Events a dialect lacks become {} and are skipped by the runner.
        return to_wire(event, self.dialect) or {}

    def _session_event(self, kind: str) -> dict[str, Any]:
        return {"type": kind, "event_id": new_id("event"), "session": session_wire(self.settings, self.dialect)}


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """A snapshot of an item for an event: the stored item changes later (status, transcript)."""
    if "content" not in item:
        return dict(item)
    return {**item, "content": [dict(p) for p in item["content"]]}


def _heard_text(text: str, marks: list[tuple[int, int]], audio_len: int, cut: int) -> str:
    """The part of ``text`` spoken by the first ``cut`` bytes of audio, whole words only.

    Each mark says the audio from its byte offset on speaks the text from its char offset on, up to
    the next mark; within a stretch, the share of the text heard is the share of the audio heard.
    """
    if not marks:
        return text if cut >= audio_len else ""
    heard = 0
    for i, (audio_at, text_at) in enumerate(marks):
        audio_end = marks[i + 1][0] if i + 1 < len(marks) else audio_len
        text_end = marks[i + 1][1] if i + 1 < len(marks) else len(text)
        if cut >= audio_end and audio_end > audio_at:
            heard = text_end
        elif cut > audio_at:
            share = (cut - audio_at) / (audio_end - audio_at)
            piece = text[text_at:text_end]
            n = int(len(piece) * share)
            if " " in piece[:n] and n < len(piece) and not piece[n].isspace():
                n = piece.rindex(" ", 0, n)
            heard = text_at + n
            break
        else:
            break
    return text[:heard].rstrip()
