"""What a Realtime session asks its runner to do: every call of a session returns a list of these effects, in order.

A session (gateway/realtime/session.py) returns them; the runner (gateway/runtime/session_runner.py) carries each
out in turn and feeds the results back through the session's methods named below. They are values: nothing
changes them once made. The effects every protocol core has (sending a server event, running the VAD, starting
a response, ...) are gateway/core/effects.py's; these are the Realtime core's own, and ``Effect`` is the union.
"""

from __future__ import annotations

from dataclasses import dataclass

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
from gateway.realtime.tools import McpServer


@dataclass(frozen=True, slots=True)
class Denoise:
    """Noise reduction is on (``kind``: near_field or far_field): clean this pcm16 24 kHz input audio and pass
    it to ``denoised``, in order, before anything else of the session sees it."""

    pcm: bytes
    kind: str


@dataclass(frozen=True, slots=True)
class Play:
    """Server-side playout (WebRTC): queue this response audio on the outbound track."""

    response_id: str
    item_id: str
    pcm: bytes


@dataclass(frozen=True, slots=True)
class PlayoutEnd:
    """Server-side playout: this response sends no more audio; once its queue has played, it has stopped."""

    response_id: str


@dataclass(frozen=True, slots=True)
class ClearPlayout:
    """Server-side playout: drop queued audio at once, then call ``playout_cleared`` with what was heard."""


@dataclass(frozen=True, slots=True)
class ListMcpTools:
    """List this MCP server's tools and pass them (or why listing failed) to ``mcp_tools_listed``."""

    item_id: str
    server: McpServer


@dataclass(frozen=True, slots=True)
class CallMcp:
    """Call this tool on this MCP server and pass its output (or error) to ``mcp_call_finished``."""

    response_id: str
    item_id: str
    server: McpServer
    name: str
    arguments: str


Effect = (SendEvent | RunVad | ResetVad | Denoise | RunSmartTurn | StartResponse | StopResponse | Play | PlayoutEnd
          | ClearPlayout | Mark | Transcribe | PrepareTranscript | ListMcpTools | CallMcp | Fault)
