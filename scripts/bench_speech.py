"""Speech API benchmark: POST /v1/audio/speech at several concurrencies, streamed, against the Qwen3-TTS engine.

The gateway runs in its own process (this script with --serve: bench_gateway.py's gateway, its pipeline
responder on the fake OpenAI-compatible server, so realtime sessions can share the engine; its probe records
loop lag, CPU and the engine's counters once a second), or as `serve --workers N` runs it (--workers N: N
worker processes on one port sharing the engine process, each probed; the worst one's loop lag is reported).
The load generator is --clients processes of HTTP/1.1 clients (asyncio protocols, httptools' parser): at
concurrency C, C clients each open a connection, then make --requests requests back to back on it (closed
loop), reading each answer as it streams (pcm by default: what the engine makes, nothing to decode); each
process records its own loop lag (a late client inflates TTFB and so "HTTP"). One answer per voice, not
counted, comes before its first level. Each request's input is long enough that the answer runs to [engine]
max_frames (--frames; random weights rarely say EOS), so every answer is --frames x 80 ms of audio.

Voices: "speaker" (a CustomVoice speaker: [engine.voices] alloy) and "clone" (an in-context clone of
tests/fixtures/one_sentence.wav with its transcript, prepared at start as [voices.bench]: needs a Base
checkpoint among --checkpoint's). Reported per voice and level:

  TTFB P50/P95        the client's request sent (written to its socket) -> first audio byte
  first audio P50/P95 the request's arrival -> the engine's first packet, as the gateway reports it
                      (Server-Timing "audio"); queue = the wait for a place ([speech] max_streams)
  HTTP P50/P95        TTFB - first audio, per request: what the HTTP path adds to the engine's first packet
  HTTP in, out P95    its two ends (each gateway process times the requests the benchmark tags, X-Bench-Id):
                      request sent -> the app called (uvicorn parsing it, and waiting behind the requests that
                      came with it), and the first audio bytes sent -> the client has them; the progress
                      lines and --json also give HTTP P95 (and its inbound end's) for each client's first
                      request (all at once) and its later ones (each as the answer before it ends), and
                      each gateway process's share of the requests and its inbound end's P95, and the
                      worst second of any of them: its event loop's wait for a core (Linux's schedstat), and
                      its longest garbage collection
  RTF P50/max         request sent -> last byte, over the answer's audio duration
  audio s/s           seconds of audio delivered per second of the level, all requests together
  engine              mean batch, step busy share (and GPU busy on a GPU) over the level
  loop lag P99        the gateway's (the worst worker's), and in brackets the load generator's

--sessions N also runs N realtime sessions (bench_gateway.py's pipeline scenario, Poisson arrivals over one
scenario of 14 s, four times over) through the same engine; each speech level starts once all of them have
started, and their stop -> first delta P50/P95 is reported beside it.

    .venv/bin/python scripts/bench_speech.py --checkpoint tests/data/qwen3_tts_tiny,tests/data/qwen3_tts_tiny_base \\
        --concurrency 1,2 --frames 20 --voices speaker,clone        # (GATEWAY_ENGINE_VOICES=alloy=vivian)
    python3 scripts/bench_speech.py --checkpoint /tmp/q06,/tmp/f06b --max-streams 512 --concurrency 1,24,64,256 \\
        --frames 125 --engine-mode process --workers 8 --sessions 200

--codecs measures the response formats' encoders alone (gateway/audio_codecs.py, PyAV) on this CPU: the CPU
time per second of audio, and how much audio goes in before a format's first bytes come out, in 80 ms packets
(the engine's first packet) of speech (tests/fixtures/two_turns.wav).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
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
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httptools

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_gateway as bg  # noqa: E402 - the gateway process, its probe and the realtime load generator

REFERENCE = ROOT / "tests" / "fixtures" / "one_sentence.wav"
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog."
# Longer than any answer's frames can speak (a token per 80 ms frame): the answer runs to max_frames.
INPUT = ("Streaming speech keeps going while there is text to read, one frame after another, so that the "
         "listener hears the first words long before the last ones are made. ") * 8
FRAME_S = 0.08
VOICES = {"speaker": "alloy", "clone": "bench"}
# --sessions: each runs bench_gateway's pipeline scenario this many times; a speech level starts once all of
# them have started (they arrive over one scenario), so it runs while they talk, if it ends within the rest.
SESSION_CYCLES = 4
SCENARIO_S = len(bg.scenario("pipeline")) / 48000


# --- the gateway process ---------------------------------------------------------------------------


def speech_config(args: argparse.Namespace) -> Any:
    from gateway.config import VoiceConfig  # noqa: PLC0415 - the gateway's modules in its own processes only

    config, _ = bg.gateway_config(args)
    speech = config.speech
    # Each worker's share (with --workers N, in each): the engine's free rows are the limit of them all.
    speech.max_streams, speech.max_waiting, speech.wait_timeout_s = args.max_streams or 0, 4096, 600.0
    if "clone" in args.voices.split(","):
        config.voices.named = {"bench": VoiceConfig(reference=str(REFERENCE), transcript=REFERENCE_TEXT)}
    return config


def timed_app(app: Any) -> Any:
    """This benchmark's middleware in each gateway process: for each request it tagged (X-Bench-Id), when the
    app was called and when its first body bytes went to the socket (time.perf_counter, CLOCK_MONOTONIC: one
    clock for every process on the host), appended to the stats folder's http-PID.jsonl once a second."""
    out = Path(os.environ["BENCH_SPEECH_STATS"]) / f"http-{os.getpid()}.jsonl"
    pending: list[str] = []
    flusher: asyncio.Task[None] | None = None

    async def flush() -> None:
        while True:
            await asyncio.sleep(1.0)
            if pending:
                with out.open("a") as f:
                    f.write("".join(pending))
                pending.clear()

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        nonlocal flusher
        tag = dict(scope["headers"]).get(b"x-bench-id") if scope["type"] == "http" else None
        if tag is None:
            await app(scope, receive, send)
            return
        if flusher is None:
            flusher = asyncio.get_running_loop().create_task(flush())
        called, first = time.perf_counter(), None

        async def first_body(message: Any) -> None:
            nonlocal first
            await send(message)
            if first is None and message["type"] == "http.response.body":
                first = time.perf_counter()
                pending.append(json.dumps({"id": tag.decode(), "called": called, "first": first}) + "\n")

        await app(scope, receive, first_body)

    return timed


