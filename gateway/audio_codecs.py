"""Audio files and streams in the formats of OpenAI's audio APIs, through PyAV (FFmpeg's codecs and
containers, inside its wheel): what /v1/audio/speech sends and what the voice routes receive.

``SpeechEncoder`` turns the engine's pcm16 mono 24 kHz, chunk by chunk, into a response format's bytes as
soon as the codec makes them (a container that would wait for the end is told to write at once: Ogg pages
per packet, WAV and FLAC headers that need no seek back), with the speed change (FFmpeg's ``atempo``,
pitch kept) before the codec. ``decode_upload`` reads an uploaded file of the accepted containers into
float32 mono at the rate asked for, refusing what is not audio, is cut short, or is too long.

PyAV is a dependency of the package; a host that runs the gateway from a bare set of wheels without it (the
GPU benchmark host, whose wheels python -m bench.wheels gathers) serves pcm at speed 1 only, and says so (NoCodecs) for
the rest.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from gateway.audio import SAMPLE_RATE

try:
    import av
    import av.filter
except ImportError:  # see the docstring: pcm only
    av = None


class NoCodecs(RuntimeError):
    """PyAV is not installed: only pcm at speed 1 can be answered, and no upload read."""


def _require_av(what: str) -> None:
    if av is None:
        raise NoCodecs(f"{what} needs PyAV (pip install av), which this host lacks")


@dataclass(frozen=True)
class ResponseFormat:
    content_type: str
    container: str | None = None  # None: the raw samples, no codec
    codec: str = ""
    container_options: dict[str, str] = field(default_factory=dict)


# What OpenAI's speech endpoint answers with, all at 24 kHz mono. `fflags +bitexact` leaves out the encoder's
# name tag; an Ogg page per packet sends opus as it is made (the muxer would hold a second of it).
RESPONSE_FORMATS: dict[str, ResponseFormat] = {
    "mp3": ResponseFormat("audio/mpeg", "mp3", "libmp3lame", {"fflags": "+bitexact"}),
    "opus": ResponseFormat("audio/ogg", "ogg", "libopus", {"fflags": "+bitexact", "page_duration": "1"}),
    "aac": ResponseFormat("audio/aac", "adts", "aac", {"fflags": "+bitexact"}),
    "flac": ResponseFormat("audio/flac", "flac", "flac", {"fflags": "+bitexact"}),
    "wav": ResponseFormat("audio/wav", "wav", "pcm_s16le", {"fflags": "+bitexact"}),
    "pcm": ResponseFormat("audio/pcm"),
}

MIN_SPEED, MAX_SPEED = 0.25, 4.0
# One atempo filter takes 0.5 to 100; a slower speed is a chain of them.
_ATEMPO_MIN = 0.5


class _Sink(io.RawIOBase):
    """A container's output: not seekable, so the muxer writes as it goes (headers with open-ended sizes
    where it would otherwise seek back at the end), and `take` hands on what it wrote since."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class _Tempo:
    """FFmpeg's atempo on a pcm16 stream: the speech faster or slower, its pitch kept."""

    def __init__(self, speed: float) -> None:
        self.graph = av.filter.Graph()
        node = self.graph.add_abuffer(format="s16", sample_rate=SAMPLE_RATE, layout="mono",
                                      time_base=Fraction(1, SAMPLE_RATE))
        source, factors = node, []
        while speed < _ATEMPO_MIN:
            factors.append(_ATEMPO_MIN)
            speed /= _ATEMPO_MIN
        factors.append(speed)
        for factor in factors:
            tempo = self.graph.add("atempo", f"{factor:.6f}")
            node.link_to(tempo)
            node = tempo
        sink = self.graph.add("abuffersink")
        node.link_to(sink)
        self.graph.configure()
        self.source = source
        self.pts = 0

    def process(self, frame: av.AudioFrame | None) -> list[av.AudioFrame]:
        if frame is not None:
            frame.pts = self.pts
            self.pts += frame.samples
        self.graph.push(frame)
        out = []
        while True:
            try:
                out.append(self.graph.pull())
            except (av.BlockingIOError, av.EOFError):
                return out


