"""Audio formats and conversions: the one place where client audio becomes pcm16 24 kHz and back.

The session's canonical internal format is pcm16: little-endian int16, mono, 24 kHz. Clients may send
and receive G.711 (mu-law or A-law, 8 kHz) instead; ``InputDecoder`` and ``OutputEncoder`` convert
while streaming, carrying resampler state and odd trailing bytes between chunks so that the chunk
boundaries chosen by the network never change the audio.
"""

from __future__ import annotations

import struct
from typing import Literal

import numpy as np
import numpy.typing as npt
import soxr

SAMPLE_RATE = 24_000
"""Rate of the canonical internal format (pcm16)."""

FORMAT_RATES: dict[str, int] = {"pcm16": 24_000, "g711_ulaw": 8_000, "g711_alaw": 8_000}
"""Beta format names (also what the session stores) and their sample rates."""

GA_FORMATS: dict[str, str] = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
"""GA ``format.type`` values mapped to the beta names above (GA pcm is always 24 kHz)."""

_BYTES_PER_SAMPLE: dict[str, int] = {"pcm16": 2, "g711_ulaw": 1, "g711_alaw": 1}

Int16Array = npt.NDArray[np.int16]
Float32Array = npt.NDArray[np.float32]


def check_format(fmt: str) -> str:
    """Return ``fmt`` if it is a known beta format name; raise ValueError naming the choices otherwise."""
    if fmt not in FORMAT_RATES:
        raise ValueError(f"unknown audio format {fmt!r}; expected one of {', '.join(FORMAT_RATES)}")
    return fmt


def pcm16_duration_ms(nbytes: int, rate: int = SAMPLE_RATE) -> float:
    """Duration of ``nbytes`` of pcm16 mono at ``rate`` (default 24 kHz), in milliseconds."""
    return nbytes / 2 * 1000.0 / rate


def duration_ms(fmt: str, nbytes: int) -> float:
    """Duration of ``nbytes`` of audio in the client format ``fmt``, in milliseconds."""
    return nbytes / _BYTES_PER_SAMPLE[check_format(fmt)] * 1000.0 / FORMAT_RATES[fmt]


def pcm16_bytes_for_ms(ms: float, rate: int = SAMPLE_RATE) -> int:
    """Byte count of ``ms`` milliseconds of pcm16 mono, rounded down to whole samples."""
    return int(ms * rate / 1000.0) * 2


def bytes_to_int16(data: bytes | bytearray | memoryview) -> Int16Array:
    """View little-endian pcm16 bytes as int16 samples (no copy; read-only for bytes input)."""
    return np.frombuffer(data, dtype="<i2")


def int16_to_float32(samples: Int16Array) -> Float32Array:
    """int16 → float32 in [-1, 1), scaled by 1/32768 (the convention Silero and soxr expect)."""
    return samples.astype(np.float32) * np.float32(1.0 / 32768.0)


def float32_to_int16(samples: Float32Array) -> Int16Array:
    """float32 → int16, rounded to nearest and clipped (no dither: output must be deterministic)."""
    scaled = np.rint(samples * np.float32(32768.0))
    return np.clip(scaled, -32768, 32767).astype(np.int16)


# --- G.711 -------------------------------------------------------------------------------------
# Tables built once from the ITU/Sun reference algorithm (the one CPython's audioop implements):
# 64 Ki entries for encoding every int16 value, 256 for decoding. A lookup is then one numpy take.

_SEG_UEND = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_SEG_AEND = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)


def _build_ulaw_encode() -> npt.NDArray[np.uint8]:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 2  # the reference works on 14 bits
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(pcm), 8159) + (0x84 >> 2)  # clip, then add the bias
    seg = np.searchsorted(_SEG_UEND, mag)  # first segment whose end >= mag
    code = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | ((mag >> (np.minimum(seg, 7) + 1)) & 0xF))
    return (code ^ mask).astype(np.uint8)


def _build_ulaw_decode() -> Int16Array:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _build_alaw_encode() -> npt.NDArray[np.uint8]:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 3  # the reference works on 13 bits
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = np.searchsorted(_SEG_AEND, mag)
    s = np.minimum(seg, 7)
    quant = np.where(s < 2, mag >> 1, mag >> s) & 0x0F
    code = np.where(seg >= 8, 0x7F, (s << 4) | quant)
    return (code ^ mask).astype(np.uint8)


