"""The one event catalogue of the OpenAI Realtime protocol, for both of its shapes.

The session speaks GA internally: it builds GA-shaped server events and reads client events whose
names are the same in both shapes. ``to_wire`` renders a server event for the connection's dialect
(beta renames events and reshapes items, responses and the session object); ``parse_session`` reads
either shape of session.update into one ``SessionSettings``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.tools import Tool


class Dialect(Enum):
    GA = "ga"
    BETA = "beta"


# Every server event the gateway sends, by GA name, with its beta name (None: not sent in beta).
SERVER_EVENTS: dict[str, str | None] = {
    "error": "error",
    "session.created": "session.created",
    "session.updated": "session.updated",
    "conversation.item.added": "conversation.item.created",
    "conversation.item.done": None,
    "conversation.item.deleted": "conversation.item.deleted",
    "conversation.item.retrieved": "conversation.item.retrieved",
    "conversation.item.truncated": "conversation.item.truncated",
    "conversation.item.input_audio_transcription.completed": (
        "conversation.item.input_audio_transcription.completed"
    ),
    "conversation.item.input_audio_transcription.failed": "conversation.item.input_audio_transcription.failed",
    "input_audio_buffer.committed": "input_audio_buffer.committed",
    "input_audio_buffer.cleared": "input_audio_buffer.cleared",
    "input_audio_buffer.speech_started": "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped": "input_audio_buffer.speech_stopped",
    "input_audio_buffer.timeout_triggered": None,
    "response.created": "response.created",
    "response.done": "response.done",
    "response.output_item.added": "response.output_item.added",
    "response.output_item.done": "response.output_item.done",
    "response.content_part.added": "response.content_part.added",
    "response.content_part.done": "response.content_part.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.function_call_arguments.delta": "response.function_call_arguments.delta",
    "response.function_call_arguments.done": "response.function_call_arguments.done",
    "mcp_list_tools.in_progress": None,
    "mcp_list_tools.completed": None,
    "mcp_list_tools.failed": None,
    "response.mcp_call_arguments.delta": None,
    "response.mcp_call_arguments.done": None,
    "response.mcp_call.in_progress": None,
    "response.mcp_call.completed": None,
    "response.mcp_call.failed": None,
    "rate_limits.updated": "rate_limits.updated",
    "output_audio_buffer.started": "output_audio_buffer.started",
    "output_audio_buffer.stopped": "output_audio_buffer.stopped",
    "output_audio_buffer.cleared": "output_audio_buffer.cleared",
}

CLIENT_EVENTS = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.delete",
        "conversation.item.truncate",
        "response.create",
        "response.cancel",
        "output_audio_buffer.clear",
    }
)

# Content part types: GA assistant parts are output_*, beta's are bare.
_BETA_PART_TYPES = {"output_audio": "audio", "output_text": "text"}
_GA_PART_TYPES = {"audio": "output_audio", "text": "output_text"}

AUDIO_FORMATS = ("pcm16", "g711_ulaw", "g711_alaw")
_GA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


class ProtocolError(Exception):
    """A client event the gateway refuses; becomes an ``error`` event and changes nothing."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def error_event(
    code: str, message: str, param: str | None = None, client_event_id: str | None = None,
    error_type: str = "invalid_request_error",
) -> dict[str, Any]:
    return {
        "type": "error",
        "event_id": new_id("event"),
        "error": {
            "type": error_type,
            "code": code,
            "message": message,
            "param": param,
            "event_id": client_event_id,
        },
    }


# --- reading client values ---------------------------------------------------------------------


def field_of(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], param: str, required: bool = False):
    """obj[key] checked against ``kind``; None when absent and not required."""
    if key not in obj or obj[key] is None:
        if required:
            raise ProtocolError("missing_required_parameter", f"Missing required parameter: '{param}'.", param)
        return None
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python; a JSON true is never a valid number here.
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds) or (float in kinds and isinstance(value, int))
    if not ok:
        names = " or ".join(k.__name__.replace("str", "string").replace("dict", "object") for k in kinds)
        raise ProtocolError(
            "invalid_type", f"Invalid type for '{param}': expected {names}, got {type(value).__name__}.", param
        )
    return value


def _choice(value: Any, choices: tuple[str, ...], param: str) -> str:
    if value not in choices:
        raise ProtocolError(
            "invalid_value", f"Invalid value for '{param}': {value!r}; supported: {', '.join(choices)}.", param
        )
    return value


# --- the session object ------------------------------------------------------------------------


