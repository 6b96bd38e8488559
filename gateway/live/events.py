"""The GPT-Live event catalogue, the error and info shapes, and the strict reading of client events.

Live sessions are strict: an unknown field is refused (``unknown_parameter``, naming it in ``param``), an unknown
event type is refused with the supported ones listed in single quotes, and every error echoes the client's
``event_id`` as ``client_event_id`` (in the error and beside it).
"""

from __future__ import annotations

from typing import Any

from gateway.core.ids import new_id
from gateway.core.values import ProtocolError

# The client events a primary connection may send, in the order OpenAI's SDK lists them.
CLIENT_EVENTS = (
    "session.start",
    "session.update",
    "session.input_audio.append",
    "session.input_audio.mute",
    "session.input_audio.unmute",
    "session.instructions.append",
    "session.thinking.append",
    "session.commentary.append",
    "response.item.create",
    "response.create",
    "session.close",
)
# A sideband attaches to a running session: it neither starts it nor sends its audio.
SIDEBAND_EVENTS = tuple(e for e in CLIENT_EVENTS if e not in ("session.start", "session.input_audio.append"))
APPENDS = ("session.instructions.append", "session.thinking.append", "session.commentary.append")

# Every server event the gateway sends.
SERVER_EVENTS = (
    "session.started",
    "session.updated",
    "session.input_audio.muted",
    "session.input_audio.unmuted",
    "session.instructions.appended",
    "session.thinking.appended",
    "session.commentary.appended",
    "session.input_audio.append",  # reflected to sidebands
    "session.output_audio.delta",
    "session.input_transcript.delta",
    "session.output_transcript.delta",
    "session.delegation.created",
    "response.event",
    "session.usage.updated",
    "session.closed",
    "error",
    "info",
)

# The fields each client event may have (besides ``type`` and ``event_id``), and those it must have.
FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "session.start": (frozenset({"session"}), frozenset({"session"})),
    "session.update": (frozenset({"session"}), frozenset({"session"})),
    "session.input_audio.append": (frozenset({"audio"}), frozenset({"audio"})),
    "session.input_audio.mute": (frozenset(), frozenset()),
    "session.input_audio.unmute": (frozenset(), frozenset()),
    "response.item.create": (frozenset({"item"}), frozenset({"item"})),
    "response.create": (frozenset(), frozenset()),
    "session.close": (frozenset(), frozenset()),
    **{kind: (frozenset({"content", "delegation_id"}), frozenset({"content", "delegation_id"})) for kind in APPENDS},
}


def unknown_event(kind: str, supported: tuple[str, ...]) -> ProtocolError:
    names = ", ".join(f"'{name}'" for name in supported)
    return ProtocolError("invalid_event_type", f"Invalid value: '{kind[:100]}'. Supported values are: {names}.",
                         "type")


def event(kind: str, client_event_id: str | None = None, **fields: Any) -> dict[str, Any]:
    """A server event with a fresh ``event_id`` (``client_event_id`` when a client command caused it)."""
    out: dict[str, Any] = {"type": kind, "event_id": new_id("event")}
    if client_event_id is not None:
        out["client_event_id"] = client_event_id
    out.update(fields)
    return out


def error_event(code: str, message: str, param: str | None = None, client_event_id: str | None = None,
                error_type: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's Live error: ``client_event_id`` in the error and beside it; ``param`` only when one applies."""
    error: dict[str, Any] = {"type": error_type, "code": code, "message": message}
    if param is not None:
        error["param"] = param
    if client_event_id is not None:
        error["client_event_id"] = client_event_id
    return event("error", client_event_id, error=error)
