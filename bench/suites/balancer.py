"""Two echo gateways behind nginx (deploy/nginx/gateway.conf) on this machine: balance, the proxy hop, drain.

Each gateway is `python -m gateway serve` as deployed behind a balancer (bench/nginx.py); plain websockets
clients stream fixture speech in 20 ms chunks at real-time pace, --turns turns per session (speech, 800 ms of
silence, then wait for response.done):

balance  --sessions sessions opened together through nginx: how many each gateway holds (its /metrics).
hop      speech_stopped -> first audio delta as the client sees it, the same load direct (half on each gateway)
         and through nginx; and the round trip of a client event (session.update -> session.updated, one
         session, idle gateways), direct and through nginx: what the hop itself costs.
drain    --sessions conversations through nginx, started over --spread seconds; gateway a gets SIGTERM
         --kill-after seconds in. The time to a's last session's end and to its exit, how a's sessions ended
         (finished their conversation, or told and closed with 1001), and the sessions lost: any that ended
         otherwise, or whose speech sent was not answered before the end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import statistics
import tempfile
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.load import CHUNK_MS, FIXTURES
from bench.nginx import API_KEY, Gateway, Nginx, metric, nginx_missing
from bench.stats import lag_probe, pct, rounded
from bench.validity import mark

HELP = "two gateways behind nginx: balance, the proxy hop, a drain that loses no session"
HOW = """\
    python -m bench balancer --small                   # 4 sessions, 1 turn each
    python -m bench balancer --sessions 12 --turns 3"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, help="sessions (default 12; --small 4)")
    parser.add_argument("--turns", type=int, help="turns per session (default 3; --small 1)")
    parser.add_argument("--spread", type=float, default=3.0, help="seconds over which sessions start")
    parser.add_argument("--wav", default="question_sky.wav", help="fixture speech for each turn")
    parser.add_argument("--kill-after", type=float, help="seconds into the drain run to SIGTERM a (default 6; "
                        "--small 3)")
    parser.add_argument("--round-trips", type=int, help="session.update round trips (default 200; --small 20)")
    parser.add_argument("--drain-seconds", type=float, default=30.0)
    parser.add_argument("--notice-seconds", type=float, default=10.0)


def speech(name: str) -> bytes:
    with wave.open(str(FIXTURES / name)) as w:
        return w.readframes(w.getnframes()) + bytes(48 * 800)  # then 800 ms of silence: the turn ends


@dataclass
class Conversation:
    url: str
    session_id: str = ""
    latencies: list[float] = field(default_factory=list)  # speech_stopped -> first delta, seconds
    answered: int = 0  # turns whose response.done came
    sent: int = 0  # turns whose speech was sent whole
    notice: bool = False
    close_code: int | None = None  # the close code the server sent (1000: answering the client's close)
    ended_at: float = 0.0


