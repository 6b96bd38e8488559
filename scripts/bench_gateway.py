"""Load benchmark: N concurrent Realtime sessions over loopback, speech streamed at real-time pace.

The gateway runs in its own process (this script with --serve), instrumented with an event-loop lag
probe (a 10 ms timer; lag = how late it fires) and a CPU-time sampler. The client side is this
process: plain websockets clients that stream fixture speech in 20 ms chunks on a real-time clock,
with one session scenario per responder:

echo      turn 1 is answered in full; turn 2's echo is interrupted by turn 3 (barge-in); turn 3 answered.
pipeline  STT (100 ms), LLM first token (80 ms) from the fake OpenAI-compatible server, tone TTS with
          first audio after 25 ms at real-time pace; turn 1's reply is interrupted by turn 2 (barge-in),
          turn 2's reply is stopped by response.cancel 300 ms after its first audio.

Reported per N: loop lag P50/P99, gateway CPU seconds per session-minute, speech_stopped -> first
audio delta P50/P95, barge-in speech_started -> response.done P50/P95, cancel -> last delta P95,
and audio lost or reordered (echo: the reply must be the committed input audio, byte for byte; all:
no delta of a response after its response.done).
The last columns give stop -> first delta and cancel -> last delta as the gateway's own trace
(gateway/trace.py) records them, on its clock: the client-side figures also hold the client's wait for
CPU, which on a small machine shared by all three processes is most of the tail.

    .venv/bin/python scripts/bench_gateway.py --responder echo --sessions 1,10,50,100
    .venv/bin/python scripts/bench_gateway.py --responder pipeline --sessions 1,50
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np
import orjson
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures"
CHUNK_MS = 20
DELTA_TYPES = ("response.output_audio.delta", "response.audio.delta")


def load_pcm(name: str) -> bytes:
    with wave.open(str(FIXTURES / name)) as w:
        return w.readframes(w.getnframes())


def silence(ms: int) -> bytes:
    return bytes(48 * ms)


async def lag_probe(record: Callable[[float], None]) -> None:
    """A 10 ms timer in this process's loop: records how late (seconds) it fires, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + 0.01
        await asyncio.sleep(0.01)
        record(loop.time() - due)


# --- the gateway process ---------------------------------------------------------------------------


async def serve(port: int, stats_path: str, responder_kind: str, fake_url: str) -> None:
    from gateway.config import load_config
    from gateway.server import Gateway

    config = load_config()
    config.server.port = port
    config.server.host = "127.0.0.1"
    config.trace.jsonl_path = stats_path + ".trace"
    responder = None
    if responder_kind == "pipeline":
        from gateway.backends import LlmClient
        from gateway.pipeline import BridgeSettings, PipelineResponder
        from gateway.tone_tts import ToneEngine

        config.stt.base_url = config.llm.base_url = fake_url  # the gateway's transcriber: the fake STT
        responder = PipelineResponder(
            LlmClient.from_config(config.llm),
            ToneEngine(first_audio_ms=25, realtime=True),
            BridgeSettings(config.tts.starter_chars, config.tts.max_segment_chars),
        )
    else:
        config.responder.echo_pace = 1.0
    gateway = Gateway(config, responder)
    await gateway.start()
    lags: list[tuple[float, float]] = []
    cpu: list[tuple[float, float]] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)

    def record(lag: float) -> None:
        lags.append((time.time(), lag))
        if len(lags) % 25 == 0:
            cpu.append((time.time(), time.process_time()))

    task = asyncio.create_task(lag_probe(record))
    await stop.wait()
    task.cancel()
    Path(stats_path).write_text(json.dumps({"lags": lags, "cpu": cpu}))
    await gateway.stop()


# --- the client side -----------------------------------------------------------------------------


# A pipeline turn's stages in the gateway's trace (gateway/trace.py), from the end of speech.
TURN_STAGES = ("speech_stopped", "committed", "stt_done", "llm_first_token", "tts_first_audio", "first_delta")


@dataclass
class Result:
    first_delta_ms: list[float] = field(default_factory=list)
    barge_in_ms: list[float] = field(default_factory=list)
    cancel_to_last_delta_ms: list[float] = field(default_factory=list)
    audio_errors: list[str] = field(default_factory=list)
    responses: dict[str, str] = field(default_factory=dict)
    stop_late_ms: list[float] = field(default_factory=list)  # speech_stopped after the audio that ended it
    client_lags_ms: list[float] = field(default_factory=list)  # did the load generator keep its pace?
    traces: list[dict] = field(default_factory=list)  # the gateway's own per-turn trace (gateway/trace.py)


def append_messages(timeline: bytes) -> list[str]:
    """The timeline as append events, encoded once: every session sends the same audio."""
    step = 48 * CHUNK_MS
    return [
        '{"type":"input_audio_buffer.append","audio":"' + base64.b64encode(timeline[i : i + step]).decode() + '"}'
        for i in range(0, len(timeline), step)
    ]