@dataclass
class TurnDetection:
    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    eagerness: str = "auto"  # semantic_vad only: how readily a pause ends the turn (gateway/smart_turn.py)


@dataclass
class Transcription:
    model: str = "whisper-1"
    language: str | None = None
    prompt: str | None = None


@dataclass
class SessionSettings:
    id: str
    model: str
    instructions: str
    voice: str
    modalities: list[str] = field(default_factory=lambda: ["audio"])
    input_format: str = "pcm16"
    output_format: str = "pcm16"
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: Transcription | None = None
    noise_reduction: str | None = None
    temperature: float = 0.8
    max_output_tokens: int | str = "inf"
    speed: float = 1.0
    tools: list[Tool] = field(default_factory=list)  # read by gateway/tools.py, not by parse_session
    tool_choice: str | dict[str, Any] = "auto"
    # GA settings the gateway keeps and reports back but does not act on.
    tracing: str | dict[str, Any] | None = None
    truncation: str | dict[str, Any] = "auto"
    prompt: dict[str, Any] | None = None
    include: list[str] | None = None


def _parse_format_ga(value: Any, param: str) -> str:
    fmt = field_of({"f": value}, "f", dict, param, required=True)
    kind = field_of(fmt, "type", str, f"{param}.type", required=True)
    for name, ga in _GA_FORMATS.items():
        if kind == ga:
            if name == "pcm16":
                rate = field_of(fmt, "rate", int, f"{param}.rate")
                if rate not in (None, 24000):
                    raise ProtocolError(
                        "invalid_value", f"Invalid value for '{param}.rate': only 24000 is supported.",
                        f"{param}.rate",
                    )
            return name
    return _choice(kind, tuple(_GA_FORMATS.values()), f"{param}.type")


def _parse_turn_detection(value: Any, current: TurnDetection | None, defaults: TurnDetection,
                          param: str) -> TurnDetection | None:
    if value is None:
        return None
    td = field_of({"t": value}, "t", dict, param, required=True)
    kind = field_of(td, "type", str, f"{param}.type") or (current.type if current else "server_vad")
    _choice(kind, ("server_vad", "semantic_vad"), f"{param}.type")
    base = replace(current or defaults)
    base.type = kind
    if (eagerness := field_of(td, "eagerness", str, f"{param}.eagerness")) is not None:
        base.eagerness = _choice(eagerness, ("low", "medium", "high", "auto"), f"{param}.eagerness")
    threshold = field_of(td, "threshold", float, f"{param}.threshold")
    if threshold is not None:
        if not 0.0 <= threshold <= 1.0:
            raise ProtocolError("invalid_value", f"'{param}.threshold' must be between 0 and 1.", f"{param}.threshold")
        base.threshold = float(threshold)
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        ms = field_of(td, key, int, f"{param}.{key}")
        if ms is not None:
            if not 0 <= ms <= 10_000:
                raise ProtocolError("invalid_value", f"'{param}.{key}' must be between 0 and 10000.", f"{param}.{key}")
            setattr(base, key, ms)
    if "idle_timeout_ms" in td:
        idle = field_of(td, "idle_timeout_ms", int, f"{param}.idle_timeout_ms")
        if idle is not None and not 5_000 <= idle <= 30_000:
            raise ProtocolError(
                "invalid_value", f"'{param}.idle_timeout_ms' must be between 5000 and 30000.",
                f"{param}.idle_timeout_ms",
            )
        base.idle_timeout_ms = idle
    for key in ("create_response", "interrupt_response"):
        flag = field_of(td, key, bool, f"{param}.{key}")
        if flag is not None:
            setattr(base, key, flag)
    return base


def _parse_transcription(value: Any, param: str) -> Transcription | None:
    if value is None:
        return None
    tr = field_of({"t": value}, "t", dict, param, required=True)
    return Transcription(
        model=field_of(tr, "model", str, f"{param}.model") or "whisper-1",
        language=field_of(tr, "language", str, f"{param}.language"),
        prompt=field_of(tr, "prompt", str, f"{param}.prompt"),
    )


def _parse_modalities(value: Any, param: str) -> list[str]:
    mods = field_of({"m": value}, "m", list, param, required=True)
    for i, m in enumerate(mods):
        _choice(m, ("text", "audio"), f"{param}[{i}]")
    if not mods:
        raise ProtocolError("invalid_value", f"'{param}' must not be empty.", param)
    # ["text", "audio"] (beta's default) means audio with its transcript.
    return ["audio"] if "audio" in mods else ["text"]


