"""A session's input side: the uncommitted audio buffer and the turn detector that watches it.

All times are input-audio milliseconds: ``received_ms`` of audio has arrived, the buffer holds the
audio from ``start_ms`` on. The VAD runs behind the input (its results come back later), so the
detector's events carry times, and a commit or clear resets it up to the audio it took.

server_vad ends a turn after silence_duration_ms of silence (``TurnDetector``); semantic_vad asks the
Smart Turn model at each pause (``SemanticTurnDetector``, over the same ``TurnDetector``), so its
detector also returns ``CheckTurn`` requests and takes the verdicts back (``verdict``).
"""

from __future__ import annotations

from collections import deque
from itertools import chain

from gateway.audio import InputDecoder
from gateway.config import Config
from gateway.core.semantic_vad import SECONDS, CheckTurn, SemanticTurnDetector, eagerness_levels
from gateway.core.vad import TurnDetector, TurnEvent
from gateway.realtime.conversation import BYTES_PER_MS
from gateway.realtime.settings import TurnDetection

TRIM_BYTES = 1000 * BYTES_PER_MS
CHUNK_BYTES = 32 * 1024


class PcmBuffer:
    """Bytes appended at the end and dropped from the front, both cheap whatever the length: the bytes in
    chunks of CHUNK_BYTES (a bytearray whose front is cut copies all the rest once it grows again: a second
    dropped from a minute kept cost ~0.3 ms, each second of each session). Appends of any size, tiny ones
    too, take no more room than their bytes and one chunk."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._tail = bytearray()  # the chunk being filled
        self._head = 0  # bytes of the first chunk already dropped
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, data: bytes) -> None:
        self._tail += data
        self._len += len(data)
        if len(self._tail) >= CHUNK_BYTES:
            self._chunks.append(bytes(self._tail))
            self._tail.clear()

    def drop(self, n: int) -> None:
        """Drop the first ``n`` bytes."""
        n = min(n, self._len)
        self._len -= n
        n += self._head
        while self._chunks and n >= len(self._chunks[0]):
            n -= len(self._chunks.popleft())
        if self._chunks:
            self._head = n
        else:
            del self._tail[:n]
            self._head = 0

    def get(self, begin: int, stop: int) -> bytes:
        """A copy of bytes ``begin`` to ``stop``."""
        begin, stop = begin + self._head, min(stop, self._len) + self._head
        pieces, at = [], 0
        for chunk in chain(self._chunks, (self._tail,)):
            if at >= stop:
                break
            if at + len(chunk) > begin:
                pieces.append(chunk[max(0, begin - at) : stop - at])
            at += len(chunk)
        return b"".join(pieces)

    def clear(self) -> None:
        self._chunks.clear()
        self._tail.clear()
        self._head = self._len = 0


class InputAudio:
    def __init__(self, config: Config, input_format: str) -> None:
        self._config = config.session
        vad = config.vad
        self.decoder = InputDecoder(input_format)
        self.detector = TurnDetector(
            threshold=vad.threshold,
            prefix_padding_ms=vad.prefix_padding_ms,
            silence_duration_ms=vad.silence_duration_ms,
            min_speech_ms=vad.min_speech_ms,
        )
        self._semantic_config = config.semantic_vad
        self._eagerness = eagerness_levels(config.semantic_vad)
        self.semantic: SemanticTurnDetector | None = None  # while turn detection is semantic_vad
        self.buffer = PcmBuffer()  # uncommitted input, pcm16 24 kHz
        self.start_ms = 0.0  # input-audio time of buffer[0]
        self.received_ms = 0.0
        self.speech: tuple[str, float] | None = None  # (item id, audio_start_ms) while the user speaks
        self.idle_since_ms = 0.0

    @property
    def buffered_ms(self) -> float:
        return len(self.buffer) / BYTES_PER_MS

    def set_format(self, input_format: str) -> bytes:
        """Switch the input format; returns the audio the old decoder still held (it belongs to the buffer)."""
        tail = self.decoder.flush()
        self.decoder = InputDecoder(input_format)
        return tail

    def tune(self, td: TurnDetection | None) -> None:
        """Follow the session's turn detection settings (the session ends any speech in progress first when
        the kind changes)."""
        if td is None or td.type != "semantic_vad":
            if self.semantic is not None:
                self.semantic.reset(self.received_ms)  # hands the windows it held back to the detector
                self.semantic = None
            if td is not None:
                self.detector.silence_duration_ms = td.silence_duration_ms
        if td is None:
            return
        self.detector.threshold = td.threshold
        self.detector.prefix_padding_ms = td.prefix_padding_ms
        if td.type == "semantic_vad":
            eagerness = self._eagerness[td.eagerness]
            if self.semantic is None:
                cfg = self._semantic_config
                self.semantic = SemanticTurnDetector(self.detector, eagerness, cfg.pause_ms, cfg.recheck_ms)
            self.semantic.eagerness = eagerness

    def add(self, pcm: bytes, td: TurnDetection | None) -> tuple[float, float] | None:
        """Append input audio; returns the (start, end) ms of audio a full buffer dropped that a commit
        would have taken (idle audio dropped while VAD listens is not reported)."""
        self.buffer.append(pcm)
        self.received_ms += len(pcm) / BYTES_PER_MS
        return self._trim(td)

    def take(self, start_ms: float, end_ms: float) -> bytes:
        """The buffered audio from ``start_ms`` to ``end_ms``, removed with everything before it."""
        begin, stop = self._span(start_ms, end_ms)
        audio = self.buffer.get(begin, stop)
        self.buffer.drop(stop)
        self.start_ms += stop / BYTES_PER_MS
        return audio

    def clear(self) -> None:
        self.decoder.reset()
        self.buffer.clear()
        self.start_ms = self.received_ms
        self.end_speech()

    def peek(self, start_ms: float, end_ms: float) -> bytes:
        """The buffered audio from ``start_ms`` to ``end_ms``, left in the buffer."""
        begin, stop = self._span(start_ms, end_ms)
        return self.buffer.get(begin, stop)

    def _span(self, start_ms: float, end_ms: float) -> tuple[int, int]:
        begin = max(0, int((start_ms - self.start_ms) * BYTES_PER_MS) & ~1)
        return begin, max(begin, int((end_ms - self.start_ms) * BYTES_PER_MS) & ~1)

    def end_speech(self) -> None:
        """The client took the turn (commit, clear, VAD off): the speech in progress is not a turn."""
        self.speech = None
        (self.semantic or self.detector).reset(until_ms=self.received_ms)

    def feed(self, probabilities) -> list[TurnEvent | CheckTurn]:
        return (self.semantic or self.detector).feed(probabilities)

    def check_audio(self, check: CheckTurn) -> bytes:
        """What the model judges for ``check``: the turn's audio so far, its last 8 s at most."""
        return self.peek(max(check.start_ms, check.end_ms - SECONDS * 1000), check.end_ms)

    def verdict(self, seq: int, probability: float | None) -> list[TurnEvent | CheckTurn]:
        if self.semantic is None:
            return []  # semantic_vad was switched off meanwhile
        return self.semantic.verdict(seq, probability)

    @property
    def heard_ms(self) -> float:
        """Input time the VAD has analysed (it may trail the input)."""
        return min(self.detector.position_ms, self.received_ms)

    def _trim(self, td: TurnDetection | None) -> tuple[float, float] | None:
        """Bound the uncommitted buffer. With VAD on and no speech, a VAD turn needs only the prefix
        padding, but a manual commit or an idle timeout commits what is there: keep idle_buffer_seconds."""
        cfg = self._config
        idle = td is not None and self.speech is None
        if idle:
            keep_ms = max(td.prefix_padding_ms + 1000, cfg.idle_buffer_seconds * 1000)
        else:
            keep_ms = cfg.max_buffer_seconds * 1000
        keep = int(keep_ms) * BYTES_PER_MS
        # Trimmed a second at a time, not per append.
        if len(self.buffer) < keep + TRIM_BYTES:
            return None
        excess = len(self.buffer) - keep
        self.buffer.drop(excess)
        start = self.start_ms
        self.start_ms += excess / BYTES_PER_MS
        return None if idle else (start, self.start_ms)