async def run_session(
    url: str, timeline: bytes, messages: list[str], responder: str, delay: float, check_audio: bool,
    result: Result,
) -> None:
    await asyncio.sleep(delay)
    expected_responses = 3 if responder == "echo" else 2
    async with websockets.connect(url, compression=None, max_size=2**24) as ws:
        loop = asyncio.get_running_loop()
        speech: dict[str, tuple[int, int]] = {}  # item id -> (audio_start_ms, audio_end_ms)
        replies: dict[str, bytearray] = {}
        response_item: dict[str, str] = {}  # response id -> the user item it answers
        last_user_item: str | None = None
        stopped_at: float | None = None
        started_at: float | None = None
        done: dict[str, float] = {}
        first_delta: dict[str, float] = {}
        last_delta: dict[str, float] = {}
        cancel_sent: dict[str, float] = {}
        responses_seen = 0
        silence_ms = 0

        cancels: list[asyncio.Task[None]] = []

        async def cancel_later(rid: str) -> None:
            await asyncio.sleep(0.3)
            cancel_sent[rid] = loop.time()
            await ws.send('{"type":"response.cancel"}')

        async def reader() -> None:
            nonlocal last_user_item, stopped_at, started_at, responses_seen, silence_ms
            async for raw in ws:
                now = loop.time()
                ev = orjson.loads(raw)
                kind = ev["type"]
                if kind == "session.created":
                    silence_ms = ev["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"]
                elif kind == "input_audio_buffer.speech_started":
                    speech[ev["item_id"]] = (ev["audio_start_ms"], -1)
                    started_at = now
                elif kind == "input_audio_buffer.speech_stopped":
                    speech[ev["item_id"]] = (speech[ev["item_id"]][0], ev["audio_end_ms"])
                    last_user_item, stopped_at = ev["item_id"], now
                    # The append that completed the silence was sent on the client's real-time clock.
                    result.stop_late_ms.append((now - t0) * 1000 - ev["audio_end_ms"] - silence_ms)
                elif kind == "response.created":
                    rid = ev["response"]["id"]
                    responses_seen += 1
                    response_item[rid] = last_user_item or ""
                    replies[rid] = bytearray()
                elif kind in DELTA_TYPES:
                    rid = ev["response_id"]
                    if rid in done:
                        result.audio_errors.append(f"delta after response.done of {rid}")
                    if check_audio:
                        replies[rid] += base64.b64decode(ev["delta"])
                    last_delta[rid] = now
                    if rid not in first_delta:
                        first_delta[rid] = now
                        if stopped_at is not None:
                            result.first_delta_ms.append((now - stopped_at) * 1000)
                        if responder == "pipeline" and responses_seen == 2:
                            cancels.append(asyncio.create_task(cancel_later(rid)))
                elif kind == "response.done":
                    rid = ev["response"]["id"]
                    done[rid] = now
                    status = ev["response"]["status"]
                    result.responses[rid] = status
                    reason = (ev["response"].get("status_details") or {}).get("reason")
                    if reason == "turn_detected" and started_at is not None:
                        result.barge_in_ms.append((now - started_at) * 1000)
                        cancel_sent[rid] = started_at
                    if len(done) == expected_responses:
                        return
                elif kind == "error":
                    result.audio_errors.append(f"error event: {ev['error']['message']}")

        read = asyncio.create_task(reader())
        t0 = loop.time()
        for i, message in enumerate(messages):
            wait = t0 + i * CHUNK_MS / 1000 - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await ws.send(message)
        try:
            await asyncio.wait_for(read, 15.0)  # the last reply's tail
        except TimeoutError:
            result.audio_errors.append(f"session ended with {len(done)} of {expected_responses} responses")
    for rid, t_cancel in cancel_sent.items():
        result.cancel_to_last_delta_ms.append(max(0.0, (last_delta.get(rid, 0.0) - t_cancel) * 1000))
    if responder == "echo" and check_audio:
        for rid, reply in replies.items():
            start, end = speech.get(response_item.get(rid, ""), (0, -1))
            expected = timeline[start * 48 : end * 48]
            complete = result.responses.get(rid) == "completed"
            if (complete and abs(len(reply) - len(expected)) > 2) or reply != expected[: len(reply)]:
                result.audio_errors.append(f"{rid}: echo differs from the committed audio")


def pct(values: list[float], q: float) -> float:
    values = [v for v in values if not np.isnan(v)]
    return float(np.percentile(values, q)) if values else float("nan")


def traced(result: Result, key: str) -> list[float]:
    return [t[key] for t in result.traces if key in t]