async def serve(args: argparse.Namespace) -> None:
    from gateway.server.serve import GatewayServer  # noqa: PLC0415 - the gateway's modules in its own process only

    server = GatewayServer(speech_config(args))
    server.app = timed_app(server.app)
    await bg.serve_probed(server, args.stats_dir)


def serve_workers(args: argparse.Namespace) -> int:
    """The gateway as `serve --workers N` runs it (bench_gateway.serve_workers, with this benchmark's config)."""
    from gateway.server.workers import Hooks, Workers, worker_count  # noqa: PLC0415 - as serve's

    config = speech_config(args)
    config.server.workers = args.workers
    return Workers(config, worker_count(config), hooks=Hooks(serving=bg.probe_worker, app=timed_app)).run()


def start_gateway(args: argparse.Namespace, stats_dir: Path, fake_url: str) -> subprocess.Popen[str]:
    return bg.spawn_serving([__file__, "--serve", "--port", str(args.port), "--stats-dir", str(stats_dir),
                             "--fake-url", fake_url, "--checkpoint", args.checkpoint, "--engine-mode",
                             args.engine_mode, "--engine-devices", args.engine_devices, "--max-streams",
                             str(args.max_streams), "--frames", str(args.frames), "--voices", args.voices,
                             "--workers", str(args.workers)], args.workers)


# --- the load generator ------------------------------------------------------------------------------