class SpeechEncoder:
    """pcm16 mono 24 kHz in, a response format's bytes out: ``encode`` each chunk as it comes (what the
    codec has made so far comes back), then ``finish``."""

    def __init__(self, response_format: str, speed: float = 1.0) -> None:
        spec = RESPONSE_FORMATS[response_format]
        if spec.container is not None or speed != 1.0:
            _require_av(f"response_format {response_format!r}" + (f" at speed {speed:g}" if speed != 1.0 else ""))
        self.content_type = spec.content_type
        self.tempo = _Tempo(speed) if speed != 1.0 else None
        self.sink: _Sink | None = None
        if spec.container is not None:
            self.sink = _Sink()
            self.container = av.open(self.sink, "w", format=spec.container, options=spec.container_options)
            self.stream = self.container.add_stream(spec.codec, rate=SAMPLE_RATE, layout="mono")
        self.samples_in = self.samples_out = 0

    @property
    def passthrough(self) -> bool:
        """pcm at speed 1: the bytes go out as they are (nothing to run off the event loop)."""
        return self.sink is None and self.tempo is None

    def encode(self, pcm: bytes) -> bytes:
        samples = np.frombuffer(pcm, dtype="<i2")
        self.samples_in += len(samples)
        if self.passthrough:
            self.samples_out += len(samples)
            return pcm
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        return self._out([frame] if self.tempo is None else self.tempo.process(frame))

    def finish(self) -> bytes:
        frames = self.tempo.process(None) if self.tempo is not None else []
        tail = self._out(frames)
        if self.sink is None:
            return tail
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.container.close()
        return tail + self.sink.take()

    def _out(self, frames: list[av.AudioFrame]) -> bytes:
        self.samples_out += sum(f.samples for f in frames)
        if self.sink is None:
            return b"".join(bytes(f.to_ndarray().astype("<i2").tobytes()) for f in frames)
        for frame in frames:
            for packet in self.stream.encode(frame):
                self.container.mux(packet)
        return self.sink.take()


# --- uploads -------------------------------------------------------------------------------------

# FFmpeg's names for the containers OpenAI accepts (mpeg, wav, ogg, aac, flac, webm, mp4), and the audio
# codecs read from them; anything else is refused before it reaches a decoder.
ACCEPTED_CONTAINERS = frozenset({"mp3", "wav", "ogg", "aac", "flac", "matroska,webm", "mov,mp4,m4a,3gp,3g2,mj2"})
ACCEPTED_CODECS = frozenset({"mp3", "mp3float", "aac", "opus", "libopus", "vorbis", "flac", "alac", "pcm_u8",
                             "pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_f32le", "pcm_f64le", "pcm_mulaw",
                             "pcm_alaw", "pcm_s16be", "pcm_s24be", "pcm_s32be", "pcm_f32be"})
ACCEPTED_MEDIA_TYPES = ("audio/mpeg", "audio/wav", "audio/x-wav", "audio/ogg", "audio/aac", "audio/flac",
                        "audio/webm", "audio/mp4")
# Containers whose header states the duration (mp3's Xing frame, FLAC's STREAMINFO, webm and mp4 headers):
# a file of these that decodes to less than that (by more than a frame or two, or 5 %) was cut short.
# FFmpeg estimates the others' from the bit rate (ADTS) or reads it from the last page there (Ogg).
STATED_DURATION = frozenset({"mp3", "flac", "matroska,webm", "mov,mp4,m4a,3gp,3g2,mj2"})
TRUNCATION_TOLERANCE_S = 0.1