async def converse(url: str, pcm: bytes, turns: int, start_at: float = 0.0) -> Conversation:
    """One session: ``turns`` turns of speech at real-time pace, each answered before the next."""
    import websockets

    result = Conversation(url)
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    done = asyncio.Event()
    stopped: list[float] = []
    async with websockets.connect(url.replace("http", "ws") + "/v1/realtime?model=gpt-realtime", max_size=None,
                                  additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:

        async def read() -> None:
            first_delta = True
            async for raw in ws:
                event = json.loads(raw)
                kind = event["type"]
                if kind == "session.created":
                    result.session_id = event["session"]["id"]
                elif kind == "input_audio_buffer.speech_stopped":
                    stopped.append(time.monotonic())
                    first_delta = False
                elif kind == "response.output_audio.delta" and not first_delta and stopped:
                    result.latencies.append(time.monotonic() - stopped[-1])
                    first_delta = True
                elif kind == "response.done":
                    result.answered += 1
                    done.set()
                elif kind == "error" and event["error"]["code"] == "server_shutting_down":
                    result.notice = True

        reader = asyncio.create_task(read())
        try:
            for _ in range(turns):
                done.clear()
                step = 48 * CHUNK_MS
                began = time.monotonic()
                for i, offset in enumerate(range(0, len(pcm), step)):
                    await asyncio.sleep(max(0.0, began + i * CHUNK_MS / 1000 - time.monotonic()))
                    audio = base64.b64encode(pcm[offset:offset + step]).decode()
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                result.sent += 1
                await asyncio.wait([reader, asyncio.ensure_future(done.wait())], timeout=30,
                                   return_when=asyncio.FIRST_COMPLETED)
                if reader.done():
                    break
        except websockets.ConnectionClosed:
            pass
        if not reader.done():
            await ws.close()
        await asyncio.gather(reader, return_exceptions=True)
        received = ws.protocol.close_rcvd
        result.close_code = received.code if received is not None else None
    result.ended_at = time.monotonic()
    return result


async def balance(nginx: Nginx, gateways: list[Gateway], sessions: int) -> dict[str, int]:
    """Sessions opened together through nginx, held while each gateway's /metrics is read."""
    import websockets

    url = nginx.url.replace("http", "ws") + "/v1/realtime?model=gpt-realtime"
    headers = {"Authorization": f"Bearer {API_KEY}"}
    connections = await asyncio.gather(*(websockets.connect(url, additional_headers=headers)
                                         for _ in range(sessions)))
    try:
        await asyncio.gather(*(ws.recv() for ws in connections))
        return {g.name: int(await asyncio.to_thread(metric, g.url, "gateway_sessions")) for g in gateways}
    finally:
        await asyncio.gather(*(ws.close() for ws in connections))


async def load(urls: list[str], pcm: bytes, turns: int, spread: float) -> list[Conversation]:
    now = time.monotonic()
    return await asyncio.gather(*(converse(url, pcm, turns, now + spread * i / len(urls))
                                  for i, url in enumerate(urls)))


async def round_trips(url: str, count: int) -> list[float]:
    """session.update -> session.updated, one after another on one session, in milliseconds."""
    import websockets

    times = []
    async with websockets.connect(url.replace("http", "ws") + "/v1/realtime?model=gpt-realtime",
                                  additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        await ws.recv()
        for _ in range(count):
            began = time.monotonic()
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
            while json.loads(await ws.recv())["type"] != "session.updated":
                pass
            times.append((time.monotonic() - began) * 1000)
    return times


async def drain(nginx: Nginx, doomed: Gateway, pcm: bytes, sessions: int, turns: int, args: argparse.Namespace,
                kill_after: float) -> dict[str, Any]:
    run = asyncio.create_task(load([nginx.url] * sessions, pcm, turns, args.spread))
    await asyncio.sleep(kill_after)
    held = int(await asyncio.to_thread(metric, doomed.url, "gateway_sessions"))
    signalled = time.monotonic()
    doomed.terminate()
    code = await asyncio.to_thread(doomed.proc.wait, args.drain_seconds + 30)
    exited = time.monotonic()
    conversations = await run
    # a's sessions: the session ids do not name the gateway, so its log does
    doomed_ids = {line.split("session ")[1].split()[0] for line in doomed.log if " opened (" in line}
    on_doomed = [c for c in conversations if c.session_id in doomed_ids]
    finished = [c for c in conversations if c.close_code == 1000 and c.answered == c.sent == turns]
    told = [c for c in conversations if c.close_code == 1001 and c.notice]
    # lost: ended any other way (no close frame, another code, 1001 without the notice), or left unanswered
    lost = [c for c in conversations if c not in finished and c not in told]
    last_end = max((c.ended_at for c in on_doomed), default=signalled)
    return {"measure": "drain", "sessions": len(conversations), "held_by_a": held,
            "last_session_s": round(last_end - signalled, 2), "exit_s": round(exited - signalled, 2),
            "exit_code": code, "a_finished": len([c for c in on_doomed if c in finished]),
            "a_told_then_closed": len([c for c in on_doomed if c in told]),
            "turns_cut": sum(c.sent - c.answered for c in told), "sessions_lost": len(lost),
            "lost": [(c.close_code, c.notice) for c in lost], "drain_seconds": args.drain_seconds,
            "notice_seconds": args.notice_seconds}


def latency(measure: str, conversations: list[Conversation]) -> dict[str, Any]:
    ms = [x * 1000 for c in conversations for x in c.latencies]
    return {"measure": measure, "turns": len(ms), "first_delta_p50_ms": rounded(pct(ms, 50)),
            "first_delta_p95_ms": rounded(pct(ms, 95)), "first_delta_mean_ms": rounded(statistics.fmean(ms)) if ms
            else None}


async def measure(args: argparse.Namespace, lags: list[float]) -> list[dict[str, Any]]:
    sessions = args.sessions or (4 if args.small else 12)
    turns = args.turns or (1 if args.small else 3)
    trips = args.round_trips or (20 if args.small else 200)
    pcm = speech(args.wav)
    settings = {"server_drain_seconds": args.drain_seconds, "server_drain_notice_seconds": args.notice_seconds,
                "server_max_sessions": sessions * 2}
    gateways = [Gateway("a", **settings), Gateway("b", **settings)]
    nginx = None
    prefix = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    probe = asyncio.create_task(lag_probe(lambda lag: lags.append(lag * 1000)))
    rows: list[dict[str, Any]] = []
    try:
        for g in gateways:
            await asyncio.to_thread(g.wait_started, 600)  # the local models load on a busy CPU too
        nginx = Nginx([g.port for g in gateways], prefix)
        placed = await balance(nginx, gateways, sessions)
        rows.append({"measure": "balance", "sessions": sessions, "placed": placed})
        for name, url in (("direct", gateways[1].url), ("via nginx", nginx.url)):
            times = await round_trips(url, trips)
            rows.append({"measure": f"round trip, {name}", "round_trips": len(times),
                         "p50_ms": rounded(pct(times, 50)), "p95_ms": rounded(pct(times, 95))})
        rows.append(latency("hop, direct", await load([gateways[i % 2].url for i in range(sessions)], pcm, turns,
                                                      args.spread)))
        rows.append(latency("hop, via nginx", await load([nginx.url] * sessions, pcm, turns, args.spread)))
        rows.append(await drain(nginx, gateways[0], pcm, sessions, turns, args, args.kill_after or
                                (3.0 if args.small else 6.0)))
    finally:
        probe.cancel()
        if nginx is not None:
            nginx.stop()
        for g in gateways:
            g.stop()
        shutil.rmtree(prefix, ignore_errors=True)
    for row in rows:
        print(row, flush=True)
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    if (why := nginx_missing()) is not None:
        raise SystemExit(why)
    lags: list[float] = []
    rows = asyncio.run(measure(args, lags))
    for row in rows:
        row["load"] = {"client_lag_p99_ms": rounded(pct(lags, 99))}
        mark(row, args.bounds)
    return {"setup": "two echo gateways behind nginx", "settings": {
        "sessions": rows[0]["sessions"], "wav": args.wav, "spread_s": args.spread, "drain_seconds": args.drain_seconds,
        "notice_seconds": args.notice_seconds}, "levels": rows}
