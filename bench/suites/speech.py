"""The speech API (POST /v1/audio/speech) at several concurrencies, streamed, on the Qwen3-TTS engine.

The gateway is bench/serve.py as `serve --workers N` runs it (its engine process holding a CustomVoice and a
Base checkpoint, each worker timing the benchmark's tagged requests at both ends); the load generator is
bench/load.py's HTTP clients (asyncio protocols, httptools' parser): at concurrency C, C clients each make
--requests requests back to back on a kept-alive connection, reading each answer as it streams (pcm: what the
engine makes, nothing to decode). One answer per voice, not counted, comes first. Each request's input is
longer than any answer can speak, so every answer runs to [engine] max_frames (--frames x 80 ms).

Voices: "speaker" (a CustomVoice speaker: [engine.voices] alloy) and "clone" (an in-context clone of
tests/fixtures/one_sentence.wav with its transcript, prepared at start as [voices.bench]). Per voice and level:

  TTFB P50/P95         the client's request written -> its first audio byte
  first audio P50/P95  the request's arrival -> the engine's first packet, as the gateway says (Server-Timing)
  HTTP P50/P95         TTFB - first audio, per request: what the HTTP path adds (the target: <= 5 ms P95),
                       also for each client's first request (all at once) and its later ones apart
  HTTP in, out P95     its two ends: request written -> the app called, first bytes sent -> the client has them;
                       each worker's share of the requests and its inbound P95; the worst second of any worker
                       (its loop's wait for a core, its longest garbage collection)
  RTF P50/max          request written -> last byte, over the answer's audio
  audio s/s            seconds of audio delivered per second of the level
  loop lag P99         the worst worker's; the load generator's is the load side's (bench/validity.py)

--sessions N also runs N realtime sessions (the gateway suite's pipeline scenario, Poisson arrivals, four
times over) through the same engine; each speech level starts once they have all started. --codecs measures
the response formats' encoders alone (gateway/audio_codecs.py) on this CPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import time
from typing import Any

from bench import checkpoints
from bench.launcher import Fakes, Gateway, bench_settings, engine_settings, free_port, split_cores
from bench.load import CONNECT_LEAD_S, FIXTURES, Pool, Sessions, run_sessions, scenario_s, speech_process
from bench.stats import pct, rounded
from bench.suites.gateway import engine_rates
from bench.validity import mark

HELP = "the speech API (/v1/audio/speech): TTFB, what HTTP adds, RTF at 1..256 requests at once"
HOW = """\
    python -m bench speech --small                       # tiny CustomVoice + Base, 1 and 2 requests, 2 workers
    python -m bench speech --device cuda --model 0.6b    # 1, 24, 64 and 256 x 5; 12 workers, the load on 2 cores
    python -m bench speech --device cuda --model 1.7b --concurrency 24 --sessions 200
    python -m bench speech --codecs                      # the response formats' encoders alone"""
REFERENCE = FIXTURES / "one_sentence.wav"
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog."
# Longer than any answer's frames can speak (a token per 80 ms frame): the answer runs to max_frames.
INPUT = ("Streaming speech keeps going while there is text to read, one frame after another, so that the "
         "listener hears the first words long before the last ones are made. ") * 8