async def run_load(url: str, sessions: int, timeline: bytes, responder: str) -> tuple[Result, float, float]:
    result = Result()
    rng = random.Random(sessions)
    messages = append_messages(timeline)
    start = time.time()
    probe = asyncio.create_task(lag_probe(lambda lag: result.client_lags_ms.append(lag * 1000)))
    # The client shares the machine with the gateway: it checks the echoed bytes of 10 sessions only.
    await asyncio.gather(*(
        run_session(url, timeline, messages, responder, rng.uniform(0, 2.0), i < 10, result)
        for i in range(sessions)
    ))
    probe.cancel()
    return result, start, time.time()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--responder", choices=["echo", "pipeline"], default="echo")
    parser.add_argument("--sessions", default="1,10,50,100", help="comma-separated session counts")
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    parser.add_argument("--fake-url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.port, args.stats, args.responder, args.fake_url))
        return 0

    counts = [int(n) for n in args.sessions.split(",")]
    sentence = load_pcm("one_sentence.wav")
    if args.responder == "echo":
        timeline = sentence + silence(4000) + sentence + silence(500) + sentence + silence(4000)
    else:
        timeline = sentence + silence(1200) + sentence + silence(5000)
    stats_file = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    procs = []
    fake_url = ""
    if args.responder == "pipeline":
        fake = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_openai", "--port", str(args.port + 1), "--stt-ms", "100",
             "--ttft-ms", "80", "--reply", "Sure. The weather tomorrow looks sunny with a light breeze, and "
             "it should stay warm until the evening."],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )
        procs.append(fake)
        fake.stdout.readline()
        fake_url = f"http://127.0.0.1:{args.port + 1}/v1"
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--port", str(args.port), "--stats", stats_file,
         "--responder", args.responder, "--fake-url", fake_url],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": pythonpath},
    )
    procs.append(server)
    server.stdout.readline()
    url = f"ws://127.0.0.1:{args.port}/v1/realtime"
    runs = []
    try:
        trace_path = Path(stats_file + ".trace")
        for n in counts:
            result, start, end = asyncio.run(run_load(url, n, timeline, args.responder))
            time.sleep(1.0)
            result.traces = [json.loads(line) for line in trace_path.read_text().splitlines()]
            trace_path.write_text("")  # the gateway appends to it: what follows belongs to the next run
            runs.append((n, result, start, end))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        for p in procs[:-1]:
            p.terminate()
            p.wait(10)
    stats = json.loads(Path(stats_file).read_text())
    os.unlink(stats_file)
    os.unlink(stats_file + ".trace")

    print(f"\nbench_gateway --responder {args.responder}  ({platform.node()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')})")
    header = ("sessions", "lag p50 ms", "lag p99 ms", "cpu s/session-min", "stop->delta p50", "p95",
              "barge-in p50", "p95", "cancel->last delta p95", "responses", "audio errors",
              "gateway stop->delta p50", "p95", "gateway cancel->last delta p95", "client lag p99",
              "stop late p50", "p95")
    print(" | ".join(header))
    for n, result, start, end in runs:
        lags = [lag * 1000 for t, lag in stats["lags"] if start <= t <= end]
        cpu = [c for t, c in stats["cpu"] if start <= t <= end]
        cpu_per = (cpu[-1] - cpu[0]) / (n * (end - start) / 60) if len(cpu) > 1 else float("nan")
        statuses = {s: list(result.responses.values()).count(s) for s in set(result.responses.values())}
        row = (
            n, f"{pct(lags, 50):.2f}", f"{pct(lags, 99):.2f}", f"{cpu_per:.2f}",
            f"{pct(result.first_delta_ms, 50):.1f}", f"{pct(result.first_delta_ms, 95):.1f}",
            f"{pct(result.barge_in_ms, 50):.2f}", f"{pct(result.barge_in_ms, 95):.2f}",
            f"{pct(result.cancel_to_last_delta_ms, 95):.2f}", json.dumps(statuses, sort_keys=True),
            len(result.audio_errors),
            f"{pct(traced(result, 'first_delta_ms'), 50):.1f}", f"{pct(traced(result, 'first_delta_ms'), 95):.1f}",
            f"{pct(traced(result, 'cancel_to_last_delta_ms'), 95):.2f}", f"{pct(result.client_lags_ms, 99):.1f}",
            f"{pct(result.stop_late_ms, 50):.1f}", f"{pct(result.stop_late_ms, 95):.1f}",
        )
        print(" | ".join(str(x) for x in row))
        for err in result.audio_errors[:5]:
            print("   ", err)
    if args.responder == "pipeline":
        print("\nwhere a turn's time goes (gateway trace, each stage from the one before it, P50 / P95 ms)")
        print(" | ".join(("sessions", *(f"{a} -> {b}" for a, b in pairwise(TURN_STAGES)))))
        for n, result, _, _ in runs:
            steps = [
                [t.get(b + "_ms", np.nan) - t.get(a + "_ms", 0.0) for t in result.traces]
                for a, b in pairwise(TURN_STAGES)
            ]
            print(" | ".join((str(n), *(f"{pct(v, 50):.1f} / {pct(v, 95):.1f}" for v in steps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
