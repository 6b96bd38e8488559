"""Whole-product capacity: realtime sessions over WebSocket against the gateway as `serve --workers N` runs it,
with its engine processes, on fake OpenAI-compatible STT (100 ms) and LLM (first token 80 ms) backends.

The gateway is bench/serve.py (`serve`'s code, each serving process probed: loop lag, CPU, sessions, the
engine's counters); the load generator is bench/load.py's sessions (Poisson arrivals, then the aligned worst
case where asked); the fakes run as several processes on one port. With --client-cpus the load side (load
generator and fakes) runs on cores of its own, the gateway and its engine processes on the rest.

Per level: stop → first delta P50/P95, VAD late P50/P95, every worker's loop lag P99 (the worst is the
target's), barge-in and cancel → last delta, audio lost or reordered, GPU busy and the engine's mean batch,
CPU seconds per session-minute (and by stage with --profile: py-spy on one worker, bench/cpu_stages.py), the
workers' spread, where a turn's time goes (the gateway's own trace), and the load side's own figures (the
load generator's lag, the fakes' latencies and lag): a level whose load side did not keep up is INVALID
(bench/validity.py).

--protocol live runs GPT-Live sessions (/v1/live/sessions, bench/live_load.py) on the same audio and fakes: the
scenario's two turns, turn 1's reply cut by turn 2 (Live has no response.cancel: turn 2's reply plays to the
end of the scenario), each target mapped (bench/targets.py, docs/live.md):
- stop → first delta becomes turn end → first audio: Live sends no speech_stopped, so a turn's end is the
  moment the client's clock reached the earliest point it can end in the audio (live_load.turn_ends: where the
  gateway's own VAD, run on the same audio, ends its speech, plus [semantic_vad] pause_ms; the point Realtime's
  VAD late is measured from), and first audio the arrival of the first non-silent 100 ms delta, plus its first
  audible sample's place in it. The figure holds what Realtime splits into stop → first delta and VAD late (here
  with Smart Turn's verdict in it), and the output clock's tick (audio ready between ticks waits up to 100 ms):
  bound 250 + 40 + 100 = 390 ms;
- VAD late: inside the figure above (no event to time it by), reported as none;
- barge-in: our speech stops at the gateway's next tick after the VAD hears the user, and no event says so: the
  user's speech start in the audio → the last audible sample of our speech, heard. Bound 250 ms: the VAD's
  min_speech_ms (64), a window (32), its batch interval (10), a tick (100) and Realtime's 40 of VAD lateness;
- worst worker loop lag P99 (20 ms) and the load side's validity as for Realtime;
- audio errors: error events, a delta that is not 100 ms, output ticks missing once the audio is sent, a turn
  with no reply heard, no session.closed after session.close.

--protocol sip runs the sessions as phone calls (bench/sip_load.py): SIP over UDP and RTP with G.711 µ-law at
8 kHz, a minimal user agent per call in the load generator's processes (a UDP socket of its own for its
signalling, one for its media), to the gateway's SIP endpoint on a free port with no webhook (the default
session answers every call) and [sip] and [calls] bounds raised to the level's size (the INVITEs per second
too: every call comes from this host, all at once when aligned). The scenario's audio as a phone sends it; a
phone has no response.cancel, so turn 2's reply plays to its end. Measured on the phone's side: VAD late as
Realtime's (the turn's speech_stopped from the gateway's trace, which names each call's SIP Call-ID, less when
the packet that completed the silence was due); stop → first audio heard (from that speech_stopped to the first
audible sample received: the media clock's next 20 ms tick is in it, bound 250 + 20 ms); barge-in as the phone
hears it, the caller's speech start to the agent's last audible sample (bound 170 ms: bench/targets.py);
end of speech → first audio, the phone's stopwatch; audio errors in the RTP stream (a packet lost or out of
order, another source, SSRC or codec), a turn unanswered, BYE unanswered. A call not answered makes the level
INVALID. Where the gateway serves phone calls in one process only (gateway/config.py), pass `--workers 1`.

--tts tone speaks with a tone engine (25 ms to first audio, then real time) and --responder echo answers
with the user's audio: the gateway without a model. --backends measures instead what the STT and LLM clients
cost the event loop per call (the fakes with no latency; the openai package's plain calls beside them).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import re
import shutil
import statistics
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench import checkpoints, cpu_stages, live_load, sip_load
from bench.launcher import Fakes, Gateway, bench_settings, engine_settings, free_port, split_cores
from bench.load import CONNECT_LEAD_S, Pool, Sessions, run_sessions, scenario_s
from bench.phones import free_sip_port
from bench.stats import pct, rounded
from bench.validity import mark
from gateway.config import VadConfig

HELP = "whole-product capacity: realtime sessions through `serve --workers N`, its engine processes and fakes"
HOW = """\
    python -m bench gateway --small                                    # a CPU rehearsal: tiny checkpoint, 2 workers
    python -m bench gateway --device cuda --model 0.6b --gpus 1 --workers 12 --client-cpus 4   # 1000 x 2, aligned
    python -m bench gateway --device cpu --responder echo --tts tone --workers 1 --sessions 10,50,100
    python -m bench gateway --backends                                 # the STT and LLM clients' CPU per call
    python -m bench gateway --small --protocol live                    # GPT-Live sessions, a CPU rehearsal
    python -m bench gateway --device cuda --model 0.6b --gpus 1 --client-cpus 4 --protocol live   # Live, 1000 x 2
    python -m bench gateway --device cpu --tts tone --workers 1 --sessions 10 --protocol sip      # phone calls

