"""What a session asks its runner to do: every call of a session returns a list of these effects, in order.

A session (gateway/realtime/session.py) returns them; the runner (gateway/runtime/session_runner.py) carries each
out in turn (sending a server event is one: ``SendEvent``) and feeds the results back through the session's
methods named below. They are values: nothing changes them once made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.core.responder import ResponseRequest
from gateway.realtime.tools import McpServer


@dataclass(frozen=True, slots=True)
class SendEvent:
    """Send this server event to the client (already in the client's dialect)."""

    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunVad:
    """Compute VAD probabilities for this pcm16 24 kHz audio and pass them to ``vad_result``, in order.

    Later client events need not wait for the result: turn events carry input-audio times, and a
    commit or clear tells the detector which audio it took (``TurnDetector.reset``)."""

    pcm: bytes


@dataclass(frozen=True, slots=True)
class Denoise:
    """Noise reduction is on (``kind``: near_field or far_field): clean this pcm16 24 kHz input audio and pass
    it to ``denoised``, in order, before anything else of the session sees it."""

    pcm: bytes
    kind: str


@dataclass(frozen=True, slots=True)
class RunSmartTurn:
    """semantic_vad: ask the Smart Turn model whether this turn's audio (pcm16 24 kHz, up to the pause) is
    finished speaking, and pass P(complete) to ``smart_turn_result`` with ``seq`` (None if the model failed).
    The session's turn detector waits for the answer before it judges later audio."""

    seq: int
    pcm: bytes


@dataclass(frozen=True, slots=True)
class StartResponse:
    request: ResponseRequest


@dataclass(frozen=True, slots=True)
class StopResponse:
    """Stop the response's producer (close its LLM stream, cancel its TTS, drop its queued audio) and its
    MCP calls."""

    response_id: str


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
class Transcribe:
    """Transcribe this user audio item: pass the text to ``input_transcript_delta`` as it comes, then
    the whole of it (or why it failed) to ``input_transcribed``."""

    item_id: str
    pcm: bytes
    language: str | None = None  # the session's transcription language and prompt, if it set them
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class PrepareTranscript:
    """Transcribe this audio quietly, ahead of its Transcribe (a VAD turn in its closing pause): a later
    Transcribe of the same bytes takes the result. Each one replaces the previous; ``pcm`` None only
    drops it (the user spoke again)."""

    pcm: bytes | None
    language: str | None = None
    prompt: str | None = None


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


@dataclass(frozen=True, slots=True)
class Mark:
    """A latency checkpoint of the current turn (for the trace)."""

    name: str
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """Handling a client event failed unexpectedly (a bug): the client got a server_error and the session goes
    on; the runner logs it, in full the first time (``count``: the session's faults so far)."""

    error: BaseException
    count: int


Effect = (SendEvent | RunVad | RunSmartTurn | StartResponse | StopResponse | Play | PlayoutEnd | ClearPlayout
          | Mark | Transcribe | PrepareTranscript | ListMcpTools | CallMcp | Fault)