FRAME_S = 0.08
VOICES = {"speaker": "alloy", "clone": "bench"}
SESSION_CYCLES = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="0.6b or 1.7b: its CustomVoice and Base checkpoints (--small: tiny)")
    parser.add_argument("--checkpoints", default="", help="where random checkpoints are made and kept")
    parser.add_argument("--voices", default="speaker,clone", help="speaker, clone, or both")
    parser.add_argument("--concurrency", help="concurrent clients per level (default 1,24,64,256 x 5; --small 1,2)")
    parser.add_argument("--requests", type=int, default=2, help="requests each client makes, back to back")
    parser.add_argument("--frames", type=int, help="[engine] max_frames: each answer's length (default 125; "
                        "--small 20)")
    parser.add_argument("--format", default="pcm", help="response_format (pcm: no encoding)")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--max-streams", type=int, help="[engine] max_streams (default 512; --small 4)")
    parser.add_argument("--workers", type=int, help="gateway workers (default 12; --small 2)")
    parser.add_argument("--clients", type=int, default=2, help="load-generator processes")
    parser.add_argument("--client-cpus", type=int, help="cores of the load generator's own (default 2; --small 0)")
    parser.add_argument("--sessions", type=int, default=0, help="realtime sessions sharing the engine meanwhile")
    parser.add_argument("--time-budget", type=float, default=0, help="seconds: no level starts past it (0: none)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--codecs", action="store_true", help="measure the response formats' encoders alone")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.codecs:
        return codecs(args)
    small = args.small
    model = args.model or ("tiny" if small else "0.6b")
    frames = args.frames or (20 if small else 125)
    workers = args.workers if args.workers is not None else (2 if small else 12)
    client_cpus = args.client_cpus if args.client_cpus is not None else (0 if small else 2)
    gpus = args.gpus if args.device == "cuda" else 0
    levels = [int(c) for c in (args.concurrency or ("1,2" if small else "1,24,64,256,256,256,256,256")).split(",")]
    voices = [v.strip() for v in args.voices.split(",") if v.strip()]
    folders = [checkpoints.folder(model, args.checkpoints)]
    if "clone" in voices:
        folders.append(checkpoints.folder(checkpoints.base_of(model), args.checkpoints))
    max_streams = args.max_streams or (4 if small else 512)
    gateway_cpus, load_cpus = split_cores(client_cpus)
    port = args.port or free_port()
    settings: dict[str, Any] = {
        **bench_settings(port), "responder.kind": "pipeline",
        **engine_settings(folders, args.device, gpus, max_streams=max_streams, max_frames=frames),
        # each worker's share (in each of --workers N): the engine's free rows are the limit of them all
        "speech.max_streams": max_streams, "speech.max_waiting": 4096, "speech.wait_timeout_s": 600.0}
    if "clone" in voices:
        settings["voices.named"] = {"bench": {"reference": str(REFERENCE), "transcript": REFERENCE_TEXT}}
    speech_url = f"http://127.0.0.1:{port}/v1/audio/speech"
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    fakes = Fakes(1, load_cpus)
    settings |= {"stt.base_url": fakes.url, "llm.base_url": fakes.url}
    gateway = pool = session_pool = None
    background = concurrent.futures.ThreadPoolExecutor(1)
    try:
        gateway = Gateway(settings, workers=workers, cpus=gateway_cpus, time_http=True)
        pool = Pool(args.clients, load_cpus)
        session_pool = Pool(args.clients, load_cpus) if args.sessions else None
        for voice in voices:
            body = {"model": "tts-1", "input": INPUT, "voice": VOICES[voice], "response_format": args.format}
            pool.map(speech_process, [(speech_url, body, 1, 1, 0)])  # the voice's and the gateway's first use
            for burst, concurrency in enumerate(levels):
                if args.time_budget and time.monotonic() - started > args.time_budget:
                    print(f"out of time before {voice} at {concurrency}", flush=True)
                    break
                talking = None
                if session_pool is not None:  # the sessions' level, in a thread, while the speech level runs
                    talking = background.submit(run_sessions, session_pool, gateway.url, args.sessions, "pipeline",
                                                SESSION_CYCLES, 0.0, False, args.sessions)
                    # until every session has started (they arrive over one scenario), then the speech level
                    time.sleep(CONNECT_LEAD_S + 1.0 + args.sessions * 0.002 + scenario_s("pipeline"))
                shares = [concurrency // args.clients + (k < concurrency % args.clients) for k in range(args.clients)]
                start = time.time()
                # each level's seeds, and so its requests' tags, are its own: a level may repeat another's
                results = pool.map(speech_process, [(speech_url, body, n, args.requests,
                                                     1_000_000 * (len(rows) + 1) + 1000 * k + concurrency)
                                                    for k, n in enumerate(shares) if n])
                end = time.time()
                sessions = talking.result()[0] if talking is not None else None
                time.sleep(1.5)  # the probes' last records
                row = summarise([r for rs, _ in results for r in rs], [lag for _, lag in results], start, end,
                                gateway, sessions, frames, args.format)
                row |= {"model": model, "voice": voice, "concurrency": concurrency, "burst": burst + 1,
                        "sessions": args.sessions, "workers": gateway.workers}
                if sessions is not None:  # their load generator and fakes are the load side too
                    theirs = sessions.load()
                    row["load"] |= {"client_lag_p99_ms": max(row["load"]["client_lag_p99_ms"] or 0,
                                                             theirs["client_lag_p99_ms"] or 0),
                                    "late_starts": theirs["late_starts"], "fake": fakes.figures(start, end)}
                rows.append(mark(row, args.bounds))
                print(f"{voice} x {concurrency}: TTFB P95 {row['ttfb_p95_ms']} ms, HTTP P95 {row['http_p95_ms']} "
                      f"ms (first {row['http_first_p95_ms']}, later {row['http_later_p95_ms']}; worst worker in "
                      f"{max(row['worker_in_p95_ms'], default=None)}), RTF max {row['rtf_max']}, "
                      f"{row['audio_s_per_s']} audio s/s, errors {row['errors']}; load generator lag P99 "
                      f"{row['load']['client_lag_p99_ms']} ms: {'valid' if row['valid'] else 'INVALID'}", flush=True)
    finally:
        background.shutdown(cancel_futures=True)
        for p in (pool, session_pool):
            if p is not None:
                p.close()
        for part in (gateway, fakes):
            if part is not None:
                part.stop()
    return {"setup": f"{checkpoints.label(model)}, {', '.join(voices)}, {workers} workers", "settings": {
        "model": model, "voices": voices, "concurrency": levels, "requests": args.requests, "frames": frames,
        "format": args.format, "gpus": gpus, "workers": workers, "clients": args.clients, "client_cpus": client_cpus,
        "sessions": args.sessions, "input_chars": len(INPUT), "gateway": settings}, "levels": rows}


def summarise(rows: list[dict[str, Any]], client_lags: list[float], start: float, end: float, gateway: Gateway,
              sessions: Sessions | None, frames: int, fmt: str) -> dict[str, Any]:
    times = gateway.http_times()
    records = gateway.records(start, end)
    ok = [r for r in rows if r.get("status") == 200 and r.get("first") is not None]
    audio_s = [r["bytes"] / 48000 if fmt == "pcm" else frames * FRAME_S for r in ok]
    ttfb = [(r["first"] - r["sent"]) * 1000 for r in ok]
    http = [t - r["audio_ms"] for t, r in zip(ttfb, ok, strict=True)]
    # HTTP's two ends: request written -> the app called (the kernel, uvicorn's parsing and the wait behind the
    # requests that came with it), and the first body bytes sent -> the client has them.
    timed = [(r, times[r["id"]]) for r in ok if r["id"] in times]
    http_in = [(t["called"] - r["sent"]) * 1000 for r, t in timed]
    http_out = [(r["first"] - t["first"]) * 1000 for r, t in timed]
    # A level's first requests arrive at once; each client's next one when its answer ends (answers of one
    # length, started together, end together).
    first = [r["id"].endswith("-0") for r in ok]
    timed_first = [r["id"].endswith("-0") for r, _ in timed]
    workers: dict[str, list[float]] = {}
    for (_, t), inbound in zip(timed, http_in, strict=True):
        workers.setdefault(t["pid"], []).append(inbound)
    rtf = [(r["end"] - r["sent"]) / a for r, a in zip(ok, audio_s, strict=True) if a > 0]
    lag_p99 = [pct([lag for rec in rs for lag in rec["lags_ms"]], 99) for rs in records.values()]
    probed = [rec for rs in records.values() for rec in rs]
    engine = engine_rates(records)
    return {
        "requests": len(rows), "errors": len(rows) - len(ok),
        "error_sample": [r.get("error") for r in rows if r.get("status") != 200][:2],
        "ttfb_p50_ms": rounded(pct(ttfb, 50)), "ttfb_p95_ms": rounded(pct(ttfb, 95)),
        "first_audio_p50_ms": rounded(pct([r["audio_ms"] for r in ok], 50)),
        "first_audio_p95_ms": rounded(pct([r["audio_ms"] for r in ok], 95)),
        "queue_p95_ms": rounded(pct([r["queue_ms"] for r in ok], 95)),
        "http_p50_ms": rounded(pct(http, 50)), "http_p95_ms": rounded(pct(http, 95)),
        "http_first_p95_ms": rounded(pct([h for h, f in zip(http, first, strict=True) if f], 95)),
        "http_later_p95_ms": rounded(pct([h for h, f in zip(http, first, strict=True) if not f], 95)),
        "http_in_p95_ms": rounded(pct(http_in, 95)), "http_out_p95_ms": rounded(pct(http_out, 95)),
        "http_in_first_p95_ms": rounded(pct([i for i, f in zip(http_in, timed_first, strict=True) if f], 95)),
        "http_in_later_p95_ms": rounded(pct([i for i, f in zip(http_in, timed_first, strict=True) if not f], 95)),
        "worker_requests": sorted(len(ins) for ins in workers.values()),
        "worker_in_p95_ms": sorted(rounded(pct(ins, 95)) for ins in workers.values()),
        "core_wait_max_ms": max((rec.get("core_wait_ms", 0.0) for rec in probed), default=None),
        "gc_max_ms": max((rec.get("gc_max_ms", 0.0) for rec in probed), default=None),
        "rtf_p50": rounded(pct(rtf, 50), 3), "rtf_max": rounded(max(rtf, default=math.nan), 3),
        "audio_s_per_s": rounded(sum(audio_s) / (end - start), 1), "seconds": rounded(end - start, 1),
        "worker_lag_p99_ms": rounded(max(lag_p99, default=math.nan), 1),
        "engine_batch_mean": rounded(engine.get("batch_mean", math.nan), 1),
        "gpu_busy": rounded(engine.get("gpu_busy", math.nan)),
        **({"session_first_delta_p50_ms": rounded(pct(sessions.first_delta_ms, 50), 1),
            "session_first_delta_p95_ms": rounded(pct(sessions.first_delta_ms, 95), 1)} if sessions else {}),
        "load": {"client_lag_p99_ms": rounded(max(client_lags, default=math.nan)),
                 "client_processes": len(client_lags)},
    }


def codecs(args: argparse.Namespace) -> dict[str, Any]:
    """The response formats' encoders alone, on this CPU: CPU ms per second of audio, and the audio that goes in
    before a format's first bytes come out, in 80 ms packets (the engine's) of tests/fixtures/two_turns.wav."""
    import wave

    from gateway.audio_codecs import RESPONSE_FORMATS, SpeechEncoder

    with wave.open(str(FIXTURES / "two_turns.wav")) as w:
        speech = w.readframes(w.getnframes()) * (1 if args.small else 4)
    packet = 2 * 1920
    rows = []
    for fmt in RESPONSE_FORMATS:
        encoder = SpeechEncoder(fmt)
        first = None
        cpu = time.process_time()
        for offset in range(0, len(speech), packet):
            if encoder.encode(speech[offset:offset + packet]) and first is None:
                first = (offset + packet) / 48
        encoder.finish()
        cpu_ms = (time.process_time() - cpu) * 1000 / (len(speech) / 48000)
        rows.append({"format": fmt, "cpu_ms_per_audio_s": round(cpu_ms, 2), "audio_before_first_bytes_ms": first,
                     "valid": None, "invalid": []})
        print(f"{fmt}: {cpu_ms:.2f} ms of CPU per audio second, {first:.0f} ms of audio before the first bytes")
    return {"setup": "response formats' encoders", "settings": {"audio_s": len(speech) / 48000,
                                                                 "packet_ms": 80}, "levels": rows}
