"""What the session asks of a responder, and what a responder answers with: the core's interface types.

A responder (gateway/responders/) turns a committed user turn into a streamed response. It is an async
generator: the session runner iterates it and closes it on barge-in or
response.cancel, so every ``await`` inside it is a cancellation point (an HTTP stream in flight is
closed, a TTS stream is cancelled). Anything it yields after cancellation is dropped by the session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the assistant made, with its result (a function's output, an MCP call's output or error)."""

    call_id: str
    name: str
    arguments: str
    output: str


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation item as a responder sees it (an assistant message may hold the tool calls after it)."""

    item_id: str
    role: str  # "system" | "user" | "assistant"
    text: str | None = None  # text content, the transcript of audio, or what was heard of it
    audio: bytes | None = None  # pcm16 24 kHz, for user audio items
    images: list[tuple[str, str]] = field(default_factory=list)  # user only: (data URL, detail) of each picture
    tool_calls: list[ToolCall] = field(default_factory=list)  # assistant only: calls that have a result


@dataclass(frozen=True, slots=True)
class ResponseRequest:
    response_id: str
    item_id: str  # the assistant item being produced
    instructions: str
    messages: list[Message]
    voice: str
    modalities: list[str] = field(default_factory=lambda: ["audio"])
    max_output_tokens: int | None = None
    temperature: float | None = None  # None: the backend's configured temperature
    tools: list[dict[str, Any]] = field(default_factory=list)  # chat-completions tools (gateway/realtime/tools.py)
    tool_choice: str | dict[str, Any] | None = None  # chat-completions tool_choice; None with no tools
    parallel_tool_calls: bool | None = None  # False: at most one call a round; None: the backend's own
    speed: float = 1.0  # the voice's speed (the session's audio.output.speed, 0.25 to 1.5)


@dataclass(frozen=True, slots=True)
class AudioOut:
    """pcm16 mono 24 kHz of the response's speech."""

    pcm: bytes


@dataclass(frozen=True, slots=True)
class SpeechText:
    """Text of the assistant's speech, spoken by the audio that follows it (until the next SpeechText)."""

    text: str


@dataclass(frozen=True, slots=True)
class TextOut:
    """Text of a text-only response (output modality "text")."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The LLM began tool call ``index`` of this reply (parallel calls have their own indices)."""

    index: int
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """A piece of the JSON arguments of tool call ``index``, as the LLM streamed it."""

    index: int
    delta: str


@dataclass(frozen=True, slots=True)
class LlmUsage:
    """The LLM's token counts for one chat completion (sent when its server reports them)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class TraceMark:
    """A latency checkpoint (stt_done, llm_first_token, tts_first_audio) reached by the responder."""

    name: str


@dataclass(frozen=True, slots=True)
class ReplyCut:
    """The LLM stopped at its token limit (max_output_tokens, or its server's): the reply is incomplete."""


ResponseOutput = (AudioOut | SpeechText | TextOut | ToolCallStart | ToolCallArguments | LlmUsage | ReplyCut
                  | TraceMark)


class BackendError(Exception):
    """A backend (stt, llm, tts) failed; the response ends with status failed and this message."""

    def __init__(self, backend: str, cause: str) -> None:
        super().__init__(f"{backend} backend failed: {cause}")
        self.backend = backend
        self.cause = cause


class Transcriber(Protocol):
    def transcribe(self, pcm16_24k: bytes, language: str | None = None,
                   prompt: str | None = None) -> AsyncIterator[str]:
        """The text of the audio as it is recognised: pieces whose concatenation is the transcript (one
        piece from a recogniser that does not stream). ``language`` and ``prompt`` from the session
        override the configured ones. A failure raises BackendError."""


async def transcript_of(transcriber: Transcriber, pcm16_24k: bytes, language: str | None = None,
                        prompt: str | None = None) -> str:
    """The whole transcript of the audio, trimmed."""
    return "".join([piece async for piece in transcriber.transcribe(pcm16_24k, language, prompt)]).strip()


# Transcriptions of user audio items by item id, each started when its item was committed (the runner's): a
# responder awaits those of the messages that have no text yet. A failed one raises its BackendError.
Transcripts = Mapping[str, Awaitable[str]]


class Responder(Protocol):
    # Whether respond() reads the transcripts of user audio (its ``transcripts``): the runner then transcribes
    # every committed user audio item, not only for sessions that ask for it.
    reads_transcripts: bool
    # The voices it speaks with, lower case (None: any name will do).
    voices: frozenset[str] | None

    def respond(self, request: ResponseRequest, transcripts: Transcripts) -> AsyncIterator[ResponseOutput]: ...
