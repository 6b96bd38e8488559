"""VAD lateness on one worker's event loop while that loop is busy with other work (part of the turns suite:
``python -m bench turns --busy-ms 0,4,8``).

N Realtime sessions (a Session and its SessionRunner on the worker's batched VAD, as gateway.runtime.gateway
builds them; no transport) stream a spoken sentence and 1.2 s of silence, over and over, in 20 ms appends on a
real-time clock, their phases spread over one append. Meanwhile a task takes the loop for busy_ms every
every_ms: the other sessions' protocol work of a loaded worker. speech_stopped lateness is what the gateway
suite reports as "VAD late": when the session sends the event, less the moment the audio that completed the
silence was due (audio_end_ms + silence_duration_ms on the session's clock); 15-30 ms of it are the 32 ms
window and the 20 ms append. CPU: this process's CPU seconds (the loop and the VAD's thread) per
session-minute, the busy task's own excluded.
"""

from __future__ import annotations

import asyncio
import base64
import sys
import time
import wave
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson

from bench.load import FIXTURES
from gateway.config import load_config
from gateway.realtime.session import Session
from gateway.responders.echo import EchoResponder
from gateway.runtime.session_runner import SessionRunner
from gateway.runtime.silero import SWITCH_INTERVAL_S, SileroModel, SileroVAD, VadBatcher

APPEND_MS = 20


def speech() -> bytes:
    with wave.open(str(FIXTURES / "one_sentence.wav")) as w:
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
