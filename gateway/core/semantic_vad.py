"""semantic_vad: turn detection that asks a model, at each pause, whether the user has finished.

``SemanticTurnDetector`` runs over server_vad's ``TurnDetector``: at each pause in a turn it asks for the
Smart Turn model (a ``CheckTurn`` the runtime answers with gateway/runtime/smart_turn.py) and ends the
turn on a "complete" verdict, or once an "incomplete" one has waited as long as the eagerness allows.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.audio import Float32Array
from gateway.config import SemanticVadConfig
from gateway.core.vad import SpeechStarted, SpeechStopped, TurnDetector, TurnEvent

SECONDS = 8  # the model sees the last 8 s of a turn, zero-padded in front when shorter


@dataclass(frozen=True, slots=True)
class Eagerness:
    """How readily a pause ends the turn."""

    threshold: float
    """A verdict of P(complete) at or above this ends the turn at once."""
    max_wait_ms: int
    """Silence after which the turn ends whatever the model said."""


def eagerness_levels(cfg: SemanticVadConfig) -> dict[str, Eagerness]:
    """The eagerness levels a session may ask for, from [semantic_vad] (checked by gateway.config.check);
    "auto" is "medium", as at OpenAI."""
    levels = {name: Eagerness(getattr(cfg, f"{name}_threshold"), getattr(cfg, f"{name}_max_wait_ms"))
              for name in ("low", "medium", "high")}
    levels["auto"] = levels["medium"]
    return levels


@dataclass(frozen=True, slots=True)
class CheckTurn:
    """Ask the model whether the turn's audio from ``start_ms`` to ``end_ms`` (input-audio time) is a
    finished turn; hand P(complete) to ``SemanticTurnDetector.verdict(seq, p)``."""

    seq: int
    start_ms: int
    end_ms: int


# Check numbers are unique in the process, so that a verdict can never be taken for another detector's.
_CHECK_SEQ = itertools.count(1)


class SemanticTurnDetector:
    """semantic_vad turn detection: Silero finds speech and pauses, Smart Turn judges each pause.

    Wraps a ``TurnDetector`` whose silence_duration_ms is the pause that triggers the model (``pause_ms``).
    Its first ``SpeechStarted`` opens the turn and is passed on; its ``SpeechStopped`` marks a pause and
    becomes a ``CheckTurn`` on the turn's audio so far. A verdict at or above the eagerness's threshold
    ends the turn (``SpeechStopped`` at the end of the speech, as server_vad reports it); below it, the
    turn stays open: speech that resumes continues the same turn (no second ``SpeechStarted``) and its
    next pause is checked again on the whole turn; silence that lasts ``recheck_ms`` more asks again
    (0 = never), and silence of the eagerness's ``max_wait_ms`` ends the turn whatever the model said.

    While a check is out, the windows fed are held back and replayed once its verdict is in: every
    decision is taken at the audio position it was asked for, so the turns depend on the audio alone,
    not on how fast the model answers or how fast the client streams (a slow model delays a turn's end,
    it never moves it). Times are input-audio milliseconds.
    """

    def __init__(self, vad: TurnDetector, eagerness: Eagerness, pause_ms: int = 200, recheck_ms: int = 0) -> None:
        self.vad = vad
        self.eagerness = eagerness
        self.pause_ms = pause_ms
        self.recheck_ms = recheck_ms
        vad.silence_duration_ms = pause_ms
        self._turn_start: int | None = None
        self._pause_start: int | None = None  # end of the speech, while the turn pauses
        self._pending: int | None = None  # seq of the check awaited
        self._held: list[float] = []  # windows fed while a check is out
        self._next_check_ms = 0

    @property
    def in_speech(self) -> bool:
        """Whether a turn is open (SpeechStarted passed on, no SpeechStopped yet)."""
        return self._turn_start is not None

    @property
    def position_ms(self) -> int:
        """Input time of the end of the last window judged (held windows not included)."""
        return self.vad.position_ms

    def reset(self, until_ms: float = 0.0) -> None:
        """Forget the turn in progress (no event); see ``TurnDetector.reset``. Held windows count as
        fed: they are audio the reset takes too, so none of them can start a turn."""
        held, self._held = self._held, []
        self._turn_start = self._pause_start = self._pending = None
        self.vad.reset(until_ms)
        self.vad.feed(held)

    @property
    def pause_start_ms(self) -> float | None:
        """Where the pause under way began, in a turn: where the turn ends if the pause is its end; else None."""
        return self._pause_start

    def feed(self, probs: Sequence[float] | Float32Array) -> list[TurnEvent | CheckTurn]:
        """Feed the next windows' speech probabilities in order; return the events and checks they cause."""
        if self._pending is not None:
            self._held.extend(map(float, probs))
            return []
        events: list[TurnEvent | CheckTurn] = []
        for i, p in enumerate(probs):
            for ev in self.vad.feed((p,)):
                if isinstance(ev, SpeechStarted):
                    if self._turn_start is None:
                        self._turn_start = ev.audio_start_ms
                        events.append(ev)
                    else:  # the user goes on: the pause was not the end
                        self._pause_start = None
                elif self._turn_start is not None:
                    self._pause_start = ev.audio_end_ms
                    events.append(self._check())
            if self._pause_start is not None and self._pending is None:
                if self.position_ms - self._pause_start >= self.eagerness.max_wait_ms:
                    events.append(self._end())
                elif self.recheck_ms and self.position_ms >= self._next_check_ms:
                    events.append(self._check())
            if self._pending is not None:
                self._held.extend(map(float, probs[i + 1 :]))
                break
        return events

    def verdict(self, seq: int, probability: float | None) -> list[TurnEvent | CheckTurn]:
        """The model's answer to ``CheckTurn`` number ``seq`` (None: the model failed, the wait decides);
        returns what it and the windows held back meanwhile cause."""
        if seq != self._pending:
            return []  # the turn was reset meanwhile
        self._pending = None
        events: list[TurnEvent | CheckTurn] = []
        if probability is not None and probability >= self.eagerness.threshold:
            events.append(self._end())
        held, self._held = self._held, []
        return events + self.feed(held)

    def _check(self) -> CheckTurn:
        assert self._turn_start is not None
        self._pending = next(_CHECK_SEQ)
        self._next_check_ms = self.position_ms + self.recheck_ms
        return CheckTurn(self._pending, self._turn_start, self.position_ms)

    def _end(self) -> SpeechStopped:
        assert self._pause_start is not None
        event = SpeechStopped(audio_end_ms=self._pause_start)
        self._turn_start = self._pause_start = None
        return event
