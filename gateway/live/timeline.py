"""The session timeline: milliseconds of input audio since the session started (a media clock, not wall time).

Output goes out in 100 ms ticks of it; transcript deltas and append acknowledgements fall on its 200 ms grid
(OpenAI's captures put them there); text is spread over the audio that carries it word by word.
"""

from __future__ import annotations

import re

TICK_MS = 100
GRID_MS = 200
# An append's place on the timeline: this long after the timeline position it arrived at (OpenAI acknowledges
# appends 0.6-1.0 s later), one grid step long.
INJECTION_DELAY_MS = 600

_WORD = re.compile(r"\s*\S+")


def grid_floor(ms: float) -> int:
    return int(ms // GRID_MS) * GRID_MS


def words(text: str) -> list[str]:
    """``text`` in words, each with the whitespace before it (their concatenation is the text, less trailing
    whitespace)."""
    return _WORD.findall(text)


def spread(text: str, start_ms: float, end_ms: float) -> list[tuple[int, int, str]]:
    """``text`` spoken from ``start_ms`` to ``end_ms`` as transcript deltas on the grid: (start, end, text), one
    per 200 ms span that a word starts in, each word placed by its share of the characters."""
    pieces = words(text)
    total = sum(len(p) for p in pieces) or 1
    out: list[tuple[int, int, str]] = []
    done = 0
    for piece in pieces:
        at = grid_floor(start_ms + (end_ms - start_ms) * done / total)
        done += len(piece)
        if out and out[-1][0] == at:
            out[-1] = (at, at + GRID_MS, out[-1][2] + piece)
        else:
            out.append((at, at + GRID_MS, piece))
    return out
