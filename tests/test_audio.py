"""gateway.audio: G.711 bit-exactness, streaming resampling, client format decoding and encoding."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
import soxr

from gateway import audio
from gateway.audio import InputDecoder, OutputEncoder, RationalResampler, StreamResampler
from tests.conftest import split

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))


def _audioop():
    """CPython's audioop (3.11/3.12 only): the reference implementation of G.711, used in tests only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return importlib.import_module("audioop")
        except ImportError:
            pytest.skip("audioop is not available on this Python")




def _sine(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


def _snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    ref, test = ref.astype(np.float64), test.astype(np.float64)
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - test) ** 2), 1e-30)))


# --- G.711 ---


def test_g711_matches_audioop_for_every_value() -> None:
    audioop = _audioop()
    pcm = ALL_INT16.astype("<i2").tobytes()
    assert audio.ulaw_encode(ALL_INT16) == audioop.lin2ulaw(pcm, 2)
    assert audio.alaw_encode(ALL_INT16) == audioop.lin2alaw(pcm, 2)
    assert audio.ulaw_decode(ALL_CODES).astype("<i2").tobytes() == audioop.ulaw2lin(ALL_CODES, 2)
    assert audio.alaw_decode(ALL_CODES).astype("<i2").tobytes() == audioop.alaw2lin(ALL_CODES, 2)


def test_g711_classic_table_values() -> None:
    # Values from the ITU-T G.711 tables (as in Sun's g711.c): silence codes, extremes, sign bits.
    ulaw = audio.ulaw_decode(bytes([0x00, 0x0F, 0x10, 0x1F, 0x20, 0x7E, 0x7F, 0x80, 0xFF]))
    assert ulaw.tolist() == [-32124, -16764, -15996, -8316, -7932, -8, 0, 32124, 0]
    alaw = audio.alaw_decode(bytes([0x00, 0x01, 0x2A, 0x55, 0x80, 0xAA, 0xD5]))
    assert alaw.tolist() == [-5504, -5248, -32256, -8, 5504, 32256, 8]
    edges = np.array([0, -1, 32767, -32768], dtype=np.int16)
    assert audio.ulaw_encode(edges) == bytes([0xFF, 0x7E, 0x80, 0x00])
    assert audio.alaw_encode(edges) == bytes([0xD5, 0x55, 0xAA, 0x2A])