class Answers(asyncio.Protocol):
    """One kept-alive connection of the load generator, one request at a time, its answers parsed by httptools
    (uvicorn's parser). Not aiohttp: its own work on each answer, with 64 answers starting at once in one
    process, queued up and was measured as the gateway's outbound end (bench/RESULTS.md). Here an answer's
    first audio byte is timed as its bytes are read, before anything else of it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[dict[str, Any]] | None = None
        self.row: dict[str, Any] = {}
        self.error = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def ask(self, head: bytes, body: bytes, tag: str) -> asyncio.Future[dict[str, Any]]:
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.row, self.error = {"id": tag, "first": None, "bytes": 0}, bytearray()
        self.transport.write(head + body)
        self.row["sent"] = time.perf_counter()  # written to the socket: the client's own work before is not HTTP's
        return self.answer

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc or ConnectionError("the gateway closed the connection"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"server-timing":
            timing = dict(p.strip().split(";dur=") for p in value.decode().split(",") if p)
            self.row["audio_ms"] = float(timing.get("audio", "nan"))
            self.row["queue_ms"] = float(timing.get("queue", "nan"))

    def on_headers_complete(self) -> None:
        self.row["status"] = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.row["status"] != 200:
            self.error += body[:200]
        elif self.row["first"] is None:
            self.row["first"] = time.perf_counter()
        self.row["bytes"] += len(body)

    def on_message_complete(self) -> None:
        self.row["end"] = time.perf_counter()
        if self.row["status"] != 200:
            self.row = {"status": self.row["status"], "error": self.error.decode(errors="replace")[:200]}
        self._finish(None)

    def _finish(self, exc: Exception | None) -> None:
        answer, self.answer = self.answer, None
        if answer is not None and not answer.done():
            if exc is None:
                answer.set_result(self.row)
            else:
                answer.set_exception(exc)


def client_process(url: str, voice: str, fmt: str, workers: int, requests: int,
                   seed: int) -> tuple[list[dict[str, Any]], list[float]]:
    """One load-generator process: `workers` clients, each making `requests` requests back to back on a kept-alive
    connection (opened before the first: a connection's set-up is not the HTTP path's first packet); the rows,
    and this process's own loop lags (ms: how late it is at reading what the gateway sent)."""
    address = urlsplit(url)
    assert address.hostname is not None and address.port is not None

    async def run() -> tuple[list[dict[str, Any]], list[float]]:
        loop = asyncio.get_running_loop()
        rng = random.Random(seed)
        lags: list[float] = []

        async def worker(k: int, connection: Answers) -> list[dict[str, Any]]:
            rows = []
            for n in range(requests):
                body = json.dumps({"model": "tts-1", "input": INPUT, "voice": voice, "response_format": fmt,
                                   "seed": rng.randrange(2**32)}).encode()
                tag = f"{voice}-{seed}-{k}-{n}"
                head = (f"POST {address.path} HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\nX-Bench-Id: {tag}\r\n\r\n").encode()
                rows.append(await asyncio.wait_for(connection.ask(head, body, tag), 900))
            return rows

        connections = [c for _, c in await asyncio.gather(
            *(loop.create_connection(Answers, address.hostname, address.port) for _ in range(workers)))]
        # A connection is complete once the kernel has it, and the gateway's once a worker has it (`serve`'s
        # parent accepts each and hands it over): one answer on each first, so that a level's requests do not
        # wait for that, which is the connection's set-up.
        ready = f"GET /healthz HTTP/1.1\r\nHost: {address.netloc}\r\n\r\n".encode()
        await asyncio.gather(*(c.ask(ready, b"", "ready") for c in connections))
        probe = asyncio.create_task(bg.lag_probe(lambda lag: lags.append(lag * 1000)))
        try:
            rows = [r for rs in await asyncio.gather(*(worker(k, c) for k, c in enumerate(connections))) for r in rs]
        finally:
            probe.cancel()
            for connection in connections:
                if connection.transport is not None:
                    connection.transport.close()
        return rows, lags

    return asyncio.run(run())


