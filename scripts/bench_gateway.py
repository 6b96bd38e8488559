"""Load benchmark: N concurrent Realtime sessions over loopback, speech streamed at real-time pace.

The gateway runs in its own process (this script with --serve), with a probe in its event loop (a 10 ms
timer: lag = how late it fires), its CPU time and the TTS engine's counters (batch size, steps, GPU time),
appended once a second to a JSON-lines file per gateway process in a stats folder. The load generator is
--clients processes of plain websockets clients (so it is never the bottleneck; each reports its own loop
lag) that stream fixture speech in 20 ms chunks on a real-time clock, one session scenario per responder,
repeated --cycles times per session:

echo      turn 1 is answered in full; turn 2's echo is interrupted by turn 3 (barge-in); turn 3 answered.
pipeline  STT (100 ms) and LLM (first token 80 ms) from the fake OpenAI-compatible server; turn 1's reply is
          interrupted by turn 2 (barge-in), turn 2's reply is stopped by response.cancel 300 ms after its
          first audio. TTS: the tone engine (--tts tone: first audio after 25 ms, then real-time pace), or
          the Qwen3-TTS engine (--tts engine --checkpoint DIR), in a thread of the gateway or in an engine
          process (--engine-mode process: the gateway starts it as `[engine] mode = "process"` does).

Sessions start as real traffic does, at the arrivals of a Poisson process spread over --spread seconds
(default: one scenario's length, so turns end at random moments), or all at the same instant (--aligned:
the worst case; --arrivals poisson,aligned runs both). Each session connects ahead of its start.

Reported per level: the gateway's loop lag (P99 per gateway process), speech_stopped -> first audio delta
P50/P95, VAD lateness P50/P95 (speech_stopped after the audio that completed the silence was sent), the
engine's mean batch and its step and GPU time per second, the load generator's own lag, barge-in and
cancel times, and audio lost or reordered (echo: the reply must be the committed input audio, byte for
byte; all: no delta of a response after its response.done). A second table gives stop -> first delta and
cancel -> last delta as the gateway's own trace (gateway/runtime/trace.py) records them, and, for the pipeline,
where a turn's time goes.

    .venv/bin/python scripts/bench_gateway.py --responder echo --sessions 1,10,50,100
    .venv/bin/python scripts/bench_gateway.py --responder pipeline --sessions 1,50
    .venv/bin/python scripts/bench_gateway.py --responder pipeline --tts engine --checkpoint /tmp/q06 \\
        --engine-mode process --max-streams 512 --sessions 100,200,400 --arrivals poisson,aligned

--workers N runs the gateway as `serve --workers N` does (gateway.server.workers: N worker processes on one
port, sharing the engine processes): each worker probes itself into its own file in the stats folder, and
the report gives every worker's loop lag P99 and their maximum (the issue's target is on each worker).

    .venv/bin/python scripts/bench_gateway.py --responder pipeline --tts engine --checkpoint /tmp/q06 \\
        --engine-mode process --max-streams 512 --workers 12 --clients 4 --sessions 100,200,400 \\
        --arrivals poisson,aligned --aligned-sessions 400
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import dataclasses
import gc
import json
import multiprocessing
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import cpu_stages
import numpy as np
import orjson
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures"
CHUNK_MS = 20
DELTA_TYPES = ("response.output_audio.delta", "response.audio.delta")
CONNECT_LEAD_S = 2.0  # a session connects this long before its first audio
REPLY = "Sure. The weather tomorrow looks sunny with a light breeze, and it should stay warm until the evening."


def load_pcm(name: str) -> bytes:
    with wave.open(str(FIXTURES / name)) as w:
        return w.readframes(w.getnframes())


def silence(ms: int) -> bytes:
    return bytes(48 * ms)


def scenario(responder: str) -> bytes:
    sentence = load_pcm("one_sentence.wav")
    if responder == "echo":
        return sentence + silence(4000) + sentence + silence(500) + sentence + silence(4000)
    return sentence + silence(1200) + sentence + silence(5000)


async def lag_probe(record: Callable[[float], None]) -> None:
    """A 10 ms timer in this process's loop: records how late (seconds) it fires, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + 0.01
        await asyncio.sleep(0.01)
        record(loop.time() - due)


# --- the gateway process ---------------------------------------------------------------------------


