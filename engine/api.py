"""What a TTS engine is to its caller: the stream interface every engine speaks, and its chunks and errors.

An engine opens one stream per utterance, in a voice: a name from its ``voices``, or a prepared voice
(``prompt``, an engine.voices.VoicePrompt: a clone of reference audio, or a design from a description)
that the caller holds and passes with each stream (``voice`` then only names it). ``instructions`` (style,
emotion) reach the engines that follow them; the others refuse or ignore them, as each one's docstring says.
Text goes in with ``feed`` (fragments as an LLM streams them when ``incremental`` is true, else whole
segments) and ``end``; audio comes out as ``TTSChunk``s of pcm16 mono 24 kHz. ``cancel`` stops the stream
inside the engine at its next step and frees it; iteration then ends. A chunk's ``text`` is the text whose
speech starts in that chunk, so a caller can cut a transcript at the point the listener stopped hearing.

The Qwen3-TTS engine implements it in a thread of the caller's process (engine.threaded) and, over IPC,
the gateway's engine client; the gateway's other engines (tone, piper) implement it too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from engine.voices import VoicePrompt

SAMPLE_RATE = 24_000  # Hz: every stream's audio, a reference's too (the 12 Hz codec's rate)


class TTSError(Exception):
    """Bad input to the engine (empty text, unknown voice or language, text too long)."""


@dataclass
class TTSChunk:
    pcm: bytes
    text: str = ""


class TTSStream(Protocol):
    def feed(self, text: str) -> None: ...

    def end(self) -> None: ...

    def cancel(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[TTSChunk]: ...


class TTSEngine(Protocol):
    incremental: bool
    voices: frozenset[str] | None  # the voice names open() takes, lower case (None: any)

    def open(self, voice: str, language: str | None = None, *, prompt: VoicePrompt | None = None,
             instructions: str | None = None) -> TTSStream: ...
