"""The in-process Qwen3-TTS engine behind gateway.tts.TTSEngine: one worker thread owns the model.

The event loop only appends text and flags under a lock (feed, end, cancel) and awaits an asyncio.Queue;
the worker thread tokenizes, steps the model and decodes audio, and hands each packet to the loop with
call_soon_threadsafe. Each pass of the worker loop admits waiting streams into free cache slots, takes in
new text, then steps every runnable stream once (round-robin; streams join and leave between steps, so a
later change can batch the same set into one step). A stream waiting for text costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine import checkpoint
from engine.checkpoint import Checkpoint, CheckpointError
from engine.prompt import PromptError, TextTokens, Voice
from engine.sampling import SamplingParams
from engine.stream import Packet, Stream
from gateway.tts import TTSChunk, TTSError

if TYPE_CHECKING:
    from gateway.config import EngineConfig

log = logging.getLogger(__name__)

# Language names the checkpoint knows, also by their ISO 639-1 codes (what an STT reports).
ISO_LANGUAGES = {"zh": "chinese", "en": "english", "de": "german", "it": "italian", "pt": "portuguese",
                 "es": "spanish", "ja": "japanese", "ko": "korean", "fr": "french", "ru": "russian"}
# Talker positions a streaming prompt takes before its first frame (role 3, control <= 6, first text 1).
PROMPT_POSITIONS = 16


class QwenTTSStream:
    """One utterance; the gateway.tts.TTSStream protocol. Create with QwenTTSEngine.open."""

    def __init__(self, engine: QwenTTSEngine, voice: Voice, loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self.voice = voice
        self._loop = loop
        self._queue: asyncio.Queue[TTSChunk | BaseException | None] = asyncio.Queue()
        # Shared with the worker under engine._cond:
        self.incoming: list[str] = []
        self.ended = False
        self.cancelled = False
        self.chars = 0
        self.has_text = False
        # The worker's own:
        self.core: Stream | None = None
        self._finished = False  # the consumer saw the end

    def feed(self, text: str) -> None:
        with self._engine._cond:
            if self.ended:
                raise TTSError("feed after end")
            if self.cancelled:
                return
            if self.chars + len(text) > self._engine.max_text_chars:
                raise TTSError(f"text longer than {self._engine.max_text_chars} characters")
            self.chars += len(text)
            self.has_text = self.has_text or bool(text.strip())
            self.incoming.append(text)
            self._engine._cond.notify()

    def end(self) -> None:
        with self._engine._cond:
            if self.ended or self.cancelled:
                return
            self.ended = True
            if not self.has_text:
                self.cancelled = True  # nothing to say: the worker frees the stream, iteration ends
                self._queue.put_nowait(None)
            self._engine._cond.notify()
        if not self.has_text:
            raise TTSError("empty text")

    def cancel(self) -> None:
        with self._engine._cond:
            if self.cancelled:
                return
            self.cancelled = True
            self._engine._cond.notify()
        self._queue.put_nowait(None)  # iteration ends now; the worker frees the stream at its next pass

    def __aiter__(self) -> QwenTTSStream:
        return self

    async def __anext__(self) -> TTSChunk:
        if self._finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None or self.cancelled:
            self._finished = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        return item

    def deliver(self, item: TTSChunk | BaseException | None) -> None:
        """Worker side: hand an item to the event loop."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody listens any more
            with self._engine._cond:
                self.cancelled = True