def _build_alaw_decode() -> Int16Array:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_ULAW_ENC = _build_ulaw_encode()
_ULAW_DEC = _build_ulaw_decode()
_ALAW_ENC = _build_alaw_encode()
_ALAW_DEC = _build_alaw_decode()


def ulaw_encode(samples: Int16Array) -> bytes:
    """int16 samples → G.711 mu-law bytes (one byte per sample)."""
    return _ULAW_ENC[samples.astype(np.int32) + 32768].tobytes()


def ulaw_decode(data: bytes | bytearray | memoryview) -> Int16Array:
    """G.711 mu-law bytes → int16 samples."""
    return _ULAW_DEC[np.frombuffer(data, dtype=np.uint8)]


def alaw_encode(samples: Int16Array) -> bytes:
    """int16 samples → G.711 A-law bytes (one byte per sample)."""
    return _ALAW_ENC[samples.astype(np.int32) + 32768].tobytes()


def alaw_decode(data: bytes | bytearray | memoryview) -> Int16Array:
    """G.711 A-law bytes → int16 samples."""
    return _ALAW_DEC[np.frombuffer(data, dtype=np.uint8)]


# --- Resampling ----------------------------------------------------------------------------------


class StreamResampler:
    """A streaming soxr resampler for one direction of one stream (mono).

    State is carried between chunks, so any chunking of a signal yields the same samples (per-chunk
    resampling without state crackles). Output is time-aligned with the input: soxr compensates its
    filter delay by holding back ~21 ms (HQ) of output until more input or ``flush()`` arrives.

    soxr always runs in float32 here: its int16 mode adds random dither, which would make the output
    depend on chunking and differ from run to run. ``dtype`` is the I/O type of ``process``/``flush``.
    """

    def __init__(
        self,
        in_rate: int,
        out_rate: int,
        dtype: Literal["int16", "float32"] = "int16",
        quality: str = "HQ",
    ) -> None:
        if dtype not in ("int16", "float32"):
            raise ValueError(f"dtype must be 'int16' or 'float32', not {dtype!r}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.dtype = np.dtype(dtype)
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)

    def process(self, samples: npt.NDArray[np.int16] | npt.NDArray[np.float32]) -> npt.NDArray:
        """Resample the next chunk; returns what is ready (possibly empty), in ``dtype``."""
        if samples.dtype != self.dtype:
            raise TypeError(f"expected {self.dtype} samples, got {samples.dtype}")
        return self._run(samples, last=False)

    def flush(self) -> npt.NDArray:
        """End of the stream: return the held-back tail and make the resampler ready for a new stream."""
        out = self._run(np.zeros(0, dtype=self.dtype), last=True)
        self._stream.clear()
        return out

    def reset(self) -> None:
        """Drop the held-back tail (e.g. the output was cancelled) and start a new stream."""
        self._stream.clear()

    def _run(self, samples: npt.NDArray, last: bool) -> npt.NDArray:
        x = int16_to_float32(samples) if self.dtype == np.int16 else samples
        y = self._stream.resample_chunk(np.ascontiguousarray(x, dtype=np.float32), last=last)
        return float32_to_int16(y) if self.dtype == np.int16 else y


# --- Client format <-> canonical pcm16 24 kHz ----------------------------------------------------


class InputDecoder:
    """Client input bytes in ``fmt`` → pcm16 24 kHz bytes, streaming.

    For pcm16 this is the identity (the same bytes object comes back when no odd byte is pending);
    an odd trailing byte is carried to the next call. For G.711 each byte is one 8 kHz sample,
    decoded by table and upsampled with carried state.
    """

    def __init__(self, fmt: str) -> None:
        self.format = check_format(fmt)
        self._carry = b""
        self._resampler = StreamResampler(8_000, SAMPLE_RATE) if fmt != "pcm16" else None
        self._decode = ulaw_decode if fmt == "g711_ulaw" else alaw_decode

    def decode(self, data: bytes) -> bytes:
        """Convert the next chunk; may return fewer bytes than a whole conversion (held back)."""
        if self._resampler is None:
            return self._pcm16(data)
        if not data:
            return b""
        return self._resampler.process(self._decode(data)).tobytes()

    def flush(self) -> bytes:
        """End of the input stream: the resampler's held-back tail (an odd pcm16 byte is dropped)."""
        self._carry = b""
        return self._resampler.flush().tobytes() if self._resampler is not None else b""

    def reset(self) -> None:
        """Forget everything pending (e.g. input_audio_buffer.clear)."""
        self._carry = b""
        if self._resampler is not None:
            self._resampler.reset()

    def _pcm16(self, data: bytes) -> bytes:
        if self._carry:
            data = self._carry + data
            self._carry = b""
        if len(data) & 1:
            self._carry = data[-1:]
            data = data[:-1]
        return data