Levels default to 1000 sessions per GPU twice (Poisson), then once aligned; `--sessions`, `--arrivals`,
`--aligned-sessions` change them. The record's levels hold the figures of the load side beside the gateway's."""
# A pipeline turn's stages in the gateway's trace (gateway/runtime/trace.py), from the end of speech.
TURN_STAGES = ("speech_stopped", "committed", "stt_done", "llm_first_token", "tts_first_audio", "first_delta")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--protocol", choices=["realtime", "live", "sip"], default="realtime", help="the sessions' "
                        "protocol: Realtime (/v1/realtime), GPT-Live (/v1/live/sessions; pipeline responder only) or "
                        "phone calls (SIP and RTP, G.711 µ-law)")
    parser.add_argument("--responder", choices=["pipeline", "echo"], default="pipeline")
    parser.add_argument("--tts", choices=["engine", "tone"], default="engine", help="pipeline: the TTS")
    parser.add_argument("--model", help="the checkpoint's model (0.6b, 1.7b; --small: tiny)")
    parser.add_argument("--checkpoint", default="", help="a checkpoint folder instead of the model's random one")
    parser.add_argument("--checkpoints", default="", help="where random checkpoints are made and kept")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs, one engine process each ([engine] devices)")
    parser.add_argument("--engine-mode", choices=["process", "thread"], default="process")
    parser.add_argument("--vad-device", choices=["auto", "cpu", "engine"], default="auto", help="[vad] device: where "
                        "Silero runs (auto: the engine processes on GPUs, else each gateway process)")
    parser.add_argument("--max-streams", type=int, help="[engine] max_streams (default 0: the engine's own choice, "
                        "as `serve` makes it; --small 4)")
    parser.add_argument("--engine-max-frames", type=int, help="[engine] max_frames: random weights never say EOS, "
                        "so this ends a reply nobody cut (default 250 = 20 s; --small 60)")
    parser.add_argument("--workers", type=int, help="gateway worker processes (default 0: serve's own choice on the "
                        "gateway's cores: one per 100 sessions of the largest level (of 1000 at least), at most one "
                        "per core less two per engine process; --small 2)")
    parser.add_argument("--worker-balance", choices=["connections", "accept"], default="connections")
    parser.add_argument("--sessions", help="comma-separated session counts (default 1000 per GPU, twice; --small 4,4)")
    parser.add_argument("--arrivals", default="poisson,aligned", help="poisson, aligned or both: how sessions' starts "
                        "are spread (the Poisson levels first, then the aligned ones)")
    parser.add_argument("--aligned-sessions", default="", help="the session counts at which the aligned arrivals run "
                        "(default: the largest level, once)")
    parser.add_argument("--spread", type=float, default=0.0, help="seconds over which Poisson arrivals spread "
                        "(0 = one scenario's length)")
    parser.add_argument("--cycles", type=int, default=1, help="times each session runs its scenario")
    parser.add_argument("--clients", type=int, default=0, help="load-generator processes (0: one per 200 sessions, "
                        "per 100 calls with --protocol sip)")
    parser.add_argument("--fake-processes", type=int, default=0, help="fake backend processes on the one port (0: one "
                        "per 1000 sessions)")
    parser.add_argument("--client-cpus", type=int, default=0, help="cores of the load side's own (load generator and "
                        "fakes), the last ones; the gateway gets the others (0: every process shares every core)")
    parser.add_argument("--profile", type=float, help="seconds of py-spy samples of one worker per level: CPU per "
                        "session-minute by stage (default 15; --small 0; 0 = off)")
    parser.add_argument("--profile-engine", action="store_true", help="--profile samples an engine process too: its "
                        "CPU by thread (it slows the engine's VAD thread: VAD lateness is not a result then)")
    parser.add_argument("--profile-raw", type=Path, help="keep the py-spy samples (a worker's, an engine process's) "
                        "in this folder")
    parser.add_argument("--port", type=int, default=0, help="the gateway's port (0: a free one)")
    parser.add_argument("--backends", action="store_true", help="measure the STT and LLM clients' CPU per call instead")
    parser.add_argument("--calls", type=int, default=30, help="--backends: calls measured per row, after the first")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.backends:
        return backend_calls(args)
    live, sip = args.protocol == "live", args.protocol == "sip"
    if live and args.responder != "pipeline":
        raise SystemExit("--protocol live: the pipeline responder only (GPT-Live's voice model is the pipeline)")
    small = args.small
    cuda = args.device == "cuda"
    gpus = args.gpus if cuda else 0
    model = None
    if args.responder == "pipeline" and args.tts == "engine":
        model = args.model or ("tiny" if small else "0.6b")
    workers = args.workers if args.workers is not None else (2 if small else 0)
    per_gpu = 1000
    sessions = args.sessions or ("4,4" if small else f"{per_gpu * max(1, gpus)},{per_gpu * max(1, gpus)}")
    counts = [int(n) for n in sessions.split(",") if n.strip()]
    labels = [a.strip() for a in args.arrivals.split(",") if a.strip()]
    if not counts or set(labels) - {"poisson", "aligned"}:
        raise SystemExit("--sessions: comma-separated counts; --arrivals: poisson, aligned or both")
    aligned_at = [int(n) for n in args.aligned_sessions.split(",") if n.strip()] or [max(counts)]
    plan = [(n, "poisson") for n in counts] * ("poisson" in labels)
    plan += [(n, "aligned") for n in aligned_at] * ("aligned" in labels)
    clients = args.clients or max(1, math.ceil(max(counts) / (sip_load.CALLS_PER_PROCESS if sip else 200)))
    fake_processes = args.fake_processes or max(1, math.ceil(max(counts) / 1000))
    profile = args.profile if args.profile is not None else (0.0 if small else 15.0)
    gateway_cpus, load_cpus = split_cores(args.client_cpus)

    port = args.port or free_port()
    trace = Path(tempfile.mkdtemp(prefix="bench-trace-")) / "trace.jsonl"
    # [server] max_sessions is the gateway's total: a level of 1000 per GPU on several GPUs must not meet it.
    settings: dict[str, Any] = {**bench_settings(port), "trace.jsonl_path": str(trace),
                                "server.worker_balance": args.worker_balance, "server.max_sessions": max(1000, *counts)}
    if args.responder == "echo":
        # the echo alone: not the local models "auto" picks where they are installed, nor their whisper
        settings |= {"responder.kind": "echo", "responder.echo_pace": 1.0, "local.stt": False}
    else:
        settings |= {"responder.kind": "pipeline"}
    settings["vad.device"] = args.vad_device
    sip_port = free_sip_port() if sip else 0
    if sip:
        settings |= sip_load.gateway_settings(sip_port, max(counts))
    if model is not None:
        checkpoint = Path(args.checkpoint) if args.checkpoint else checkpoints.folder(model, args.checkpoints)
        settings |= engine_settings([checkpoint], args.device, gpus, mode=args.engine_mode,
                                    max_streams=args.max_streams or (4 if small else 0),
                                    max_frames=args.engine_max_frames or (60 if small else 250))
    fakes = gateway = pool = None
    levels: list[dict[str, Any]] = []
    try:
        if args.responder == "pipeline":
            fakes = Fakes(fake_processes, load_cpus)
            settings |= {"stt.base_url": fakes.url, "llm.base_url": fakes.url}
        gateway = Gateway(settings, workers=workers, cpus=gateway_cpus, tone=args.tts == "tone")
        pool = Pool(clients, load_cpus)
        for run_index, (n, label) in enumerate(plan):
            profiler = Profiler(gateway, profile, args.spread or scenario_s(args.responder), args.profile_engine,
                                args.profile_raw)
            if live:
                result, start, end = live_load.run_sessions(pool, gateway.live_url, "live", "capacity", n,
                                                            args.cycles, args.spread, label == "aligned", seed=n,
                                                            timed_from_turn_end=True)
            elif sip:
                result, start, end = sip_load.run_calls(pool, ("127.0.0.1", sip_port), n, args.responder,
                                                        args.cycles, args.spread, label == "aligned", seed=n)
            else:
                result, start, end = run_sessions(pool, gateway.url, n, args.responder, args.cycles, args.spread,
                                                  label == "aligned", seed=n)
            time.sleep(1.5)  # the probes' last records
            traces = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
            trace.write_text("")  # the gateway appends to it: what follows belongs to the next level
            if sip:
                sip_load.join(result, traces, settings.get("vad.silence_duration_ms",
                                                           VadConfig().silence_duration_ms))
            level = summarise(n, label, result, gateway.records(start, end), traces, start, end)
            level |= {"run": sum(1 for m, lb in plan[:run_index] if (m, lb) == (n, label)) + 1,
                      "protocol": args.protocol, "responder": args.responder,
                      "tts": args.tts if args.responder == "pipeline" else None,
                      "model": model, "gpus": gpus, "workers": gateway.workers,
                      "sessions_per_gpu": n // gpus if gpus else n}
            shares, engine_shares = profiler.shares()
            level["cpu_by_stage"] = {stage: rounded(share * level["cpu_s_per_session_min"], 3)
                                     for stage, share in shares.items()} if shares else None
            if engine_shares and level.get("engine_cpu_s_per_session_min") is not None:
                level["engine_cpu_by_thread"] = {name: rounded(share * level["engine_cpu_s_per_session_min"], 3)
                                                 for name, share in engine_shares.items()}
            level["load"] = result.load() | ({"fake": fakes.figures(start, end)} if fakes else {})
            if sip:
                level |= {"calls_answered": n - len(result.unanswered), "unanswered": result.unanswered[:5],
                          "end_to_audio_p50_ms": rounded(pct(result.end_to_audio_ms, 50), 1),
                          "end_to_audio_p95_ms": rounded(pct(result.end_to_audio_ms, 95), 1)}
                level["load"]["unanswered_calls"] = len(result.unanswered)
            levels.append(mark(level, args.bounds))
            print(line(level), flush=True)
    finally:
        if pool is not None:
            pool.close()
        for part in (gateway, fakes):
            if part is not None:
                part.stop()
        shutil.rmtree(trace.parent, ignore_errors=True)
    what = checkpoints.label(model) if model else args.responder
    if args.responder == "pipeline" and args.tts == "tone":
        what = "tone TTS"
    count = levels[0]["workers"] if levels else workers
    setup = f"{what}, {gpus} GPU{'s' if gpus != 1 else ''}, {count} worker{'s' if count != 1 else ''}"
    setup += ", GPT-Live" if live else ", SIP calls" if sip else ""
    return {"setup": setup, "settings": {
        "protocol": args.protocol, "responder": args.responder, "tts": args.tts, "model": model, "gpus": gpus,
        "workers": workers,
        "sessions": counts, "arrivals": labels, "aligned_sessions": aligned_at, "cycles": args.cycles,
        "clients": clients, "fake_processes": fake_processes, "client_cpus": args.client_cpus,
        "gateway_cpus": gateway_cpus or "all", "load_cpus": load_cpus or "all", "profile_s": profile,
        "profile_engine": args.profile_engine,
        "gateway": settings}, "levels": levels}


class Profiler:
    """py-spy on one worker, and on one engine process (``engine``) where there are any, for `seconds` of a level,
    from a third of the way into its arrivals; their raw samples kept in ``keep`` (a folder) when given."""

    def __init__(self, gateway: Gateway, seconds: float, spread: float, engine: bool = False,
                 keep: Path | None = None) -> None:
        self._raw: dict[str, str | None] = {}
        self._threads: list[threading.Thread] = []
        self._keep = keep
        if seconds > 0:
            delay = CONNECT_LEAD_S + 1.0 + spread / 3
            for kind in ("worker", "engine") if engine else ("worker",):
                thread = threading.Thread(target=self._run, args=(gateway, kind, seconds, delay), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _run(self, gateway: Gateway, kind: str, seconds: float, delay: float) -> None:
        time.sleep(delay)
        if pids := gateway.pids() if kind == "worker" else gateway.engine_pids():
            self._raw[kind] = raw = cpu_stages.record(pids[0], seconds)
            if raw and self._keep is not None:
                self._keep.mkdir(parents=True, exist_ok=True)
                (self._keep / f"{kind}-{pids[0]}-{time.strftime('%H%M%S')}.txt").write_text(raw)

    def shares(self) -> tuple[dict[str, float], dict[str, float]]:
        """The worker's CPU by stage and the engine process's by thread, as shares (empty: not profiled)."""
        for thread in self._threads:
            thread.join()
        worker, engine = self._raw.get("worker"), self._raw.get("engine")
        return (cpu_stages.shares(worker) if worker else {}, cpu_stages.thread_shares(engine) if engine else {})


def engine_rates(records: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Mean batch, and step and GPU seconds per second, over the window, from the engine counters one gateway
    process read (every gateway process reads the same engines); the VAD's busy share each engine's too, as
    workers whose VADs crowd on one engine would show only there."""
    rows = next((r for r in records.values() if r and "engine" in r[0]), None)
    if not rows or len(rows) < 2:
        return {}
    first, last = rows[0], rows[-1]
    span = last["t"] - first["t"]
    deltas: dict[str, dict[Any, float]] = {}
    for key in ("steps", "frames", "step_seconds", "gpu_seconds", "turns", "turn_seconds", "vad_windows",
                "vad_seconds", "cpu_seconds"):
        before = {e.get("endpoint", i): e[key] for i, e in enumerate(first["engine"]) if e.get(key) is not None}
        after = {e.get("endpoint", i): e[key] for i, e in enumerate(last["engine"]) if e.get(key) is not None}
        # An engine restarted in the window (counters from zero) is left out.
        deltas[key] = {k: after[k] - before[k] for k in after if k in before and after[k] >= before[k]}
    totals = {key: sum(each.values()) for key, each in deltas.items()}
    engines = max(1, len(last["engine"]))
    gpu = any(e.get("gpu_seconds") is not None for e in last["engine"])
    return {"batch_mean": totals["frames"] / totals["steps"] if totals["steps"] else math.nan,
            "step_busy": totals["step_seconds"] / span / engines,
            "gpu_busy": totals["gpu_seconds"] / span / engines if gpu else math.nan, "engines": engines,
            "turns": totals["turns"], "turn_busy": totals["turn_seconds"] / span / engines,
            "vad_windows": totals["vad_windows"], "vad_busy": totals["vad_seconds"] / span / engines,
            "vad_busy_each": [rounded(seconds / span) for seconds in deltas["vad_seconds"].values()],
            "cpu_per_minute": totals["cpu_seconds"] / span * 60}


