"""What a consent recording must say, and how a voice sample is checked against it.

A consent recording is the voice's owner reading this deployment's consent phrase in their language
(OpenAI's idea, our own wording): the gateway's speech-to-text must hear it, in order, with at most a few
words missed or misheard (``[voices] phrase_match``, the share of the phrase's words, or characters in
Chinese, Japanese and Korean, found in order in the transcript). A voice sample must then be the same
speaker: the cosine similarity of the two recordings' speaker embeddings (the Qwen3-TTS Base checkpoint's
speaker encoder) at least ``[voices] similarity_threshold`` (calibrated by scripts/calibrate_consent.py).

The phrases cover the languages the Qwen3-TTS checkpoints speak. A language is named by its BCP 47 tag
("en-US"); its primary subtag picks the phrase.
"""

from __future__ import annotations

import re
import unicodedata
from difflib import SequenceMatcher

import numpy as np

CONSENT_PHRASES: dict[str, str] = {
    "en": "I am the owner of this voice, and I consent to a synthetic copy of my voice being created and used.",
    "zh": "我是这个声音的主人，我同意创建并使用我声音的合成副本。",
    "de": "Ich bin die Person, der diese Stimme gehört, und ich willige ein, dass eine synthetische Kopie meiner "
          "Stimme erstellt und verwendet wird.",
    "fr": "Je suis la personne à qui appartient cette voix, et je consens à ce qu'une copie synthétique de ma voix "
          "soit créée et utilisée.",
    "es": "Soy la persona dueña de esta voz y doy mi consentimiento para que se cree y se use una copia sintética de "
          "mi voz.",
    "it": "Sono la persona a cui appartiene questa voce e acconsento che venga creata e usata una copia sintetica "
          "della mia voce.",
    "pt": "Eu sou a pessoa dona desta voz e autorizo que uma cópia sintética da minha voz seja criada e usada.",
    "ru": "Я владелец этого голоса и даю согласие на создание и использование синтетической копии моего голоса.",
    "ja": "私はこの声の持ち主であり、私の声の合成コピーが作成され、使用されることに同意します。",
    "ko": "저는 이 목소리의 주인이며, 제 목소리의 합성 복제본이 만들어지고 사용되는 것에 동의합니다.",
}
# Written without spaces between words (or spaced inconsistently by speech-to-text): compared by character.
BY_CHARACTER = frozenset({"zh", "ja", "ko"})


# A BCP 47 tag's shape (RFC 5646 §2.1: a 2-3 letter language, then subtags of 1-8 letters and digits), at most
# 35 characters (§4.4.1): the tag is stored and listed with the consent, so it stays a tag.
LANGUAGE_TAG = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8})*")
MAX_LANGUAGE_CHARS = 35


def primary_language(tag: str) -> str | None:
    """The phrase table's key for a BCP 47 tag ("en-US" -> "en"), or None when it is no such tag or no phrase is
    published for it."""
    tag = tag.strip()
    if len(tag) > MAX_LANGUAGE_CHARS or not LANGUAGE_TAG.fullmatch(tag):
        return None
    primary = tag.replace("_", "-").split("-")[0].lower()
    return primary if primary in CONSENT_PHRASES else None


def _tokens(text: str, language: str) -> list[str]:
    kept = "".join(" " if unicodedata.category(ch)[0] in "PSZC" else ch for ch in unicodedata.normalize("NFKC", text))
    kept = kept.casefold()
    return [ch for ch in kept if not ch.isspace()] if language in BY_CHARACTER else kept.split()


def phrase_heard(transcript: str, language: str) -> float:
    """The share of the language's consent phrase found, in order, in `transcript` (0 to 1)."""
    expected = _tokens(CONSENT_PHRASES[language], language)
    heard = _tokens(transcript, language)
    matcher = SequenceMatcher(None, expected, heard, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / len(expected)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two speaker embeddings."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm > 0 else 0.0
