"""Prompts as the official `Qwen3TTSForConditionalGeneration.generate` builds them, for the three kinds of
checkpoint: CustomVoice (a named speaker, and on 1.7B an instruction), VoiceDesign (a description of the
voice), Base (a voice cloned from reference audio: engine.clone).

The talker reads two tracks summed position by position: a text track (text_projection of text-embedding
rows) and a codec track (codec-embedding rows, or a vector: a clone's x-vector, a reference frame's 16 code
embeddings summed). The official text is "<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n";
its first 3 tokens are the role and its last 5 are never read.

    instruct: "<|im_start|>user\\n{instruction}<|im_end|>\\n"    (text track only; CustomVoice 1.7B, VoiceDesign)
    role:    text <|im_start|> assistant \\n                     (text track only)
    control: text tts_pad x (n-2), tts_bos                     + codec [think|nothink, think_bos, (lang),
                                                                 think_eos, (speaker | x-vector), pad]
    streaming (dual-track) mode:
    first:   text token 0                                      + codec bos      -> the prefill makes frame 0
    then frame k reads text token k (k = 1..), then tts_eos once, then tts_pad, each added to the sum of the
    previous frame's 16 code embeddings.
    non-streaming mode: all text tokens + tts_eos over codec pad, then tts_pad + codec bos; frames read tts_pad.

An in-context (ICL) clone replaces "first" with its reference: the text track reads the reference's
transcript, then the text, then tts_eos, against the codec track's bos and the reference's frames. In
streaming mode the text takes as many positions as there are frames (tts_pad after it when shorter) and
what does not fit is read one token per frame as above; non-streaming, the text positions come first (over
codec pad) and the frames after them (over tts_pad).

A language of "chinese" or "auto" with a dialect speaker (eric, dylan) uses the speaker's dialect tag.
Nothing here reaches the frame step: a voice changes a stream's prompt only, so streams of any voice,
mode and language share one batch.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any

from engine.talker import ModelConfig
from engine.voices import VoicePrompt

ROLE = "<|im_start|>assistant\n"


class PromptError(ValueError):
    """An unknown speaker or language, or a voice the checkpoint cannot speak; the message says which."""


def instruct_text(instruction: str) -> str:
    return f"<|im_start|>user\n{instruction}<|im_end|>\n"


def reference_text(transcript: str) -> str:
    return f"<|im_start|>assistant\n{transcript}<|im_end|>\n"


@dataclass(frozen=True, eq=False)
class Voice:
    """How a stream speaks: a CustomVoice `speaker`, a Base `clone` or a VoiceDesign description (in
    `instruct_ids`), and its language. `instruct_ids` are the tokens of instruct_text (a CustomVoice 1.7B
    instruction, a VoiceDesign description), `ref_ids` those of an ICL clone's transcript."""

    language: str  # "auto" or a key of codec_language_id
    speaker: str | None = None
    clone: VoicePrompt | None = None
    instruct_ids: tuple[int, ...] = ()
    ref_ids: tuple[int, ...] = ()

    @classmethod
    def resolve(cls, cfg: ModelConfig, speaker: str | None, language: str | None, *, tokens: TextTokens | None = None,
                clone: VoicePrompt | None = None, instructions: str | None = None) -> Voice:
        """A voice the checkpoint speaks: PromptError (saying why) when `speaker`, `clone` or
        `instructions` do not fit its kind, or the language is unknown. `tokens` tokenizes instructions
        and transcripts. Instructions a checkpoint ignores (0.6B CustomVoice, as the official code) are
        dropped."""
        lang = (language or "auto").lower()
        if lang != "auto" and (lang not in cfg.languages or "dialect" in lang):
            known = sorted(k for k in cfg.languages if "dialect" not in k)
            raise PromptError(f"unknown language {language!r}; use auto or one of {', '.join(known)}")
        description = None
        if cfg.kind == "custom_voice":
            if clone is not None:
                raise PromptError("a CustomVoice checkpoint speaks its own speakers; a prepared voice needs a "
                                  "Base (cloned) or VoiceDesign (designed) checkpoint")
            spk = (speaker or "").lower()
            if spk not in cfg.speakers:
                raise PromptError(f"unknown speaker {speaker!r}; the checkpoint has {', '.join(sorted(cfg.speakers))}")
            speaker = spk
            description = instructions if cfg.follows_instructions else None
        elif cfg.kind == "voice_design":
            # No description at all is allowed, as in the official code: the checkpoint's own default voice.
            if (clone is not None and clone.mode != "design") or (clone is None and speaker):
                raise PromptError("a VoiceDesign checkpoint speaks designed voices (a description), not "
                                  + ("cloned ones" if clone is not None else f"speaker {speaker!r}"))
            if instructions:
                raise PromptError("a designed voice is its description: it takes no separate instructions")
            speaker, description = None, clone.text if clone is not None else None
        else:
            if clone is None or clone.kind != "clone":
                raise PromptError("a Base checkpoint speaks cloned voices (prepared from reference audio), not "
                                  + ("designed ones" if clone is not None else f"speaker {speaker!r}"))
            if clone.speaker is None or clone.speaker.shape[0] != cfg.talker.hidden:
                raise PromptError(f"the cloned voice was prepared for a {clone.model.get('size', '?')} checkpoint "
                                  f"(width {clone.model.get('hidden', '?')}), not this one ({cfg.size})")
            if clone.codes is not None and int(clone.codes.max()) >= cfg.predictor.vocab:
                raise PromptError(f"the cloned voice's codes exceed the codebooks' {cfg.predictor.vocab} entries")
            if instructions:
                raise PromptError("a Base checkpoint takes no instructions")
            speaker = None
        needs_tokens = bool(description) or (clone is not None and clone.mode == "icl")
        if needs_tokens and tokens is None:
            raise PromptError("instructions and transcripts need the text tokenizer")
        instruct = tuple(tokens.encode(instruct_text(description))[0]) if description and tokens else ()
        ref = ()
        if clone is not None and clone.mode == "icl" and tokens is not None:
            ref = tuple(tokens.encode(reference_text(clone.text or ""))[0][3:-2])
        return cls(lang, speaker, clone, instruct, ref)

    @property
    def icl(self) -> bool:
        return self.clone is not None and self.clone.mode == "icl"

    def codec_prefix(self, cfg: ModelConfig) -> list[int]:
        """Codec-track ids of the control positions: think tags, language, speaker (NO_CODEC for a clone's
        x-vector), pad (bos comes with the first text token)."""
        language_id = None if self.language == "auto" else cfg.languages[self.language]
        dialect = cfg.dialects.get(self.speaker or "")
        if dialect and self.language in ("chinese", "auto"):
            language_id = cfg.languages[dialect]
        if language_id is None:
            tags = [cfg.nothink, cfg.think_bos, cfg.think_eos]
        else:
            tags = [cfg.think, cfg.think_bos, language_id, cfg.think_eos]
        if self.speaker is not None:
            tags.append(cfg.speakers[self.speaker])
        elif self.clone is not None and self.clone.kind == "clone":
            tags.append(NO_CODEC)
        return tags + [cfg.codec_pad]

    def text_needed(self) -> int:
        """Text tokens the streaming prompt holds before the text is final: an ICL prompt holds as many
        text-track tokens as the reference has frames, plus one (so its first ones must be known), any
        other prompt one."""
        return max(1, self.clone.frames + 1 - len(self.ref_ids)) if self.icl and self.clone else 1

    def positions(self, cfg: ModelConfig, text_tokens: int = 1, non_streaming: bool = False) -> int:
        """The length of the prompt for `text_tokens` tokens of text (the KV-cache positions it takes; a
        streaming prompt's does not depend on the text)."""
        control = len(self.instruct_ids) + 3 + len(self.codec_prefix(cfg))
        if self.icl and self.clone:
            frames = self.clone.frames + 1
            seq = len(self.ref_ids) + text_tokens + 1
            return control + (seq + frames if non_streaming else frames)
        return control + (text_tokens + 2 if non_streaming else 1)


