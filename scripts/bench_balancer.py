"""Balancer benchmark: two echo gateways behind nginx (deploy/nginx/gateway.conf) on this machine.

Three measures, each with plain websockets clients that stream fixture speech in 20 ms chunks at real-time
pace, --turns turns per session (speech, 800 ms of silence, wait for response.done):

balance   --sessions sessions opened together through nginx: how many each gateway holds (its /metrics).
hop       speech_stopped -> first audio delta, as the client sees it, for the same load (--sessions
          sessions) direct (half on each gateway) and through nginx: the extra latency of the proxy hop.
          Both events cross the hop, so it shows only what nginx adds between them; the round trip of a
          client event (session.update -> session.updated, --round-trips of them, one session, idle
          gateways) shows the hop itself.
drain     --sessions conversations through nginx, started over --spread seconds; gateway A gets SIGTERM
          --kill-after seconds in. Reported: the time from SIGTERM to A's last session ending and to A's
          exit, how A's sessions ended (finished their conversation / told, then closed with 1001) and the
          sessions lost: any that ended otherwise, or whose sent speech was not answered before the end.

    .venv/bin/python scripts/bench_balancer.py --sessions 12 --turns 3
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.balancer import API_KEY, ROOT, Gateway, Nginx, metric, nginx_missing  # noqa: E402

CHUNK_MS = 20


def speech(name: str) -> bytes:
    with wave.open(str(ROOT / "tests" / "fixtures" / name)) as w:
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def balance(nginx: Nginx, gateways: list[Gateway], sessions: int) -> dict[str, int]:
    """Sessions opened together through nginx, held while each gateway's /metrics is read."""
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


def summary(conversations: list[Conversation]) -> str:
    latencies = [x * 1000 for c in conversations for x in c.latencies]
    return (f"P50 {percentile(latencies, 0.5):.1f} ms, P95 {percentile(latencies, 0.95):.1f} ms, "
            f"mean {statistics.fmean(latencies):.1f} ms over {len(latencies)} turns")


async def drain(nginx: Nginx, doomed: Gateway, pcm: bytes, args: argparse.Namespace) -> list[str]:
    started = time.monotonic()
    run = asyncio.create_task(load([nginx.url] * args.sessions, pcm, args.turns, args.spread))
    await asyncio.sleep(args.kill_after)
    held = int(await asyncio.to_thread(metric, doomed.url, "gateway_sessions"))
    signalled = time.monotonic()
    doomed.terminate()
    code = await asyncio.to_thread(doomed.proc.wait, args.drain_seconds + 30)
    exited = time.monotonic()
    conversations = await run
    # A's sessions: those that ended after the SIGTERM without being able to start again (they ended by
    # themselves or by A's close); the session ids do not name the gateway, so the server's log does.
    doomed_ids = {line.split("session ")[1].split()[0] for line in doomed.log if " opened (" in line}
    on_doomed = [c for c in conversations if c.session_id in doomed_ids]
    finished = [c for c in conversations if c.close_code == 1000 and c.answered == c.sent == args.turns]
    told = [c for c in conversations if c.close_code == 1001 and c.notice]
    # Lost: ended any other way (no close frame, another code, 1001 without the notice), or left unanswered.
    lost = [c for c in conversations if c not in finished and c not in told]
    unanswered = sum(c.sent - c.answered for c in told)
    last_end = max((c.ended_at for c in on_doomed), default=signalled)
    return [
        f"sessions: {len(conversations)} through nginx over {args.spread:g} s, {args.turns} turns each; "
        f"SIGTERM to gateway a {args.kill_after:g} s in, holding {held} (drain_seconds {args.drain_seconds:g}, "
        f"notice {args.notice_seconds:g})",
        f"SIGTERM -> last session of a ended: {last_end - signalled:.2f} s; SIGTERM -> a exited: "
        f"{exited - signalled:.2f} s (exit code {code})",
        f"a's sessions: {len(on_doomed)}: {len([c for c in on_doomed if c in finished])} finished their "
        f"conversation, {len([c for c in on_doomed if c in told])} told then closed 1001 ({unanswered} turn(s) "
        f"cut by the close); sessions lost (any gateway): {len(lost)} {[(c.close_code, c.notice) for c in lost]}",
        f"whole run {time.monotonic() - started:.1f} s",
    ]


async def main(args: argparse.Namespace) -> None:
    if (why := nginx_missing()) is not None:
        sys.exit(why)
    pcm = speech(args.wav)
    settings = {"server_drain_seconds": args.drain_seconds, "server_drain_notice_seconds": args.notice_seconds,
                "server_max_sessions": args.sessions * 2}
    gateways = [Gateway("a", **settings), Gateway("b", **settings)]
    nginx = None
    try:
        for g in gateways:
            g.wait_started()
        nginx = Nginx([g.port for g in gateways], Path(tempfile.mkdtemp(prefix="bench-nginx-")))
        lines = [f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; "
                 f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
        placed = await balance(nginx, gateways, args.sessions)
        lines.append(f"balance: {args.sessions} sessions opened together through nginx -> {placed}")
        for name, url in (("direct", gateways[1].url), ("via nginx", nginx.url)):
            times = await round_trips(url, args.round_trips)
            lines.append(f"session.update round trip, {name}: P50 {percentile(times, 0.5):.2f} ms, "
                         f"P95 {percentile(times, 0.95):.2f} ms over {len(times)}")
        direct = await load([gateways[i % 2].url for i in range(args.sessions)], pcm, args.turns, args.spread)
        proxied = await load([nginx.url] * args.sessions, pcm, args.turns, args.spread)
        lines.append(f"speech_stopped -> first delta, direct:      {summary(direct)}")
        lines.append(f"speech_stopped -> first delta, via nginx:   {summary(proxied)}")
        hop = [percentile([x for c in proxied for x in c.latencies], q) - percentile(
            [x for c in direct for x in c.latencies], q) for q in (0.5, 0.95)]
        lines.append(f"proxy hop: {hop[0] * 1000:+.1f} ms at P50, {hop[1] * 1000:+.1f} ms at P95")
        lines += await drain(nginx, gateways[0], pcm, args)
        print("\n".join(lines))
    finally:
        if nginx is not None:
            nginx.stop()
        for g in gateways:
            g.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--spread", type=float, default=3.0, help="seconds over which sessions start")
    parser.add_argument("--wav", default="question_sky.wav", help="fixture speech for each turn")
    parser.add_argument("--kill-after", type=float, default=6.0, help="seconds into the drain run to SIGTERM a")
    parser.add_argument("--round-trips", type=int, default=200)
    parser.add_argument("--drain-seconds", type=float, default=30.0)
    parser.add_argument("--notice-seconds", type=float, default=10.0)
    asyncio.run(main(parser.parse_args()))