def test_g711_round_trip() -> None:
    # Every code decodes to a value that encodes back to it, except mu-law's "negative zero" 0x7F.
    assert audio.alaw_encode(audio.alaw_decode(ALL_CODES)) == ALL_CODES
    ulaw_codes = bytes(c for c in range(256) if c != 0x7F)
    assert audio.ulaw_encode(audio.ulaw_decode(ulaw_codes)) == ulaw_codes
    # Quantisation error stays within half a step of a 13/14-bit log scale: < 1/16 of the magnitude
    # beyond the linear segments.
    for enc, dec in ((audio.ulaw_encode, audio.ulaw_decode), (audio.alaw_encode, audio.alaw_decode)):
        x = ALL_INT16.astype(np.int32)
        err = np.abs(dec(enc(ALL_INT16)).astype(np.int32) - x)
        assert np.all(err <= np.maximum(np.abs(x) // 16, 132))


# --- StreamResampler ---


@pytest.mark.parametrize(("rate_in", "rate_out"), [(24_000, 16_000), (8_000, 24_000), (24_000, 8_000)])
def test_resampler_chunking_does_not_change_output(rate_in: int, rate_out: int) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(rate_in) * 4000).astype(np.int16)  # 1 s of loud noise

    def run(sizes: list[int]) -> np.ndarray:
        rs = StreamResampler(rate_in, rate_out)
        parts, i, k = [], 0, 0
        while i < len(x):
            parts.append(rs.process(x[i : i + sizes[k % len(sizes)]]))
            i += sizes[k % len(sizes)]
            k += 1
        parts.append(rs.flush())
        return np.concatenate(parts)

    whole = run([len(x)])
    assert len(whole) == rate_out
    for sizes in ([rate_in // 50], [1, 7, 333, 2], [4099, 13]):
        assert np.array_equal(run(sizes), whole)


def test_resampler_has_no_crackle_and_is_time_aligned() -> None:
    x = _sine(440, 8_000, 1.0)
    rs = StreamResampler(8_000, 24_000, dtype="float32")
    y = np.concatenate([rs.process(c) for c in np.array_split(x, 50)] + [rs.flush()])
    # Against the ideal 24 kHz sine (away from the edges where the filter sees zeros): 20 ms
    # chunks without carried state measure ~50 dB here, with crackle at every boundary.
    ideal = _sine(440, 24_000, 1.0)
    assert _snr_db(ideal[1200:-1200], y[1200:-1200]) > 90
    assert _snr_db(soxr.resample(x, 8_000, 24_000), y) > 90
    # soxr compensates its filter delay: an impulse comes out at the same time.
    impulse = np.zeros(24_000, dtype=np.float32)
    impulse[12_000] = 1.0
    rs = StreamResampler(24_000, 16_000, dtype="float32")
    out = np.concatenate([rs.process(c) for c in np.array_split(impulse, 37)] + [rs.flush()])
    assert int(np.argmax(out)) == 8_000


@pytest.mark.parametrize(("up", "down", "chunk"), [(3, 1, 160), (1, 3, 480), (2, 3, 480), (3, 2, 320), (1, 3, 101)])
def test_rational_resampler_is_its_filter_whatever_the_chunks(up: int, down: int, chunk: int) -> None:
    """The phone path's resampler: the polyphase filter's output (float64 here, to 1 LSB), the same in any
    chunking, with its fixed delay of taps / 2 input samples."""
    x = (np.random.default_rng(up * 10 + down).standard_normal(8000) * 6000).astype(np.int16)
    rs = RationalResampler(up, down)
    got = np.concatenate([rs.process(x[i : i + chunk]) for i in range(0, len(x), chunk)] + [rs.flush()])
    whole = RationalResampler(up, down)
    assert np.array_equal(got, np.concatenate([whole.process(x), whole.flush()]))
    taps = rs.taps
    n = np.arange(up * taps) - (up * taps - 1) / 2
    cutoff = 1 / max(up, down)
    h = cutoff * np.sinc(cutoff * n) * np.kaiser(up * taps, 8.0) * up
    stuffed = np.zeros(len(x) * up + taps // 2 * up)
    stuffed[: len(x) * up : up] = x
    expected = np.convolve(stuffed, h)[: len(stuffed)][::down]
    assert len(got) == len(expected)
    assert np.abs(got - np.clip(np.rint(expected), -32768, 32767)).max() <= 1


def test_resampler_flush_readies_a_new_stream_and_checks_dtype() -> None:
    x = (_sine(300, 24_000, 0.2) * 32767).astype(np.int16)
    fresh = StreamResampler(24_000, 8_000)
    first = np.concatenate([fresh.process(x), fresh.flush()])
    again = np.concatenate([fresh.process(x), fresh.flush()])
    assert np.array_equal(first, again)
    fresh.process(x)
    fresh.reset()  # the held-back tail is dropped, not leaked into the next stream
    assert np.array_equal(np.concatenate([fresh.process(x), fresh.flush()]), first)
    with pytest.raises(TypeError):
        fresh.process(x.astype(np.float32))
    with pytest.raises(ValueError):
        StreamResampler(24_000, 8_000, dtype="float64")  # type: ignore[arg-type]


# --- InputDecoder / OutputEncoder ---


def test_pcm16_is_identity_and_carries_odd_bytes() -> None:
    data = (_sine(500, 24_000, 0.1) * 20000).astype("<i2").tobytes()
    dec, enc = InputDecoder("pcm16"), OutputEncoder("pcm16")
    assert dec.decode(data) is data  # no copy on the common path
    assert enc.encode(data) is data
    for codec, convert in ((InputDecoder("pcm16"), "decode"), (OutputEncoder("pcm16"), "encode")):
        out = b"".join(getattr(codec, convert)(c) for c in split(data, [1, 3, 480, 7, 2]))
        assert out == data
    dec.decode(b"\x01")
    assert dec.flush() == b""
    assert dec.decode(b"\x02\x03") == b"\x02\x03"  # the dangling byte died with the stream


@pytest.mark.parametrize("fmt", ["g711_ulaw", "g711_alaw"])
def test_g711_input_decoder_streams(fmt: str) -> None:
    x = (_sine(700, 8_000, 0.5) * 20000).astype(np.int16)
    encoded = audio.ulaw_encode(x) if fmt == "g711_ulaw" else audio.alaw_encode(x)

    def run(sizes: list[int]) -> bytes:
        dec = InputDecoder(fmt)
        return b"".join(dec.decode(c) for c in split(encoded, sizes)) + dec.flush()

    whole = run([len(encoded)])
    assert len(whole) == len(encoded) * 3 * 2  # 8 kHz → 24 kHz, 1 byte → 2 bytes per sample
    assert run([160]) == whole
    assert run([1, 33, 7]) == whole
    assert audio.pcm16_duration_ms(len(whole)) == audio.duration_ms(fmt, len(encoded)) == 500.0


@pytest.mark.parametrize("fmt", ["g711_ulaw", "g711_alaw"])
def test_g711_output_encoder_streams_and_round_trips(fmt: str) -> None:
    pcm = (_sine(1000, 24_000, 0.5) * 16000).astype("<i2").tobytes()

    def run(sizes: list[int]) -> bytes:
        enc = OutputEncoder(fmt)
        return b"".join(enc.encode(c) for c in split(pcm, sizes)) + enc.flush()

    whole = run([len(pcm)])
    assert len(whole) == len(pcm) // 2 // 3
    assert run([960]) == whole
    assert run([1, 961, 5]) == whole  # odd sizes: bytes carried, never lost or misaligned
    dec = InputDecoder(fmt)
    back = audio.bytes_to_int16(dec.decode(whole) + dec.flush()).astype(np.float32)
    orig = audio.bytes_to_int16(pcm).astype(np.float32)
    # G.711's own SNR on a sine is ~38 dB; the two resamplings must cost nothing audible on top.
    assert _snr_db(orig[2400:-2400], back[2400:-2400]) > 33


def test_encoder_reset_drops_pending_output() -> None:
    pcm = (_sine(1000, 24_000, 0.2) * 16000).astype("<i2").tobytes()
    enc = OutputEncoder("g711_ulaw")
    expected = enc.encode(pcm) + enc.flush()
    enc.encode(pcm[:2001])
    enc.reset()
    assert enc.encode(pcm) + enc.flush() == expected


def test_format_helpers() -> None:
    assert audio.check_format("g711_alaw") == "g711_alaw"
    with pytest.raises(ValueError, match="pcm16"):
        InputDecoder("opus")
    assert audio.GA_FORMATS["audio/pcmu"] == "g711_ulaw"
    assert audio.pcm16_duration_ms(48_000) == 1000.0
    assert audio.pcm16_bytes_for_ms(20) == 960
    assert audio.duration_ms("g711_ulaw", 160) == 20.0
    x = np.array([-32768, -1, 0, 1, 32767], dtype=np.int16)
    f = audio.int16_to_float32(x)
    assert f.dtype == np.float32 and f[0] == -1.0
    assert np.array_equal(audio.float32_to_int16(f), x)
    assert audio.float32_to_int16(np.array([1.5, -1.5], dtype=np.float32)).tolist() == [32767, -32768]
