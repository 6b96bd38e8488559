"""Input audio transcription: which user audio items are transcribed, and the events that reports.

When it runs: a user audio item (a committed turn, or a client's item with audio and no transcript)
is transcribed as it enters the conversation, whatever becomes of the response to it, when

- the session asks for it: a transcription session, or ``audio.input.transcription`` (beta:
  ``input_audio_transcription``) set; a session that asks with no speech-to-text available gets
  ``conversation.item.input_audio_transcription.failed`` naming why, instead of silence;
- or the responder reads transcripts (the pipeline's STT step), asked or not.

The runner carries out each Transcribe effect and feeds back ``delta`` (as the STT server streams
them, or the whole text at once from one that does not), then ``completed`` or ``failed``.

Early: a VAD turn's transcription starts in its closing pause (``[stt] early_ms``), as a
PrepareTranscript of the audio up to the pause, which is byte for byte what the turn commits if the
user stays silent; the turn's Transcribe then takes that result instead of starting from nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.config import Config
from gateway.realtime.conversation import BYTES_PER_MS, Conversation, EventMaker, Item
from gateway.realtime.effects import Effect, PrepareTranscript, Transcribe
from gateway.realtime.settings import SessionSettings

if TYPE_CHECKING:
    from gateway.realtime.turns import InputAudio


class InputTranscription:
    def __init__(self, event: EventMaker, conversation: Conversation, config: Config) -> None:
        self._event = event
        self._conversation = conversation
        self._config = config
        # Set by the runner: it has a transcriber; its responder reads user transcripts.
        self.available = False
        self.always = False
        self._early_pause: int | None = None  # the pause whose audio is being transcribed early

    def wanted(self, settings: SessionSettings) -> bool:
        return self.always or settings.type == "transcription" or settings.transcription is not None

    def early(self, settings: SessionSettings, audio: InputAudio) -> list[Effect]:
        """After the VAD's windows: start transcribing the turn in progress once its pause has lasted
        ``early_ms``, or drop that when the pause ends in more speech (or in the turn's commit, which has
        taken the result by then)."""
        early_ms = self._config.stt.early_ms
        if not (early_ms and self.available and self.wanted(settings)):
            return []
        speech = audio.speech
        pause = audio.detector.pause_ms if speech is not None else None
        if pause is not None and audio.heard_ms - pause < early_ms:
            pause = None
        if pause == self._early_pause:
            return []
        self._early_pause = pause
        if speech is None or pause is None:
            return [PrepareTranscript(None)]
        tr = settings.transcription
        return [PrepareTranscript(audio.peek(speech[1], pause), tr and tr.language, tr and tr.prompt)]

    def start(self, item: Item, settings: SessionSettings) -> list[Effect]:
        """``item`` entered the conversation: transcribe it if anyone wants its text."""
        if not self.wanted(settings):
            return []
        if not self.available:
            return self._failed(item, "stt_unavailable", self._unavailable())
        tr = settings.transcription
        return [Transcribe(item.id, bytes(item.audio), tr and tr.language, tr and tr.prompt)]

    def delta(self, item_id: str, text: str) -> list[Effect]:
        item = self._conversation.get(item_id)
        if item is None or not text:
            return []  # deleted meanwhile
        return self._event("conversation.item.input_audio_transcription.delta", item_id=item_id,
                            content_index=_audio_part(item), delta=text)

    def completed(self, item_id: str, text: str) -> list[Effect]:
        item = self._conversation.get(item_id)
        if item is None:
            return []
        # Usage as a duration: the audio transcribed (what whisper-1 reports), whatever the STT server counts.
        return [*self._event(
            "conversation.item.input_audio_transcription.completed", item_id=item_id,
            content_index=_audio_part(item), transcript=text,
            usage={"type": "duration", "seconds": round(len(item.audio) / (1000 * BYTES_PER_MS), 3)},
        ), *self._conversation.set_transcript(item, text)]

    def failed(self, item_id: str, message: str) -> list[Effect]:
        item = self._conversation.get(item_id)
        return [] if item is None else self._failed(item, "stt_backend_error", message)

    def _failed(self, item: Item, code: str, message: str) -> list[Effect]:
        # No param: the JS Agents SDK's schema takes a string or nothing there, never null.
        return self._event("conversation.item.input_audio_transcription.failed", item_id=item.id,
                            content_index=_audio_part(item),
                            error={"type": "transcription_error", "code": code, "message": message})

    def _unavailable(self) -> str:
        stt = self._config.stt
        if stt.audio_in:
            why = "[stt] audio_in = true sends user audio to the LLM instead"
        elif not stt.base_url:
            why = "[stt] base_url is empty, and the local STT is off or not installed"
        else:
            why = "the responder in use transcribes nothing"
        return f"No speech-to-text backend is available to transcribe input audio ({why})."


def _audio_part(item: Item) -> int:
    """Index of the item's (first) input_audio part."""
    return next((i for i, p in enumerate(item.data.get("content", ())) if p["type"] == "input_audio"), 0)
