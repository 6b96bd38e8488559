"""What a TTS engine is to its caller: the stream interface every engine speaks, and its chunks and errors.

An engine opens one stream per utterance, in a voice: a name from its ``voices``, or a prepared voice
(``prompt``, an engine.voices.VoicePrompt: a clone of reference audio, or a design from a description)
that the caller holds and passes with each stream (``voice`` then only names it). ``instructions`` (style,
emotion) reach the engines that follow them; the others refuse or ignore them, as each one's docstring says.
``sampling`` (a Sampling) sets a stream's own seed and sampling where the engine samples.
Text goes in with ``feed`` (fragments as an LLM streams them when ``incremental`` is true, else whole
segments) and ``end``; audio comes out as ``TTSChunk``s of pcm16 mono 24 kHz. ``cancel`` stops the stream
inside the engine at its next step and frees it; iteration then ends. A chunk's ``text`` is the text whose
speech starts in that chunk, so a caller can cut a transcript at the point the listener stopped hearing.

The Qwen3-TTS engine implements it in a thread of the caller's process (engine.threaded) and, over IPC,
the gateway's engine client; the gateway's other engines (tone, piper) implement it too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, fields
from typing import Protocol

from engine.voices import VoicePrompt

SAMPLE_RATE = 24_000  # Hz: every stream's audio, a reference's too (the 12 Hz codec's rate)


class TTSError(Exception):
    """Bad input to the engine (empty text, unknown voice or language, text too long)."""


@dataclass
class TTSChunk:
    pcm: bytes
    text: str = ""


@dataclass(frozen=True)
class Sampling:
    """A stream's own sampling over the engine's defaults (the checkpoint's generation_config and [engine]
    seed); None keeps the default. The ``subtalker_`` fields are the code predictor's (the official
    generate's names). Engines that do not sample (tone, piper) ignore it."""

    seed: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    subtalker_temperature: float | None = None
    subtalker_top_k: int | None = None
    subtalker_top_p: float | None = None

    def problem(self) -> tuple[str, str] | None:
        """The first field out of its range, and why; None when all are in range."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            low, high, what = SAMPLING_RANGES[f.name]
            kind = int if isinstance(low, int) else float
            if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and
                                                                                 not isinstance(value, int)):
                return f.name, f"'{f.name}' must be {'an integer' if kind is int else 'a number'}"
            if not low <= value <= high or (f.name in OPEN_BELOW and value == low):
                return f.name, f"'{f.name}' must be {what}, got {value}"
        return None


# Each field's range (low, high) and how an error states it. Temperatures and top_p exclude 0.
SAMPLING_RANGES: dict[str, tuple[float, float, str]] = {
    "seed": (0, 2**32 - 1, "an integer from 0 to 4294967295"),
    "temperature": (0.0, 2.0, "above 0 and at most 2"),
    "top_k": (0, 4096, "an integer from 0 (no top-k) to 4096"),
    "top_p": (0.0, 1.0, "above 0 and at most 1"),
    "repetition_penalty": (1.0, 2.0, "from 1 (none) to 2"),
    "subtalker_temperature": (0.0, 2.0, "above 0 and at most 2"),
    "subtalker_top_k": (0, 4096, "an integer from 0 (no top-k) to 4096"),
    "subtalker_top_p": (0.0, 1.0, "above 0 and at most 1"),
}
OPEN_BELOW = frozenset({"temperature", "top_p", "subtalker_temperature", "subtalker_top_p"})


class TTSStream(Protocol):
    def feed(self, text: str) -> None: ...

    def end(self) -> None: ...

    def cancel(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[TTSChunk]: ...


class TTSEngine(Protocol):
    incremental: bool
    voices: frozenset[str] | None  # the voice names open() takes, lower case (None: any)

    def open(self, voice: str, language: str | None = None, *, prompt: VoicePrompt | None = None,
             instructions: str | None = None, sampling: Sampling | None = None) -> TTSStream: ...