def _parse_max_tokens(value: Any, param: str) -> int | str:
    if value == "inf":
        return "inf"
    n = field_of({"n": value}, "n", int, param, required=True)
    if not 1 <= n <= 4096:
        raise ProtocolError("invalid_value", f"'{param}' must be between 1 and 4096, or \"inf\".", param)
    return n


def parse_session(
    body: Any, current: SessionSettings, dialect: Dialect, voice_locked: bool, vad_defaults: TurnDetection,
    voices: frozenset[str] | None = None,
) -> SessionSettings:
    """A session.update's ``session`` applied to ``current``; only the fields sent change. Turn detection
    switched on starts from ``vad_defaults``; ``voices`` are the voices the speech engine has (None: any)."""
    s = field_of({"session": body}, "session", dict, "session", required=True)
    new = replace(current)
    if (instructions := field_of(s, "instructions", str, "session.instructions")) is not None:
        new.instructions = instructions
    if dialect is Dialect.GA:
        kind = field_of(s, "type", str, "session.type")
        if kind is not None and kind != "realtime":
            raise ProtocolError(
                "invalid_value", "Only sessions of type 'realtime' are supported by this gateway.", "session.type"
            )
        if "output_modalities" in s:
            new.modalities = _parse_modalities(s["output_modalities"], "session.output_modalities")
        if "max_output_tokens" in s:
            new.max_output_tokens = _parse_max_tokens(s["max_output_tokens"], "session.max_output_tokens")
        audio = field_of(s, "audio", dict, "session.audio") or {}
        inp = field_of(audio, "input", dict, "session.audio.input") or {}
        out = field_of(audio, "output", dict, "session.audio.output") or {}
        if "format" in inp:
            new.input_format = _parse_format_ga(inp["format"], "session.audio.input.format")
        if "format" in out:
            new.output_format = _parse_format_ga(out["format"], "session.audio.output.format")
        if "turn_detection" in inp:
            new.turn_detection = _parse_turn_detection(
                inp["turn_detection"], current.turn_detection, vad_defaults, "session.audio.input.turn_detection"
            )
        if "transcription" in inp:
            new.transcription = _parse_transcription(inp["transcription"], "session.audio.input.transcription")
        if "noise_reduction" in inp:
            nr = field_of(inp, "noise_reduction", dict, "session.audio.input.noise_reduction")
            new.noise_reduction = nr.get("type") if nr else None
        voice = field_of(out, "voice", (str, dict), "session.audio.output.voice")
        speed = field_of(out, "speed", float, "session.audio.output.speed")
        voice_param = "session.audio.output.voice"
        _parse_ga_extras(s, new)
    else:
        if "modalities" in s:
            new.modalities = _parse_modalities(s["modalities"], "session.modalities")
        if "max_response_output_tokens" in s:
            new.max_output_tokens = _parse_max_tokens(
                s["max_response_output_tokens"], "session.max_response_output_tokens"
            )
        for key, attr in (("input_audio_format", "input_format"), ("output_audio_format", "output_format")):
            if (fmt := field_of(s, key, str, f"session.{key}")) is not None:
                setattr(new, attr, _choice(fmt, AUDIO_FORMATS, f"session.{key}"))
        if "turn_detection" in s:
            new.turn_detection = _parse_turn_detection(
                s["turn_detection"], current.turn_detection, vad_defaults, "session.turn_detection"
            )
        if "input_audio_transcription" in s:
            new.transcription = _parse_transcription(
                s["input_audio_transcription"], "session.input_audio_transcription"
            )
        if "input_audio_noise_reduction" in s:
            nr = field_of(s, "input_audio_noise_reduction", dict, "session.input_audio_noise_reduction")
            new.noise_reduction = nr.get("type") if nr else None
        if (temperature := field_of(s, "temperature", float, "session.temperature")) is not None:
            if not 0.6 <= temperature <= 1.2:
                raise ProtocolError(
                    "invalid_value", "'session.temperature' must be between 0.6 and 1.2.", "session.temperature"
                )
            new.temperature = float(temperature)
        voice = field_of(s, "voice", str, "session.voice")
        speed = field_of(s, "speed", float, "session.speed")
        voice_param = "session.voice"
    if voice is not None:
        name = voice if isinstance(voice, str) else field_of(voice, "id", str, f"{voice_param}.id", required=True)
        if name != current.voice and voice_locked:
            raise ProtocolError(
                "cannot_update_voice", "Cannot update a session's voice after audio has been output.", voice_param
            )
        new.voice = check_voice(name, voices, voice_param)
    if speed is not None:
        if not 0.25 <= speed <= 1.5:
            raise ProtocolError("invalid_value", "speed must be between 0.25 and 1.5.", voice_param[:-5] + "speed")
        new.speed = float(speed)
    return new


