"""The agent pipeline: STT -> LLM -> TTS, streamed, with the LLM and the speech overlapping.

The LLM's deltas go through the text bridge into the TTS stream as they arrive (or straight in
for an incremental engine) while the audio already made is yielded, so speech starts after the
first segment rather than after the whole reply. Two tasks do this, one reading the LLM, one
reading the TTS stream; both report through one queue that ``respond`` drains, so the latency
marks come out when they happen. Closing ``respond`` (barge-in, response.cancel) cancels both
tasks, which closes the LLM's HTTP stream and cancels the TTS stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine.api import TTSEngine, TTSError, TTSStream
from engine.voices import VoicePrompt
from gateway.audio import decode_wav
from gateway.audio_codecs import SpeechEncoder
from gateway.config import ConfigError, VoiceConfig
from gateway.core.responder import (
    AudioOut,
    BackendError,
    LlmUsage,
    ReplyCut,
    ResponseOutput,
    ResponseRequest,
    SpeechText,
    TextOut,
    ToolCallArguments,
    ToolCallStart,
    TraceMark,
    Transcripts,
)
from gateway.responders.remote import chat_messages
from gateway.responders.text_bridge import TextBridge
from gateway.responders.tts import SegmentedStream


def _read_reference(path: str) -> tuple[np.ndarray, int]:
    """A reference recording: its samples (float32, channels averaged) and rate."""
    with open(path, "rb") as f:
        samples, rate = decode_wav(f.read())
    return samples.mean(axis=1, dtype=np.float32), rate


# A custom voice's prompt for an engine, by id (None: no such voice).
VoiceSource = Callable[[str, TTSEngine], Awaitable[VoicePrompt | None]]


class ChatModel(Protocol):
    """A streamed chat LLM: a remote one (gateway.responders.remote.LlmClient) or in process
    (gateway.responders.local_llm)."""

    def stream_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
    ) -> AsyncIterator[str | ToolCallStart | ToolCallArguments | LlmUsage | ReplyCut]:
        """The reply: text deltas, tool calls, and last the token counts; closing the iterator stops it."""

    async def aclose(self) -> None: ...



@dataclass
class BridgeSettings:
    """How LLM text is cut into segments for a non-incremental engine (see gateway.responders.text_bridge)."""

    starter_chars: int = 24
    max_segment_chars: int = 160


# The marks that the LLM reader's and the audio player's tasks have ended (see PipelineResponder._speak).
_READER_ENDED, _PLAYER_ENDED = object(), object()
_Outputs = asyncio.Queue[ResponseOutput | object]
LlmOutput = str | ToolCallStart | ToolCallArguments | LlmUsage | ReplyCut


def _tts_error(exc: Exception) -> BackendError:
    return exc if isinstance(exc, BackendError) else BackendError("tts", f"{type(exc).__name__}: {exc}"[:200])


async def _transcript_text(transcript: asyncio.Task[str]) -> str:
    """A turn's transcript, shielded: closing the response must not cancel the item's transcription. A failure
    comes as a new error: the task's own, raised here and through the response's frames, which hold the task
    (the request's transcripts), would keep them all in a reference cycle."""
    try:
        return await asyncio.shield(transcript)
    except BackendError as exc:
        raise BackendError(exc.backend, exc.cause) from None
    finally:
        del transcript



async def _first_call_only(chat: AsyncIterator[LlmOutput]) -> AsyncIterator[LlmOutput]:
    """The reply with its first tool call only: parallel_tool_calls false holds whatever the backend does (a
    server that ignores the flag, a model that makes two calls anyway)."""
    first: int | None = None
    async with aclosing(chat):
        async for delta in chat:
            if isinstance(delta, ToolCallStart | ToolCallArguments):
                first = delta.index if first is None else first
                if delta.index != first:
                    continue
            yield delta

class PipelineResponder:
    """The LLM (remote or local) and the TTS engine; user audio is read as the transcripts the runner
    starts when each item is committed (the gateway's one transcriber: see build_transcriber)."""

    def __init__(
        self,
        llm: ChatModel,
        tts_engine: TTSEngine,
        bridge: BridgeSettings | None = None,
        *,
        audio_in: bool = False,
        language: str | None = None,
        voices: dict[str, VoiceConfig] | None = None,
    ) -> None:
        """``audio_in``: user audio goes to the LLM as input_audio, no STT; ``language``: the TTS's;
        ``voices``: the [voices.NAME] the TTS engine prepares at start (``prepare``)."""
        self.llm = llm
        self.tts_engine = tts_engine
        self.bridge = bridge or BridgeSettings()
        self.audio_in = audio_in
        self.language = language
        self.reads_transcripts = not audio_in
        self.voice_configs = voices or {}
        self.prepared: dict[str, VoicePrompt] = {}  # by lower-case name
        # The deployment's custom voices, by id (set by the gateway: gateway.runtime.voices.library), read when
        # a response speaks in one; None for any other name. Unset: the prepared voices and the engine's only.
        self.voice_source: VoiceSource | None = None

    async def aclose(self) -> None:
        """Close the LLM client's connection pool and the TTS engine's connections (at server shutdown)."""
        await self.llm.aclose()
        close = getattr(self.tts_engine, "aclose", None)
        if close is not None:
            await close()  # engine processes: their sockets, and the processes when this gateway started them

    async def prepare(self) -> None:
        """Make the configured voices, once, at start: a clone in the TTS engine's thread or process (its
        reference read here in a worker thread), a design from its description. ConfigError names a voice
        the engine cannot make or speak."""
        engine_voices = self.tts_engine.voices or frozenset()
        for name, spec in self.voice_configs.items():
            where = f"[voices.{name}]"
            if name in engine_voices:
                raise ConfigError(f"{where}: the TTS engine has a voice of that name already")
            try:
                if spec.description:
                    voice = VoicePrompt.design(spec.description)
                else:
                    prepare = getattr(self.tts_engine, "prepare", None)
                    if prepare is None:
                        raise ConfigError(f"{where}: cloning a voice needs the qwen3 TTS engine ([tts] engine)")
                    audio, rate = await asyncio.to_thread(_read_reference, spec.reference)
                    voice = await prepare(audio, rate, spec.transcript or None)
            except (OSError, ValueError, TTSError, BackendError) as exc:  # unreadable, or not a voice
                raise ConfigError(f"{where}: {exc}") from None
            self.prepared[name] = voice

    @property
    def voices(self) -> frozenset[str] | None:
        """The engine's voice names and the prepared voices' (None: the engine takes any name)."""
        names = self.tts_engine.voices
        return None if names is None else names | frozenset(self.prepared)

    async def respond(self, request: ResponseRequest, transcripts: Transcripts) -> AsyncIterator[ResponseOutput]:
        messages = list(request.messages)
        if not self.audio_in:
            # The turn being answered: the last user item, when it is audio.
            turn = next((i for i in reversed(range(len(messages))) if messages[i].role == "user"), None)
            for i, item in enumerate(messages):
                if item.role != "user" or not item.audio or item.text:
                    continue
                # Still transcribing (a turn that was cut short keeps its place in the conversation), or
                # failed: an earlier turn is then left out, this turn fails the response.
                transcript = transcripts.get(item.item_id)
                try:
                    if transcript is None:
                        raise BackendError("stt", "the turn was not transcribed: no STT ([stt] base_url is empty "
                                           "and the local STT is off or not installed)")
                    text = await _transcript_text(transcript)
                except BackendError:
                    if i == turn:
                        raise
                    continue
                messages[i] = dataclasses.replace(item, text=text)
                if i == turn:
                    yield TraceMark("stt_done")
                    if not text:
                        return  # nothing was said (noise, a cough): there is nothing to answer

        chat = self.llm.stream_chat(
            chat_messages(request.instructions, messages, self.audio_in),
            max_output_tokens=request.max_output_tokens,
            temperature=request.temperature,
            tools=request.tools,
            tool_choice=request.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
        )
        if request.parallel_tool_calls is False:
            chat = _first_call_only(chat)
        if "audio" not in request.modalities:
            first = True
            async with aclosing(chat):
                async for delta in chat:
                    if first:
                        yield TraceMark("llm_first_token")
                        first = False
                    yield TextOut(delta) if isinstance(delta, str) else delta
            return
        async with aclosing(self._speak(chat, request.voice, request.speed)) as outputs:
            async for out in outputs:
                yield out

    async def _speak(self, chat: AsyncIterator[LlmOutput], voice: str,
                     speed: float = 1.0) -> AsyncIterator[ResponseOutput]:
        prompt = self.prepared.get(voice.lower())
        if prompt is None and self.voice_source is not None:
            try:
                prompt = await self.voice_source(voice, self.tts_engine)
            except Exception as exc:  # the voice's files, or its preparation for this engine
                raise _tts_error(exc) from exc
        # An in-context clone's prompt holds the text as long as its reference (or all of it): fed a reply as
        # it is written, its speech would wait for most of the reply; segment by segment it starts on the first.
        segmented = self.tts_engine.incremental and prompt is not None and prompt.mode == "icl"
        stream: TTSStream
        try:
            if segmented:
                stream = SegmentedStream(self.tts_engine, voice=voice, language=self.language, prompt=prompt)
            else:
                stream = self.tts_engine.open(voice, self.language, prompt=prompt)
        except Exception as exc:
            raise _tts_error(exc) from exc
        outputs: _Outputs = asyncio.Queue()
        # Segments as the LLM wrote them, whitespace before them included, in the order fed: the
        # engine gets them stripped, the transcript needs them whole.
        written: deque[str] = deque()
        # Tool calls the LLM made after speaking: they follow the speech's audio (see _read_llm).
        held: list[ResponseOutput] = []
        incremental = self.tts_engine.incremental and not segmented
        reader = asyncio.create_task(self._read_llm(chat, stream, incremental, outputs, written, held))
        player = asyncio.create_task(self._play(stream, outputs, written, speed))
        # Each task's end is told by a marker, not the task: a task that failed or was cancelled keeps its
        # frame in its exception's traceback, the frame holds `outputs`, and the three would make a cycle.
        reader.add_done_callback(lambda _: outputs.put_nowait(_READER_ENDED))
        player.add_done_callback(lambda _: outputs.put_nowait(_PLAYER_ENDED))
        finished = False
        try:
            while True:
                out = await outputs.get()
                if out is _READER_ENDED or out is _PLAYER_ENDED:
                    ended = reader if out is _READER_ENDED else player
                    if (exc := ended.exception()) is not None:
                        raise exc
                    if ended is player:  # all audio is out; the reader ended the stream or the engine stopped
                        finished = True
                        break
                    continue
                yield out
            for out in held:
                yield out
        finally:
            if not finished:
                stream.cancel()
            reader.cancel()
            player.cancel()
            await asyncio.gather(reader, player, return_exceptions=True)
            # A task's failure raised here holds this frame in its traceback: the frame lets go of the tasks.
            reader = player = ended = exc = None

    async def _read_llm(
        self, chat: AsyncIterator[LlmOutput], stream: TTSStream, incremental: bool, outputs: _Outputs,
        written: deque[str], held: list[ResponseOutput],
    ) -> None:
        """Feeds the reply's text to the TTS stream. Its tool calls go out at once while the LLM has said
        nothing, so that a call is not held up by speech; after words ("let me check"), they are ``held``
        until that speech has played, so that each output item ends before the next begins."""
        bridge = None if incremental else TextBridge(**dataclasses.asdict(self.bridge))
        spoken = False
        said = False
        reply: list[str] = []

        def feed(texts: Iterable[str]) -> None:
            nonlocal spoken
            for text in texts:
                try:
                    if bridge is None:
                        stream.feed(text)
                    else:
                        written.append(text)
                        stream.feed(text.strip())
                except Exception as exc:
                    raise _tts_error(exc) from exc
                if not spoken and text.strip():
                    outputs.put_nowait(TraceMark("llm_first_segment"))  # the TTS has text to speak
                spoken = spoken or bool(text.strip())

        first = True
        async with aclosing(chat):
            async for delta in chat:
                if first:
                    outputs.put_nowait(TraceMark("llm_first_token"))
                    first = False
                if not isinstance(delta, str):
                    if said:
                        if bridge is not None:  # the words before a call are whole: spoken now, not at the end
                            feed(bridge.end())
                        held.append(delta)
                    else:
                        outputs.put_nowait(delta)
                    continue
                said = said or bool(delta.strip())
                reply.append(delta)
                feed([delta] if bridge is None else bridge.feed(delta))
        if bridge is not None:
            feed(bridge.end())
        if not spoken:
            # Nothing to say aloud (an empty reply, an emoji): engines refuse an utterance without words, and
            # there is nothing to play; what the LLM wrote is still the reply's transcript.
            stream.cancel()
            if text := "".join(reply).strip():
                outputs.put_nowait(SpeechText(text))
            return
        try:
            stream.end()
        except Exception as exc:
            raise _tts_error(exc) from exc

    async def _play(self, stream: TTSStream, outputs: _Outputs, written: deque[str], speed: float) -> None:
        first = True
        # The session's speed (audio.output.speed): FFmpeg's atempo on the engine's audio, its pitch kept.
        tempo = SpeechEncoder("pcm", speed) if speed != 1.0 else None
        try:
            async for chunk in stream:
                if chunk.text:
                    if written and written[0].strip() == chunk.text:
                        outputs.put_nowait(SpeechText(written.popleft()))
                    else:  # an incremental engine's own account of the text
                        outputs.put_nowait(SpeechText(chunk.text))
                pcm = tempo.encode(chunk.pcm) if tempo is not None and chunk.pcm else chunk.pcm
                if pcm:
                    if first:
                        outputs.put_nowait(TraceMark("tts_first_audio"))
                        first = False
                    outputs.put_nowait(AudioOut(pcm))
            if tempo is not None and (tail := tempo.finish()):
                outputs.put_nowait(AudioOut(tail))
        except Exception as exc:  # an engine failure of any kind fails the response as a tts error
            raise _tts_error(exc) from exc
        # What the engine found nothing to say in (an emoji, "..."): the reply's words all the same, so that
        # its item holds them and the LLM's next prompt has its turn.
        while written:
            outputs.put_nowait(SpeechText(written.popleft()))