class OutputEncoder:
    """pcm16 24 kHz bytes → client output bytes in ``fmt``, streaming.

    Call ``flush()`` at the end of each response's audio (the resampler holds back ~21 ms) and
    ``reset()`` when the output is cancelled mid-stream.
    """

    def __init__(self, fmt: str) -> None:
        self.format = check_format(fmt)
        self._carry = b""
        self._resampler = StreamResampler(SAMPLE_RATE, 8_000) if fmt != "pcm16" else None
        self._encode = ulaw_encode if fmt == "g711_ulaw" else alaw_encode

    def encode(self, pcm: bytes) -> bytes:
        """Convert the next pcm16 24 kHz chunk (odd trailing bytes are carried)."""
        if self._carry:
            pcm = self._carry + pcm
            self._carry = b""
        if len(pcm) & 1:
            self._carry = pcm[-1:]
            pcm = pcm[:-1]
        if self._resampler is None:
            return pcm
        if not pcm:
            return b""
        return self._encode(self._resampler.process(bytes_to_int16(pcm)))

    def flush(self) -> bytes:
        """End of this output stream: the held-back tail, encoded; ready for the next stream."""
        self._carry = b""
        return self._encode(self._resampler.flush()) if self._resampler is not None else b""

    def reset(self) -> None:
        """Drop anything pending without emitting it (cancelled output)."""
        self._carry = b""
        if self._resampler is not None:
            self._resampler.reset()


# --- exact 2x resampling for WebRTC's 48 kHz ------------------------------------------------------

HALF_BAND_TAPS = 128


def _half_band() -> np.ndarray:
    """Low-pass at a quarter of the 48 kHz rate (12 kHz): a Kaiser-windowed sinc (β 10), unity DC gain.

    Images and aliases are below −99 dB up to 10 kHz (−56 dB at 11 kHz); the delay is 1.3 ms.
    """
    n = np.arange(HALF_BAND_TAPS) - (HALF_BAND_TAPS - 1) / 2
    h = np.sinc(n / 2) * np.kaiser(HALF_BAND_TAPS, 10.0)
    return (h / h.sum()).astype(np.float32)