def response_format(params: dict[str, Any], dialect: Dialect) -> str | None:
    """A response.create's own output audio format, if it sets one."""
    if dialect is Dialect.GA:
        audio = field_of(params, "audio", dict, "response.audio") or {}
        out = field_of(audio, "output", dict, "response.audio.output") or {}
        return _parse_format_ga(out["format"], "response.audio.output.format") if out.get("format") else None
    fmt = field_of(params, "output_audio_format", str, "response.output_audio_format")
    return None if fmt is None else _choice(fmt, AUDIO_FORMATS, "response.output_audio_format")


def check_voice(name: str, voices: frozenset[str] | None, param: str) -> str:
    if voices is not None and name.lower() not in voices:
        raise ProtocolError(
            "invalid_value", f"Voice '{name}' is not available; this gateway has: {', '.join(sorted(voices))}.", param
        )
    return name


def _parse_ga_extras(s: dict[str, Any], new: SessionSettings) -> None:
    """Settings kept and reported back as sent (the gateway has no tracing, truncation policy or stored
    prompts): their shape is checked, their content is not acted on."""
    if "tracing" in s:
        tracing = field_of(s, "tracing", (str, dict), "session.tracing")
        if isinstance(tracing, str):
            _choice(tracing, ("auto",), "session.tracing")
        new.tracing = tracing
    if "truncation" in s:
        truncation = field_of(s, "truncation", (str, dict), "session.truncation") or "auto"
        if isinstance(truncation, str):
            _choice(truncation, ("auto", "disabled"), "session.truncation")
        new.truncation = truncation
    if "prompt" in s:
        new.prompt = field_of(s, "prompt", dict, "session.prompt")
    if "include" in s:
        include = field_of(s, "include", list, "session.include")
        for i, entry in enumerate(include or []):
            _choice(entry, ("item.input_audio_transcription.logprobs",), f"session.include[{i}]")
        new.include = include


def _td_wire(td: TurnDetection | None, dialect: Dialect) -> dict[str, Any] | None:
    if td is None:
        return None
    if td.type == "semantic_vad":
        return {"type": td.type, "eagerness": td.eagerness, "create_response": td.create_response,
                "interrupt_response": td.interrupt_response}
    out = {
        "type": td.type,
        "threshold": td.threshold,
        "prefix_padding_ms": td.prefix_padding_ms,
        "silence_duration_ms": td.silence_duration_ms,
        "create_response": td.create_response,
        "interrupt_response": td.interrupt_response,
    }
    if dialect is Dialect.GA:
        out["idle_timeout_ms"] = td.idle_timeout_ms
    return out


def _tr_wire(tr: Transcription | None) -> dict[str, Any] | None:
    if tr is None:
        return None
    return {"model": tr.model, "language": tr.language, "prompt": tr.prompt}


def format_wire(name: str) -> dict[str, Any]:
    return {"type": "audio/pcm", "rate": 24000} if name == "pcm16" else {"type": _GA_FORMATS[name]}


def session_wire(s: SessionSettings, dialect: Dialect) -> dict[str, Any]:
    noise = {"type": s.noise_reduction} if s.noise_reduction else None
    if dialect is Dialect.GA:
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": s.id,
            "model": s.model,
            "output_modalities": s.modalities,
            "instructions": s.instructions,
            "tools": [t.wire() for t in s.tools],
            "tool_choice": s.tool_choice,
            "max_output_tokens": s.max_output_tokens,
            "tracing": s.tracing,
            "truncation": s.truncation,
            "prompt": s.prompt,
            "include": s.include,
            "audio": {
                "input": {
                    "format": format_wire(s.input_format),
                    "transcription": _tr_wire(s.transcription),
                    "noise_reduction": noise,
                    "turn_detection": _td_wire(s.turn_detection, dialect),
                },
                "output": {"format": format_wire(s.output_format), "voice": s.voice, "speed": s.speed},
            },
        }
    return {
        "id": s.id,
        "object": "realtime.session",
        "model": s.model,
        "modalities": ["text", "audio"] if s.modalities == ["audio"] else ["text"],
        "instructions": s.instructions,
        "voice": s.voice,
        "input_audio_format": s.input_format,
        "output_audio_format": s.output_format,
        "input_audio_transcription": _tr_wire(s.transcription),
        "input_audio_noise_reduction": noise,
        "turn_detection": _td_wire(s.turn_detection, dialect),
        "tools": [t.wire() for t in s.tools],
        # Beta's tool_choice is a string: a named function is its name.
        "tool_choice": s.tool_choice["name"] if isinstance(s.tool_choice, dict) else s.tool_choice,
        "temperature": s.temperature,
        "max_response_output_tokens": s.max_output_tokens,
        "speed": s.speed,
    }