def run_speech(pool: concurrent.futures.Executor, clients: int, url: str, voice: str, args: argparse.Namespace,
               concurrency: int, level: int) -> tuple[list[dict[str, Any]], list[float], float, float]:
    shares = [concurrency // clients + (k < concurrency % clients) for k in range(clients)]
    start = time.time()
    # Each level's seeds, and so its requests' tags, are its own: a level may repeat another's concurrency.
    futures = [pool.submit(client_process, url, voice, args.format, n, args.requests,
                           1_000_000 * level + 1000 * k + concurrency) for k, n in enumerate(shares) if n]
    results = [f.result() for f in futures]
    return [r for rows, _ in results for r in rows], [lag for _, lags in results for lag in lags], start, time.time()


def bench_codecs() -> None:
    import wave  # noqa: PLC0415 - this mode only

    from gateway.audio_codecs import RESPONSE_FORMATS, SpeechEncoder  # noqa: PLC0415

    with wave.open(str(ROOT / "tests" / "fixtures" / "two_turns.wav")) as w:
        speech = w.readframes(w.getnframes()) * 4  # ~32 s
    packet = 2 * 1920
    print("| format | CPU ms per audio second | audio in before the first bytes out, ms |")
    print("| --- | --- | --- |")
    for fmt in RESPONSE_FORMATS:
        encoder = SpeechEncoder(fmt)
        first = None
        cpu = time.process_time()
        for offset in range(0, len(speech), packet):
            if encoder.encode(speech[offset:offset + packet]) and first is None:
                first = (offset + packet) / 48
        encoder.finish()
        cpu_ms = (time.process_time() - cpu) * 1000 / (len(speech) / 48000)
        print(f"| {fmt} | {cpu_ms:.2f} | {first:.0f} |")


# --- the report ---------------------------------------------------------------------------------------


def server_times(stats_dir: Path) -> dict[str, dict[str, float]]:
    """timed_app's records, every gateway process's (its "pid"), by request tag."""
    return {r["id"]: {**r, "pid": path.stem}
            for path in stats_dir.glob("http-*.jsonl") for r in map(json.loads, path.open())}


def summarise(voice: str, concurrency: int, rows: list[dict[str, Any]], client_lags: list[float], start: float,
              end: float, records: dict[int, list[dict]], times: dict[str, dict[str, float]],
              sessions: bg.Result | None, args: argparse.Namespace) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == 200 and r["first"] is not None]
    bytes_per_s = 2 * 24000 if args.format == "pcm" else None
    audio_s = [r["bytes"] / bytes_per_s for r in ok] if bytes_per_s else [args.frames * FRAME_S for _ in ok]
    ttfb = [(r["first"] - r["sent"]) * 1000 for r in ok]
    http = [t - r["audio_ms"] for t, r in zip(ttfb, ok, strict=True)]
    # HTTP's two ends, from timed_app's records: request sent -> the app called (the client's write, the
    # kernel, uvicorn's parsing, and the wait behind the requests that came with it), and the first body bytes
    # sent -> the client has them (the kernel, the client's parsing and its own wait in a burst).
    timed = [(r, times[r["id"]]) for r in ok if r["id"] in times]
    http_in = [(t["called"] - r["sent"]) * 1000 for r, t in timed]
    http_out = [(r["first"] - t["first"]) * 1000 for r, t in timed]
    # A level's first requests arrive at once; each client's next one when its answer ends (answers of one
    # length, started together, end together): HTTP added and its inbound end, P95, for each of the two.
    first = [r["id"].endswith("-0") for r in ok]
    timed_first = [r["id"].endswith("-0") for r, _ in timed]
    waves = {name: ([h for h, f in zip(http, first, strict=True) if f == is_first],
                    [i for i, f in zip(http_in, timed_first, strict=True) if f == is_first])
             for name, is_first in (("first", True), ("later", False))}
    # Each gateway process's share of the level's requests and its inbound end's P95: a balance to check.
    workers: dict[str, list[float]] = {}
    for (_, t), inbound in zip(timed, http_in, strict=True):
        workers.setdefault(t["pid"], []).append(inbound)
    rtf = [(r["end"] - r["sent"]) / a for r, a in zip(ok, audio_s, strict=True) if a > 0]
    # Each gateway process's loop lag P99 (one per worker with --workers N): the worst one is reported.
    lag_p99 = [bg.pct([lag for rec in rs for lag in rec["lags_ms"]], 99) for rs in records.values()]
    probed = [rec for rs in records.values() for rec in rs]
    row = {
        "voice": voice, "concurrency": concurrency, "requests": len(rows), "errors": len(rows) - len(ok),
        "error_sample": [r.get("error") for r in rows if r["status"] != 200][:2],
        "ttfb_p50_ms": bg.pct(ttfb, 50), "ttfb_p95_ms": bg.pct(ttfb, 95),
        "first_audio_p50_ms": bg.pct([r["audio_ms"] for r in ok], 50),
        "first_audio_p95_ms": bg.pct([r["audio_ms"] for r in ok], 95),
        "queue_p95_ms": bg.pct([r["queue_ms"] for r in ok], 95),
        "http_p50_ms": bg.pct(http, 50), "http_p95_ms": bg.pct(http, 95),
        "http_in_p50_ms": bg.pct(http_in, 50), "http_in_p95_ms": bg.pct(http_in, 95),
        "http_out_p50_ms": bg.pct(http_out, 50), "http_out_p95_ms": bg.pct(http_out, 95),
        **{f"http_{name}_p95_ms": bg.pct(h, 95) for name, (h, _) in waves.items()},
        **{f"http_in_{name}_p95_ms": bg.pct(i, 95) for name, (_, i) in waves.items()},
        "worker_requests": sorted(len(ins) for ins in workers.values()),
        "worker_in_p95_ms": sorted(round(bg.pct(ins, 95), 2) for ins in workers.values()),
        # The worst second of any gateway process: its loop's wait for a core, and its longest collection.
        "core_wait_max_ms": max((rec.get("core_wait_ms", 0.0) for rec in probed), default=float("nan")),
        "gc_max_ms": max((rec.get("gc_max_ms", 0.0) for rec in probed), default=float("nan")),
        "rtf_p50": bg.pct(rtf, 50), "rtf_max": max(rtf, default=float("nan")),
        "audio_s_per_s": sum(audio_s) / (end - start), "seconds": end - start,
        "loop_lag_p99_ms": max(lag_p99, default=float("nan")), "client_lag_p99_ms": bg.pct(client_lags, 99),
        "engine": bg.engine_rates(records),
    }
    if sessions is not None:
        row["sessions"] = args.sessions
        row["session_first_delta_p50_ms"] = bg.pct(sessions.first_delta_ms, 50)
        row["session_first_delta_p95_ms"] = bg.pct(sessions.first_delta_ms, 95)
        statuses = list(sessions.responses.values())
        row["session_responses"] = {s: statuses.count(s) for s in set(statuses)}
    return row