class Upsampler2x:
    """pcm16 24 → 48 kHz, exactly two samples out per sample in, with a fixed 1.3 ms delay.

    StreamResampler (soxr HQ) releases its output in ~35 ms blocks, so a reply produced at real
    time left the paced track with nothing to send between blocks (5–8 short gaps in a 3 s reply,
    measured). Here the half-band filter runs as its two phases, history carried between chunks;
    ~40 µs per 40 ms chunk.
    """

    def __init__(self) -> None:
        h = _half_band() * 2  # zero-stuffing halves the level
        self._phases = (h[0::2], h[1::2])
        self._history = np.zeros(HALF_BAND_TAPS // 2 - 1, dtype=np.float32)

    def process(self, samples: np.ndarray) -> np.ndarray:
        x = np.concatenate([self._history, samples.astype(np.float32)])
        self._history = x[len(x) - len(self._history) :]
        out = np.empty(2 * len(samples), dtype=np.float32)
        out[0::2] = np.convolve(x, self._phases[0], "valid")
        out[1::2] = np.convolve(x, self._phases[1], "valid")
        return np.clip(np.rint(out), -32768, 32767).astype(np.int16)

    def flush(self) -> np.ndarray:
        """The end of the signal still inside the filter; then ready for a new one."""
        tail = self.process(np.zeros(len(self._history), dtype=np.int16))
        self.reset()
        return tail

    def reset(self) -> None:
        self._history[:] = 0


class Downsampler2x:
    """pcm16 48 → 24 kHz, one sample out per two in, with a fixed 1.3 ms delay.

    The microphone's way in: soxr HQ would hand VAD its audio in ~35 ms blocks (21 ms late on
    average, measured), and every turn's end would be detected that much later.
    """

    def __init__(self) -> None:
        self._h = _half_band()
        self._history = np.zeros(HALF_BAND_TAPS - 1, dtype=np.float32)
        self._consumed = 0  # input samples so far: which of them fall on the output grid

    def process(self, samples: np.ndarray) -> np.ndarray:
        x = np.concatenate([self._history, samples.astype(np.float32)])
        self._history = x[len(x) - len(self._history) :]
        filtered = np.convolve(x, self._h, "valid")[self._consumed % 2 :: 2]
        self._consumed += len(samples)
        return np.clip(np.rint(filtered), -32768, 32767).astype(np.int16)


# --- WAV files ---------------------------------------------------------------------------------

_WAVE_PCM, _WAVE_FLOAT, _WAVE_EXTENSIBLE = 1, 3, 0xFFFE
_WAVE_TAG_NAMES = {2: "MS ADPCM", 6: "A-law", 7: "mu-law", 0x11: "IMA ADPCM", 0x55: "MP3"}
_WAVE_SUPPORTED = {(_WAVE_PCM, 8), (_WAVE_PCM, 16), (_WAVE_PCM, 24), (_WAVE_PCM, 32), (_WAVE_FLOAT, 32),
                   (_WAVE_FLOAT, 64)}


def decode_wav(data: bytes) -> tuple[Float32Array, int]:
    """A WAV file's samples as float32 in [-1, 1], shaped [frames, channels], and its sample rate.

    Reads the RIFF chunks itself (Python's ``wave`` takes 16-bit PCM only): integer PCM of 8, 16, 24 or
    32 bits, IEEE float of 32 or 64 bits, and WAVE_FORMAT_EXTENSIBLE of either (what sox and ffmpeg write
    for more than two channels or deeper samples). Anything else is a ValueError naming the problem.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a WAV file (no RIFF/WAVE header)")
    fmt = payload = None
    pos = 12
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        body = data[pos + 8 : pos + 8 + size]  # a truncated last chunk keeps what is there
        if chunk == b"fmt ":
            fmt = body
        elif chunk == b"data":
            payload = body
        pos += 8 + size + (size & 1)
    if fmt is None or len(fmt) < 16:
        raise ValueError("WAV file without a valid fmt chunk")
    if payload is None:
        raise ValueError("WAV file without a data chunk")
    tag, channels, rate = struct.unpack_from("<HHI", fmt)
    (bits,) = struct.unpack_from("<H", fmt, 14)
    if tag == _WAVE_EXTENSIBLE and len(fmt) >= 26:
        (tag,) = struct.unpack_from("<H", fmt, 24)  # the sub-format GUID starts with the plain tag
    if channels < 1 or rate < 1:
        raise ValueError(f"WAV file with {channels} channels at {rate} Hz")
    if (tag, bits) not in _WAVE_SUPPORTED:
        if tag in (_WAVE_PCM, _WAVE_FLOAT):
            kind = f"{bits}-bit {'PCM' if tag == _WAVE_PCM else 'float'}"
        else:
            kind = _WAVE_TAG_NAMES.get(tag, f"format tag {tag}")
        raise ValueError(f"unsupported WAV encoding ({kind}); use PCM of 8-32 bits or 32/64-bit float")
    width = bits // 8
    raw = payload[: len(payload) // (width * channels) * width * channels]
    if tag == _WAVE_FLOAT:
        samples = np.frombuffer(raw, dtype=f"<f{width}").astype(np.float32)
    elif bits == 8:  # unsigned, centred on 128
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128) / 128
    elif bits == 24:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        value = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        samples = (np.where(value >= 1 << 23, value - (1 << 24), value) / float(1 << 23)).astype(np.float32)
    else:
        samples = (np.frombuffer(raw, dtype=f"<i{width}") / float(1 << (bits - 1))).astype(np.float32)
    return samples.reshape(-1, channels), rate


def wav_to_pcm16(data: bytes) -> bytes:
    """A WAV file of any supported encoding, rate and channel count → pcm16 mono 24 kHz bytes."""
    samples, rate = decode_wav(data)
    mono = samples.mean(axis=1, dtype=np.float32)
    if rate != SAMPLE_RATE:
        resampler = StreamResampler(rate, SAMPLE_RATE, dtype="float32")
        mono = np.concatenate([resampler.process(mono), resampler.flush()])
    return float32_to_int16(np.clip(mono, -1.0, 1.0)).tobytes()


def wav_bytes(pcm16: bytes, rate: int = SAMPLE_RATE) -> bytes:
    """A WAV file (mono pcm16) holding ``pcm16``."""
    fmt = struct.pack("<HHIIHH", _WAVE_PCM, 1, rate, rate * 2, 2, 16)
    return b"".join([b"RIFF", struct.pack("<I", 36 + len(pcm16)), b"WAVE", b"fmt ", struct.pack("<I", len(fmt)),
                     fmt, b"data", struct.pack("<I", len(pcm16)), pcm16])


# --- rational-ratio resampling with a short, fixed delay (phone audio) ---------------------------------


def polyphase_filter(up: int, down: int, taps: int) -> list[Float32Array]:
    """The anti-aliasing filter of resampling by ``up``/``down``: a Kaiser-windowed sinc (β 8) cut at the lower
    rate's band edge, ``up * taps`` long, as ``up`` phases of ``taps``: phases[p][j] weighs input x[k - j] for
    an output at upsampled position k * up + p. Its delay is (up * taps - 1) / 2 upsampled samples."""
    n = np.arange(up * taps) - (up * taps - 1) / 2
    cutoff = 1 / max(up, down)  # of the upsampled rate's Nyquist
    h = cutoff * np.sinc(cutoff * n) * np.kaiser(up * taps, 8.0) * up
    return [h[p::up].astype(np.float32) for p in range(up)]


class RationalResampler:
    """pcm16 resampled by ``up``/``down`` (8 → 24 kHz is 3/1, 24 → 16 kHz is 2/3), streaming, with a fixed
    delay of ``taps`` / 2 input samples (2 ms at 8 kHz).

    A polyphase Kaiser-windowed sinc (β 8) cut at the lower rate's band edge; history is carried between
    chunks, so chunking never changes the output. soxr HQ holds ~21 ms and releases its output in blocks:
    on a phone call's way in that would be turn detection's delay, on its way out gaps in a paced playout.
    """

    def __init__(self, up: int, down: int, taps: int = 32) -> None:
        self.up, self.down, self.taps = up, down, taps
        self._phases = polyphase_filter(up, down, taps)
        self._history = np.zeros(taps - 1, dtype=np.float32)
        self._consumed = 0  # input samples seen
        self._produced = 0  # output samples made

    def process(self, samples: np.ndarray) -> np.ndarray:
        x = np.concatenate([self._history, samples.astype(np.float32)])
        start = self._consumed - (self.taps - 1)  # the input index of x[0]
        self._consumed += len(samples)
        # Outputs whose newest input sample has arrived: position n * down lands at input k = n * down // up.
        last = (self._consumed * self.up - 1) // self.down
        position = np.arange(self._produced, last + 1) * self.down
        self._produced = last + 1
        self._history = x[len(x) - (self.taps - 1):]
        # Each phase's filter over the chunk is one np.convolve, whose "valid" output i is the one at
        # x[i + taps - 1]; the two ratios a phone call uses (100 chunks a second each way) need no gather.
        if not len(position):
            return np.zeros(0, dtype=np.int16)
        valid = position // self.up - start - (self.taps - 1)
        if self.down == 1:  # every new input sample gives `up` outputs, one per phase
            out = np.empty((len(samples), self.up), dtype=np.float32)
            for p, h in enumerate(self._phases):
                out[:, p] = np.convolve(x, h, mode="valid")
            out = out.ravel()
        elif self.up == 1:  # every `down`-th input sample gives one
            out = np.convolve(x, self._phases[0], mode="valid")[valid[0] :: self.down][: len(position)]
        else:
            phase = position % self.up
            out = np.empty(len(position), dtype=np.float32)
            for p, h in enumerate(self._phases):
                at = phase == p
                if at.any():
                    out[at] = np.convolve(x, h, mode="valid")[valid[at]]
        return np.rint(out).clip(-32768, 32767).astype(np.int16)

    def flush(self) -> np.ndarray:
        """The end of the signal still inside the filter; then ready for a new one."""
        tail = self.process(np.zeros(self.taps // 2, dtype=np.int16))
        self.reset()
        return tail

    def reset(self) -> None:
        self._history[:] = 0
        self._consumed = self._produced = 0
