"""The gateway's CPU seconds for a fixed, transport-heavy workload: CPU time, not wall time, so that a machine
shared with other work still gives comparable figures (the gateway suite's loop lag and latencies do not).

One gateway process (echo, at no pace). WebSocket: 20 sessions at once, VAD off; each sends 500 appends of 20 ms
audio, commits, asks for a response and reads the echo (250 deltas of 40 ms) to response.done; three rounds.
Then plain HTTP: 32 clients on kept-alive connections, 150 requests each, GET /healthz and POST
/v1/realtime/client_secrets (a JSON body in, a JSON answer out) in turn; the gateway's CPU per request, three
rounds. The CPU is the process's own (all its threads), read from /proc between rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import time
from pathlib import Path
from typing import Any

from bench.launcher import Gateway, bench_settings, free_port

HELP = "the gateway's CPU for a fixed WebSocket and HTTP workload (CPU time: comparable on a busy machine)"
HOW = """\
    python -m bench transport --small        # one round of each, a tenth of the work
    python -m bench transport                # 3 rounds of 20 sessions x 500 appends, 3 of 4800 requests"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, help="rounds of each workload (default 3; --small 1)")


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, every thread (/proc/PID/stat: utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def session(url: str, appends: list[str]) -> int:
    import orjson
    import websockets

    async with websockets.connect(url, max_size=None, compression=None) as ws:
        await ws.recv()
        await ws.send(orjson.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"turn_detection": None}}}}).decode())
        for message in appends:
            await ws.send(message)
        await ws.send('{"type":"input_audio_buffer.commit"}')
        await ws.send('{"type":"response.create"}')
        deltas = 0
        async for raw in ws:
            kind = orjson.loads(raw)["type"]
            deltas += kind == "response.output_audio.delta"
            if kind == "response.done":
                break
    return deltas


async def http_load(base: str, clients: int, requests: int) -> int:
    """`clients` clients making `requests` requests each; how many were answered 200."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def client() -> int:
            ok = 0
            for n in range(requests):
                if n % 2:
                    answer = http.post(base + "/v1/realtime/client_secrets",
                                       json={"session": {"type": "realtime", "instructions": "Be brief."}})
                else:
                    answer = http.get(base + "/healthz")
                async with answer as got:
                    await got.read()
                    ok += got.status == 200
            return ok

        return sum(await asyncio.gather(*(client() for _ in range(clients))))


def run(args: argparse.Namespace) -> dict[str, Any]:
    small = args.small
    rounds = args.rounds or (1 if small else 3)
    sessions, appends_n, clients, requests = (20, 50, 32, 16) if small else (20, 500, 32, 150)
    settings = {**bench_settings(free_port()), "responder.kind": "echo", "responder.echo_pace": 0.0,
                "local.stt": False}
    gateway = Gateway(settings)
    pid = gateway.process.pid
    chunk = base64.b64encode(bytes(960)).decode()
    appends = ['{"type":"input_audio_buffer.append","audio":"' + chunk + '"}'] * appends_n
    rows = []
    try:
        for k in range(rounds):
            cpu, start = cpu_seconds(pid), time.time()
            deltas = asyncio.run(_sessions(gateway.url, sessions, appends))
            rows.append({"workload": "websocket", "round": k + 1, "appends": sessions * appends_n, "deltas": deltas,
                         "cpu_s": round(cpu_seconds(pid) - cpu, 3), "wall_s": round(time.time() - start, 1),
                         "valid": None, "invalid": []})
            print(f"WebSocket round {k + 1}: gateway CPU {rows[-1]['cpu_s']} s for {sessions * appends_n} appends in, "
                  f"{deltas} deltas out", flush=True)
        for k in range(rounds):
            cpu, start = cpu_seconds(pid), time.time()
            ok = asyncio.run(http_load(gateway.base, clients, requests))
            per = (cpu_seconds(pid) - cpu) / (clients * requests) * 1e6
            rows.append({"workload": "http", "round": k + 1, "requests": clients * requests, "answered_200": ok,
                         "cpu_us_per_request": round(per), "wall_s": round(time.time() - start, 1), "valid": None,
                         "invalid": []})
            print(f"HTTP round {k + 1}: gateway CPU {per:.0f} us per request ({ok} of {clients * requests} "
                  "answered 200)", flush=True)
    finally:
        gateway.stop()
    return {"setup": "echo, one process", "settings": {"rounds": rounds, "sessions": sessions, "appends": appends_n,
                                                       "http_clients": clients, "http_requests": requests},
            "levels": rows}


async def _sessions(url: str, n: int, appends: list[str]) -> int:
    return sum(await asyncio.gather(*(session(url, appends) for _ in range(n))))
