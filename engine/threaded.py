"""The Qwen3-TTS engine in a thread of the caller's process: engine.api's TTSEngine over loaded checkpoints.

A worker thread owns the models and runs the batching loop (engine.batcher); a stream's packets, and a
prepared voice, reach the caller's event loop through call_soon_threadsafe. ``QwenTTSEngine.from_config``
is what the gateway calls for ``[engine] mode = "thread"``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.api import Sampling, TTSChunk, TTSError
from engine.batcher import Batcher, Model, Utterance
from engine.checkpoint import Checkpoint
from engine.handles import QueuedStream
from engine.prompt import Voice
from engine.voices import VoicePrompt


class QwenTTSStream(Utterance, QueuedStream):
    """One utterance of the in-process engine; engine.api's TTSStream. Create with
    QwenTTSEngine.open (on the event loop): packets reach the loop through call_soon_threadsafe."""

    def __init__(self, engine: QwenTTSEngine, target: tuple[Model, Voice], loop: asyncio.AbstractEventLoop,
                 sampling: Sampling | None = None) -> None:
        super().__init__(engine, target, self._deliver, sampling)
        self._loop = loop

    def end(self) -> None:
        try:
            super().end()
        except TTSError:
            self.put(None)  # nothing to say: iteration ends, the loop frees the stream
            raise

    def cancel(self) -> None:
        if super().cancel():
            self.put(None)  # iteration ends now; the loop frees the stream at its next pass

    def _deliver(self, item: TTSChunk | BaseException | None) -> None:
        try:
            self._loop.call_soon_threadsafe(self.put, item)
        except RuntimeError:  # the loop is closed: nobody listens any more
            with self.lock:
                self.cancelled = True


class QwenTTSEngine(Batcher):
    """engine.api's TTSEngine over a loaded checkpoint, in the caller's process: a worker thread owns the
    model and runs the batching loop; `from_config` is what the gateway calls."""

    incremental = True
    model_name = "Qwen3-TTS"

    def __init__(self, ckpts: Checkpoint | Sequence[Checkpoint], **options: Any) -> None:
        super().__init__(ckpts, **options)
        self._thread = threading.Thread(target=self._run, name="qwen3-tts-worker", daemon=True)
        self._thread.start()

    def open(self, voice: str, language: str | None = None, *, prompt: VoicePrompt | None = None,
             instructions: str | None = None, sampling: Sampling | None = None) -> QwenTTSStream:
        """A new stream for `voice` (an OpenAI voice name from [engine.voices], or a checkpoint speaker), or
        for a prepared voice (`prompt`, named `voice`); TTSError when the engine cannot speak it (see
        Batcher.resolve). `instructions` go to a CustomVoice 1.7B checkpoint; a 0.6B one ignores them (as the
        official code, with a note logged once). `sampling`: the stream's own seed and sampling."""
        target = self.resolve(voice, language, prompt, instructions)
        return self.admit(QwenTTSStream(self, target, asyncio.get_running_loop(), sampling))

    async def prepare(self, audio: np.ndarray, sample_rate: int, text: str | None = None) -> VoicePrompt:
        """Clone a voice from reference audio (Batcher.prepare_voice) on the worker thread; TTSError when it
        cannot be."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[VoicePrompt] = loop.create_future()

        def deliver(result: Any) -> None:
            def settle() -> None:
                if done.done():
                    return
                if isinstance(result, BaseException):
                    done.set_exception(result)
                else:
                    done.set_result(result)
            loop.call_soon_threadsafe(settle)

        self.submit(lambda: self.prepare_voice(audio, sample_rate, text), deliver)
        return await done

    async def stats(self) -> list[dict[str, Any]]:
        """One entry per engine (here: this one): see Batcher.counters."""
        return [self.counters()]

    def close(self) -> None:
        with self.cond:
            self._closed = True
            self.cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(self.has_work)
                if self._closed:
                    break
            self.run_pass()
        self.fail_all(TTSError("the engine is closed"))
