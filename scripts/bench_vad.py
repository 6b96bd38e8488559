"""Measure the CPU cost of the audio input path: VAD per window, batched VAD, turn detection, codecs.

Usage::

    python scripts/bench_vad.py [--sessions 100] [--seconds 2]

Everything runs on one thread, as on the event loop or in the one VAD worker thread. The audio is
the committed speech fixture, sent in 20 ms appends like a real-time client. The last lines run N
sessions in real time on an event loop with one VAD worker thread, one by one and with VadBatcher,
and give the share of a core used and the latency from an append to its probabilities.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import wave
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from gateway.audio import InputDecoder, OutputEncoder, alaw_encode, bytes_to_int16, ulaw_encode
from gateway.core.vad import WINDOW_MS, TurnDetector
from gateway.runtime.silero import SileroModel, SileroVAD, VadBatcher, process_many

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "two_turns.wav"
APPEND_BYTES = 960  # 20 ms of pcm16 24 kHz


def load() -> bytes:
    with wave.open(str(FIXTURE), "rb") as w:
        return w.readframes(w.getnframes())


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def timed(fn: Callable[[], object], repeat: int) -> np.ndarray:
    """Per-call CPU times of this thread in microseconds: other processes on the machine don't count
    (onnxruntime runs in the calling thread with intra_op_num_threads=1)."""
    out = np.empty(repeat)
    for i in range(repeat):
        t = time.thread_time()
        fn()
        out[i] = time.thread_time() - t
    return out * 1e6


def report(name: str, us: np.ndarray, per: str = "call") -> None:
    print(f"{name:<44} median {np.median(us):7.1f} µs  p99 {np.percentile(us, 99):7.1f} µs  per {per}")


async def realtime_load(
    n: int, seconds: float, appends: list[bytes], model: SileroModel, batched: bool, inline_windows: int
) -> tuple[float, np.ndarray]:
    """n sessions appending 20 ms every 20 ms of wall time; returns (cores used, result latencies µs).

    Latency is wall time, so it grows when other processes compete for the cores; CPU use does not.
    """
    with ThreadPoolExecutor(1) as executor:
        loop = asyncio.get_running_loop()
        batcher = VadBatcher(executor)
        latencies: list[float] = []

        def unbatched(vad: SileroVAD, pcm: bytes) -> Awaitable[np.ndarray]:
            # What a runner without the batcher does: few windows inline, many in the worker.
            if vad.windows_pending(len(pcm)) <= inline_windows:
                future = loop.create_future()
                future.set_result(vad.process(pcm))
                return future
            return loop.run_in_executor(executor, vad.process, pcm)

        async def session(k: int) -> None:
            vad = SileroVAD(model)
            start = t0 + 0.02 * k / n  # spread the sessions' phases over a 20 ms period
            for step in range(int(seconds * 50)):
                due = start + 0.02 * step  # when this append "arrives"; latency counts from here
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                pcm = appends[(step + k) % len(appends)]
                await (batcher.process(vad, pcm) if batched else unbatched(vad, pcm))
                latencies.append((time.perf_counter() - due) * 1e6)

        cpu, wall = time.process_time(), time.perf_counter()
        t0 = wall
        await asyncio.gather(*(session(k) for k in range(n)))
        return (time.process_time() - cpu) / (time.perf_counter() - wall), np.array(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=2.0, help="audio per session in the load test")
    parser.add_argument("--inline-windows", type=int, default=4, help="run on the loop up to this many windows")
    args = parser.parse_args()

    model = SileroModel.shared()
    pcm = load()
    appends = chunks(pcm, APPEND_BYTES)

    # One session, 20 ms appends: most calls complete no window, some one or two.
    vad = SileroVAD(model)
    calls = np.empty(len(appends))
    windows = np.empty(len(appends), dtype=int)
    for i, c in enumerate(appends):
        t = time.thread_time()
        windows[i] = len(vad.process(c))
        calls[i] = (time.thread_time() - t) * 1e6
    report("SileroVAD.process, 20 ms append", calls)
    report("  ... calls that completed no window", calls[windows == 0])
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

    # Load: N sessions in real time on one event loop plus one VAD worker thread, as in the server.
    for batched in (False, True):
        cores, latency = asyncio.run(
            realtime_load(args.sessions, args.seconds, appends, model, batched, args.inline_windows)
        )
        print(f"{args.sessions} real-time sessions, {'VadBatcher' if batched else 'one by one'}: "
              f"{cores:.0%} of a core (VAD + loop), result latency median {np.median(latency):.0f} µs, "
              f"p99 {np.percentile(latency, 99):.0f} µs")


if __name__ == "__main__":
    main()
