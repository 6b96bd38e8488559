"""server_vad: turn detection over the VAD's speech probabilities, one per 32 ms window of input audio.

No model and no I/O: the runtime runs Silero (gateway/runtime/silero.py) and feeds the probabilities in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

WINDOW_MS = 32  # input audio per speech probability (Silero's window: 512 samples at 16 kHz)


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    audio_start_ms: int
    """Start of the speech minus prefix_padding_ms (clamped to ``floor_ms``), in input-audio time."""


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    audio_end_ms: int
    """End of the last speech window, in input-audio time."""


TurnEvent = SpeechStarted | SpeechStopped


class TurnDetector:
    """server_vad turn detection over Silero probabilities (no I/O, no model: feed it numbers).

    Hysteresis as in Silero's VADIterator: speech begins at a window with p >= threshold; a silence
    run begins at a window with p < threshold − 0.15 (floored at 0.01) and is cancelled by a window
    with p >= threshold; windows in between continue whatever is under way. Speech stops once the
    silence run has lasted silence_duration_ms.

    min_speech_ms (default 64, two windows) keeps a single-window spike from starting a turn: a start
    is reported only once speech has held (no window below the low threshold) that long, so
    speech_started comes min_speech_ms after the onset (one window later than without it), while
    audio_start_ms still points at the onset. Silero itself already ignores clicks, knocks, claps and
    noise bursts (measured: none reaches 0.35), and even "uh" lasts 8 windows, so more would only
    delay barge-in.

    Times are input-audio milliseconds: ``start_ms`` is the input time of the first window fed, and
    each window adds 32 ms, so a client streaming faster than real time gets the same events.
    The parameters are plain attributes; changing them between feeds takes effect at the next window.
    """

    def __init__(
        self,
        threshold: float = 0.5,
        prefix_padding_ms: int = 300,
        silence_duration_ms: int = 500,
        min_speech_ms: int = 64,
        start_ms: int = 0,
    ) -> None:
        self.threshold = threshold
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms
        self.min_speech_ms = min_speech_ms
        self.start_ms = start_ms
        self.floor_ms = start_ms
        """audio_start_ms never goes below this; raised to the detection time at each stop. The session
        may raise it too (after a manual commit or a clear) so padding never reaches committed audio."""
        self._windows = 0
        self._skip_until_ms = 0.0
        self._onset_ms: int | None = None  # candidate or confirmed speech start
        self._confirmed = False
        self._silence_ms: int | None = None  # start of the current silence run while in speech

    @property
    def in_speech(self) -> bool:
        """Whether SpeechStarted has been emitted without a matching SpeechStopped yet."""
        return self._confirmed

    @property
    def pause_ms(self) -> int | None:
        """Start of the silence run under way in confirmed speech (where its turn ends if the silence
        lasts silence_duration_ms), else None."""
        return self._silence_ms if self._confirmed else None

    @property
    def position_ms(self) -> int:
        """Input time of the end of the last window fed."""
        return self.start_ms + self._windows * WINDOW_MS

    def reset(self, until_ms: float = 0.0) -> None:
        """Forget any speech in progress (no event).

        The audio before ``until_ms`` is gone (committed or cleared), also the part not fed yet: the
        windows that end there start no speech, and no speech starts before it.
        """
        self._skip_until_ms = until_ms
        self.floor_ms = max(self.floor_ms, self.position_ms, math.ceil(until_ms))
        self._onset_ms = None
        self._confirmed = False
        self._silence_ms = None

    def feed(self, probs: Iterable[float]) -> list[TurnEvent]:
        """Feed the next windows' probabilities in order; return the events they cause."""
        events: list[TurnEvent] = []
        for p in probs:
            begin = self.position_ms
            self._windows += 1
            end = begin + WINDOW_MS
            if end <= self._skip_until_ms:
                continue
            low = max(self.threshold - 0.15, 0.01)
            if self._onset_ms is None:
                if p >= self.threshold:
                    self._onset_ms = begin
                    self._silence_ms = None
            elif not self._confirmed and p < low:
                self._onset_ms = None  # too short: a click, not speech
                continue
            if self._onset_ms is None:
                continue
            if not self._confirmed:
                if end - self._onset_ms >= self.min_speech_ms:
                    self._confirmed = True
                    start = max(self._onset_ms - self.prefix_padding_ms, self.floor_ms, 0)
                    events.append(SpeechStarted(audio_start_ms=start))
                continue
            if p >= self.threshold:
                self._silence_ms = None
            elif p < low and self._silence_ms is None:
                self._silence_ms = begin
            if self._silence_ms is not None and end - self._silence_ms >= self.silence_duration_ms:
                events.append(SpeechStopped(audio_end_ms=self._silence_ms))
                self._onset_ms = None
                self._confirmed = False
                self._silence_ms = None
                self.floor_ms = max(self.floor_ms, end)
        return events
