"""What a protocol core asks of its runner, whatever the protocol: each call of a session returns a list of effects,
in order, and these are the ones every core uses.

A core (gateway/realtime/session.py, gateway/live/session.py) returns them; its runner (gateway/runtime/) carries
each out in turn (sending a server event is one: ``SendEvent``) and feeds the results back through the session's
methods named below. They are values: nothing changes them once made. A core's own effects are beside it
(gateway/realtime/effects.py, gateway/live/effects.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.core.responder import ResponseRequest


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
class ResetVad:
    """Start the VAD model's memory afresh, as for a new stream: after a clear or a commit, the speech before it
    must not carry into the probabilities of what follows (a word cut off would make silence a turn)."""



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
