"""One GPT-Live session as a sans-I/O state machine: events in, events and effects out.

No sockets, tasks or clocks live here. The runner (gateway/runtime/live_runner.py) feeds it client events, input
audio, VAD probabilities, transcripts, the voice model's outputs and the backend's events, and asks for each 100 ms
``tick`` of output once the timeline has reached it (never faster than real time). The timeline is the input
audio's sample count: with no input audio nothing advances, no output goes out and no append is acknowledged.

The "voice model" is the gateway's conversational path (a responder: STT → LLM → TTS) with one tool, ``delegate``.
Turns are found by our VAD and Smart Turn; when the user starts speaking over our speech, the speech stops at the
next tick and no event says so. Appends are context, acknowledged when the timeline passes their place; commentary
(and a delegated backend's final answer) is spoken by the voice model in its own words.

Every handler validates its whole input before it changes anything, so a refused event (an ``error`` back to the
client, with its ``client_event_id``) leaves the session as it was; an unexpected exception is a server_error and
the session goes on.
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict, deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from gateway.config import Config
from gateway.core.effects import (
    Fault,
    Mark,
    PrepareTranscript,
    RunSmartTurn,
    RunVad,
    SendEvent,
    StartResponse,
    StopResponse,
    Transcribe,
)
from gateway.core.ids import new_id
from gateway.core.responder import (
    AudioOut,
    BackendError,
    LlmUsage,
    Message,
    ReplyCut,
    ResponseOutput,
    ResponseRequest,
    SpeechText,
    TextOut,
    ToolCallArguments,
    ToolCallStart,
    TraceMark,
)
from gateway.core.semantic_vad import CheckTurn, SemanticTurnDetector, eagerness_levels
from gateway.core.vad import SpeechStarted, SpeechStopped, TurnDetector
from gateway.core.values import ProtocolError, check_fields, field_of, parse_json
from gateway.live.audio import SessionAudio
from gateway.live.effects import (
    DelegationRequest,
    Effect,
    EndSession,
    Reflect,
    Reply,
    RunDelegation,
    StopDelegation,
)
from gateway.live.events import (
    CLIENT_EVENTS,
    FIELDS,
    SIDEBAND_EVENTS,
    error_event,
    event,
    unknown_event,
)
from gateway.live.settings import (
    LiveSettings,
    data_channel_lists,
    parse_start,
    parse_update,
    tokens,
)
from gateway.live.timeline import GRID_MS, INJECTION_DELAY_MS, TICK_MS, grid_floor, spread, words

BYTES_PER_MS = 48  # pcm16 24 kHz, the core's audio
TICK_BYTES = TICK_MS * BYTES_PER_MS
# Speech the voice model is reckoned to take per character while its length is not known yet (a segment whose
# audio is still coming): for spreading its words only.
MS_PER_CHAR = 60
# Input audio kept for the turn being spoken: the longest turn (a longer one keeps its last minute).
MAX_TURN_MS = 60_000
IDLE_KEEP_MS = 2_000  # kept while nobody speaks: the prefix padding of the next turn
MAX_HISTORY = 48  # conversation messages the voice model sees
MAX_NOTES = 64  # context notes (appends, delegation results) it sees
LIFECYCLE = ("response.created", "response.queued", "response.in_progress", "response.completed", "response.failed",
             "response.incomplete", "response.cancelled")
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "response.cancelled")

DELEGATE_TOOL = {
    "type": "function",
    "function": {
        "name": "delegate",
        "description": "Hand a task you cannot do yourself (looking something up, checking, acting, anything needing "
                       "tools or more thought) to the back end. Say briefly that you are on it; the result comes "
                       "back later as a note, and you then tell the user.",
        "parameters": {"type": "object", "properties": {"task": {
            "type": "string", "description": "The task, complete and self-contained."}}, "required": ["task"]},
    },
}
POLICY = ("You are the voice of a live spoken conversation: answer in one or two short spoken sentences, no "
          "lists or markup. Call the delegate tool for anything you cannot answer yourself; never invent results. "
          "Notes below are context from the application: speak a note marked 'to say' in your own words, and never "
          "read out one marked 'silent'.")


@dataclass
class _Append:
    kind: str  # instructions | thinking | commentary
    content: str
    delegation_id: str | None
    client_event_id: str | None
    start_ms: int
    end_ms: int


@dataclass
class _Voice:
    """A response of the voice model under way."""

    id: str
    item_id: str
    delegations: dict[int, tuple[str, str]] = field(default_factory=dict)  # tool call index -> (id, target)
    arguments: dict[int, str] = field(default_factory=dict)
    said: str = ""  # text that has gone out (heard)
    audio_done: bool = False  # its responder ended: its last segment ends where its audio does
    spoken: str | None = None  # what a commentary or backend result it speaks belongs to (the trace's)


@dataclass
class _Segment:
    """Text of our speech and where its audio lies in the output stream (bytes of pcm16 24 kHz)."""

    response_id: str
    start: int
    pieces: list[str]
    end: int | None = None  # known once the next segment starts or the response ends
    sent: int = 0  # pieces emitted


@dataclass
class _Run:
    """A run of the Responses delegation's backend."""

    id: str
    delegation_id: str | None
    input: list[dict[str, Any]]
    calls: list[dict[str, Any]] = field(default_factory=list)  # completed function_call items
    text: str = ""
    ended: bool = False  # a terminal event came
    failed: bool = False


