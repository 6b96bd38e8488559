"""The one event catalogue of the OpenAI Realtime protocol, for both of its shapes.

The session speaks GA internally: it builds GA-shaped server events and reads client events whose
names are the same in both shapes. ``to_wire`` renders a server event for the connection's dialect
(beta renames events and reshapes items and responses); the session object's two shapes are
gateway/realtime/settings.py's.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

# Shared with every protocol core (gateway/core/), and named here too: the Realtime modules take them from their
# catalogue.
from gateway.core.ids import new_id as new_id
from gateway.core.values import ProtocolError as ProtocolError


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
    "conversation.item.input_audio_transcription.delta": "conversation.item.input_audio_transcription.delta",
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

# A beta transcription session's own names for the session events (GA keeps session.*).
BETA_TRANSCRIPTION_SESSION_EVENTS = {
    "session.created": "transcription_session.created",
    "session.updated": "transcription_session.updated",
}

CLIENT_EVENTS = frozenset(
    {
        "session.update",
        "transcription_session.update",  # beta; its body is always beta-shaped
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

# Content part types: beta's assistant parts are bare where GA's are output_*.
_BETA_PART_TYPES = {"output_audio": "audio", "output_text": "text"}

AUDIO_FORMATS = ("pcm16", "g711_ulaw", "g711_alaw")
# The GA shape's names of the audio formats.
GA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


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
    out["output_audio_format"] = next((n for n, ga in GA_FORMATS.items() if ga == fmt), None)
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
