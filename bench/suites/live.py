"""GPT-Live beside Realtime: the same turns, the same models, the same audio, one gateway.

The gateway is bench/serve.py in one process: the pipeline responder on the fake STT (100 ms) and LLM (first
token 80 ms) with the tone TTS (first audio 25 ms after a segment, then real time). Every session streams the
same audio, tests/fixtures/one_sentence.wav and silence, in 20 ms appends on a real-time clock; Live sessions
over /v1/live/sessions (pcm16 24 kHz, client delegation), Realtime ones over /v1/realtime with semantic_vad at
"high", the turn detector `[live] eagerness` gives Live (Silero, then Smart Turn at each pause).

End of speech is aligned the same way on both protocols: the moment the client's real-time clock reached the
last sample above -54 dBFS of the turn's speech in the audio it sent, never a server's event (Live has no
speech_stopped). First output audio is the arrival of the first delta holding a sample above that level, plus
that sample's place in it: on Live, in the continuous 100 ms session.output_audio.delta stream (silence
included); on Realtime, in the reply's response.output_audio.delta events (bench/live_load.py says it exactly).

Levels, the two protocols one after the other on the one gateway, each level's sessions arriving as a Poisson
process over one turn's length (so they overlap for all but their first turn):

- latency: --latency-sessions sessions of --turns turns each (a sentence, then 2 s of silence; the reply, one
  short sentence, is over before the next turn): end of speech → first audio P50/P95, and beside it the gateway's
  own trace (speech_stopped → the first audio it sent), and for Realtime speech_stopped → first audio and where
  its audio_end_ms put the end of speech against the client's;
- cpu: --cpu-sessions sessions, --cpu-turns turns each: the gateway process's CPU seconds over the level per
  minute of the sessions' audio (session-minutes; the gateway's CPU with no session, measured for IDLE_S before
  the levels, is in it and beside it), its loop lag;
- delegation (Live only, a gateway of its own on fakes whose voice model delegates each turn without a word): the
  client answers session.delegation.created at once with a session.commentary.append; round trip = created's
  arrival → the first audible audio after it (the commentary's paraphrase), P50/P95, with the gateway's trace
  (delegation_created → commentary_spoken) beside it. The commentary is placed 600-800 ms after the timeline
  position it arrived at (docs/live.md), so most of the round trip is the protocol's own wait.

Each level carries its load side's own figures (load generator lag, late starts, the fakes' latencies): a
level whose load side did not keep up is INVALID (bench/validity.py).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import live_load
from bench.launcher import Fakes, Gateway, bench_settings, free_port
from bench.load import Pool, Sessions
from bench.stats import pct, rounded
from bench.validity import mark

HELP = "GPT-Live beside Realtime: end of speech to first audio, the delegation round trip, CPU per session-minute"
HOW = """\
    python -m bench live --small      # 1 session x 3 turns a protocol, 3 sessions for CPU, 2 delegations
    python -m bench live              # 2 sessions x 12 turns, 8 sessions x 4 turns for CPU, 2 x 8 delegations"""
IDLE_S = 5.0  # the gateway's own CPU, measured with no session before the levels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, help="latency: turns per session (default 12; --small 3)")
    parser.add_argument("--latency-sessions", type=int, help="latency: sessions (default 2; --small 1)")
    parser.add_argument("--cpu-sessions", type=int, help="cpu: sessions (default 8; --small 3)")
    parser.add_argument("--cpu-turns", type=int, help="cpu: turns per session (default 4; --small 2)")
    parser.add_argument("--delegations", type=int, help="delegation: turns (each delegated) per session, two "
                        "sessions (default 8; --small 2, one session)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    small = args.small
    turns = args.turns or (3 if small else 12)
    latency_sessions = args.latency_sessions or (1 if small else 2)
    cpu_sessions = args.cpu_sessions or (3 if small else 8)
    cpu_turns = args.cpu_turns or (2 if small else 4)
    delegations = args.delegations or (2 if small else 8)
    delegation_sessions = 1 if small else 2
    plan = [("latency", latency_sessions, turns, "turns"), ("cpu", cpu_sessions, cpu_turns, "turns")]
    levels: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}
    pool = Pool(1)
    try:
        with Served(delegate=False) as served:
            settings = served.settings
            for measure, n, repeats, scenario in plan:
                for protocol in ("realtime", "live"):
                    levels.append(served.level(pool, measure, protocol, scenario, n, repeats, args))
        with Served(delegate=True) as served:
            levels.append(served.level(pool, "delegation", "live", "delegation", delegation_sessions, delegations,
                                       args))
    finally:
        pool.close()
    return {"setup": "tone TTS, fake STT and LLM, 1 process", "settings": {
        "turns": turns, "latency_sessions": latency_sessions, "cpu_sessions": cpu_sessions, "cpu_turns": cpu_turns,
        "delegations": delegations, "delegation_sessions": delegation_sessions, "reply": live_load.SHORT_REPLY,
        "commentary": live_load.COMMENTARY, "gateway": settings}, "levels": levels}