# --- items and responses -----------------------------------------------------------------------


def parse_item(body: Any, param: str = "item") -> dict[str, Any]:
    """A client-created item, checked, in GA shape (beta part types renamed)."""
    item = field_of({"item": body}, "item", dict, param, required=True)
    kind = _choice(field_of(item, "type", str, f"{param}.type", required=True),
                   ("message", "function_call", "function_call_output", "mcp_approval_response"), f"{param}.type")
    out: dict[str, Any] = {"id": field_of(item, "id", str, f"{param}.id") or new_id("item"),
                           "object": "realtime.item", "type": kind, "status": "completed"}
    if kind == "message":
        role = _choice(field_of(item, "role", str, f"{param}.role", required=True),
                       ("user", "assistant", "system"), f"{param}.role")
        allowed = {
            "user": ("input_text", "input_audio"),
            "system": ("input_text",),
            "assistant": ("output_text", "output_audio"),
        }[role]
        parts = []
        for i, raw in enumerate(field_of(item, "content", list, f"{param}.content", required=True)):
            p = field_of({"p": raw}, "p", dict, f"{param}.content[{i}]", required=True)
            ptype = field_of(p, "type", str, f"{param}.content[{i}].type", required=True)
            ptype = _GA_PART_TYPES.get(ptype, ptype) if role == "assistant" else ptype
            _choice(ptype, allowed, f"{param}.content[{i}].type")
            part: dict[str, Any] = {"type": ptype}
            if ptype in ("input_text", "output_text"):
                part["text"] = field_of(p, "text", str, f"{param}.content[{i}].text", required=True)
            else:
                part["audio"] = field_of(p, "audio", str, f"{param}.content[{i}].audio")
                part["transcript"] = field_of(p, "transcript", str, f"{param}.content[{i}].transcript")
            parts.append(part)
        out.update(role=role, content=parts)
    elif kind == "function_call":
        out.update(
            call_id=field_of(item, "call_id", str, f"{param}.call_id") or new_id("call"),
            name=field_of(item, "name", str, f"{param}.name", required=True),
            arguments=field_of(item, "arguments", str, f"{param}.arguments") or "",
        )
    elif kind == "function_call_output":
        out.update(
            call_id=field_of(item, "call_id", str, f"{param}.call_id", required=True),
            output=field_of(item, "output", str, f"{param}.output", required=True),
        )
    else:  # the client's answer to an mcp_approval_request (GA only: the session checks the dialect)
        del out["object"], out["status"]  # not fields of this item type
        out.update(
            approval_request_id=field_of(item, "approval_request_id", str, f"{param}.approval_request_id",
                                         required=True),
            approve=field_of(item, "approve", bool, f"{param}.approve", required=True),
            reason=field_of(item, "reason", str, f"{param}.reason"),
        )
    return out


def _item_beta(item: dict[str, Any]) -> dict[str, Any]:
    if "content" not in item:
        return item
    content = [{**p, "type": _BETA_PART_TYPES.get(p["type"], p["type"])} for p in item["content"]]
    return {**item, "content": content}


def _response_beta(resp: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in resp.items() if k not in ("audio", "output_modalities")}
    out["modalities"] = ["text", "audio"] if resp.get("output_modalities") == ["audio"] else ["text"]
    audio_out = (resp.get("audio") or {}).get("output") or {}
    out["voice"] = audio_out.get("voice")
    fmt = (audio_out.get("format") or {}).get("type")
    out["output_audio_format"] = next((n for n, ga in _GA_FORMATS.items() if ga == fmt), None)
    out["output"] = [_item_beta(i) for i in resp.get("output", [])]
    return out


def to_wire(event: dict[str, Any], dialect: Dialect) -> dict[str, Any] | None:
    """The event as the client's dialect has it; None when that dialect has no such event."""
    if dialect is Dialect.GA:
        return event
    name = SERVER_EVENTS[event["type"]]
    if name is None:
        return None
    out = {**event, "type": name}
    if "item" in out:
        out["item"] = _item_beta(out["item"])
    if "response" in out:
        out["response"] = _response_beta(out["response"])
    return out