def error_kinds(errors: list[str]) -> dict[str, int]:
    """How many audio errors of each kind: their messages without the session or call they name, numbers as N."""
    kinds = collections.Counter(re.sub(r"\d+", "N", e.split(": ", 1)[-1]) for e in errors)
    return dict(kinds.most_common(10))


def summarise(n: int, label: str, result: Sessions, records: dict[int, list[dict[str, Any]]],
              traces: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    lag_p99 = {pid: pct([lag for r in rows for lag in r["lags_ms"]], 99) for pid, rows in records.items()}
    # Each serving process's most sessions at once in the level: the spread between workers.
    held = {pid: max((r.get("sessions", 0) for r in rows), default=0) for pid, rows in records.items()}
    cpu = [(rows[0]["cpu_s"], rows[-1]["cpu_s"]) for rows in records.values() if len(rows) > 1]
    cpu_per = sum(b - a for a, b in cpu) / (n * (end - start) / 60) if cpu else math.nan
    # Of that, the kernel's (system time: the sockets' reads, writes and polls, the threads' hand-overs).
    kernel = [rows[-1].get("cpu_kernel_s", math.nan) - rows[0].get("cpu_kernel_s", math.nan)
              for rows in records.values() if len(rows) > 1]
    kernel_per = sum(kernel) / (n * (end - start) / 60) if kernel else math.nan
    # And by thread, every process's together (the event loop's, the VAD's, ZeroMQ's I/O): a thread that ended
    # within the level is left out.
    by_thread: collections.Counter[str] = collections.Counter()
    for rows in records.values():
        if len(rows) > 1:
            first, last = rows[0].get("cpu_threads_s", {}), rows[-1].get("cpu_threads_s", {})
            by_thread.update({name: s - first.get(name, 0.0) for name, s in last.items()})
    engine = engine_rates(records)
    # The engine processes' CPU (their TTS steps, and the VAD or Smart Turn they run for the gateway processes),
    # per session-minute as the gateway's.
    engine_cpu = engine.get("cpu_per_minute", 0.0) / n
    statuses = list(result.responses.values())

    def traced(key: str) -> list[float]:
        return [t[key] for t in traces if key in t]

    return {
        "sessions": n, "arrivals": label,
        "first_delta_p50_ms": rounded(pct(result.first_delta_ms, 50), 1),
        "first_delta_p95_ms": rounded(pct(result.first_delta_ms, 95), 1),
        "vad_late_p50_ms": rounded(pct(result.stop_late_ms, 50), 1),
        "vad_late_p95_ms": rounded(pct(result.stop_late_ms, 95), 1),
        "worker_lag_p99_ms": rounded(max(lag_p99.values(), default=math.nan), 1),
        "worker_lag_p99_mean_ms": rounded(statistics.mean(lag_p99.values()) if lag_p99 else math.nan, 1),
        "worker_lag_p99_each_ms": [rounded(v, 1) for v in lag_p99.values()],
        "loop_lag_p50_ms": rounded(pct([lag for rs in records.values() for r in rs for lag in r["lags_ms"]], 50)),
        "barge_in_p50_ms": rounded(pct(result.barge_in_ms, 50)),
        "barge_in_p95_ms": rounded(pct(result.barge_in_ms, 95)),
        "cancel_to_last_delta_p95_ms": rounded(pct(result.cancel_to_last_delta_ms, 95)),
        "audio_errors": len(result.audio_errors), "errors": result.audio_errors[:5],
        "error_kinds": error_kinds(result.audio_errors),
        "responses": {s: statuses.count(s) for s in sorted(set(statuses))},
        "cpu_s_per_session_min": rounded(cpu_per, 3),
        "kernel_cpu_s_per_session_min": rounded(kernel_per, 3),
        "cpu_by_thread": {name: rounded(s / (n * (end - start) / 60), 3) for name, s in by_thread.most_common()
                          if s / (n * (end - start) / 60) >= 0.001},
        "engine_cpu_s_per_session_min": rounded(engine_cpu, 3),
        "product_cpu_s_per_session_min": rounded(cpu_per + engine_cpu, 3),
        "sessions_per_worker_max": max(held.values(), default=0),
        "sessions_per_worker_mean": rounded(statistics.mean(held.values()) if held else math.nan, 1),
        "gpu_busy": rounded(engine.get("gpu_busy", math.nan)),
        "engine_step_busy": rounded(engine.get("step_busy", math.nan)),
        "engine_batch_mean": rounded(engine.get("batch_mean", math.nan), 1),
        # Smart Turn checks the engine processes judged ([semantic_vad] device), and their share of its time.
        "engine_turns": engine.get("turns", 0), "engine_turn_busy": rounded(engine.get("turn_busy", math.nan)),
        # Silero VAD windows the engine processes stepped ([vad] device), and their share of the VAD thread's time.
        "engine_vad_windows": engine.get("vad_windows", 0),
        "engine_vad_busy": rounded(engine.get("vad_busy", math.nan)),
        "engine_vad_busy_each": engine.get("vad_busy_each", []),
        "gateway_first_delta_p95_ms": rounded(pct(traced("first_delta_ms"), 95), 1),
        "gateway_cancel_to_last_delta_p95_ms": rounded(pct(traced("cancel_to_last_delta_ms"), 95)),
        "stages_ms": {f"{a} -> {b}": [rounded(pct(v, 50), 1), rounded(pct(v, 95), 1)] for a, b in pairwise(TURN_STAGES)
                      for v in [[t.get(b + "_ms", math.nan) - t.get(a + "_ms", 0.0) for t in traces]]},
    }


def line(level: dict[str, Any]) -> str:
    load, fake = level["load"], level["load"].get("fake") or {}
    verdict = "valid" if level["valid"] else "INVALID: " + "; ".join(level["invalid"])
    return (f"{level['sessions']} sessions, {level['arrivals']}: stop -> first delta P95 {level['first_delta_p95_ms']} "
            f"ms, VAD late P95 {level['vad_late_p95_ms']} ms, worst worker lag P99 {level['worker_lag_p99_ms']} ms, "
            f"barge-in P95 {level['barge_in_p95_ms']} ms, audio errors {level['audio_errors']}, GPU busy "
            f"{level['gpu_busy']}, CPU {level['cpu_s_per_session_min']} s/session-min (kernel "
            f"{level['kernel_cpu_s_per_session_min']}; engines {level['engine_cpu_s_per_session_min']}) | load "
            f"generator lag P99 "
            f"{rounded(load['client_lag_p99_ms'] or math.nan, 1)} ms, fake STT P95 {fake.get('stt_p95_ms')} ms, "
            f"LLM first token P95 {fake.get('llm_p95_ms')} ms, fakes' lag P99 {fake.get('lag_p99_ms')} ms: {verdict}")


def backend_calls(args: argparse.Namespace) -> dict[str, Any]:
    """What the STT and LLM clients cost this process's event loop per call: gateway.responders.remote as the
    gateway runs it, beside the openai package's plain calls, against the fakes with no latency (in processes of
    their own, so this process's CPU time is the clients' alone). A client's first call is reported apart:
    one-off imports and model builds land there when start-up has not paid them."""
    calls = 3 if args.small else args.calls
    fakes = Fakes(1, stt_ms=0, llm_ms=0)
    try:
        rows = asyncio.run(_backend_calls(fakes.url, calls))
    finally:
        fakes.stop()
    for row in rows:
        print(f"{row['call']} | {row['client']} | first call CPU {row['first_cpu_ms']} ms | CPU {row['cpu_ms']} ms "
              f"| wall {row['wall_ms']} ms", flush=True)
    return {"setup": "backend clients", "settings": {"calls": calls, "audio_s": 3.0}, "levels": rows}


async def _backend_calls(base_url: str, calls: int) -> list[dict[str, Any]]:
    import openai

    from gateway.audio import wav_bytes
    from gateway.core.responder import Message, transcript_of
    from gateway.responders.remote import LlmClient, SttClient, chat_messages

    pcm = bytes(24000 * 3 * 2)
    conversation = [Message("u1", "user", "What is the weather like tomorrow?"),
                    Message("a1", "assistant", "Mostly sunny, with a light breeze."),
                    Message("u2", "user", "And in the evening?")]
    messages = chat_messages("You are a helpful voice assistant.", conversation)
    stt, llm = SttClient(base_url, "whisper"), LlmClient(base_url, "llm")
    await asyncio.gather(stt.check(), llm.check())  # what the gateway does at start-up
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)

    async def gateway_chat() -> None:
        async for _ in llm.stream_chat(messages):
            pass

    async def sdk_stt() -> None:
        await sdk.audio.transcriptions.create(file=("audio.wav", wav_bytes(pcm), "audio/wav"), model="whisper")

    async def sdk_chat() -> None:
        stream = await sdk.chat.completions.create(model="llm", messages=messages, stream=True)  # type: ignore
        async for _ in stream:
            pass

    plan = [("transcription, 3 s of audio", "gateway.responders.remote", lambda: transcript_of(stt, pcm)),
            ("transcription, 3 s of audio", "openai, default transport", sdk_stt),
            ("chat stream", "gateway.responders.remote", gateway_chat),
            ("chat stream", "openai, default transport", sdk_chat)]
    rows = []
    for what, client, call in plan:
        cpu0 = time.process_time()
        await call()
        first = (time.process_time() - cpu0) * 1000
        cpu, wall = [], []
        for _ in range(calls):
            c, w = time.process_time(), time.perf_counter()
            await call()
            cpu.append((time.process_time() - c) * 1000)
            wall.append((time.perf_counter() - w) * 1000)
        rows.append({"call": what, "client": client, "first_cpu_ms": round(first, 1),
                     "cpu_ms": round(statistics.median(cpu), 2), "wall_ms": round(statistics.median(wall), 2),
                     "valid": None, "invalid": []})
    await asyncio.gather(stt.aclose(), llm.aclose(), sdk.close())
    return rows