NO_CODEC = -1  # a position with a text-track token only (or a vector on the codec track)


@dataclass
class Prompt:
    """A stream's prompt, position by position: text-track ids, codec-track ids (NO_CODEC where none), and
    where the codec track is a vector: a clone's x-vector at `speaker_at`, an ICL clone's reference frames
    from `codes_at` on. `text_read` target-text tokens are in it, and the first frames read `leftover`
    transcript tokens before the text's next one; `eos_read` when tts_eos is in it."""

    text: list[int]
    codec: list[int]
    voice: Voice
    speaker_at: int = -1
    codes_at: int = -1
    text_read: int = 0
    leftover: list[int] = field(default_factory=list)
    eos_read: bool = False

    def __len__(self) -> int:
        return len(self.text)


def build(cfg: ModelConfig, voice: Voice, role_ids: list[int], text_ids: list[int], non_streaming: bool = False,
          final: bool = True) -> Prompt:
    """The talker's prompt for `text_ids` (all of the text when `final`; a streaming prompt needs only
    voice.text_needed() of them). Its embedding is text_embed(text) + codec_embed(codec) + the vectors."""
    if not text_ids:
        raise PromptError("empty text")
    prefix = voice.codec_prefix(cfg)
    lead = list(voice.instruct_ids) + role_ids
    text = lead + [cfg.tts_pad] * (len(prefix) - 1) + [cfg.tts_bos]
    codec = [NO_CODEC] * len(lead) + prefix
    prompt = Prompt(text, codec, voice)
    if voice.clone is not None and voice.clone.kind == "clone":
        prompt.speaker_at = len(lead) + len(prefix) - 2
    if voice.icl:
        ref = list(voice.ref_ids)
        seq = ref + text_ids + ([cfg.tts_eos] if final else [])
        frames = voice.clone.frames + 1 if voice.clone else 1
        if non_streaming:
            if not final:
                raise PromptError("a non-streaming prompt needs all of its text")
            text += seq + [cfg.tts_pad] * frames
            codec += [cfg.codec_pad] * len(seq) + [cfg.codec_bos] + [NO_CODEC] * (frames - 1)
            prompt.codes_at, prompt.text_read, prompt.eos_read = len(codec) - frames + 1, len(text_ids), True
            return prompt
        if not final and len(seq) < frames:
            raise PromptError("an in-context clone's prompt needs the text's first tokens")
        held = seq[:frames]
        text += held + [cfg.tts_pad] * (frames - len(held))
        codec += [cfg.codec_bos] + [NO_CODEC] * (frames - 1)
        prompt.codes_at = len(codec) - frames + 1
        prompt.text_read = min(len(text_ids), max(0, frames - len(ref)))
        prompt.leftover = ref[frames:]
        prompt.eos_read = final and len(seq) <= frames
        return prompt
    if non_streaming:
        if not final:
            raise PromptError("a non-streaming prompt needs all of its text")
        text += text_ids + [cfg.tts_eos, cfg.tts_pad]
        codec += [cfg.codec_pad] * (len(text_ids) + 1) + [cfg.codec_bos]
        prompt.text_read, prompt.eos_read = len(text_ids), True
    else:
        text.append(text_ids[0])
        codec.append(cfg.codec_bos)
        prompt.text_read = 1
    return prompt