class Served:
    """The fakes and a one-process gateway on them, with its trace, until the ``with`` ends."""

    def __init__(self, delegate: bool) -> None:
        self.trace = Path(tempfile.mkdtemp(prefix="bench-trace-")) / "trace.jsonl"
        self.fakes = Fakes(1, reply=live_load.SHORT_REPLY, delegate=delegate)
        self.settings = {**bench_settings(free_port()), "trace.jsonl_path": str(self.trace),
                         "responder.kind": "pipeline", "stt.base_url": self.fakes.url,
                         "llm.base_url": self.fakes.url}
        try:
            self.gateway = Gateway(self.settings, workers=1, tone=True)
        except BaseException:
            self.fakes.stop()
            raise
        # what the gateway costs with no session: in each level's CPU, spread over its session-minutes
        since = time.time()
        time.sleep(IDLE_S)
        rows = [r for rs in self.gateway.records(since, time.time()).values() for r in rs]
        self.idle_cpu = (rows[-1]["cpu_s"] - rows[0]["cpu_s"]) * 60 / (rows[-1]["t"] - rows[0]["t"]) \
            if len(rows) > 1 else math.nan

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.gateway.stop()
        self.fakes.stop()
        shutil.rmtree(self.trace.parent, ignore_errors=True)

    def level(self, pool: Pool, measure: str, protocol: str, scenario: str, n: int, repeats: int,
              args: argparse.Namespace) -> dict[str, Any]:
        url = self.gateway.live_url if protocol == "live" else self.gateway.url
        spread = len(live_load.timeline(scenario, 1)) / 48000  # arrivals over one turn: the sessions overlap
        result, start, end = live_load.run_sessions(pool, url, protocol, scenario, n, repeats, spread, False, seed=n)
        time.sleep(1.5)  # the probes' last records
        traces = [json.loads(line) for line in self.trace.read_text().splitlines()] if self.trace.exists() else []
        self.trace.write_text("")  # the gateway appends to it: what follows belongs to the next level
        audio_min = n * len(live_load.timeline(scenario, repeats)) / 48000 / 60
        level = figures(result, self.gateway.records(start, end), traces, audio_min)
        level = {"measure": measure, "protocol": protocol, "sessions": n, "turns_per_session": repeats, **level,
                 "gateway_idle_cpu_s_per_min": rounded(self.idle_cpu, 3),
                 "load": result.load() | {"fake": self.fakes.figures(start, end)}}
        mark(level, args.bounds)
        print(line(level), flush=True)
        return level


def figures(result: Sessions, records: dict[int, list[dict[str, Any]]], traces: list[dict[str, Any]],
            audio_min: float) -> dict[str, Any]:
    """A level's figures: the load generator's, the gateway probe's and its trace's."""
    cpu = sum(rows[-1]["cpu_s"] - rows[0]["cpu_s"] for rows in records.values() if len(rows) > 1)
    lags = [lag for rows in records.values() for r in rows for lag in r["lags_ms"]]
    first_delta = [t["first_delta_ms"] for t in traces if "first_delta_ms" in t]
    return {
        "turns": len(result.end_to_audio_ms),
        "end_to_audio_p50_ms": rounded(pct(result.end_to_audio_ms, 50), 1),
        "end_to_audio_p95_ms": rounded(pct(result.end_to_audio_ms, 95), 1),
        "stop_to_audio_p50_ms": rounded(pct(result.first_delta_ms, 50), 1),
        "stop_to_audio_p95_ms": rounded(pct(result.first_delta_ms, 95), 1),
        "vad_end_offset_p50_ms": rounded(pct(result.vad_end_offset_ms, 50), 1),
        "gateway_first_delta_p50_ms": rounded(pct(first_delta, 50), 1),
        "gateway_first_delta_p95_ms": rounded(pct(first_delta, 95), 1),
        "delegations": len(result.delegation_ms),
        "delegation_p50_ms": rounded(pct(result.delegation_ms, 50), 1),
        "delegation_p95_ms": rounded(pct(result.delegation_ms, 95), 1),
        "gateway_delegation_p50_ms": rounded(pct(delegation_trace(traces), 50), 1),
        "gateway_delegation_p95_ms": rounded(pct(delegation_trace(traces), 95), 1),
        "cpu_s_per_session_min": rounded(cpu / audio_min if audio_min and records else math.nan, 3),
        "worker_lag_p99_ms": rounded(pct(lags, 99), 1),
        "audio_errors": len(result.audio_errors), "errors": result.audio_errors[:5],
    }


def delegation_trace(traces: list[dict[str, Any]]) -> list[float]:
    """The gateway's own round trips: each delegation_created to its session's next commentary_spoken (ms)."""
    moments: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for t in traces:
        if "event" in t:
            moments[t["session_id"]].append((t["at_ms"], t["event"]))
    out = []
    for rows in moments.values():
        created = None
        for at, name in sorted(rows):
            if name == "delegation_created":
                created = at
            elif name == "commentary_spoken" and created is not None:
                out.append(at - created)
                created = None
    return out


def line(level: dict[str, Any]) -> str:
    load, fake = level["load"], level["load"]["fake"]
    verdict = "valid" if level["valid"] else "INVALID: " + "; ".join(level["invalid"])
    if level["measure"] == "delegation":
        what = (f"delegation round trip P50 {level['delegation_p50_ms']} P95 {level['delegation_p95_ms']} ms "
                f"({level['delegations']}; gateway's P50 {level['gateway_delegation_p50_ms']} ms)")
    else:
        what = (f"end of speech -> first audio P50 {level['end_to_audio_p50_ms']} P95 {level['end_to_audio_p95_ms']} "
                f"ms ({level['turns']} turns), CPU {level['cpu_s_per_session_min']} s/session-min")
    return (f"{level['measure']}, {level['protocol']}, {level['sessions']} sessions: {what}, audio errors "
            f"{level['audio_errors']} | load generator lag P99 {rounded(load['client_lag_p99_ms'] or math.nan, 1)} "
            f"ms, fake STT P95 {fake.get('stt_p95_ms')} ms, LLM P95 {fake.get('llm_p95_ms')} ms: {verdict}")