class AudioFileError(ValueError):
    """An upload that cannot be used: ``unsupported`` (not audio of an accepted kind: HTTP 415), ``invalid``
    (damaged or cut short) or ``too_long``; the message says why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def decode_upload(data: bytes, max_seconds: float, rate: int = SAMPLE_RATE) -> npt.NDArray[np.float32]:
    """An uploaded audio file's first audio track as float32 mono at `rate`; AudioFileError when it is not
    audio of the accepted containers and codecs, is damaged or cut short, or holds more than `max_seconds`
    (decoding stops there, so a small file that expands to hours costs no more than the limit); NoCodecs
    without PyAV."""
    _require_av("reading an uploaded recording")
    try:
        container = av.open(io.BytesIO(data), "r")
    except (av.FFmpegError, ValueError, UnicodeDecodeError):
        raise AudioFileError("unsupported", "the file is not audio in a supported format (mp3, wav, ogg, aac, "
                                            "flac, webm or mp4)") from None
    with container:
        fmt = container.format.name
        if fmt not in ACCEPTED_CONTAINERS or not container.streams.audio:
            raise AudioFileError("unsupported", f"the file is {fmt!r} without accepted audio; send mp3, wav, ogg, "
                                                "aac, flac, webm or mp4")
        stream = container.streams.audio[0]
        if stream.codec_context is None:  # a damaged header that names no decoder FFmpeg has
            raise AudioFileError("invalid", "the file's audio track cannot be decoded; the file is damaged")
        codec = stream.codec_context.name
        if codec not in ACCEPTED_CODECS:
            raise AudioFileError("unsupported", f"the audio codec {codec!r} is not accepted")
        limit = int(max_seconds * rate)
        pieces: list[np.ndarray] = []
        decoded = 0
        try:
            for out in _resampled(container.decode(stream), rate):
                pieces.append(out.to_ndarray()[0])
                decoded += out.samples
                if decoded > limit:
                    raise AudioFileError("too_long", f"the audio is longer than {max_seconds:g} s")
        except av.FFmpegError as exc:
            raise AudioFileError("invalid", f"the audio cannot be decoded ({exc.strerror or type(exc).__name__}); "
                                            "the file is damaged or cut short") from None
        declared = _declared_seconds(container, stream) if fmt in STATED_DURATION else None
    if decoded > limit:
        raise AudioFileError("too_long", f"the audio is longer than {max_seconds:g} s")
    if decoded == 0:
        raise AudioFileError("invalid", "the file holds no audio")
    if declared is not None and declared - decoded / rate > TRUNCATION_TOLERANCE_S + 0.05 * declared:
        raise AudioFileError("invalid", f"the file is cut short: its header promises {declared:.2f} s, "
                                        f"{decoded / rate:.2f} s decode")
    if fmt == "wav" and _wav_cut_short(data):
        raise AudioFileError("invalid", "the WAV file is cut short: it holds fewer bytes than its header says")
    audio = np.concatenate(pieces).astype(np.float32, copy=False)
    if not np.isfinite(audio).all():  # float PCM can carry them, and they would poison every model downstream
        raise AudioFileError("invalid", "the audio holds samples that are not numbers (NaN or infinity)")
    return np.clip(audio, -1.0, 1.0, out=audio)


def _resampled(frames: Iterator[av.AudioFrame], rate: int) -> Iterator[av.AudioFrame]:
    """Decoded frames as float32 mono at `rate`. A track may change its rate or layout midway (ADTS or MP3
    streams joined end to end), and a resampler takes one input format: each run of frames gets its own."""
    resampler, shape = None, None
    for frame in frames:
        if (frame.format.name, frame.layout.name, frame.sample_rate) != shape:
            if resampler is not None:
                yield from resampler.resample(None)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            shape = (frame.format.name, frame.layout.name, frame.sample_rate)
        yield from resampler.resample(frame)
    if resampler is not None:
        yield from resampler.resample(None)


def _declared_seconds(container: av.container.InputContainer, stream: av.AudioStream) -> float | None:
    """The duration the file's header gives, when it gives one."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _wav_cut_short(data: bytes) -> bool:
    """FFmpeg reads a cut WAV file without complaint (its duration comes from the bytes there): the RIFF
    header's size says what the file should hold. A WAV written as a stream promises nothing: its size is
    left 0 or set to a placeholder near the format's 2 or 4 GiB limit (0xFFFFFFFF; espeak-ng writes
    0x7FFFF024), far beyond any upload accepted here."""
    size = int.from_bytes(data[4:8], "little")
    return 0 < size < 0x7FFF0000 and size + 8 > len(data)