class LiveSession:
    def __init__(self, config: Config, *, webrtc: bool = False, voices: Collection[str] | None = None,
                 now_s: float = 0.0, backend: bool = True) -> None:
        """``webrtc``: the transport negotiates the audio (no ``audio.format``; the data channel's allow-lists
        apply); ``voices``: the TTS's voices (None: any name); ``now_s``: the unix time, for ``expires_at``;
        ``backend``: a Responses delegation backend is configured."""
        self.config = config
        self.backend = backend
        self.live = config.live
        self.webrtc = webrtc
        self.voices = voices
        self.id = new_id("live")
        self.expires_at = int(now_s + self.live.max_session_s)
        self.settings: LiveSettings | None = None
        self.closed = False
        self.audio = SessionAudio(None)
        self.input_samples = 0  # the media clock: input samples at the session's rate
        self.ticks = 0  # output ticks sent
        self.muted = False
        vad = config.vad
        self.detector = TurnDetector(threshold=vad.threshold, prefix_padding_ms=vad.prefix_padding_ms,
                                     silence_duration_ms=vad.silence_duration_ms, min_speech_ms=vad.min_speech_ms)
        semantic = config.semantic_vad
        eagerness = eagerness_levels(semantic)[self.live.eagerness]
        self.turns = SemanticTurnDetector(self.detector, eagerness, semantic.pause_ms, semantic.recheck_ms)
        self._heard = bytearray()  # input audio (pcm16 24 kHz) of the turn under way, and a little before it
        self._heard_start_ms = 0.0
        self._received_ms = 0.0  # input audio given to the VAD
        self._speech: tuple[str, float] | None = None  # (item id, start ms) while the user speaks
        # The pause whose turn is being transcribed early: the turn's audio up to it is what a Smart Turn check
        # asks about, and what the turn commits if the check or the wait ends it.
        self._early_pause: float | None = None
        self._utterances: dict[str, tuple[float, float]] = {}  # user items being transcribed: their spans
        self._transcribed = False  # a user turn's transcript went out: the next one's follows it after a space
        # The voice model's context.
        self._history: deque[Message] = deque(maxlen=MAX_HISTORY)
        self._notes: deque[str] = deque(maxlen=MAX_NOTES)
        self._prompts: deque[tuple[str, str | None]] = deque()  # (what to speak about, trace key) while busy
        self._voice: _Voice | None = None
        # Output: our speech not played yet, and the text it carries.
        self._out = bytearray()
        self._played = 0  # stream bytes played (speech only)
        self._queued = 0  # stream bytes queued
        self._segments: deque[_Segment] = deque()
        self._out_text: dict[int, str] = {}  # output transcript by grid span, until the timeline passes it
        self._last_out = ""  # the last output transcript text (its spacing)
        self._first_audio: str | None = None  # a response whose first audio has not gone out yet
        # Appends and delegations.
        self._appends: deque[_Append] = deque()
        self._delegations: OrderedDict[str, str] = OrderedDict()  # id -> target
        self._runs: dict[str, _Run] = {}
        self._waiting: list[_Run] = []  # runs that ended with function calls, waiting for their outputs
        self._items: list[dict[str, Any]] = []  # response.item.create items held for response.create
        self._failures = 0
        self._next_usage_ms = int(self.live.usage_interval_s * 1000)
        self.last_usage_s = 0

    # --- the clock -----------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self.settings is not None

    @property
    def timeline_ms(self) -> int:
        return self.input_samples * 1000 // self.audio.rate

    @property
    def ticks_due(self) -> int:
        """Output ticks the timeline has reached that have not gone out."""
        return 0 if self.closed or not self.started else self.timeline_ms // TICK_MS - self.ticks

    # --- client events ---------------------------------------------------------------------------------

    def handle(self, text: str | bytes, sideband: bool = False) -> list[Effect]:
        """One client message (a JSON text frame) from the primary connection, or a sideband's."""
        if self.closed:
            return []
        event_id = None
        try:
            body = parse_json(text)
            if not isinstance(body, dict):
                raise ProtocolError("invalid_json", "A client event must be a JSON object.")
            raw_id = body.get("event_id")
            event_id = raw_id if isinstance(raw_id, str) else None
            field_of(body, "event_id", str, "event_id")
            kind = field_of(body, "type", str, "type", required=True)
            supported = SIDEBAND_EVENTS if sideband else CLIENT_EVENTS
            if kind not in supported:
                raise unknown_event(kind, supported)
            if kind == "session.start" and (self.started or self.webrtc):
                raise ProtocolError("session_already_started", "The session has started already: session.start "
                                    "comes once, first, and never on WebRTC.", "type")
            if not self.started and kind != "session.start":
                raise ProtocolError("session_not_started", f"Send session.start first: '{kind}' cannot come before "
                                    "the session has started.", "type")
            allowed, required = FIELDS[kind]
            check_fields(body, allowed | {"type", "event_id"})
            for name in required:
                if name not in body:
                    raise ProtocolError("missing_required_parameter", f"Missing required parameter: '{name}'.", name)
            allowed_events = data_channel_lists(self.settings)[0] if self.webrtc and self.settings else None
            if not sideband and allowed_events is not None and kind not in allowed_events:
                raise ProtocolError("event_not_allowed", f"This data channel may not send '{kind}' "
                                    "(session.client.data_channel.allowed_client_events).", "type")
            return getattr(self, "_on_" + kind.replace(".", "_"))(body, event_id)
        except ProtocolError as exc:
            return [Reply(error_event(exc.code, exc.message, exc.param, event_id))]
        except Exception as exc:  # a bug must cost the client this event, never the session
            self._failures += 1
            message = f"The server failed to handle this event ({type(exc).__name__}); the session goes on."
            return [Fault(exc, self._failures),
                    Reply(error_event("server_error", message, None, event_id, "server_error"))]

    def start(self, body: Any, client_event_id: str | None = None) -> list[Effect]:
        """Start with this configuration (session.start's ``session``, or a WebRTC create's); ProtocolError if it
        is refused."""
        settings = parse_start(body, self.live, session_id=self.id, expires_at=self.expires_at, webrtc=self.webrtc,
                               default_voice=self.config.session.voice, voices=self.voices)
        if settings.responses is not None and not self.backend:
            raise ProtocolError("unsupported_parameter", "Responses delegation needs a backend server, and this "
                                "gateway has none ([live] delegation_base_url or [llm] base_url): use client "
                                "delegation.", "session.delegation.type")
        self.settings = settings
        self.audio = SessionAudio(self.settings.audio_format)
        for message in self.settings.input:
            role = "system" if message["role"] == "developer" else message["role"]
            self._history.append(Message(message.get("id") or new_id("item"), role, message["content"][0]["text"]))
        effects: list[Effect] = [SendEvent(self.started_event(client_event_id))]
        if self.webrtc and self.settings.client is not None:
            clients, servers = data_channel_lists(self.settings)
            sends = "every client event" if clients is None else ", ".join(sorted(clients)) or "no event"
            gets = "every server event" if servers is None else ", ".join(
                s.get("response_event") or s["type"] for s in servers) or "errors and notices only"
            effects.append(SendEvent(event("info", code="data_channel_permissions",
                                           message=f"This data channel may send {sends}; it receives {gets}.")))
        return effects

    def started_event(self, client_event_id: str | None = None) -> dict[str, Any]:
        assert self.settings is not None
        return event("session.started", client_event_id, session=self.settings.wire())

    def _on_session_start(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        return self.start(body["session"], event_id)

    def _on_session_update(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        assert self.settings is not None
        self.settings = parse_update(body["session"], self.settings)
        return [SendEvent(event("session.updated", event_id, session=self.settings.wire()))]

    def _on_session_input_audio_append(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        if self.webrtc:
            raise ProtocolError("invalid_event_type", "Audio comes on the WebRTC media track, not the data channel.",
                                "type")
        audio = field_of(body, "audio", str, "audio", required=True)
        limit = self.config.session.max_append_bytes
        if len(audio) // 4 * 3 > limit:
            raise ProtocolError("audio_too_large", f"An append may carry at most {limit} bytes of audio "
                                "([session] max_append_bytes).", "audio")
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("invalid_base64", "'audio' is not valid base64.", "audio") from None
        if len(raw) % self.audio.bytes_per_sample:  # a stray byte would shift every later sample
            raise ProtocolError("invalid_value", f"'audio' must hold whole pcm16 samples: an even number of bytes, "
                                f"not {len(raw)}.", "audio")
        self.input_samples += len(raw) // self.audio.bytes_per_sample
        return self.input_audio(self.audio.decode(raw), timeline_counted=True)

    def _on_session_input_audio_mute(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        self.muted = True
        return [SendEvent(event("session.input_audio.muted", event_id))]

    def _on_session_input_audio_unmute(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        self.muted = False
        return [SendEvent(event("session.input_audio.unmuted", event_id))]

    def _append(self, kind: str, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        content = field_of(body, "content", str, "content", required=True)
        delegation_id = field_of(body, "delegation_id", str, "delegation_id")
        assert self.settings is not None
        if (count := tokens(content)) > self.live.max_append_tokens:
            raise ProtocolError("string_above_max_length", f"'content' may hold at most {self.live.max_append_tokens}"
                                f" tokens (it has about {count}): send it in several appends.", "content")
        if delegation_id is not None:
            if self.settings.responses is not None:
                raise ProtocolError("invalid_value", "A delegation_id is not accepted with Responses delegation: "
                                    "send null.", "delegation_id")
            if self._delegations.get(delegation_id) != "client":
                raise ProtocolError("delegation_not_found", f"No client delegation '{delegation_id[:100]}' in this "
                                    "session.", "delegation_id")
        if len(self._appends) >= self.live.max_pending_appends:
            raise ProtocolError("too_many_pending_appends", f"{len(self._appends)} appends are waiting for the "
                                "timeline already ([live] max_pending_appends); keep input audio flowing.")
        start = grid_floor(self.timeline_ms) + INJECTION_DELAY_MS
        self._appends.append(_Append(kind, content, delegation_id, event_id, start, start + GRID_MS))
        return [Mark("commentary_appended")] if kind == "commentary" else []

    def _on_session_instructions_append(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        return self._append("instructions", body, event_id)

    def _on_session_thinking_append(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        return self._append("thinking", body, event_id)

    def _on_session_commentary_append(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        return self._append("commentary", body, event_id)

    def _responses_only(self, kind: str) -> dict[str, Any]:
        assert self.settings is not None
        if self.settings.responses is None:
            raise ProtocolError("invalid_request_error", f"{kind} requires Responses delegation.", "type")
        return self.settings.responses

    def _on_response_item_create(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        self._responses_only("response.item.create")
        item = field_of(body, "item", dict, "item", required=True)
        kind = field_of(item, "type", str, "item.type")
        if kind == "function_call_output":
            check_fields(item, {"type", "call_id", "output", "id", "status"}, "item")
            call_id = field_of(item, "call_id", str, "item.call_id", required=True)
            field_of(item, "output", (str, list), "item.output", required=True)
            if not any(c["call_id"] == call_id for run in self._waiting for c in run.calls):
                raise ProtocolError("invalid_value", f"No function call '{call_id[:100]}' is waiting for its output "
                                    "(a failed response's calls take none).", "item.call_id")
        elif kind in (None, "message"):
            check_fields(item, {"type", "role", "content", "id", "status"}, "item")
            field_of(item, "role", str, "item.role", required=True)
            field_of(item, "content", (str, list), "item.content", required=True)
        else:
            raise ProtocolError("invalid_value", "'item.type' must be 'function_call_output' or 'message'.",
                                "item.type")
        if len(self._items) >= self.live.max_response_items:
            raise ProtocolError("too_many_items", f"At most {self.live.max_response_items} items wait for "
                                "response.create ([live] max_response_items).", "item")
        self._items.append(item)
        return []

    def _on_response_create(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        responses = self._responses_only("response.create")
        if len(self._runs) >= self.live.max_response_runs:
            raise ProtocolError("too_many_active_responses", f"{len(self._runs)} delegated responses are running "
                                "([live] max_response_runs); wait for one to finish.")
        outputs = {i["call_id"] for i in self._items if i.get("type") == "function_call_output"}
        if self._waiting:
            missing = [c["call_id"] for run in self._waiting for c in run.calls if c["call_id"] not in outputs]
            if missing:
                raise ProtocolError("function_call_outputs_required", "Every pending function call needs its "
                                    f"output before response.create; missing: {', '.join(missing[:10])}.")
            waiting, self._waiting = self._waiting, []
            delegation_id = waiting[0].delegation_id
            history = [item for run in waiting for item in run.input + run.calls]
        else:
            delegation_id, history = None, self._backend_context()
        items, self._items = self._items, []
        return self._run(responses, delegation_id, history + items)

    def _on_session_close(self, body: dict[str, Any], event_id: str | None) -> list[Effect]:
        return self.close("close_requested", event_id)

    # --- input audio and turns ---------------------------------------------------------------------

    def input_audio(self, pcm: bytes, timeline_counted: bool = False) -> list[Effect]:
        """Input audio as pcm16 24 kHz: from an append (its samples already counted), or a media track."""
        if self.closed or not self.started:
            return []
        if not timeline_counted:
            self.input_samples += len(pcm) // 2 * self.audio.rate // 24000
        effects: list[Effect] = [Reflect({"type": "session.input_audio.append"}, "audio", pcm)] if pcm else []
        heard = bytes(len(pcm)) if self.muted else pcm  # muted: the model hears silence, the timeline goes on
        self._heard += heard
        self._received_ms += len(pcm) / BYTES_PER_MS
        keep_ms = MAX_TURN_MS if self._speech is not None else IDLE_KEEP_MS + self.detector.prefix_padding_ms
        excess = len(self._heard) - int(keep_ms) * BYTES_PER_MS
        if excess > BYTES_PER_MS * 1000:  # trimmed a second at a time: cutting the front moves all of it
            del self._heard[:excess]
            self._heard_start_ms += excess / BYTES_PER_MS
        if heard:
            effects.append(RunVad(heard))
        return effects

    def vad_result(self, probabilities: Any) -> list[Effect]:
        """Speech probabilities of the audio of earlier RunVad effects, in order."""
        if self.closed:
            return []
        effects = self._turn_events(self.turns.feed(probabilities))
        pause = self._pause()
        if self._early_pause is not None and pause != self._early_pause:
            self._early_pause = None  # the user went on: the early transcript is of a turn that was not
            effects.append(PrepareTranscript(None))
        if pause is not None and self.turns.position_ms - pause >= self.live.early_transcription_ms:
            effects += self._transcribe_early()
        return effects

    def smart_turn_result(self, seq: int, probability: float | None) -> list[Effect]:
        if self.closed:
            return []
        return self._turn_events(self.turns.verdict(seq, probability))

    def _turn_events(self, events: list[Any]) -> list[Effect]:
        effects: list[Effect] = []
        for ev in events:
            if isinstance(ev, SpeechStarted):
                effects += self._speech_started(ev.audio_start_ms)
            elif isinstance(ev, SpeechStopped) and self._speech is not None:
                effects += self._speech_stopped(ev.audio_end_ms)
            elif isinstance(ev, CheckTurn):
                effects.append(RunSmartTurn(ev.seq, self._audio(max(ev.start_ms, ev.end_ms - 8000), ev.end_ms)))
                effects += self._transcribe_early()
        return effects

    def _pause(self) -> float | None:
        """Where the pause under way in the user's turn began: the VAD's silence run, until a Smart Turn check
        takes it as the turn's possible end (the same point); None while the user speaks or no turn is open."""
        if self._speech is None:
            return None
        return self.turns.pause_start_ms if self.turns.pause_start_ms is not None else self.detector.pause_ms

    def _transcribe_early(self) -> list[Effect]:
        """The turn's transcription starts while the pause and Smart Turn decide whether it is over: once the
        pause has lasted [live] early_transcription_ms, or at the check if that comes first."""
        pause = self._pause()
        if self._speech is None or pause is None or pause == self._early_pause:
            return []
        self._early_pause = pause
        return [PrepareTranscript(self._audio(self._speech[1], pause))]

    def _audio(self, start_ms: float, end_ms: float) -> bytes:
        begin = max(0, int((start_ms - self._heard_start_ms) * BYTES_PER_MS) & ~1)
        stop = max(begin, int((end_ms - self._heard_start_ms) * BYTES_PER_MS) & ~1)
        return bytes(self._heard[begin:stop])

    def _speech_started(self, start_ms: float) -> list[Effect]:
        self._speech = (new_id("item"), max(start_ms, self._heard_start_ms))
        # Barge-in: our speech stops at the next tick; no event says so (the model just stops talking).
        return self._stop_speaking()

    def _stop_speaking(self, closing: bool = False) -> list[Effect]:
        effects: list[Effect] = []
        voice, self._voice = self._voice, None
        if voice is not None:
            effects.append(StopResponse(voice.id))
            effects += self._voice_ended(voice)
            if not closing and not voice.audio_done:  # cut off: what it delegated goes on all the same
                effects += self._delegated_runs(voice)
        self._out.clear()
        self._queued = self._played
        for segment in self._segments:
            segment.pieces = segment.pieces[:segment.sent]
            segment.end = min(segment.end if segment.end is not None else self._played, self._played)
        self._first_audio = None
        return effects

    def _speech_stopped(self, end_ms: float) -> list[Effect]:
        assert self._speech is not None
        item_id, start = self._speech
        self._speech = self._early_pause = None
        pcm = self._audio(start, end_ms)
        self._utterances[item_id] = (start, end_ms)
        self._history.append(Message(item_id, "user", audio=pcm))
        effects: list[Effect] = [Mark("speech_stopped"), Transcribe(item_id, pcm), Mark("committed")]
        return effects + self._respond(None)

    def input_transcript_delta(self, item_id: str, text: str) -> list[Effect]:
        return []  # the whole transcript is spread over the turn's span when it is in (input_transcribed)

    def input_transcribed(self, item_id: str, text: str | None, error: str | None = None) -> list[Effect]:
        span = self._utterances.pop(item_id, None)
        if self.closed or span is None or not text:
            return []
        for i, message in enumerate(self._history):
            if message.item_id == item_id:
                self._history[i] = Message(item_id, "user", text)
        # The input transcript is one stream of deltas: a turn's first word is set off from the last turn's.
        shown = " " + text if self._transcribed and not text[:1].isspace() else text
        self._transcribed = True
        return [SendEvent(event("session.input_transcript.delta", delta=delta, start_ms=start, end_ms=end))
                for start, end, delta in spread(shown, span[0], span[1])]

    # --- the voice model -----------------------------------------------------------------------------

    def _respond(self, prompt: str | None, spoken: str | None = None) -> list[Effect]:
        """Start the voice model: answering the user's turn (``prompt`` None) or speaking about a note."""
        assert self.settings is not None
        effects: list[Effect] = []
        if self._voice is not None:  # a new turn replaces what was about to be said
            effects += self._stop_speaking()
        voice = _Voice(new_id("resp"), new_id("item"), spoken=spoken)
        self._voice = voice
        messages = list(self._history)
        if prompt is not None:
            messages.append(Message(new_id("item"), "system", prompt))
        request = ResponseRequest(voice.id, voice.item_id, self._instructions(), messages, self.settings.tts_voice,
                                  tools=[DELEGATE_TOOL], tool_choice="auto")
        return effects + [Mark("response_created", voice.id), StartResponse(request)]

    def _instructions(self) -> str:
        assert self.settings is not None
        base = (self.settings.instructions or "").strip() or self.live.instructions or \
            self.config.session.instructions
        text = f"{base}\n\n{POLICY}"
        if self._notes:
            text += "\n\nNotes so far:\n" + "\n".join(f"- {note}" for note in self._notes)
        return text

    def response_output(self, response_id: str, out: ResponseOutput) -> list[Effect]:
        voice = self._voice
        if voice is None or voice.id != response_id or self.closed:
            return []  # stopped: what it still made is dropped
        match out:
            case AudioOut(pcm):
                if self._first_audio is None and self._queued == self._played:
                    self._first_audio = voice.id
                self._out += pcm
                self._queued += len(pcm)
            case SpeechText(text):
                if self._segments and self._segments[-1].end is None:
                    self._segments[-1].end = self._queued
                if not words(text):
                    return []
                if not voice.said and self._last_out and not self._last_out[-1].isspace() and not text[0].isspace():
                    text = " " + text  # a new reply after earlier speech: transcripts join by concatenation
                voice.said += text
                self._segments.append(_Segment(voice.id, self._queued, words(text)))
            case ToolCallStart(index, _, name) if name == "delegate":
                return self._delegate(voice, index)
            case ToolCallArguments(index, delta) if index in voice.delegations:
                voice.arguments[index] = voice.arguments.get(index, "") + delta
            case TraceMark(name):
                return [Mark(name, response_id)]
            case TextOut() | LlmUsage() | ReplyCut() | ToolCallStart() | ToolCallArguments():
                pass
        return []

    def _delegate(self, voice: _Voice, index: int) -> list[Effect]:
        assert self.settings is not None
        target = "client" if self.settings.responses is None else "responses"
        delegation_id = new_id("item")
        voice.delegations[index] = (delegation_id, target)
        self._delegations[delegation_id] = target
        while len(self._delegations) > self.live.max_delegations:
            self._delegations.popitem(last=False)
        delegation: dict[str, Any] = {"id": delegation_id, "type": "delegation", "target": target}
        if target == "responses":
            delegation["response_id"] = new_id("resp")
        return [Mark("delegation_created", voice.id),
                SendEvent(event("session.delegation.created", offset_ms=self.timeline_ms, delegation=delegation))]

    def response_finished(self, response_id: str, error: BaseException | None = None) -> list[Effect]:
        voice = self._voice
        if voice is None or voice.id != response_id or self.closed:
            return []
        voice.audio_done = True
        if self._segments and self._segments[-1].response_id == voice.id and self._segments[-1].end is None:
            self._segments[-1].end = self._queued
        effects: list[Effect] = []
        if error is not None:
            code = f"{error.backend}_backend_error" if isinstance(error, BackendError) else "server_error"
            message = str(error) if isinstance(error, BackendError) else f"The voice model failed: {error}"
            effects.append(SendEvent(error_event(code, message, error_type="server_error")))
        return effects + self._delegated_runs(voice)  # once the delegate calls' tasks are whole

    def _delegated_runs(self, voice: _Voice) -> list[Effect]:
        """The backend runs of a voice response's Responses delegations."""
        effects: list[Effect] = []
        for index, (delegation_id, target) in voice.delegations.items():
            if target == "responses":
                task = _task_of(voice.arguments.get(index, ""))
                assert self.settings is not None and self.settings.responses is not None
                context = self._backend_context()
                if task:
                    context.append({"role": "user", "content": f"Task: {task}"})
                effects += self._run(self.settings.responses, delegation_id, context)
        return effects

    def _voice_ended(self, voice: _Voice) -> list[Effect]:
        """The voice response is over (finished and played, or cut off): what was heard joins the history."""
        said = "".join(p for s in self._segments if s.response_id == voice.id for p in s.pieces[:s.sent]).strip()
        if said:
            self._history.append(Message(voice.item_id, "assistant", said))
        return [Mark("response_done", voice.id)]

    # --- the output clock ----------------------------------------------------------------------------

    def tick(self) -> list[Effect]:
        """The next 100 ms of output (the runner calls it once the timeline has reached it, at real-time pace at
        most): one audio delta, what text its speech carries, the acknowledgements the timeline has passed."""
        if self.ticks_due <= 0:
            return []
        assert self.settings is not None
        start_ms = self.ticks * TICK_MS
        self.ticks += 1
        end_ms = start_ms + TICK_MS
        n = min(TICK_BYTES, len(self._out))
        speech = bytes(self._out[:n])
        del self._out[:n]
        begin = self._played
        self._played += n
        effects: list[Effect] = []
        if n and self._first_audio is not None:
            effects.append(Mark("first_delta", self._first_audio))
            voice = self._voice
            if voice is not None and voice.spoken is not None and voice.id == self._first_audio:
                effects.append(Mark("commentary_spoken"))
            self._first_audio = None
        pcm = speech + bytes(TICK_BYTES - n)
        delta = self.audio.encode_delta(pcm, TICK_MS, silent=n == 0)
        effects.append(SendEvent({"type": "session.output_audio.delta", "delta": delta}))
        effects.append(Reflect({"type": "session.output_audio.delta", "start_ms": start_ms, "end_ms": end_ms},
                               "delta", pcm))
        self._place_words(begin, self._played, start_ms)
        for at in sorted(self._out_text):
            if at + GRID_MS <= end_ms or (n == 0 and not self._out):
                text = self._out_text.pop(at)
                self._last_out = text
                effects.append(SendEvent(event("session.output_transcript.delta", delta=text, start_ms=at,
                                               end_ms=at + GRID_MS)))
        voice = self._voice
        if voice is not None and voice.audio_done and not self._out:
            self._voice = None
            effects += self._voice_ended(voice)
        while self._appends and self._appends[0].end_ms <= end_ms:
            effects += self._inject(self._appends.popleft())
        if self._voice is None and not self._out and self._speech is None and self._prompts:
            prompt, spoken = self._prompts.popleft()
            effects += self._respond(prompt, spoken)
        if end_ms >= self._next_usage_ms:
            self._next_usage_ms += int(self.live.usage_interval_s * 1000)
            effects.append(SendEvent(self._usage_event()))
        return effects

    def _place_words(self, begin: int, end: int, start_ms: int) -> None:
        """The words whose place in our speech is before ``end`` (stream bytes) go to the transcript's spans."""
        while self._segments:
            segment = self._segments[0]
            total = sum(len(p) for p in segment.pieces) or 1
            length = (segment.end - segment.start) if segment.end is not None else \
                max(self._queued - segment.start, total * MS_PER_CHAR * BYTES_PER_MS)
            done = sum(len(p) for p in segment.pieces[:segment.sent])
            while segment.sent < len(segment.pieces):
                at = segment.start + length * done / total
                if at >= end:
                    return
                ms = start_ms + max(0.0, at - begin) / BYTES_PER_MS
                span = grid_floor(ms)
                piece = segment.pieces[segment.sent]
                self._out_text[span] = self._out_text.get(span, "") + piece
                done += len(piece)
                segment.sent += 1
            if segment.end is None:
                return
            self._segments.popleft()

    def _inject(self, append: _Append) -> list[Effect]:
        """The timeline has passed an append's place: it is in the context now, acknowledged."""
        kind = append.kind
        effects: list[Effect] = [SendEvent(event(f"session.{kind}.appended", append.client_event_id,
                                                 start_ms=append.start_ms, end_ms=append.end_ms))]
        if kind == "thinking":
            self._notes.append(f"(silent, progress of a delegated task) {append.content}")
        elif kind == "instructions":
            self._notes.append(f"(instruction) {append.content}")
            self._prompts.append((f"New instruction: {append.content}\nAct on it now if it asks you to say "
                                  "something; otherwise say nothing.", None))
        else:
            self._notes.append(f"(to say, a delegated task's result) {append.content}")
            self._prompts.append((f"Tell the user this now, briefly and in your own words: {append.content}",
                                  append.delegation_id or "commentary"))
        return effects

    def _usage_event(self) -> dict[str, Any]:
        self.last_usage_s = self.timeline_ms // 1000
        return event("session.usage.updated", usage={"seconds": self.last_usage_s})

    # --- the Responses delegation ---------------------------------------------------------------------

    def _backend_context(self) -> list[dict[str, Any]]:
        """What a backend run starts from: the conversation as transcribed so far."""
        context = []
        for message in self._history:
            if message.text and message.role in ("user", "assistant"):
                context.append({"role": message.role, "content": message.text})
        return context

    def _run(self, responses: dict[str, Any], delegation_id: str | None,
             items: list[dict[str, Any]]) -> list[Effect]:
        run_id = new_id("resp")
        self._runs[run_id] = _Run(run_id, delegation_id, items)
        model = self.live.delegation_model or responses["model"]
        request = DelegationRequest(
            model=model, input=items, instructions=responses.get("instructions"), tools=responses.get("tools") or [],
            tool_choice=responses.get("tool_choice"), parallel_tool_calls=responses.get("parallel_tool_calls"),
            reasoning=responses.get("reasoning"), text=responses.get("text"),
            max_output_tokens=responses.get("max_output_tokens"), service_tier=responses.get("service_tier"))
        return [RunDelegation(run_id, request)]

    def backend_event(self, run_id: str, raw: dict[str, Any]) -> list[Effect]:
        """A Responses streaming event of run ``run_id``, passed on in a ``response.event`` envelope."""
        run = self._runs.get(run_id)
        if run is None or self.closed:
            return []
        kind = raw.get("type")
        nested = dict(raw)
        if kind in LIFECYCLE and isinstance(raw.get("response"), dict):
            response = {k: v for k, v in raw["response"].items() if k != "input"}
            response.update(output=[], tools=[], instructions=None)
            nested["response"] = response
        elif kind == "response.output_item.done" and isinstance(raw.get("item"), dict):
            item = raw["item"]
            if item.get("type") == "function_call":
                item = {**item, "status": "completed"}
                run.calls.append({k: item[k] for k in ("type", "call_id", "name", "arguments") if k in item})
                nested["item"] = item
        elif kind == "response.output_text.delta" and isinstance(raw.get("delta"), str):
            run.text += raw["delta"]
        if kind in TERMINAL:
            run.ended = True
            run.failed = kind != "response.completed"
        return [SendEvent(event("response.event", delegation_id=run.delegation_id, event=nested))]

    def backend_finished(self, run_id: str, error: str | None = None) -> list[Effect]:
        """Run ``run_id`` ended (``error``: why it failed). Its calls wait for their outputs; a final answer is
        spoken by the voice model."""
        run = self._runs.pop(run_id, None)
        if run is None or self.closed:
            return []
        effects: list[Effect] = []
        if error is not None and not run.ended:
            failed = {"type": "response.failed", "response": {
                "id": run.id, "object": "response", "status": "failed", "output": [], "tools": [],
                "instructions": None, "error": {"code": "server_error", "message": error}}}
            effects.append(SendEvent(event("response.event", delegation_id=run.delegation_id, event=failed)))
            run.failed = True
        if run.failed:
            return effects
        if run.calls:
            self._waiting.append(run)
        elif run.text.strip():
            self._notes.append(f"(to say, a delegated task's result) {run.text.strip()}")
            self._prompts.append((f"The delegated task is done. Tell the user its result now, briefly and in your "
                                  f"own words: {run.text.strip()}", run.delegation_id or "responses"))
        return effects

    # --- the end -------------------------------------------------------------------------------------

    def close(self, reason: str, client_event_id: str | None = None) -> list[Effect]:
        """End the session: pending appends are refused, work stops, session.closed carries the final usage."""
        if self.closed:
            return []
        effects: list[Effect] = []
        if self.settings is not None:
            for append in self._appends:
                effects.append(SendEvent(error_event(
                    "context_injection_incomplete", f"The session closed before this {append.kind} append reached "
                    "its place on the timeline.", None, append.client_event_id)))
            effects += self._stop_speaking(closing=True)
            effects += [StopDelegation(run_id) for run_id in self._runs]
            effects.append(SendEvent(event("session.closed", client_event_id, reason=reason,
                                           session=self.settings.wire(),
                                           usage={"seconds": max(self.last_usage_s, self.timeline_ms // 1000)})))
        self._appends.clear()
        self._runs.clear()
        self._prompts.clear()
        self.closed = True
        return effects + [EndSession()]


def _task_of(arguments: str) -> str:
    """The ``task`` of a delegate call's JSON arguments ("" when they are not what the tool asked for)."""
    try:
        value = parse_json(arguments)
    except ProtocolError:
        return arguments.strip()
    return value.get("task", "") if isinstance(value, dict) and isinstance(value.get("task"), str) else ""