class TextTokens:
    """The text tokenizer as the prompt needs it, plus incremental tokenization of a live text feed.

    Text arriving in fragments, or taken from a long text a window at a time, is tokenized up to its last
    pre-token only (the Qwen2 pre-tokenizer splits words, numbers and punctuation runs; BPE never merges
    across those splits), so a word cut in two is not tokenized before its end arrives. Either way the
    tokens are those of the official tokenizer call on the whole text.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.role_ids = self.encode(ROLE)[0]
        if len(self.role_ids) != 3:
            raise PromptError(f"the tokenizer splits {ROLE!r} into {len(self.role_ids)} tokens, not 3")

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and their character spans in `text`."""
        _, ids, spans = self.encode_ready([(text, True)])[0]
        return ids, spans

    def encode_ready(self, pieces: list[tuple[str, bool]]) -> list[tuple[int, list[int], list[tuple[int, int]]]]:
        """The tokens of each (text, whole) piece that are ready: all of a whole one's; of any other, those
        before its last pre-token (which the text that follows could still change). Per piece: the characters
        they cover, their ids and their character spans. One call of the fast tokenizer's backend for them all
        (what the transformers call runs, without its per-text conversions; the Rust side takes the batch in
        parallel, off the GIL: per-call overhead dominates a fragment's tokenization)."""
        encodings = self.tokenizer.backend_tokenizer.encode_batch([text for text, _ in pieces],
                                                                  add_special_tokens=False)
        ready = []
        for (text, whole), encoding in zip(pieces, encodings, strict=True):
            if whole:
                ready.append((len(text), encoding.ids, encoding.offsets))
                continue
            words = encoding.word_ids
            last = words.index(words[-1]) if words else 0  # the first token of the last pre-token
            if not last:
                ready.append((0, [], []))
                continue
            spans = encoding.offsets
            ready.append((spans[last][0], encoding.ids[:last], spans[:last]))
        return ready

    @staticmethod
    def normalize(text: str) -> str:
        # The tokenizer's own normalizer is NFC; doing it first keeps its character offsets ours.
        return unicodedata.normalize("NFC", text)