def print_report(rows: list[dict[str, Any]]) -> None:
    head = ("| voice | conc. | requests (errors) | TTFB P50 / P95 ms | first audio P50 / P95 ms | HTTP P50 / P95 ms "
            "| HTTP in, out P95 ms | RTF P50 / max | audio s/s | mean batch | loop lag P99 ms (clients') "
            "| sessions: first delta P50 / P95 ms |")
    print(head)
    print("| --- " * (head.count("|") - 1) + "|")
    for r in rows:
        sessions = (f"{r['sessions']}: {r['session_first_delta_p50_ms']:.0f} / {r['session_first_delta_p95_ms']:.0f}"
                    if "sessions" in r else "-")
        print(f"| {r['voice']} | {r['concurrency']} | {r['requests']} ({r['errors']}) | {r['ttfb_p50_ms']:.1f} / "
              f"{r['ttfb_p95_ms']:.1f} | {r['first_audio_p50_ms']:.1f} / {r['first_audio_p95_ms']:.1f} | "
              f"{r['http_p50_ms']:.2f} / {r['http_p95_ms']:.2f} | "
              f"{r['http_in_p95_ms']:.2f}, {r['http_out_p95_ms']:.2f} | {r['rtf_p50']:.3f} / {r['rtf_max']:.3f} | "
              f"{r['audio_s_per_s']:.1f} | {r['engine'].get('batch_mean', float('nan')):.1f} | "
              f"{r['loop_lag_p99_ms']:.1f} ({r['client_lag_p99_ms']:.1f}) | {sessions} |")


