"""VAD lateness on one worker's event loop while that loop is busy with other work.

    python scripts/vad_lateness.py [--sessions 40] [--seconds 20] [--busy-ms 0,4,8] [--every-ms 10]

N Realtime sessions (a Session and its SessionRunner on the worker's batched VAD, as gateway.runtime.gateway
builds them; no transport) stream a spoken sentence and 1.2 s of silence, over and over, in 20 ms appends on a
real-time clock, their phases spread over one append. Meanwhile a task takes the loop for busy_ms every
every_ms: the other sessions' protocol work of a loaded worker. speech_stopped lateness is what
scripts/bench_gateway.py reports as "VAD late": when the session sends the event, less the moment the audio
that completed the silence was due (audio_end_ms + silence_duration_ms on the session's clock); 15-30 ms of it
are the 32 ms window and the 20 ms append. CPU: this process's CPU seconds (the loop and the VAD's thread) per
session-minute, the busy task's own excluded.

`vad_lateness()` takes its arguments explicitly, to be called from a benchmark suite.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.config import load_config  # noqa: E402
from gateway.realtime.session import Session  # noqa: E402
from gateway.responders.echo import EchoResponder  # noqa: E402
from gateway.runtime.session_runner import SessionRunner  # noqa: E402
from gateway.runtime.silero import SWITCH_INTERVAL_S, SileroModel, SileroVAD, VadBatcher  # noqa: E402

APPEND_MS = 20


def speech() -> bytes:
    with wave.open(str(ROOT / "tests" / "fixtures" / "one_sentence.wav")) as w:
        return w.readframes(w.getnframes())


async def vad_lateness(sessions: int, seconds: float, busy_ms: float, every_ms: float,
                       interval_ms: float = 10.0) -> dict[str, float]:
    """speech_stopped lateness P50/P95 (ms) and CPU per session-minute; see the module's docstring."""
    config = load_config(env={})
    config.vad.create_response = False  # turns only: no responses
    loop = asyncio.get_running_loop()
    audio = speech() + bytes(48 * 1200)
    appends = [orjson.dumps({"type": "input_audio_buffer.append",
                             "audio": base64.b64encode(audio[i : i + 48 * APPEND_MS]).decode()})
               for i in range(0, len(audio) - 48 * APPEND_MS + 1, 48 * APPEND_MS)]
    model = SileroModel.shared()
    late: list[float] = []
    busy_cpu = 0.0

    async def hog() -> None:
        nonlocal busy_cpu
        while True:
            start, cpu = time.perf_counter(), time.thread_time()
            while time.perf_counter() - start < busy_ms / 1000:
                pass
            busy_cpu += time.thread_time() - cpu
            await asyncio.sleep(max(0.0, (every_ms - busy_ms) / 1000))

    async def session(k: int, batcher: VadBatcher, t0: float) -> None:
        clock = t0 + APPEND_MS / 1000 * k / sessions

        async def send(text: str) -> None:
            if '"input_audio_buffer.speech_stopped"' in text:
                event = orjson.loads(text)
                due = clock + (event["audio_end_ms"] + config.vad.silence_duration_ms) / 1000
                late.append((loop.time() - due) * 1000)

        runner = SessionRunner(Session(config), EchoResponder(pace=0), SileroVAD(model), send, batcher)
        await runner.start()
        for i in range(int(seconds * 1000 / APPEND_MS)):
            await asyncio.sleep(max(0.0, clock + (i + 1) * APPEND_MS / 1000 - loop.time()))
            await runner.receive(appends[i % len(appends)])
        await asyncio.sleep(0.5)
        await runner.close()

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as the gateway does at start
    with ThreadPoolExecutor(1, thread_name_prefix="vad") as executor:
        batcher = VadBatcher(executor, interval_ms=interval_ms)
        hogging = asyncio.create_task(hog()) if busy_ms > 0 else None
        cpu, t0 = time.process_time(), loop.time() + 0.5
        await asyncio.gather(*(session(k, batcher, t0) for k in range(sessions)))
        cpu = time.process_time() - cpu
        if hogging is not None:
            hogging.cancel()
    sys.setswitchinterval(switch_interval)
    return {"sessions": sessions, "busy_ms": busy_ms, "every_ms": every_ms, "turns": len(late),
            "late_p50_ms": float(np.percentile(late, 50)), "late_p95_ms": float(np.percentile(late, 95)),
            "cpu_s_per_session_min": (cpu - busy_cpu) / (sessions * seconds / 60)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--busy-ms", default="0,4,8", help="comma-separated: the loop's other work, per period")
    parser.add_argument("--every-ms", type=float, default=10.0, help="the period of that work")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="[vad] batch_interval_ms")
    args = parser.parse_args()
    print("| sessions | loop busy | turns | speech_stopped late P50 / P95 ms | CPU s per session-minute |")
    print("| --- | --- | --- | --- | --- |")
    for busy in (float(b) for b in args.busy_ms.split(",")):
        r = asyncio.run(vad_lateness(args.sessions, args.seconds, busy, args.every_ms, args.interval_ms))
        print(f"| {r['sessions']} | {busy:g} ms every {args.every_ms:g} ms | {r['turns']} | "
              f"{r['late_p50_ms']:.1f} / {r['late_p95_ms']:.1f} | {r['cpu_s_per_session_min']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
