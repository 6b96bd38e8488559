"""The gateway as a benchmark runs it: ``python -m gateway serve``'s code, with a probe in each serving process.

    python -m bench.serve --settings run.json --stats-dir DIR [--workers N] [--tone] [--time-http] [--cpus 0-11]

It loads the configuration as ``serve`` does (the package's config.toml, then GATEWAY_* variables), sets the
options the settings file names (``{"section.key": value}``; ``"voices.named"``: ``{NAME: {reference,
transcript, description}}``), and serves: one process, or ``serve --workers N``'s parent with its engine
processes and N workers (gateway.server.workers, whose ``Hooks`` add the probe). ``--cpus`` pins it, and so
everything it starts, to those cores.

It prints ``workers N`` once the configuration is checked, then ``ready`` once per serving process. Each
serving process appends, once a second, a JSON line to DIR/gateway-PID.jsonl: its event loop's lag samples (a
10 ms timer: how late it fired), its CPU time (the kernel's part, each thread's), its sessions, how long its
loop waited for a core (schedstat) and its longest garbage collection over that second, and the TTS engine's
counters (batch, steps, step and GPU time) where the engine has them. ``--tone``: the pipeline speaks with the
tone engine (first audio 25 ms after a segment, then real time), not a model. ``--time-http``: for each request
tagged X-Bench-Id, when the app was called and when its first body bytes went out, to DIR/http-PID.jsonl.

Module-level functions only are handed to the workers (spawned: they import this module before anything else,
so nothing here may import prometheus_client at the top; see gateway.server.workers).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.stats import core_wait_s, lag_probe, pin, thread_cpu_s

STATS_ENV = "BENCH_STATS"  # the stats folder, for the workers too


def configured(settings: dict[str, Any]) -> Any:
    """load_config() with the settings applied, checked."""
    from gateway.config import VoiceConfig, check, load_config  # here: see the module's last paragraph

    config = load_config()
    for name, value in settings.items():
        section_name, _, key = name.partition(".")
        section = getattr(config, section_name, None)
        if section is None or not hasattr(section, key):
            raise SystemExit(f"bench.serve: no option {name}")
        if name == "voices.named":
            value = {voice: VoiceConfig(**fields) for voice, fields in value.items()}
        setattr(section, key, value)
    check(config)
    return config


async def probe(path: Path, engine: Any, sessions: Callable[[], int]) -> None:
    """Once a second, this process's figures (the module's docstring) as one JSON line of `path`."""
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
    waited = core_wait_s()
    try:
        with path.open("a", buffering=1) as out:
            while True:
                await asyncio.sleep(1.0)
                now_waited = core_wait_s()
                record = {"t": time.time(), "pid": os.getpid(), "lags_ms": lags, "cpu_s": time.process_time(),
                          "cpu_kernel_s": os.times().system, "cpu_threads_s": thread_cpu_s(),
                          "sessions": sessions(), "core_wait_ms": round((now_waited - waited) * 1000, 3),
                          "gc_max_ms": round(gc_max * 1000, 3)}
                lags, waited, gc_max = [], now_waited, 0.0
                if stats is not None:
                    record["engine"] = await stats()
                out.write(json.dumps(record) + "\n")
    finally:
        gc.callbacks.remove(timed_gc)
        task.cancel()


async def probed(server: Any) -> None:
    """While a serving process serves: says so, then probes itself into the stats folder."""
    print("ready", flush=True)
    await probe(Path(os.environ[STATS_ENV]) / f"gateway-{os.getpid()}.jsonl",
                getattr(server.gateway.responder, "tts_engine", None), lambda: len(server.gateway.sessions))


def tone_responder(config: Any) -> Any:
    """The pipeline on the configured STT and LLM, speaking with a tone engine that starts after 25 ms, then keeps
    real time."""
    from gateway.responders.pipeline import BridgeSettings, PipelineResponder
    from gateway.responders.remote import LlmClient
    from gateway.responders.tone_tts import ToneEngine

    return PipelineResponder(LlmClient.from_config(config.llm), ToneEngine(first_audio_ms=25, realtime=True),
                             BridgeSettings(config.tts.starter_chars, config.tts.max_segment_chars))


def timed_app(app: Any) -> Any:
    """Middleware: for each request tagged X-Bench-Id, when the app was called and when its first body bytes went
    to the socket (time.perf_counter, CLOCK_MONOTONIC: one clock for every process on the host), appended to
    the stats folder's http-PID.jsonl once a second."""
    out = Path(os.environ[STATS_ENV]) / f"http-{os.getpid()}.jsonl"
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", type=Path, required=True)
    parser.add_argument("--stats-dir", required=True)
    parser.add_argument("--workers", type=int, default=1, help="worker processes (0 = serve's own choice)")
    parser.add_argument("--tone", action="store_true", help="the pipeline speaks with the tone engine")
    parser.add_argument("--time-http", action="store_true", help="time the requests tagged X-Bench-Id")
    parser.add_argument("--cpus", default="", help="run on these cores only (e.g. 0-11)")
    args = parser.parse_args()
    pin(args.cpus)
    os.environ[STATS_ENV] = args.stats_dir
    from gateway.logs import configure_logging
    from gateway.server.workers import Hooks, Workers, worker_count

    configure_logging("WARNING")
    config = configured(json.loads(args.settings.read_text()))
    config.server.workers = args.workers
    count = worker_count(config)
    print(f"workers {count}", flush=True)
    if count > 1:
        hooks = Hooks(responder=tone_responder if args.tone else None, serving=probed,
                      app=timed_app if args.time_http else None)
        return Workers(config, count, hooks=hooks).run()
    from gateway.server.serve import GatewayServer, exit_now, run_loop, run_server

    async def serve() -> int:
        server = GatewayServer(config, tone_responder(config) if args.tone else None)
        if args.time_http:
            server.app = timed_app(server.app)
        return await run_server(server, probed)

    exit_now(run_loop(serve()))


if __name__ == "__main__":
    sys.exit(main())
