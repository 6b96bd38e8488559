"""Measure the CPU cost of the audio input path: VAD per window, batched VAD, turn detection, codecs.

Usage::

    python scripts/bench_vad.py [--sessions 100] [--seconds 2]

Everything runs on one thread, as on the event loop or in the one VAD worker thread. The audio is
the committed speech fixture, sent in 20 ms appends like a real-time client. The last lines give the
share of one core that N concurrent real-time sessions need, unbatched and batched.
"""

from __future__ import annotations

import argparse
import time
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gateway.audio import InputDecoder, OutputEncoder, alaw_encode, bytes_to_int16, ulaw_encode
from gateway.vad import WINDOW_MS, SileroModel, SileroVAD, TurnDetector, process_many

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "two_turns.wav"
APPEND_BYTES = 960  # 20 ms of pcm16 24 kHz


def load() -> bytes:
    with wave.open(str(FIXTURE), "rb") as w:
        return w.readframes(w.getnframes())


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def timed(fn: Callable[[], object], repeat: int) -> np.ndarray:
    """Per-call wall times in microseconds (one thread, so wall ≈ CPU)."""
    out = np.empty(repeat)
    for i in range(repeat):
        t = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - t
    return out * 1e6


def report(name: str, us: np.ndarray, per: str = "call") -> None:
    print(f"{name:<44} median {np.median(us):7.1f} µs  p99 {np.percentile(us, 99):7.1f} µs  per {per}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=2.0, help="audio per session in the load test")
    args = parser.parse_args()

    model = SileroModel.shared()
    pcm = load()
    appends = chunks(pcm, APPEND_BYTES)

    # One session, 20 ms appends: most calls complete no window, some one or two.
    vad = SileroVAD(model)
    calls = np.empty(len(appends))
    windows = np.empty(len(appends), dtype=int)
    for i, c in enumerate(appends):
        t = time.perf_counter()
        windows[i] = len(vad.process(c))
        calls[i] = (time.perf_counter() - t) * 1e6
    report("SileroVAD.process, 20 ms append", calls)
    report("  ... calls that completed exactly 1 window", calls[windows == 1], "window")
    big = SileroVAD(model)
    us = timed(lambda: big.process(pcm[: 48_000 * 2]), 5) / (2000 // WINDOW_MS)
    report("SileroVAD.process, 2 s append", us, "window")

    for batch in (8, 32, args.sessions):
        vads = [SileroVAD(model) for _ in range(batch)]
        one_s = pcm[:48_000]  # 1 s each: ~31 windows per session
        us = timed(lambda vads=vads, one_s=one_s: process_many([(v, one_s) for v in vads]), 3)
        report(f"process_many, {batch} sessions × 1 s", us / (batch * 31), "window")

    probs = SileroVAD(model).process(pcm)
    us = timed(lambda: TurnDetector().feed(probs), 20) / len(probs)
    report("TurnDetector.feed", us, "window")

    x20 = bytes_to_int16(appends[50])
    for fmt, encode in (("g711_ulaw", ulaw_encode), ("g711_alaw", alaw_encode)):
        dec, enc = InputDecoder(fmt), OutputEncoder(fmt)
        payload = encode(x20[::3])
        report(f"InputDecoder({fmt}).decode, 20 ms", timed(lambda d=dec, p=payload: d.decode(p), 2000))
        report(f"OutputEncoder({fmt}).encode, 20 ms", timed(lambda e=enc: e.encode(appends[50]), 2000))

    # Load: N real-time sessions, each appending 20 ms at a time, for args.seconds of audio.
    n = args.sessions
    steps = int(args.seconds * 50)
    sessions = [SileroVAD(model) for _ in range(n)]
    t = time.process_time()
    for step in range(steps):
        for k, v in enumerate(sessions):
            v.process(appends[(step + k) % len(appends)])
    unbatched = (time.process_time() - t) / args.seconds
    sessions = [SileroVAD(model) for _ in range(n)]
    t = time.process_time()
    for step in range(0, steps, 2):  # a 40 ms batching tick
        batch = [(v, appends[(step + k) % len(appends)] + appends[(step + k + 1) % len(appends)])
                 for k, v in enumerate(sessions)]
        process_many(batch)
    batched = (time.process_time() - t) / args.seconds
    print(f"{n} real-time sessions, VAD only: {unbatched:.0%} of one core unbatched, "
          f"{batched:.0%} batched every 40 ms")


if __name__ == "__main__":
    main()
