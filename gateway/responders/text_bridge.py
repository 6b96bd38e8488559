"""Cuts streamed LLM text into segments for a non-incremental TTS engine (sans I/O).

The first audio of a response can start only when the first segment is complete, so the first
segment (the starter) is short: it ends at the first punctuation or at the first word boundary past
``starter_chars``. Later segments end at sentence or clause punctuation, so each is spoken with
natural prosody; a run without punctuation is cut at a word boundary before ``max_segment_chars``
(by characters in CJK text, which has no spaces). ``end`` flushes what is left.

A segment keeps the whitespace that came before it in the LLM's text, so the segments joined are
the reply as written (the transcript); strip a segment before it goes to the engine.

Segmentation depends only on the text, never on how the LLM split it into deltas: a cut is made
only once the characters that decide it have arrived (a ``.`` is a cut only when followed by a
space, so ``3.5`` stays whole; this holds back one delta at most).
"""

from __future__ import annotations

LATIN_PUNCT = frozenset(".,!?;:")
CJK_PUNCT = frozenset("。！？，、；：")
PUNCT = LATIN_PUNCT | CJK_PUNCT
# Closing quotes and brackets stay with the punctuation they follow: `He said "yes."` is one segment.
CLOSERS = frozenset("\"')]}”’»」』）】〉》")
# Words whose trailing "." does not end a sentence.
ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "vs", "jr", "sr", "e.g", "i.e"})


def is_cjk(ch: str) -> bool:
    """Characters of scripts written without spaces between words (Chinese, Japanese kana)."""
    o = ord(ch)
    return (
        0x3000 <= o <= 0x30FF  # CJK punctuation, hiragana, katakana
        or 0x3400 <= o <= 0x4DBF
        or 0x4E00 <= o <= 0x9FFF
        or 0xF900 <= o <= 0xFAFF
        or 0xFF00 <= o <= 0xFFEF  # full-width forms
        or 0x20000 <= o <= 0x2FFFF
    )


def _speakable(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


class TextBridge:
    """Feed LLM deltas with ``feed``; each call returns the segments completed so far."""

    def __init__(self, starter_chars: int = 24, max_segment_chars: int = 160) -> None:
        if starter_chars < 1 or max_segment_chars < 2:
            raise ValueError("starter_chars must be >= 1 and max_segment_chars >= 2")
        self.starter_chars = starter_chars
        self.max_segment_chars = max_segment_chars
        self._buf = ""
        self._scan = 0  # no cut ends before this index of _buf (already decided)
        self._starter = True

    def feed(self, text: str) -> list[str]:
        self._buf += text
        if self._starter and self._scan == 0:
            self._buf = self._buf.lstrip()  # the reply's leading whitespace
        return self._cuts(final=False)

    def end(self) -> list[str]:
        """The remaining segments once the LLM is done; the bridge is then ready for a new response."""
        segments = self._cuts(final=True)
        rest = self._buf.rstrip()
        if _speakable(rest):
            segments.append(rest)
        self._buf, self._scan, self._starter = "", 0, True
        return segments

    def _cuts(self, final: bool) -> list[str]:
        segments = []
        while (cut := self._next_cut(final)) is not None:
            segments.append(self._buf[:cut])
            self._buf = self._buf[cut:]
            self._scan = 0
            self._starter = False
        return segments

    def _word_boundary(self, p: int) -> bool:
        """Whether a cut between _buf[p-1] and _buf[p] splits no word."""
        buf = self._buf
        if not 0 < p < len(buf) or buf[p] in PUNCT or buf[p] in CLOSERS:
            return False
        return buf[p].isspace() or is_cjk(buf[p - 1]) or is_cjk(buf[p])

    def _next_cut(self, final: bool) -> int | None:
        buf, n, cap = self._buf, len(self._buf), self.max_segment_chars
        i = self._scan
        while i < min(n, cap):
            ch = buf[i]
            cut = None
            if ch == "\n":
                cut = i + 1
            elif ch in PUNCT:
                j = i + 1
                while j < n and (buf[j] in PUNCT or buf[j] in CLOSERS):
                    j += 1
                if j == n and not final:
                    self._scan = i  # undecided until the next character comes
                    return None
                if (
                    j == n or any(c in CJK_PUNCT for c in buf[i:j]) or buf[j].isspace() or is_cjk(buf[j])
                ) and not self._abbreviation(i, j):
                    cut = j
                else:
                    i = j
                    continue
            elif self._starter and i >= self.starter_chars and self._word_boundary(i):
                cut = i
            if cut is not None and _speakable(buf[:cut]):
                return cut
            i += 1
        self._scan = i
        if n > cap:
            # No punctuation within the cap: cut at the last word boundary, or mid-word in a giant word.
            for p in range(cap, 0, -1):
                if self._word_boundary(p) and _speakable(buf[:p]):
                    return p
            return cap
        return None

    def _abbreviation(self, i: int, j: int) -> bool:
        if self._buf[i:j] != ".":
            return False
        start = i
        while start > 0 and not self._buf[start - 1].isspace():
            start -= 1
        return self._buf[start:i].lower() in ABBREVIATIONS