def run_queue_wait_s() -> float:
    """How long this process's main thread (its event loop) has waited for a core, in all (Linux's
    /proc/self/schedstat; 0 where there is none)."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


async def probe(path: Path, engine: Any, sessions: Callable[[], int]) -> None:
    """Once a second, append this process's loop lags, CPU time, sessions, its wait for a core and its longest
    garbage collection over that second, and (when `engine` has stats()) the TTS engine's counters to `path`,
    as one JSON line; until cancelled."""
    lags: list[float] = []
    task = asyncio.create_task(lag_probe(lambda lag: lags.append(round(lag * 1000, 3))))
    stats = getattr(engine, "stats", None)
    collecting, gc_max = 0.0, 0.0

    def timed_gc(phase: str, info: dict[str, int]) -> None:
        nonlocal collecting, gc_max
        if phase == "start":
            collecting = time.perf_counter()
        else:
            gc_max = max(gc_max, time.perf_counter() - collecting)

    gc.callbacks.append(timed_gc)
    waited = run_queue_wait_s()
    try:
        with path.open("a", buffering=1) as out:
            while True:
                await asyncio.sleep(1.0)
                now_waited = run_queue_wait_s()
                record = {"t": time.time(), "pid": os.getpid(), "lags_ms": lags, "cpu_s": time.process_time(),
                          "sessions": sessions(), "core_wait_ms": round((now_waited - waited) * 1000, 3),
                          "gc_max_ms": round(gc_max * 1000, 3)}
                lags, waited, gc_max = [], now_waited, 0.0
                if stats is not None:
                    record["engine"] = await stats()
                out.write(json.dumps(record) + "\n")
    finally:
        gc.callbacks.remove(timed_gc)
        task.cancel()


def gateway_config(args: argparse.Namespace) -> tuple[Any, bool]:
    """The benchmark's gateway configuration, and whether it speaks with the bench's tone engine."""
    from gateway.config import load_config

    config = load_config()
    config.server.port = args.port
    config.server.host = "127.0.0.1"
    config.webrtc.enabled = False
    config.mcp.enabled = False  # no session here calls a tool: the mcp package need not be installed
    config.trace.jsonl_path = str(Path(args.stats_dir) / "trace.jsonl")
    config.server.drain_seconds = 0  # the benchmark's SIGTERM comes after its sessions: no drain to wait for
    # Every session comes from this one address, all handshaking at once when aligned: no per-client share.
    config.server.max_connections_per_client = 1_000_000
    if args.responder == "echo":
        # The echo alone: not the local models "auto" picks where they are installed, nor their whisper.
        config.responder.kind, config.responder.echo_pace, config.local.stt = "echo", 1.0, False
        return config, False
    config.responder.kind = "pipeline"
    config.stt.base_url = config.llm.base_url = args.fake_url
    if args.tts == "tone":
        return config, True
    config.tts.engine = "qwen3"
    engine = config.engine
    engine.checkpoint, engine.mode, engine.devices = args.checkpoint, args.engine_mode, args.engine_devices
    engine.max_streams, engine.max_frames = args.max_streams, args.engine_max_frames
    return config, False


def tone_responder(config: Any) -> Any:
    """The pipeline on the fake backends with a tone engine that starts after 25 ms, then keeps real time."""
    from gateway.responders.pipeline import BridgeSettings, PipelineResponder
    from gateway.responders.remote import LlmClient
    from gateway.responders.tone_tts import ToneEngine

    return PipelineResponder(LlmClient.from_config(config.llm), ToneEngine(first_audio_ms=25, realtime=True),
                             BridgeSettings(config.tts.starter_chars, config.tts.max_segment_chars))


async def probe_worker(server: Any) -> None:
    """Each worker of `serve --workers N` (gateway.server.workers), once it serves: says so, then probes itself into
    the stats folder (the trace file's)."""
    print("ready", flush=True)
    await probe(Path(server.config.trace.jsonl_path).parent / f"gateway-{os.getpid()}.jsonl",
                getattr(server.gateway.responder, "tts_engine", None), lambda: len(server.gateway.sessions))


def serve_workers(args: argparse.Namespace) -> int:
    """The gateway as `serve --workers N` runs it: this process is the parent (engine processes included)."""
    from gateway.server.workers import Hooks, Workers, worker_count

    config, tone = gateway_config(args)
    config.server.workers = args.workers
    config.server.worker_balance = args.worker_balance
    hooks = Hooks(responder=tone_responder if tone else None, serving=probe_worker)
    return Workers(config, worker_count(config), hooks=hooks).run()


async def serve(args: argparse.Namespace) -> None:
    from gateway.server.serve import GatewayServer

    config, tone = gateway_config(args)
    await serve_probed(GatewayServer(config, tone_responder(config) if tone else None), args.stats_dir)


async def serve_probed(gateway: Any, stats_dir: str) -> None:
    """Start `gateway` (a GatewayServer), say "ready" on stdout, and probe its stats into `stats_dir` until
    SIGTERM; then stop it."""
    await gateway.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(probe(Path(stats_dir) / f"gateway-{os.getpid()}.jsonl",
                                     getattr(gateway.gateway.responder, "tts_engine", None),
                                     lambda: len(gateway.gateway.sessions)))
    print("ready", flush=True)
    await stop.wait()
    task.cancel()
    await gateway.stop()


def start_gateway(args: argparse.Namespace, stats_dir: Path, fake_url: str) -> subprocess.Popen[str]:
    """The gateway process(es), started; returns once they serve."""
    return spawn_serving([__file__, "--serve", "--port", str(args.port), "--stats-dir", str(stats_dir),
                          "--responder", args.responder, "--fake-url", fake_url, "--tts", args.tts,
                          "--checkpoint", args.checkpoint, "--engine-mode", args.engine_mode,
                          "--engine-devices", args.engine_devices, "--max-streams", str(args.max_streams),
                          "--engine-max-frames", str(args.engine_max_frames), "--workers", str(args.workers),
                          "--worker-balance", args.worker_balance], args.workers)


def spawn_serving(argv: list[str], processes: int = 1) -> subprocess.Popen[str]:
    """`python argv...` with this checkout importable, started; returns once each of its `processes` serving
    processes said "ready" (serve_probed)."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    server = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": pythonpath})
    for _ in range(processes):
        if server.stdout.readline().strip() != "ready":
            server.terminate()
            server.wait(60)
            raise SystemExit(f"the gateway did not start (exit status {server.returncode})")
    return server


# --- the load generator (each of --clients processes runs some of the sessions) -----------------------


# A pipeline turn's stages in the gateway's trace (gateway/runtime/trace.py), from the end of speech.
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
    late_starts: int = 0  # sessions whose connection was not ready at their start time
    traces: list[dict] = field(default_factory=list)  # the gateway's own per-turn trace (gateway/runtime/trace.py)

    def merge(self, other: dict[str, Any]) -> None:
        for f in dataclasses.fields(self):
            mine = getattr(self, f.name)
            if isinstance(mine, list):
                mine += other[f.name]
            elif isinstance(mine, dict):
                mine.update(other[f.name])
            else:
                setattr(self, f.name, mine + other[f.name])


def append_messages(timeline: bytes) -> list[str]:
    """The timeline as append events, encoded once: every session sends the same audio."""
    step = 48 * CHUNK_MS
    return [
        '{"type":"input_audio_buffer.append","audio":"' + base64.b64encode(timeline[i : i + step]).decode() + '"}'
        for i in range(0, len(timeline), step)
    ]


async def run_session(
    url: str, timeline: bytes, messages: list[str], responder: str, cycles: int, start_at: float,
    check_audio: bool, result: Result,
) -> None:
    """One session: connects CONNECT_LEAD_S before `start_at` (loop time), streams `messages` from then."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(start_at - CONNECT_LEAD_S - loop.time())
    expected_responses = (3 if responder == "echo" else 2) * cycles
    async with websockets.connect(url, compression=None, max_size=2**24) as ws:
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
                        if responder == "pipeline" and responses_seen % 2 == 0:
                            cancels.append(asyncio.create_task(cancel_later(rid)))
                elif kind == "response.done":
                    rid = ev["response"]["id"]
                    done[rid] = now
                    result.responses[rid] = ev["response"]["status"]
                    reason = (ev["response"].get("status_details") or {}).get("reason")
                    if reason == "turn_detected" and started_at is not None:
                        result.barge_in_ms.append((now - started_at) * 1000)
                        cancel_sent[rid] = started_at
                    if len(done) == expected_responses:
                        return
                elif kind == "error":
                    result.audio_errors.append(f"error event: {ev['error']['message']}")

        read = asyncio.create_task(reader())
        if loop.time() > start_at:
            result.late_starts += 1
        t0 = max(start_at, loop.time())
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


def client_process(url: str, plan: list[tuple[float, bool]], zero: float, responder: str, cycles: int) -> dict:
    """One load-generator process: its sessions, each (start offset from the wall time `zero`, check audio)."""

    async def run() -> Result:
        result = Result()
        loop = asyncio.get_running_loop()
        timeline = scenario(responder) * cycles
        messages = append_messages(timeline)
        probe_task = asyncio.create_task(lag_probe(lambda lag: result.client_lags_ms.append(lag * 1000)))
        base = loop.time() - time.time() + zero  # wall time `zero` on this loop's clock
        await asyncio.gather(*(run_session(url, timeline, messages, responder, cycles, base + offset, check,
                                           result) for offset, check in plan))
        probe_task.cancel()
        return result

    return dataclasses.asdict(asyncio.run(run()))


def arrivals(n: int, spread: float, aligned: bool, rng: random.Random) -> list[float]:
    """Start offsets: one instant for all, or a Poisson process of rate n / spread."""
    if aligned:
        return [0.0] * n
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(n / spread)
    return offsets


def run_level(pool: concurrent.futures.Executor, clients: int, url: str, n: int, args: argparse.Namespace,
              aligned: bool) -> tuple[Result, float, float]:
    rng = random.Random(n)
    spread = args.spread or len(scenario(args.responder)) / 48000
    offsets = arrivals(n, spread, aligned, rng)
    # The client shares the machine with the gateway: it checks the echoed bytes of 10 sessions only.
    plan = [(offset, i < 10) for i, offset in enumerate(offsets)]
    zero = time.time() + CONNECT_LEAD_S + 1.0 + n * 0.002  # time to connect every session first
    start = time.time()
    futures = [pool.submit(client_process, url, plan[k::clients], zero, args.responder, args.cycles)
               for k in range(clients) if plan[k::clients]]
    result = Result()
    for future in futures:
        result.merge(future.result())
    return result, start, time.time()


class Profiler:
    """py-spy on one gateway process for `seconds` of a level, from a third of the way into its arrivals."""

    def __init__(self, stats_dir: Path, seconds: float, spread: float) -> None:
        self._raw: str | None = None
        self._thread: threading.Thread | None = None
        if seconds > 0:
            delay = CONNECT_LEAD_S + 1.0 + spread / 3
            self._thread = threading.Thread(target=self._run, args=(stats_dir, seconds, delay), daemon=True)
            self._thread.start()

    def _run(self, stats_dir: Path, seconds: float, delay: float) -> None:
        time.sleep(delay)
        probes = sorted(stats_dir.glob("gateway-*.jsonl"))  # a gateway process each (a worker each)
        if probes:
            self._raw = cpu_stages.record(int(probes[0].stem.split("-")[1]), seconds)

    def shares(self) -> dict[str, float]:
        if self._thread is None:
            return {}
        self._thread.join()
        return cpu_stages.shares(self._raw) if self._raw else {}


# --- the report ---------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    values = [v for v in values if not np.isnan(v)]
    return float(np.percentile(values, q)) if values else float("nan")


def traced(result: Result, key: str) -> list[float]:
    return [t[key] for t in result.traces if key in t]


def gateway_records(stats_dir: Path, start: float, end: float) -> dict[int, list[dict]]:
    """Each gateway process's probe records (by pid) inside [start, end]."""
    out: dict[int, list[dict]] = {}
    for path in sorted(stats_dir.glob("gateway-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if start <= record["t"] <= end:
                out.setdefault(record["pid"], []).append(record)
    return out


def engine_rates(records: dict[int, list[dict]]) -> dict[str, float]:
    """Mean batch, and step and GPU seconds per second, over the window, from the engine counters one gateway
    process read (every gateway process reads the same engines)."""
    rows = next((r for r in records.values() if r and "engine" in r[0]), None)
    if not rows or len(rows) < 2:
        return {}
    first, last = rows[0], rows[-1]
    span = last["t"] - first["t"]
    totals: dict[str, float] = {}
    for key in ("steps", "frames", "step_seconds", "gpu_seconds"):
        before = {e.get("endpoint", i): e[key] for i, e in enumerate(first["engine"]) if e.get(key) is not None}
        after = {e.get("endpoint", i): e[key] for i, e in enumerate(last["engine"]) if e.get(key) is not None}
        # An engine restarted in the window (counters from zero) is left out.
        totals[key] = sum(after[k] - before[k] for k in after if k in before and after[k] >= before[k])
    engines = max(1, len(last["engine"]))
    gpu = any(e.get("gpu_seconds") is not None for e in last["engine"])
    return {"batch_mean": totals["frames"] / totals["steps"] if totals["steps"] else 0.0,
            "step_busy": totals["step_seconds"] / span / engines,
            "gpu_busy": totals["gpu_seconds"] / span / engines if gpu else float("nan"), "engines": engines}


def summarise(n: int, label: str, result: Result, records: dict[int, list[dict]], start: float,
              end: float) -> dict[str, Any]:
    lag_p99 = {pid: pct([lag for r in rows for lag in r["lags_ms"]], 99) for pid, rows in records.items()}
    # Each gateway process's most sessions at once in the level, and the spread: the worst against the mean.
    held = {pid: max((r.get("sessions", 0) for r in rows), default=0) for pid, rows in records.items()}
    cpu = [(r[0]["cpu_s"], r[-1]["cpu_s"]) for r in records.values() if len(r) > 1]
    cpu_per = sum(b - a for a, b in cpu) / (n * (end - start) / 60) if cpu else float("nan")
    statuses = {s: list(result.responses.values()).count(s) for s in set(result.responses.values())}
    return {
        "sessions": n, "arrivals": label, "loop_lag_p99_ms": lag_p99,
        "loop_lag_p99_max_ms": max(lag_p99.values(), default=float("nan")),
        "sessions_held": held,
        "spread": {"sessions_max": max(held.values(), default=0),
                   "sessions_mean": float(np.mean(list(held.values()))) if held else float("nan"),
                   "lag_p99_mean_ms": float(np.mean(list(lag_p99.values()))) if lag_p99 else float("nan")},
        "loop_lag_p50_ms": pct([lag for rows in records.values() for r in rows for lag in r["lags_ms"]], 50),
        "cpu_s_per_session_min": cpu_per,
        "first_delta_p50_ms": pct(result.first_delta_ms, 50), "first_delta_p95_ms": pct(result.first_delta_ms, 95),
        "vad_late_p50_ms": pct(result.stop_late_ms, 50), "vad_late_p95_ms": pct(result.stop_late_ms, 95),
        "barge_in_p50_ms": pct(result.barge_in_ms, 50), "barge_in_p95_ms": pct(result.barge_in_ms, 95),
        "cancel_to_last_delta_p95_ms": pct(result.cancel_to_last_delta_ms, 95),
        "gateway_first_delta_p50_ms": pct(traced(result, "first_delta_ms"), 50),
        "gateway_first_delta_p95_ms": pct(traced(result, "first_delta_ms"), 95),
        "gateway_cancel_to_last_delta_p95_ms": pct(traced(result, "cancel_to_last_delta_ms"), 95),
        "client_lag_p99_ms": pct(result.client_lags_ms, 99), "late_starts": result.late_starts,
        "responses": statuses, "audio_errors": len(result.audio_errors), "errors": result.audio_errors[:5],
        "engine": engine_rates(records),
        "stages": {f"{a} -> {b}": [pct(v, 50), pct(v, 95)] for a, b in pairwise(TURN_STAGES)
                   for v in [[t.get(b + "_ms", np.nan) - t.get(a + "_ms", 0.0) for t in result.traces]]},
    }


def print_report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    def f(x: float, digits: int = 1) -> str:
        return "-" if x != x else f"{x:.{digits}f}"

    engine = f", {args.tts} TTS" + (f" ({args.engine_mode})" if args.tts == "engine" else "")
    print(f"\nbench_gateway --responder {args.responder}{engine if args.responder == 'pipeline' else ''}  "
          f"({platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}; {args.workers} gateway "
          f"process(es), {args.clients} load processes, {args.cycles} cycles per session)")
    print("| sessions | arrivals | loop lag P99 ms: max (each gateway process) | stop -> first delta P50 / P95 ms | "
          "VAD late P50 / P95 ms | engine batch | engine step busy | GPU busy | load-gen lag P99 ms | audio errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        e = r["engine"]
        each = ", ".join(f(v) for v in r["loop_lag_p99_ms"].values())
        print(f"| {r['sessions']} | {r['arrivals']} | {f(r['loop_lag_p99_max_ms'])} ({each}) | "
              f"{f(r['first_delta_p50_ms'])} / {f(r['first_delta_p95_ms'])} | {f(r['vad_late_p50_ms'])} / "
              f"{f(r['vad_late_p95_ms'])} | {f(e.get('batch_mean', float('nan')))} | "
              f"{f(e.get('step_busy', float('nan')), 2)} | {f(e.get('gpu_busy', float('nan')), 2)} | "
              f"{f(r['client_lag_p99_ms'])} | {r['audio_errors']} |")
    print("\n| sessions | arrivals | lag P50 ms | CPU s / session-min | barge-in P50 / P95 ms | cancel -> last "
          "delta P95 ms | responses | gateway stop -> delta P50 / P95 ms | gateway cancel -> last delta P95 ms | "
          "late starts |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['sessions']} | {r['arrivals']} | {f(r['loop_lag_p50_ms'], 2)} | "
              f"{f(r['cpu_s_per_session_min'], 2)} | {f(r['barge_in_p50_ms'], 2)} / {f(r['barge_in_p95_ms'], 2)} | "
              f"{f(r['cancel_to_last_delta_p95_ms'], 2)} | {json.dumps(r['responses'], sort_keys=True)} | "
              f"{f(r['gateway_first_delta_p50_ms'])} / "
              f"{f(r['gateway_first_delta_p95_ms'])} | {f(r['gateway_cancel_to_last_delta_p95_ms'], 2)} | "
              f"{r['late_starts']} |")
        for err in r["errors"]:
            print("   ", err)
    if args.workers > 1:
        print(f"\nworkers' spread ([server] worker_balance = {args.worker_balance}): sessions held at most per "
              "worker, worst / mean, and loop lag P99, worst / mean")
        print("| sessions | arrivals | sessions held: worst / mean (each) | loop lag P99 ms: worst / mean |")
        print("| --- | --- | --- | --- |")
        for r in rows:
            sp = r["spread"]
            each = ", ".join(str(v) for v in r["sessions_held"].values())
            print(f"| {r['sessions']} | {r['arrivals']} | {sp['sessions_max']} / {f(sp['sessions_mean'])} ({each}) "
                  f"| {f(r['loop_lag_p99_max_ms'])} / {f(sp['lag_p99_mean_ms'])} |")
    if args.profile:
        print(f"\nCPU s per session-minute by stage (py-spy, {args.profile:g} s of one gateway process per level; "
              "scripts/cpu_stages.py)")
        print("| sessions | arrivals | " + " | ".join(cpu_stages.STAGES) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in cpu_stages.STAGES) + " |")
        for r in rows:
            by = r.get("cpu_by_stage") or {}
            print(f"| {r['sessions']} | {r['arrivals']} | "
                  + " | ".join(f(by.get(stage, float("nan")), 3) for stage in cpu_stages.STAGES) + " |")
    if args.responder == "pipeline":
        print("\nwhere a turn's time goes (gateway trace, each stage from the one before it, P50 / P95 ms)")
        print(" | ".join(("sessions", "arrivals", *rows[0]["stages"])) if rows else "")
        for r in rows:
            stages = (f"{f(a)} / {f(b)}" for a, b in r["stages"].values())
            print(" | ".join((str(r["sessions"]), r["arrivals"], *stages)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--responder", choices=["echo", "pipeline"], default="echo")
    parser.add_argument("--sessions", default="1,10,50,100", help="comma-separated session counts")
    parser.add_argument("--arrivals", default="poisson", help="poisson, aligned, or both (comma-separated): how "
                        "sessions' starts are spread")
    parser.add_argument("--aligned", action="store_true", help="every session starts at the same instant (the "
                        "worst case); the same as --arrivals aligned")
    parser.add_argument("--spread", type=float, default=0.0, help="seconds over which Poisson arrivals spread "
                        "(0 = one scenario's length)")
    parser.add_argument("--cycles", type=int, default=2, help="times each session runs its scenario")
    parser.add_argument("--clients", type=int, default=max(1, min(8, (os.cpu_count() or 1) // 4)),
                        help="load-generator processes")
    parser.add_argument("--tts", choices=["tone", "engine"], default="tone", help="pipeline: the TTS engine")
    parser.add_argument("--checkpoint", default="", help="--tts engine: the Qwen3-TTS checkpoint folder")
    parser.add_argument("--engine-mode", choices=["thread", "process"], default="thread")
    parser.add_argument("--engine-devices", default="auto", help="process mode: [engine] devices")
    parser.add_argument("--max-streams", type=int, default=0, help="[engine] max_streams (0 = its default)")
    parser.add_argument("--engine-max-frames", type=int, default=250, help="[engine] max_frames: random weights "
                        "never say EOS, so this ends a reply nobody cut (250 = 20 s)")
    parser.add_argument("--worker-balance", choices=["connections", "accept"], default="connections",
                        help="--workers: how the workers share connections ([server] worker_balance)")
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes (`serve --workers N`; "
                        "1 = one process, as `serve` runs by default on a CPU)")
    parser.add_argument("--aligned-sessions", default="", help="comma-separated session counts at which the "
                        "aligned arrivals run (default: every --sessions level)")
    parser.add_argument("--profile", type=float, default=0.0, help="seconds of py-spy samples of one gateway "
                        "process in each level (scripts/cpu_stages.py): CPU per session-minute by stage (0 = off)")
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--json", type=Path, help="write every level's figures here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stats-dir", help=argparse.SUPPRESS)
    parser.add_argument("--fake-url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        if args.workers > 1:
            return serve_workers(args)
        asyncio.run(serve(args))
        return 0
    if args.tts == "engine" and not args.checkpoint:
        parser.error("--tts engine needs --checkpoint")
    labels = ["aligned"] if args.aligned else [a.strip() for a in args.arrivals.split(",") if a.strip()]
    if not labels or set(labels) - {"poisson", "aligned"}:
        parser.error("--arrivals: poisson, aligned, or both")

    counts = [int(n) for n in args.sessions.split(",")]
    stats_dir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    procs: list[subprocess.Popen[str]] = []
    fake_url = ""
    if args.responder == "pipeline":
        fake = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_openai", "--port", str(args.port + 1), "--stt-ms", "100",
             "--ttft-ms", "80", "--reply", REPLY],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )
        procs.append(fake)
        fake.stdout.readline()
        fake_url = f"http://127.0.0.1:{args.port + 1}/v1"
    url = f"ws://127.0.0.1:{args.port}/v1/realtime"
    rows = []
    server = None
    # spawn: the load generator's processes start clean (no copy of this process's state).
    pool = concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=multiprocessing.get_context("spawn"))
    try:
        server = start_gateway(args, stats_dir, fake_url)
        trace_path = stats_dir / "trace.jsonl"
        aligned_at = {int(n) for n in args.aligned_sessions.split(",") if n.strip()} or set(counts)
        for n in counts:
            for label in labels:
                if label == "aligned" and n not in aligned_at:
                    continue
                profiler = Profiler(stats_dir, args.profile, args.spread or len(scenario(args.responder)) / 48000)
                result, start, end = run_level(pool, args.clients, url, n, args, label == "aligned")
                time.sleep(1.5)  # the probes' last records
                result.traces = [json.loads(line) for line in trace_path.read_text().splitlines()]
                trace_path.write_text("")  # the gateway appends to it: what follows belongs to the next run
                rows.append(summarise(n, label, result, gateway_records(stats_dir, start, end), start, end))
                rows[-1]["cpu_by_stage"] = {stage: share * rows[-1]["cpu_s_per_session_min"]
                                            for stage, share in profiler.shares().items()}
                # As it goes, so that a run cut short (a device call's time limit) keeps the levels it measured.
                r = rows[-1]
                print(f"{n} sessions, {label}: loop lag P99 max {r['loop_lag_p99_max_ms']:.1f} ms, stop -> first "
                      f"delta P95 {r['first_delta_p95_ms']:.1f} ms, VAD late P95 {r['vad_late_p95_ms']:.1f} ms, "
                      f"audio errors {r['audio_errors']}", flush=True)
                write_json(args, rows)
    finally:
        pool.shutdown(cancel_futures=True)
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        for p in procs:
            p.terminate()
            p.wait(10)
        shutil.rmtree(stats_dir, ignore_errors=True)
    print_report(args, rows)
    return 0


def write_json(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join([Path(sys.executable).name, *sys.argv]),
                                         "machine": f"{platform.node()}, {os.cpu_count()} cores",
                                         "date": time.strftime("%Y-%m-%d %H:%M %Z"), "levels": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
