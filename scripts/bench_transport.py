"""The gateway's CPU seconds for a fixed, transport-heavy workload: CPU time, not wall time, so that a
machine shared with other work still gives comparable figures (scripts/bench_gateway.py's loop lag and
latencies do not, there).

20 sessions at once, VAD off; each sends 500 appends of 20 ms audio, commits, asks for a response and
reads the echo (pace 0: 250 deltas of 40 ms) to response.done; three times per server process. Then plain
HTTP: 32 clients on kept-alive connections, 150 requests each, GET /healthz and POST
/v1/realtime/client_secrets (a JSON body in, a JSON answer out) in turn; the server's CPU per request. TREE is
a checkout of the gateway, whose own code is served, so that two commits can be compared with one venv:

    .venv/bin/python scripts/bench_transport.py .
    git archive main | tar -x -C /tmp/main && .venv/bin/python scripts/bench_transport.py /tmp/main
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import subprocess
import sys
import time

import aiohttp
import orjson
import websockets

SESSIONS, APPENDS, ROUNDS = 20, 500, 3
HTTP_CLIENTS, HTTP_REQUESTS = 32, 150

# Runs in the server process, inside TREE: the gateway as that commit serves it (the one-port server,
# or the websockets server before it), reporting its process CPU time on each line read from stdin.
SERVER = """
import asyncio, sys, time
from gateway.config import load_config
try:
    from gateway.responders.echo import EchoResponder
except ImportError:  # a tree from before the layered layout
    from gateway.core.responder import EchoResponder

async def main():
    config = load_config(env={})
    config.server.port = 0
    config.webrtc.enabled = False
    try:
        from gateway.server.serve import GatewayServer
        gateway = GatewayServer(config, EchoResponder(pace=0))
    except ImportError:
        from gateway.runtime.gateway import Gateway
        gateway = Gateway(config, EchoResponder(pace=0))
    await gateway.start()
    print(gateway.port, flush=True)
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(time.process_time(), flush=True)
    await gateway.stop()

asyncio.run(main())
"""


async def session(url: str, appends: list[str]) -> int:
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
                return deltas
    return deltas


async def load(url: str, appends: list[str]) -> int:
    return sum(await asyncio.gather(*(session(url, appends) for _ in range(SESSIONS))))


async def http_load(base: str) -> int:
    """HTTP_CLIENTS clients making HTTP_REQUESTS requests each; how many were answered 200."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def client() -> int:
            ok = 0
            for n in range(HTTP_REQUESTS):
                if n % 2:
                    answer = http.post(base + "/v1/realtime/client_secrets",
                                       json={"session": {"type": "realtime", "instructions": "Be brief."}})
                else:
                    answer = http.get(base + "/healthz")
                async with answer as got:
                    await got.read()
                    ok += got.status == 200
            return ok

        return sum(await asyncio.gather(*(client() for _ in range(HTTP_CLIENTS))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree", help="a checkout of the gateway to serve")
    tree = os.path.abspath(parser.parse_args().tree)
    server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=tree, env={**os.environ, "PYTHONPATH": tree},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    port = int(server.stdout.readline())
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    chunk = base64.b64encode(bytes(960)).decode()
    appends = ['{"type":"input_audio_buffer.append","audio":"' + chunk + '"}'] * APPENDS

    def cpu() -> float:
        server.stdin.write("cpu\n")
        server.stdin.flush()
        return float(server.stdout.readline())

    for _ in range(ROUNDS):
        start_cpu, start = cpu(), time.time()
        deltas = asyncio.run(load(url, appends))
        print(f"{tree}: server CPU {cpu() - start_cpu:.2f} s (wall {time.time() - start:.1f} s) for "
              f"{SESSIONS * APPENDS} appends in, {deltas} deltas out", flush=True)
    for _ in range(ROUNDS):
        start_cpu, start = cpu(), time.time()
        ok = asyncio.run(http_load(f"http://127.0.0.1:{port}"))
        print(f"{tree}: server CPU {(cpu() - start_cpu) / (HTTP_CLIENTS * HTTP_REQUESTS) * 1e6:.0f} µs per HTTP "
              f"request (wall {time.time() - start:.1f} s; {ok} of {HTTP_CLIENTS * HTTP_REQUESTS} answered 200)",
              flush=True)
    server.stdin.close()
    server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