def write_json(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join([Path(sys.executable).name, *sys.argv]),
                                         "machine": f"{platform.node()}, {os.cpu_count()} cores",
                                         "date": time.strftime("%Y-%m-%d %H:%M %Z"), "levels": rows}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="", help="[engine] checkpoint: a CustomVoice checkpoint, and a "
                        "Base one for --voices clone (comma-separated)")
    parser.add_argument("--codecs", action="store_true", help="measure the response formats' encoders alone")
    parser.add_argument("--voices", default="speaker", help="speaker, clone, or both (comma-separated)")
    parser.add_argument("--concurrency", default="1,24,64,256", help="comma-separated concurrent clients")
    parser.add_argument("--requests", type=int, default=2, help="requests each client makes, back to back")
    parser.add_argument("--frames", type=int, default=125, help="[engine] max_frames: each answer's length "
                        "(80 ms a frame)")
    parser.add_argument("--format", default="pcm", help="response_format (pcm: no encoding)")
    parser.add_argument("--engine-mode", choices=["thread", "process"], default="thread")
    parser.add_argument("--engine-devices", default="auto")
    parser.add_argument("--max-streams", type=int, default=0, help="[engine] max_streams, and [speech] max_streams "
                        "(0 = their defaults)")
    parser.add_argument("--sessions", type=int, default=0, help="realtime sessions sharing the engine during "
                        "each level (0 = none)")
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes (`serve --workers N`, "
                        "sharing the engine process; 1 = one process)")
    parser.add_argument("--clients", type=int, default=max(1, min(4, (os.cpu_count() or 1) // 4)),
                        help="load-generator processes")
    parser.add_argument("--client-cpus", type=int, default=0, help="pin the load generator to this many cores of "
                        "its own, the gateway and its engine processes to the rest (0 = share them all)")
    parser.add_argument("--time-budget", type=float, default=0, help="seconds: no new level starts past it")
    parser.add_argument("--port", type=int, default=18775)
    parser.add_argument("--json", type=Path, help="write every level's figures here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stats-dir", help=argparse.SUPPRESS)
    parser.add_argument("--fake-url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # What bench_gateway's gateway needs to know: the pipeline on the fake server, the Qwen3-TTS engine.
    args.responder, args.tts, args.engine_max_frames = "pipeline", "engine", args.frames
    if args.serve:
        os.environ["BENCH_SPEECH_STATS"] = args.stats_dir  # timed_app's, in this process and its workers
        if args.workers > 1:
            return serve_workers(args)
        asyncio.run(serve(args))
        return 0
    if args.codecs:
        bench_codecs()
        return 0
    if not args.checkpoint:
        parser.error("--checkpoint is needed (or --codecs)")
    started = time.monotonic()
    pinned: dict[str, Any] = {}
    if args.client_cpus:
        # As if the load generator ran on another host: its processes on the last --client-cpus cores, and
        # this process, so the gateway it starts (its workers and engine processes), on the others.
        cpus = sorted(os.sched_getaffinity(0))
        if not 0 < args.client_cpus < len(cpus):
            parser.error(f"--client-cpus must leave the gateway a core of the {len(cpus)}")
        os.sched_setaffinity(0, cpus[:-args.client_cpus])
        pinned = {"initializer": os.sched_setaffinity, "initargs": (0, cpus[-args.client_cpus:])}
    stats_dir = Path(tempfile.mkdtemp(prefix="bench-speech-"))
    fake = subprocess.Popen([sys.executable, "-m", "tests.fake_openai", "--port", str(args.port + 1), "--stt-ms",
                             "100", "--ttft-ms", "80", "--reply", bg.REPLY],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    fake.stdout.readline()
    fake_url = f"http://127.0.0.1:{args.port + 1}/v1"
    speech_url = f"http://127.0.0.1:{args.port}/v1/audio/speech"
    sessions_url = f"ws://127.0.0.1:{args.port}/v1/realtime"
    background = concurrent.futures.ThreadPoolExecutor(1)
    session_args = argparse.Namespace(spread=0.0, responder="pipeline", cycles=SESSION_CYCLES)
    spawn = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=spawn, **pinned)
    session_pool = (concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=spawn, **pinned)
                    if args.sessions else None)
    server = None
    rows: list[dict[str, Any]] = []
    try:
        server = start_gateway(args, stats_dir, fake_url)
        # Every load-generator process started before the first level: one starting during a level (a spawn
        # imports this script) would spread that level's burst of requests over its start.
        for spawned in [pool.submit(time.sleep, 0.5) for _ in range(args.clients)]:
            spawned.result()
        for voice in [v.strip() for v in args.voices.split(",") if v.strip()]:
            # One answer first, not counted: the voice's and the gateway's first use are not a level's.
            pool.submit(client_process, speech_url, VOICES[voice], args.format, 1, 1, 0).result()
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                if args.time_budget and time.monotonic() - started > args.time_budget:
                    print(f"out of time before {voice} at {concurrency}", flush=True)
                    break
                talking = None
                if session_pool is not None:  # the sessions' level, in a thread, while the speech level runs
                    talking = background.submit(bg.run_level, session_pool, args.clients, sessions_url,
                                                args.sessions, session_args, False)
                    # Until every session has started (they arrive over one scenario), then the speech level.
                    time.sleep(bg.CONNECT_LEAD_S + 1.0 + args.sessions * 0.002 + SCENARIO_S)
                result, client_lags, start, end = run_speech(pool, args.clients, speech_url, VOICES[voice], args,
                                                             concurrency, len(rows) + 1)
                sessions = talking.result()[0] if talking is not None else None
                time.sleep(1.5)  # the probe's last records
                rows.append(summarise(voice, concurrency, result, client_lags, start, end,
                                      bg.gateway_records(stats_dir, start, end), server_times(stats_dir), sessions,
                                      args))
                r = rows[-1]
                print(f"{voice} x {concurrency}: TTFB P95 {r['ttfb_p95_ms']:.1f} ms, HTTP P95 "
                      f"{r['http_p95_ms']:.2f} ms (first requests {r['http_first_p95_ms']:.2f}, later "
                      f"{r['http_later_p95_ms']:.2f}; its inbound end's in the worst worker "
                      f"{max(r['worker_in_p95_ms'], default=float('nan')):.2f}, requests per worker "
                      f"{min(r['worker_requests'], default=0)}-{max(r['worker_requests'], default=0)}; a worker's "
                      f"worst second: {r['core_wait_max_ms']:.1f} ms waiting for a core, a {r['gc_max_ms']:.1f} ms "
                      f"collection), "
                      f"RTF max {r['rtf_max']:.3f}, {r['audio_s_per_s']:.1f} audio s/s, "
                      f"errors {r['errors']}", flush=True)
                write_json(args, rows)
    finally:
        pool.shutdown(cancel_futures=True)
        background.shutdown(cancel_futures=True)
        if session_pool is not None:
            session_pool.shutdown(cancel_futures=True)
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        fake.terminate()
        fake.wait(10)
        shutil.rmtree(stats_dir, ignore_errors=True)
    print_report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
