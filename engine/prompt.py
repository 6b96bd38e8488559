"""Prompts as the official `Qwen3TTSForConditionalGeneration.generate` builds them for CustomVoice.

The talker reads two tracks summed position by position: a text track (text_projection of text-embedding
rows) and a codec track (codec-embedding rows). The official text is
"<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n"; its first 3 tokens are the role and
its last 5 are never read.

    role:    text <|im_start|> assistant \\n            (text track only)
    control: text tts_pad x (n-2), tts_bos            + codec [think|nothink, think_bos, (lang), think_eos,
                                                                (speaker), pad]
    streaming (dual-track) mode:
    first:   text token 0                             + codec bos            -> the prefill makes frame 0
    then frame k reads text token k (k = 1..), then tts_eos once, then tts_pad, each added to the sum of the
    previous frame's 16 code embeddings.
    non-streaming mode: all text tokens + tts_eos over codec pad, then tts_pad + codec bos; frames read tts_pad.

A language of "chinese" or "auto" with a dialect speaker (eric, dylan) uses the speaker's dialect tag.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

from engine.talker import ModelConfig

ROLE = "<|im_start|>assistant\n"


class PromptError(ValueError):
    """An unknown speaker or language; the message lists the known ones."""


@dataclass(frozen=True)
class Voice:
    speaker: str
    language: str  # "auto" or a key of codec_language_id

    @classmethod
    def resolve(cls, cfg: ModelConfig, speaker: str, language: str | None) -> Voice:
        spk = speaker.lower()
        if spk not in cfg.speakers:
            raise PromptError(f"unknown speaker {speaker!r}; the checkpoint has {', '.join(sorted(cfg.speakers))}")
        lang = (language or "auto").lower()
        if lang != "auto" and (lang not in cfg.languages or "dialect" in lang):
            known = sorted(k for k in cfg.languages if "dialect" not in k)
            raise PromptError(f"unknown language {language!r}; use auto or one of {', '.join(known)}")
        return cls(spk, lang)

    def codec_prefix(self, cfg: ModelConfig) -> list[int]:
        """Codec-track ids of the control positions: think tags, language, speaker, pad (bos comes with the
        first text token)."""
        language_id = None if self.language == "auto" else cfg.languages[self.language]
        dialect = cfg.dialects.get(self.speaker)
        if dialect and self.language in ("chinese", "auto"):
            language_id = cfg.languages[dialect]
        if language_id is None:
            tags = [cfg.nothink, cfg.think_bos, cfg.think_eos]
        else:
            tags = [cfg.think, cfg.think_bos, language_id, cfg.think_eos]
        return tags + [cfg.speakers[self.speaker], cfg.codec_pad]


NO_CODEC = -1  # a position with a text-track token only


def prompt_ids(cfg: ModelConfig, voice: Voice, role_ids: list[int], text_ids: list[int],
               non_streaming: bool = False) -> tuple[list[int], list[int]]:
    """The talker's prompt as two id tracks of equal length: text-track ids and codec-track ids (NO_CODEC
    where a position has none). Its embedding is text_embed(text) + codec_embed(codec), position by
    position. Streaming mode needs text_ids[0] only."""
    if not text_ids:
        raise PromptError("empty text")
    prefix = voice.codec_prefix(cfg)
    text = role_ids + [cfg.tts_pad] * (len(prefix) - 1) + [cfg.tts_bos]
    codec = [NO_CODEC] * len(role_ids) + prefix
    if non_streaming:
        text += text_ids + [cfg.tts_eos, cfg.tts_pad]
        codec += [cfg.codec_pad] * (len(text_ids) + 1) + [cfg.codec_bos]
    else:
        text.append(text_ids[0])
        codec.append(cfg.codec_bos)
    return text, codec


class TextTokens:
    """The text tokenizer as the prompt needs it, plus incremental tokenization of a live text feed.

    Text arriving in fragments is tokenized up to the last pre-token boundary only (the Qwen2 pre-tokenizer
    splits words, numbers and punctuation runs; BPE never merges across those splits), so a word cut in two
    by the feed is not tokenized before its end arrives. Text fed whole tokenizes exactly as the official
    tokenizer call on the full prompt.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pre_tokenizer = tokenizer.backend_tokenizer.pre_tokenizer
        self.role_ids = self.encode(ROLE)[0]
        if len(self.role_ids) != 3:
            raise PromptError(f"the tokenizer splits {ROLE!r} into {len(self.role_ids)} tokens, not 3")

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and their character spans in `text`."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """`encode` of each text, in one call of the fast tokenizer's backend (what the transformers call runs,
        without its per-text conversions; the Rust side takes the batch in parallel, off the GIL: per-call
        overhead dominates a fragment's tokenization)."""
        encodings = self.tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
        return [(encoding.ids, encoding.offsets) for encoding in encodings]

    def ready_prefix(self, text: str, final: bool) -> int:
        """How many leading characters of `text` can be tokenized now (all of it once the text is final)."""
        if final:
            return len(text)
        pieces = self.pre_tokenizer.pre_tokenize_str(text) if self.pre_tokenizer is not None else []
        return pieces[-1][1][0] if len(pieces) > 1 else 0

    @staticmethod
    def normalize(text: str) -> str:
        # The tokenizer's own normalizer is NFC; doing it first keeps its character offsets ours.
        return unicodedata.normalize("NFC", text)
