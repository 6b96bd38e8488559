"""gateway.audio_codecs' reading of uploads: what FFmpeg decodes of a hostile or unusual file is audio or a
clear AudioFileError, never another exception (the upload routes answer the one with 400/415, the other
would be a 500)."""

from __future__ import annotations

import io
import random
import struct

import numpy as np
import pytest

av = pytest.importorskip("av")

from gateway.audio_codecs import AudioFileError, decode_upload  # noqa: E402 - after PyAV is known present

RATE = 24_000


def encoded(fmt: str, codec: str, rate: int, seconds: float = 1.0) -> bytes:
    """A sine tone as a `fmt` file of `codec` at `rate`."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "mono"
        tone = (np.sin(np.arange(int(rate * seconds)) / 10) * 9000).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(tone[None, :], format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buf.getvalue()


def wav(data: bytes, *, bits: int, tag: int = 1, rate: int = RATE) -> bytes:
    """A mono WAV file with a hand-made header (`tag` 1: integer PCM, 3: float)."""
    fmt = struct.pack("<HHIIHH", tag, 1, rate, rate * max(bits, 8) // 8, bits // 8, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_a_stream_that_changes_its_rate_midway_decodes_whole() -> None:
    joined = encoded("adts", "aac", 24_000) + encoded("adts", "aac", 48_000)
    assert abs(len(decode_upload(joined, 30)) / RATE - 2.0) < 0.15


@pytest.mark.parametrize(("name", "data", "words"), [
    ("no decoder", wav(b"\x01\x00" * 1000, bits=0), "cannot be decoded"),
    ("NaN", wav(struct.pack("<d", float("nan")) * RATE, bits=64, tag=3), "not numbers"),
    ("infinity", wav(struct.pack("<f", float("inf")) * RATE, bits=32, tag=3), "not numbers"),
])
def test_a_damaged_file_is_invalid_saying_why(name: str, data: bytes, words: str) -> None:
    with pytest.raises(AudioFileError) as refused:
        decode_upload(data, 30)
    assert refused.value.kind == "invalid" and words in str(refused.value)


def test_loud_float_samples_are_clipped_not_passed_on() -> None:
    audio = decode_upload(wav(struct.pack("<f", 40.0) * RATE, bits=32, tag=3), 30)
    assert audio.max() == 1.0


@pytest.mark.parametrize(("fmt", "codec", "rate"), [
    ("wav", "pcm_s16le", RATE), ("flac", "flac", RATE), ("mp3", "libmp3lame", RATE), ("ogg", "libopus", 48_000),
    ("mp4", "aac", RATE), ("adts", "aac", RATE), ("webm", "libopus", 48_000),
])
def test_mutated_files_are_audio_or_an_audio_file_error(fmt: str, codec: str, rate: int) -> None:
    rng = random.Random(f"{fmt}-{codec}")
    seed = encoded(fmt, codec, rate)
    for _ in range(150):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 8)):  # most in the headers, where a decoder's setup is read
            data[rng.randrange(min(len(data), 200) if rng.random() < 0.7 else len(data))] = rng.randrange(256)
        if rng.random() < 0.2:
            del data[rng.randrange(len(data)):]
        try:
            decode_upload(bytes(data), 30)
        except AudioFileError:
            pass
