"""Custom voices as the deployment makes and uses them: consent recordings checked, voices cloned from a
sample or designed from a description, and the prepared voice a stream speaks in.

A consent recording is kept once the gateway's speech-to-text hears the consent phrase of its language in
it (gateway.runtime.voices.consent). A voice from an audio sample is made once the sample is heard to be the same
speaker as its consent recording (the Base checkpoint's speaker embeddings, cosine similarity at least
``[voices] similarity_threshold``); it is cloned in context with the sample's transcript (the one given, or
the speech-to-text's; without either, from the speaker embedding alone). A voice from a prompt is a
VoiceDesign description. Nothing is stored until every check has passed.

The store (gateway.runtime.voices.store) keeps each voice's original sample beside its prepared form, named by
the checkpoint it was prepared for: when the engine's Base checkpoint changes, a voice is prepared again
from its sample at its next use. Everything that blocks (files, decoding) runs in a worker thread; model
work runs in the engine's thread or process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from engine.api import TTSEngine, TTSError
from engine.voices import VoiceError, VoicePrompt
from gateway.audio import SAMPLE_RATE, float32_to_int16
from gateway.audio_codecs import AudioFileError, NoCodecs, decode_upload
from gateway.config import ConfigError, VoicesConfig
from gateway.core.responder import BackendError, Transcriber
from gateway.runtime.voices import consent
from gateway.runtime.voices.store import (
    CONSENT_PREFIX,
    VOICE_PREFIX,
    StoreFull,
    VoiceStore,
    default_dir,
    new_id,
    valid_id,
)

log = logging.getLogger(__name__)

CONSENT_FIELDS = ("id", "object", "name", "language", "created_at")
VOICE_FIELDS = ("id", "object", "name", "type", "created_at", "prompt")

# What making a voice needs, in the words of the refusals and of what /v1/audio/capabilities says is missing.
BASE_CHECKPOINT = 'a Qwen3-TTS Base checkpoint ([engine] checkpoint, with [tts] engine = "qwen3")'
DESIGN_CHECKPOINT = "a Qwen3-TTS VoiceDesign checkpoint ([engine] checkpoint)"
SPEECH_TO_TEXT = "speech-to-text ([stt] base_url, or the local models' [local] stt)"


def missing_models(engine: TTSEngine, transcriber: Transcriber | None) -> dict[str, list[str]]:
    """What this gateway lacks to clone a voice (a Base checkpoint, and speech-to-text to hear the consent)
    and to design one (a VoiceDesign checkpoint): an empty list where it lacks nothing."""
    kinds = getattr(engine, "kinds", ())
    cloning = [need for need, had in ((BASE_CHECKPOINT, "base" in kinds), (SPEECH_TO_TEXT, transcriber is not None))
               if not had]
    return {"cloning": cloning, "design": [] if "voice_design" in kinds else [DESIGN_CHECKPOINT]}


class VoiceRefused(Exception):
    """A request the library turns down: `kind` is invalid (400), unsupported (415), too_large (413),
    not_found (404), full (400: a limit of the deployment), unavailable (501: the gateway lacks a model) or
    busy (503: a backend failed); `param` names the field."""

    def __init__(self, kind: str, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.param, self.code = kind, param, code


@dataclass(frozen=True)
class Upload:
    """An uploaded file: its bytes and the form field that carried it."""

    data: bytes
    field: str


def public(meta: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {k: meta[k] for k in fields if meta.get(k) is not None}


class VoiceLibrary:
    def __init__(self, config: VoicesConfig) -> None:
        self.config = config
        self.store = VoiceStore(Path(config.dir).expanduser() if config.dir else default_dir(),
                                config.max_voices, config.max_consents)

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self.store.open)
        except OSError as exc:
            raise ConfigError(f"option voices.dir: cannot keep custom voices in {self.store.root} "
                              f"({exc.filename}: {exc.strerror})") from None
        log.info("custom voices in %s", self.store.root)

    # --- consents --------------------------------------------------------------------------------

    async def create_consent(self, name: str, language: str, recording: Upload,
                             transcriber: Transcriber | None) -> dict[str, Any]:
        self._check_name(name)
        primary = consent.primary_language(language)
        if primary is None:
            raise VoiceRefused("invalid", f"There is no consent phrase for {language[:40]!r}: give a BCP 47 tag "
                                          f"of one of {', '.join(sorted(consent.CONSENT_PHRASES))}.", "language")
        audio = await self._decode(recording, self.config.max_consent_seconds)
        if transcriber is None:
            raise VoiceRefused("unavailable", f"Checking a consent recording needs {SPEECH_TO_TEXT}.", "recording",
                               "consent_check_unavailable")
        transcript = await self._transcribe(transcriber, audio, primary, recording.field)
        heard = consent.phrase_heard(transcript, primary)
        if heard < self.config.phrase_match:
            raise VoiceRefused("invalid", f"The recording does not say the consent phrase for {primary!r} (heard "
                                          f"{transcript!r}: {heard:.0%} of the phrase). Record the speaker reading: "
                                          f"{consent.CONSENT_PHRASES[primary]}", "recording",
                               "consent_phrase_not_heard")
        meta = {"id": new_id(CONSENT_PREFIX), "object": "audio.voice_consent", "name": name,
                "language": language.strip(),
                "created_at": int(time.time()), "transcript": transcript, "phrase_heard": round(heard, 3)}
        await self._create("consents", meta, {"recording": recording.data})
        return public(meta, CONSENT_FIELDS)

    async def consents(self) -> list[dict[str, Any]]:
        return [public(m, CONSENT_FIELDS) for m in await asyncio.to_thread(self.store.list, "consents")]

    async def consent(self, consent_id: str) -> dict[str, Any]:
        meta = await asyncio.to_thread(self.store.get, "consents", consent_id)
        if meta is None:
            raise VoiceRefused("not_found", f"No consent recording with id {consent_id!r}.", "consent_id")
        return public(meta, CONSENT_FIELDS)

    async def rename_consent(self, consent_id: str, name: str) -> dict[str, Any]:
        self._check_name(name)
        meta = await asyncio.to_thread(self.store.get, "consents", consent_id)
        if meta is None:
            raise VoiceRefused("not_found", f"No consent recording with id {consent_id!r}.", "consent_id")
        meta["name"] = name
        if not await asyncio.to_thread(self.store.replace, "consents", consent_id, "meta.json", orjson.dumps(meta)):
            raise VoiceRefused("not_found", f"No consent recording with id {consent_id!r}.", "consent_id")
        return public(meta, CONSENT_FIELDS)

    async def delete(self, kind: str, object_id: str) -> None:
        if not await asyncio.to_thread(self.store.delete, kind, object_id):
            what = "consent recording" if kind == "consents" else "voice"
            raise VoiceRefused("not_found", f"No {what} with id {object_id!r}.",
                               "consent_id" if kind == "consents" else "voice_id")

    # --- voices ----------------------------------------------------------------------------------

    async def create_clone(self, name: str, sample: Upload, consent_id: str, engine: TTSEngine,
                           transcriber: Transcriber | None, transcript: str | None = None) -> dict[str, Any]:
        """A voice cloned from `sample`, once it is heard to be its consent recording's speaker."""
        self._check_name(name)
        prepare = getattr(engine, "prepare", None)
        if prepare is None or "base" not in getattr(engine, "kinds", ()):
            raise VoiceRefused("unavailable", f"Cloning a voice needs {BASE_CHECKPOINT}; this gateway speaks with "
                                              f"{_engine_name(engine)}.", "audio_sample", "voice_cloning_unavailable")
        audio = await self._decode(sample, self.config.max_sample_seconds)
        meta = await asyncio.to_thread(self.store.get, "consents", consent_id)
        recording = await asyncio.to_thread(self.store.read, "consents", consent_id, "recording")
        if meta is None or recording is None:
            raise VoiceRefused("invalid", f"No consent recording with id {consent_id!r}.", "consent")
        consent_audio = await self._decode(Upload(recording, "consent"), self.config.max_consent_seconds)
        heard = await self._prepare(engine, consent_audio, None, "consent")
        primary = consent.primary_language(meta["language"])
        if not transcript and transcriber is not None:
            try:
                transcript = await self._transcribe(transcriber, audio, primary, sample.field)
            except VoiceRefused:
                transcript = None  # cloned from the speaker embedding alone
        voice = await self._prepare(engine, audio, transcript or None, sample.field)
        assert heard.speaker is not None and voice.speaker is not None
        similarity = consent.similarity(heard.speaker, voice.speaker)
        if similarity < self.config.similarity_threshold:
            raise VoiceRefused("invalid", f"The sample's speaker does not match the consent recording's (similarity "
                                          f"{similarity:.3f}, at least {self.config.similarity_threshold:.3f} "
                                          "needed).", sample.field, "speaker_mismatch")
        meta = {"id": new_id(VOICE_PREFIX), "object": "audio.voice", "name": name, "type": "audio_sample",
                "created_at": int(time.time()), "consent": consent_id, "language": meta["language"],
                "similarity": round(similarity, 4), "transcript": transcript or None}
        await self._create("voices", meta, {"sample": sample.data, _prepared_name(voice): voice.to_bytes()})
        return public(meta, VOICE_FIELDS)

    async def create_design(self, name: str, prompt: str, engine: TTSEngine, script_hint: str | None,
                            model: str | None) -> dict[str, Any]:
        self._check_name(name)
        if not prompt.strip():
            raise VoiceRefused("invalid", "'prompt' is empty: describe the voice.", "prompt")
        if len(prompt) > self.config.max_prompt_chars:
            raise VoiceRefused("invalid", f"'prompt' is longer than {self.config.max_prompt_chars} characters.",
                               "prompt")
        if "voice_design" not in getattr(engine, "kinds", ()):
            raise VoiceRefused("unavailable", f"A voice from a prompt needs {DESIGN_CHECKPOINT}; this gateway speaks "
                                              f"with {_engine_name(engine)}.", "prompt", "voice_design_unavailable")
        meta = {"id": new_id(VOICE_PREFIX), "object": "audio.voice", "name": name, "type": "prompt",
                "created_at": int(time.time()), "prompt": prompt, "script_hint": script_hint, "model": model}
        await self._create("voices", meta, {})
        return public(meta, VOICE_FIELDS)

    async def voices(self) -> list[dict[str, Any]]:
        return [public(m, VOICE_FIELDS) for m in await asyncio.to_thread(self.store.list, "voices")]

    async def voice(self, voice_id: str) -> dict[str, Any]:
        meta = await asyncio.to_thread(self.store.get, "voices", voice_id)
        if meta is None:
            raise VoiceRefused("not_found", f"No voice with id {voice_id!r}.", "voice_id")
        return public(meta, VOICE_FIELDS)

    async def prompt_for(self, voice_id: str, engine: TTSEngine) -> VoicePrompt | None:
        """The voice `voice_id` as `engine` speaks it (prepared again from its sample when it was prepared for
        another checkpoint), or None when there is no such voice."""
        if not valid_id(voice_id, VOICE_PREFIX):
            return None  # a voice name (every speech request asks): no need to look in the store, off the loop
        meta = await asyncio.to_thread(self.store.get, "voices", voice_id)
        if meta is None:
            return None
        if meta["type"] == "prompt":
            return VoicePrompt.design(meta["prompt"])
        for fingerprint in getattr(engine, "fingerprints", ()):
            data = await asyncio.to_thread(self.store.read, "voices", voice_id, f"{fingerprint}.voice")
            if data is not None:
                return VoicePrompt.from_bytes(data)
        if getattr(engine, "prepare", None) is None or not getattr(engine, "fingerprints", ()):
            raise VoiceRefused("unavailable", f"A cloned voice needs a Qwen3-TTS Base checkpoint; this gateway speaks "
                                              f"with {_engine_name(engine)}.", "voice", "voice_cloning_unavailable")
        sample = await asyncio.to_thread(self.store.read, "voices", voice_id, "sample")
        if sample is None:  # deleted meanwhile
            return None
        audio = await self._decode(Upload(sample, "voice"), self.config.max_sample_seconds)
        voice = await self._prepare(engine, audio, meta.get("transcript"), "voice")
        await asyncio.to_thread(self.store.replace, "voices", voice_id, _prepared_name(voice), voice.to_bytes())
        log.info("voice %s prepared again for the engine's Base checkpoint %s", voice_id, _prepared_name(voice))
        return voice

    # --- shared ----------------------------------------------------------------------------------

    def _check_name(self, name: str) -> None:
        if not name.strip():
            raise VoiceRefused("invalid", "'name' is empty.", "name")
        if len(name) > self.config.max_name_chars:
            raise VoiceRefused("invalid", f"'name' is longer than {self.config.max_name_chars} characters.", "name")

    async def _decode(self, upload: Upload, max_seconds: float) -> np.ndarray:
        try:
            return await asyncio.to_thread(decode_upload, upload.data, max_seconds)
        except NoCodecs as exc:
            raise VoiceRefused("unavailable", f"'{upload.field}': {exc}.", upload.field, "codecs_unavailable") from None
        except AudioFileError as exc:
            kind = "unsupported" if exc.kind == "unsupported" else "invalid"
            code = {"unsupported": "unsupported_audio", "too_long": "audio_too_long"}.get(exc.kind, "invalid_audio")
            raise VoiceRefused(kind, f"'{upload.field}': {exc}.", upload.field, code) from None

    async def _transcribe(self, transcriber: Transcriber, audio: np.ndarray, language: str | None,
                          field: str) -> str:
        heard = getattr(transcriber, "languages", None)  # None: any language
        if heard is not None and language not in heard:
            raise VoiceRefused("invalid", f"This gateway's speech-to-text ({_engine_name(transcriber)}) does not hear "
                                          f"{language!r}; it hears {', '.join(sorted(heard))}.", "language",
                               "language_not_supported")
        pcm = float32_to_int16(np.clip(audio, -1.0, 1.0)).tobytes()
        try:
            return "".join([piece async for piece in transcriber.transcribe(pcm, language)]).strip()
        except BackendError as exc:
            raise VoiceRefused("busy", f"The speech-to-text failed: {exc.cause}.", field, "stt_unavailable") from None

    async def _prepare(self, engine: TTSEngine, audio: np.ndarray, transcript: str | None, field: str) -> VoicePrompt:
        prepare = getattr(engine, "prepare")  # noqa: B009 - only engines with a Base checkpoint get here
        try:
            return await prepare(audio, SAMPLE_RATE, transcript)
        except (TTSError, VoiceError) as exc:
            raise VoiceRefused("invalid", f"'{field}' cannot make a voice: {exc}.", field, "invalid_audio") from None
        except BackendError as exc:
            raise VoiceRefused("busy", f"The speech engine failed: {exc.cause}.", field, "engine_unavailable") from None

    async def _create(self, kind: str, meta: dict[str, Any], files: dict[str, bytes]) -> None:
        try:
            await asyncio.to_thread(self.store.create, kind, meta, files)
        except StoreFull as exc:
            raise VoiceRefused("full", str(exc)[:1].upper() + str(exc)[1:] + ".", None,
                               "voice_limit_reached" if kind == "voices" else "consent_limit_reached") from None


class SessionVoices(Collection[str]):
    """What a realtime session may name as its voice: the responder's voices (listed in errors) and any
    custom voice of the deployment. The session checks a name when a client sends it (session.update,
    response.create), in the event loop: a custom voice's id costs one stat of its folder there, the one file
    access the loop makes (the voice itself is read in a worker thread when a response speaks)."""

    def __init__(self, names: frozenset[str], store: VoiceStore) -> None:
        self.names, self.store = names, store

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        return name.lower() in self.names or (valid_id(name, VOICE_PREFIX) and self.store.exists("voices", name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _prepared_name(voice: VoicePrompt) -> str:
    return f"{voice.model.get('fingerprint', 'unknown')}.voice"


def _engine_name(engine: object) -> str:
    return str(getattr(engine, "model_name", type(engine).__name__))