class QwenTTSEngine:
    """gateway.tts.TTSEngine over a loaded checkpoint; `from_config` is what the gateway calls.

    Streams are opened on the event loop (open needs the running loop). `min_frames` bans EOS before that
    many frames (benchmarks hold EOS off with it; 2 is the official minimum).
    """

    incremental = True

    def __init__(self, ckpt: Checkpoint, *, packet_frames: int = 4, max_frames: int = 1500,
                 max_text_chars: int = 2000, seed: int | None = 0, greedy: bool = False,
                 voices: dict[str, str] | None = None, max_streams: int = 4, min_frames: int = 2) -> None:
        for name, value in (("packet_frames", packet_frames), ("max_frames", max_frames),
                            ("max_text_chars", max_text_chars), ("max_streams", max_streams)):
            if value < 1:
                raise CheckpointError(f"[engine] {name} must be >= 1, got {value}")
        self.ckpt = ckpt
        self.tokens = TextTokens(ckpt.tokenizer)
        self.params = SamplingParams.from_generation_config(ckpt.generation, greedy)
        self.packet_frames, self.max_frames, self.max_text_chars = packet_frames, max_frames, max_text_chars
        self.seed, self.min_frames = seed, min_frames
        self.voices = {k.lower(): v.lower() for k, v in (voices or {}).items()}
        for voice, speaker in self.voices.items():
            if speaker not in ckpt.config.speakers:
                raise CheckpointError(f"[engine.voices] {voice} = {speaker!r}: the checkpoint has no such speaker "
                                      f"(it has {', '.join(sorted(ckpt.config.speakers))})")
        ckpt.model.setup(max_streams, max_frames + PROMPT_POSITIONS)
        self._cond = threading.Condition()
        self._waiting: deque[QwenTTSStream] = deque()
        self._active: list[QwenTTSStream] = []
        self._free_slots = list(range(max_streams))
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="qwen3-tts-worker", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> QwenTTSEngine:
        ckpt = checkpoint.load(config.checkpoint, device=config.device, dtype=config.dtype)
        return cls(ckpt, packet_frames=config.packet_frames, max_frames=config.max_frames,
                   max_text_chars=config.max_text_chars, seed=config.seed, greedy=config.greedy,
                   voices=config.voices, max_streams=config.max_streams)

    def open(self, voice: str, language: str | None = None) -> QwenTTSStream:
        """A new stream for `voice` (an OpenAI voice name from [engine.voices], or a checkpoint speaker)."""
        loop = asyncio.get_running_loop()
        speaker = self.voices.get(voice.lower(), voice)
        lang = ISO_LANGUAGES.get((language or "auto").lower(), language)
        try:
            resolved = Voice.resolve(self.ckpt.config, speaker, lang)
        except PromptError as exc:
            raise TTSError(str(exc)) from None
        stream = QwenTTSStream(self, resolved, loop)
        with self._cond:
            if self._closed:
                raise TTSError("the engine is closed")
            self._waiting.append(stream)
            self._cond.notify()
        return stream

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    # -- worker thread --
    def _has_work(self) -> bool:
        if self._closed:
            return True
        if self._waiting and (self._free_slots or any(s.cancelled for s in self._waiting)):
            return True
        return any(s.cancelled or s.incoming or (s.ended and s.core is not None and not s.core.final)
                   or (s.core is not None and s.core.runnable) for s in self._active)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(self._has_work)
                if self._closed:
                    break
                self._admit()
                work = [(s, s.incoming, s.ended, s.cancelled) for s in self._active]
                for s in self._active:
                    s.incoming = []
            for stream, fragments, ended, cancelled in work:
                if cancelled:
                    self._release(stream)
                    continue
                self._guard(stream, lambda s=stream, f=fragments, e=ended: self._advance(s, f, e))
        for stream in self._active + list(self._waiting):
            stream.deliver(TTSError("the engine is closed"))

    def _admit(self) -> None:
        kept: deque[QwenTTSStream] = deque()
        while self._waiting:
            stream = self._waiting.popleft()
            if stream.cancelled:
                continue
            if not self._free_slots:
                kept.append(stream)
                continue
            slot = self._free_slots.pop()
            stream.core = Stream(self.ckpt, self.tokens, stream.voice, slot, self.params, self.seed,
                                 self.packet_frames, self.max_frames, self.min_frames)
            self._active.append(stream)
        self._waiting = kept

    def _advance(self, stream: QwenTTSStream, fragments: list[str], ended: bool) -> None:
        core = stream.core
        assert core is not None
        if fragments or (ended and not core.final):
            core.add_text("".join(fragments), ended)
        if core.runnable:
            packet = core.step()
            if packet is not None:
                stream.deliver(_chunk(packet))
        if core.done:
            stream.deliver(None)
            self._release(stream)

    def _guard(self, stream: QwenTTSStream, action: Callable[[], Any]) -> None:
        try:
            action()
        except PromptError as exc:
            stream.deliver(TTSError(str(exc)))
            self._release(stream)
        except Exception as exc:  # a failing stream must not take the worker (and every other stream) down
            log.exception("qwen3-tts stream failed")
            stream.deliver(exc)
            self._release(stream)

    def _release(self, stream: QwenTTSStream) -> None:
        with self._cond:
            if stream in self._active:
                self._active.remove(stream)
                if stream.core is not None:
                    self._free_slots.append(stream.core.gen.slot)


def _chunk(packet: Packet) -> TTSChunk:
    return TTSChunk(pcm=packet.pcm, text=packet.text)
